// The GEMM GPU tests' checks (test_skinny_gemm_gpu, test_wgmma_gemm_gpu): a problem with its
// float64 reference, a run into a poisoned output with a guard past its end, and the comparison.
//
// Tolerance per element, ref = sum_i x_i w_i and mag = sum_i |x_i w_i| in float64:
//   |got - ref| <= (bf16 out ? 2^-8 |ref| : 0) + (k / 16 + 16) * 2^-23 * mag
// 2^-8 |ref| bounds the bf16 rounding (8 significant bits: half an ulp <= 2^-8 of the value). The
// second term bounds fp32 accumulation on tensor cores: a chain of at most k / 16 block sums plus
// the split-k partials, each addition off by at most 2^-23 (truncating adders) of the magnitudes.
// Skinny vs cuBLAS: within the sum of both bounds. "Exact" inputs (multiples of 1/16 in [-1, 1])
// keep every partial sum exact in fp32 (|sum| <= 2^13 in steps of 2^-8: 22 bits), so there float
// outputs equal the reference and bf16 outputs its round-to-nearest-even, bit for bit, on both
// paths.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "attention/reference.h"
#include "attention_check.h"
#include "common/buffers.h"
#include "common/cuda_check.h"
#include "engine/gemm.h"
#include "gemm_test_data.h"

namespace graphdecode::testing {

inline constexpr std::size_t kGuard = 64;  // poisoned elements past the output

struct Problem {
  int rows = 0, k = 0, n = 0;
  bool exact = false;
  std::vector<std::uint16_t> x, w;  // [rows][k], [n][k]
  std::vector<double> ref, mag;     // [rows][n]
};

// Fresh x; W from `w` when given (one W serves every row count), else fresh.
inline Problem make_problem(Rng& rng, int rows, int k, int n, bool exact,
                            const std::vector<std::uint16_t>* w = nullptr) {
  Problem p{rows, k, n, exact, {}, {}, {}, {}};
  p.x = random_bits(rng, static_cast<std::size_t>(rows) * k, exact);
  p.w = w ? *w : random_bits(rng, static_cast<std::size_t>(n) * k, exact);
  p.ref.resize(static_cast<std::size_t>(rows) * n);
  p.mag.resize(p.ref.size());
  std::vector<double> xd(p.x.size());
  for (std::size_t i = 0; i < xd.size(); ++i) xd[i] = reference::bf16_to_float(p.x[i]);
  std::vector<double> wr(k);
  for (int c = 0; c < n; ++c) {
    for (int i = 0; i < k; ++i)
      wr[i] = reference::bf16_to_float(p.w[static_cast<std::size_t>(c) * k + i]);
    for (int r = 0; r < rows; ++r) {
      double s = 0, m = 0;
      for (int i = 0; i < k; ++i) {
        const double prod = xd[static_cast<std::size_t>(r) * k + i] * wr[i];
        s += prod;
        m += std::abs(prod);
      }
      p.ref[static_cast<std::size_t>(r) * n + c] = s;
      p.mag[static_cast<std::size_t>(r) * n + c] = m;
    }
  }
  return p;
}

// "rows R k K n N exact|random f32|bf16": the trace of one case of a sweep.
inline std::string case_name(int rows, int k, int n, bool exact, GemmOut out) {
  return "rows " + std::to_string(rows) + " k " + std::to_string(k) + " n " + std::to_string(n) +
         (exact ? " exact" : " random") + (out == GemmOut::kF32 ? " f32" : " bf16");
}

inline double bound(const Problem& p, std::size_t i, GemmOut out) {
  const double acc = (p.k / 16.0 + 16.0) * std::ldexp(1.0, -23) * p.mag[i];
  return (out == GemmOut::kBF16 ? std::ldexp(std::abs(p.ref[i]), -8) : 0.0) + acc;
}

// Runs one GEMM (`launch`, given args with y set) into a poisoned buffer; returns the outputs, or
// fails if one is unwritten or the guard past the end was touched.
inline ::testing::AssertionResult run_into(const GemmArgs& args, cudaStream_t s,
                                           std::vector<double>& got,
                                           const std::function<void(const GemmArgs&)>& launch) {
  const std::size_t n = static_cast<std::size_t>(args.rows) * args.out;
  const std::size_t esize = args.out_type == GemmOut::kF32 ? 4 : 2;
  DeviceBuffer<std::uint8_t> y((n + kGuard) * esize);
  y.fill_bytes(0xff, s);  // NaN as bf16 and as float
  GemmArgs a = args;
  a.y = y.data();
  launch(a);
  std::vector<std::uint8_t> h(y.size());
  y.download(h.data(), h.size(), s);
  GD_CUDA(cudaStreamSynchronize(s));
  for (std::size_t i = n * esize; i < h.size(); ++i)
    if (h[i] != 0xff) return ::testing::AssertionFailure() << "wrote past the output, byte " << i;
  got.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (esize == 4) {
      float v;
      std::memcpy(&v, &h[4 * i], 4);
      got[i] = v;
    } else {
      std::uint16_t b;
      std::memcpy(&b, &h[2 * i], 2);
      got[i] = reference::bf16_to_float(b);
    }
    if (std::isnan(got[i])) return ::testing::AssertionFailure() << "element " << i << " unwritten";
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult matches(const Problem& p, const std::vector<double>& got,
                                          const std::vector<double>* other, GemmOut out) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    double want = p.ref[i], tol = bound(p, i, out);
    if (p.exact && out == GemmOut::kBF16)
      want = reference::bf16_to_float(reference::float_to_bf16(float(p.ref[i])));
    if (p.exact) tol = 0;
    if (other != nullptr) want = (*other)[i], tol *= 2;
    if (!(std::abs(got[i] - want) <= tol))
      return ::testing::AssertionFailure()
             << "row " << i / p.n << " col " << i % p.n << ": got " << got[i] << ", want " << want
             << " (tol " << tol << (other ? ", vs cuBLAS" : ", vs float64") << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace graphdecode::testing
