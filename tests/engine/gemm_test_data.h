// Random bf16 operands for the GEMM/GEMV GPU tests (test_skinny_gemm_gpu,
// test_stream_gemv_fusion_gpu).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "attention/reference.h"
#include "attention_check.h"  // Rng

namespace graphdecode::testing {

// `count` bf16 values uniform in [-1, 1], or multiples of 1/16 there (`exact`: products and their
// sums stay exact in fp32 over k <= 2^13).
inline std::vector<std::uint16_t> random_bits(Rng& rng, std::size_t count, bool exact) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> grid(-16, 16);
  std::vector<std::uint16_t> v(count);
  for (auto& e : v) e = reference::float_to_bf16(exact ? grid(rng) / 16.f : u(rng));
  return v;
}

}  // namespace graphdecode::testing
