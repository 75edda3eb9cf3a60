// x / d for 0 <= x < 2^31 by one multiply-high and a shift, d fixed for a launch (page size, GQA
// group). Kernels use it where a runtime integer division sits on a path every CTA runs once: the
// division is ~20 instructions that a cold CTA must fetch and wait on.
// Round-up multiplier (Granlund-Montgomery): with l = ceil(log2 d), m = ceil(2^(31 + l) / d) < 2^32
// and x / d = (x * m) >> (31 + l), exact for every x < 2^31 (tests/common/test_fast_divmod.cpp
// checks it against `/`).
#pragma once

#include <cstdint>

#include "common/request_rules.h"  // GD_HD

namespace graphdecode {

struct FastDivmod {
  std::uint32_t divisor = 1, multiplier = 0, shift = 0;  // shift = l - 1, applied after the >> 32

  static FastDivmod make(std::uint32_t d) {
    FastDivmod f;
    f.divisor = d;
    if (d > 1) {
      std::uint32_t l = 0;
      while ((1ull << l) < d) ++l;
      f.multiplier = static_cast<std::uint32_t>(((1ull << (31 + l)) + d - 1) / d);
      f.shift = l - 1;
    }
    return f;
  }
  GD_HD std::int32_t div(std::int32_t x) const {
    if (divisor == 1) return x;
    const auto hi = static_cast<std::uint32_t>(
        (static_cast<std::uint64_t>(static_cast<std::uint32_t>(x)) * multiplier) >> 32);
    return static_cast<std::int32_t>(hi >> shift);
  }
};

}  // namespace graphdecode
