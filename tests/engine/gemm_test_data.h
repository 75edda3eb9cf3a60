// Random bf16 operands for the GEMM/GEMV GPU tests (test_skinny_gemm_gpu,
// test_stream_gemv_fusion_gpu, test_stream_mlp_gpu), and the residual rows' squares their norm
// prologues read.
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

// Sums of squares of residual rows [rows][k] as `parts` parts (any split: the prologue adds them).
inline std::vector<float> split_squares(const std::vector<std::uint16_t>& res, int rows, int k,
                                        int parts) {
  std::vector<float> sq(static_cast<std::size_t>(parts) * rows, 0.f);
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < parts; ++b) {
      double s = 0;
      for (int i = b * k / parts; i < (b + 1) * k / parts; ++i) {
        const double v = reference::bf16_to_float(res[static_cast<std::size_t>(r) * k + i]);
        s += v * v;
      }
      sq[static_cast<std::size_t>(b) * rows + r] = static_cast<float>(s);
    }
  return sq;
}

}  // namespace graphdecode::testing
