// GPU: the stream GEMV's norm fusions (engine/kernels/stream_gemv.h StreamGemvFusion), which fold a
// decode layer's input RMSNorm into the down projection before it and the qkv projection after it.
// - Epilogue: y bitwise the plain stream GEMV's; the residual bitwise bf16(residual + y) as the
//   rmsnorm kernel adds it; each CTA's sum of squares of the new residual over its own columns
//   within fp32 accumulation of the float64 sum; every output written, nothing past it.
// - Prologue: on residual rows whose squares add exactly in fp32 (multiples of 1/16), y bitwise
//   equal to the rmsnorm kernel followed by the plain stream GEMV; on random rows within the
//   float64 bound of the normed product.
// - Bad arguments: a graphdecode::Error naming the field.
// - Gemm's kAuto bounds for the stream GEMV: 8 rows and 6144 outputs, 2 rows for a k past 8192,
//   moved by GRAPHDECODE_GEMV_AUTO (sweeps); a malformed value is refused by name.
// Fresh random data per run (the seed is printed; GRAPHDECODE_SEED reproduces).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention/reference.h"
#include "attention_check.h"
#include "common/buffers.h"
#include "common/stream.h"
#include "engine/gemm.h"
#include "engine/kernels/model_kernels.h"
#include "engine/kernels/stream_gemv.h"
#include "gemm_test_data.h"
#include "support/device_vectors.h"
#include "support/field_of.h"
#include "support/gpu_test.h"
#include "support/scoped_env.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;
using reference::bf16_to_float;
using reference::float_to_bf16;
using Bits = std::vector<std::uint16_t>;

class StreamGemvFusionGpu : public GpuTest {};

// The plain stream GEMV of x [rows][k] by w [n][k] into a fresh bf16 buffer.
Bits plain_gemv(const SkinnyGemmDevice& dev, const DeviceBuffer<std::uint16_t>& x,
                const DeviceBuffer<std::uint16_t>& w, int rows, int k, int n, cudaStream_t s) {
  DeviceBuffer<std::uint16_t> y(static_cast<std::size_t>(rows) * n);
  y.fill_bytes(0xff, s);
  stream_gemv(dev, {x.data(), w.data(), y.data(), rows, k, n, false}, s);
  return to_host(y, s);
}

TEST_F(StreamGemvFusionGpu, ResidualEpilogueAddsAndLeavesEachCtasSquares) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  const int k = 2048;
  // 8196: 1025 tiles, so every CTA has more than ResidualAhead's 4 (the rest read in place), the
  // last one partial.
  for (int n : {2048, 1000, 264, 8196}) {
    const Bits w = random_bits(rng, static_cast<std::size_t>(n) * k, false);
    auto dw = to_device(w, s);
    for (int rows : {1, 3, 4, 8}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " n " + std::to_string(n));
      const auto cells = static_cast<std::size_t>(rows) * n;
      auto dx = to_device(random_bits(rng, static_cast<std::size_t>(rows) * k, false), s.get());
      const Bits res = random_bits(rng, cells + n, false);  // + a guard row past the rows
      auto dres = to_device(res, s.get());
      const int parts = stream_gemv_grid(dev, n);
      DeviceBuffer<float> sq(static_cast<std::size_t>(parts + 1) * rows);  // + a guard part
      sq.fill_bytes(0xff, s.get());
      DeviceBuffer<std::uint16_t> y(cells);
      y.fill_bytes(0xff, s.get());
      StreamGemvFusion f;
      f.residual = dres.data();
      f.sum_sq_out = sq.data();
      stream_gemv(dev, {dx.data(), dw.data(), y.data(), rows, k, n, false}, s.get(), f);
      const Bits got_y = to_host(y, s.get()), got_res = to_host(dres, s.get());
      const std::vector<float> got_sq = to_host(sq, s.get());
      const Bits want_y = plain_gemv(dev, dx, dw, rows, k, n, s.get());
      ASSERT_EQ(std::memcmp(got_y.data(), want_y.data(), cells * 2), 0) << "y != the plain GEMV's";
      for (std::size_t i = 0; i < cells; ++i)
        ASSERT_EQ(got_res[i], float_to_bf16(bf16_to_float(res[i]) + bf16_to_float(want_y[i])))
            << "residual element " << i;
      for (std::size_t i = cells; i < res.size(); ++i)
        ASSERT_EQ(got_res[i], res[i]) << "guard row element " << i - cells;
      // CTA b owns tiles [b * tiles / parts, (b + 1) * tiles / parts) of 8 columns.
      const int tiles = (n + 7) / 8;
      for (int b = 0; b < parts; ++b) {
        const int c0 = static_cast<int>(static_cast<std::int64_t>(b) * tiles / parts) * 8;
        const int c1 =
            std::min(n, static_cast<int>(static_cast<std::int64_t>(b + 1) * tiles / parts) * 8);
        for (int r = 0; r < rows; ++r) {
          double want = 0;
          for (int c = c0; c < c1; ++c) {
            const double v = bf16_to_float(got_res[static_cast<std::size_t>(r) * n + c]);
            want += v * v;
          }
          const float got = got_sq[static_cast<std::size_t>(b) * rows + r];
          ASSERT_TRUE(std::isfinite(got)) << "part " << b << " row " << r << " unwritten";
          EXPECT_NEAR(got, want, 1e-5 * want + 1e-30) << "part " << b << " row " << r;
        }
      }
      for (int r = 0; r < rows; ++r)
        ASSERT_TRUE(std::isnan(got_sq[static_cast<std::size_t>(parts) * rows + r]))
            << "guard part row " << r << " written";
    }
  }
}

TEST_F(StreamGemvFusionGpu, NormPrologueEqualsTheRmsnormKernelThenTheGemv) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  const int k = 2048, n = 3072, parts = 7;
  const float eps = 1e-5f;
  const Bits w = random_bits(rng, static_cast<std::size_t>(n) * k, false);
  auto dw = to_device(w, s.get());
  const Bits norm_w = random_bits(rng, k, false);
  auto dnorm = to_device(norm_w, s.get());
  for (bool exact : {true, false}) {
    for (int rows : {1, 2, 4, 8}) {
      SCOPED_TRACE(std::string(exact ? "exact" : "random") + " rows " + std::to_string(rows));
      const Bits res = random_bits(rng, static_cast<std::size_t>(rows) * k, exact);
      auto dres = to_device(res, s.get());
      auto dsq = to_device(split_squares(res, rows, k, parts), s.get());
      DeviceBuffer<std::uint16_t> y(static_cast<std::size_t>(rows) * n);
      y.fill_bytes(0xff, s.get());
      StreamGemvFusion f;
      f.norm_weight = dnorm.data();
      f.sum_sq_in = dsq.data();
      f.parts = parts;
      f.eps = eps;
      stream_gemv(dev, {dres.data(), dw.data(), y.data(), rows, k, n, false}, s.get(), f);
      const Bits got = to_host(y, s.get());
      ASSERT_EQ(to_host(dres, s.get()), res) << "the prologue wrote its input";

      // The unfused chain: the rmsnorm kernel, then the plain stream GEMV.
      DeviceBuffer<std::uint16_t> normed(static_cast<std::size_t>(rows) * k);
      auto live = to_device(std::vector<std::int32_t>{rows}, s.get());
      RmsNormArgs a;
      a.x = dres.data();
      a.weight = dnorm.data();
      a.y = normed.data();
      a.num_rows = live.data();
      a.max_rows = rows;
      a.hidden = k;
      a.eps = eps;
      rmsnorm(a, s.get());
      const Bits chain = plain_gemv(dev, normed, dw, rows, k, n, s.get());
      if (exact) {  // the squares add exactly in fp32 in any order: the same inverse RMS
        ASSERT_EQ(got, chain) << "fused != rmsnorm kernel + GEMV";
        continue;
      }
      // Random rows: both within the float64 bound of w * x * inv_rms (x' rounded twice to bf16,
      // the product's accumulation, the output's rounding).
      for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int i = 0; i < k; ++i) {
          const double v = bf16_to_float(res[static_cast<std::size_t>(r) * k + i]);
          ss += v * v;
        }
        const double inv = 1.0 / std::sqrt(ss / k + eps);
        for (int c = 0; c < n; ++c) {
          double ref = 0, mag = 0;
          for (int i = 0; i < k; ++i) {
            const double xn = bf16_to_float(norm_w[i]) *
                              bf16_to_float(res[static_cast<std::size_t>(r) * k + i]) * inv;
            const double p = xn * bf16_to_float(w[static_cast<std::size_t>(c) * k + i]);
            ref += p;
            mag += std::abs(p);
          }
          const double tol = std::ldexp(std::abs(ref), -8) + std::ldexp(mag, -7) +
                             (k / 16.0 + 16.0) * std::ldexp(mag, -23);
          const std::size_t at = static_cast<std::size_t>(r) * n + c;
          ASSERT_NEAR(bf16_to_float(got[at]), ref, tol) << "fused, row " << r << " col " << c;
          ASSERT_NEAR(bf16_to_float(chain[at]), ref, tol) << "chain, row " << r << " col " << c;
        }
      }
    }
  }
}

TEST_F(StreamGemvFusionGpu, BadFusionArgumentsAreRefusedByName) {
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  const int k = 256, n = 64, rows = 2;
  DeviceBuffer<std::uint16_t> x(rows * k + 8), w(n * k), y(rows * n), res(rows * n), nw(k + 8);
  DeviceBuffer<float> yf(rows * n), sq(static_cast<std::size_t>(dev.sm_count) * rows);
  const SkinnyGemmArgs a{x.data(), w.data(), y.data(), rows, k, n, false};
  const auto field = [&](const SkinnyGemmArgs& args, const StreamGemvFusion& f) {
    return field_of([&] { stream_gemv(dev, args, s.get(), f); });
  };
  StreamGemvFusion epi;
  epi.residual = res.data();
  epi.sum_sq_out = sq.data();
  EXPECT_EQ(field({x.data(), w.data(), yf.data(), rows, k, n, true}, epi), "out_f32");
  StreamGemvFusion no_sq = epi;
  no_sq.sum_sq_out = nullptr;
  EXPECT_EQ(field(a, no_sq), "sum_sq_out");
  StreamGemvFusion pro;
  pro.norm_weight = nw.data();
  pro.sum_sq_in = sq.data();
  pro.parts = 3;
  StreamGemvFusion bad = pro;
  bad.sum_sq_in = nullptr;
  EXPECT_EQ(field(a, bad), "sum_sq_in");
  for (int parts : {0, dev.sm_count + 1}) {
    bad = pro;
    bad.parts = parts;
    EXPECT_EQ(field(a, bad), "parts") << parts;
  }
  bad = pro;
  bad.norm_weight = nw.data() + 1;
  EXPECT_EQ(field(a, bad), "norm_weight");
  bad = pro;
  bad.eps = 0.f;
  EXPECT_EQ(field(a, bad), "eps");
  GD_CUDA(cudaStreamSynchronize(s.get()));
  // Gemm::run_fused only where run() takes the stream GEMV: with kAuto's bounds at 4 rows, 8 rows
  // run cuBLAS.
  std::unique_ptr<Gemm> made;
  {
    const ScopedEnv bounds("GRAPHDECODE_GEMV_AUTO", "4,3072");
    made = std::make_unique<Gemm>();
  }
  const Gemm& gemm = *made;
  DeviceBuffer<std::uint16_t> x8(8 * k), y8(8 * n);
  EXPECT_FALSE(gemm.fuses_norm({x8.data(), w.data(), y8.data(), 8, k, n, GemmOut::kBF16}));
  EXPECT_EQ(
      field_of([&] {
        gemm.run_fused({x8.data(), w.data(), y8.data(), 8, k, n, GemmOut::kBF16}, epi, s.get());
      }),
      "rows");
  // Elsewhere it is what run() takes: the stream GEMV, unless every GEMM runs the plain kernel of
  // racecheck runs (GRAPHDECODE_PLAIN_GEMM=1).
  EXPECT_EQ(gemm.fuses_norm({x.data(), w.data(), y.data(), rows, k, n, GemmOut::kBF16}),
            !gemm.plain());
  EXPECT_FALSE(gemm.fuses_norm({x.data(), w.data(), yf.data(), rows, k, n, GemmOut::kF32}));
}

TEST_F(StreamGemvFusionGpu, AutoBoundsFromTheEnvironment) {
  for (const char* other : {"GRAPHDECODE_GEMV", "GRAPHDECODE_SKINNY", "GRAPHDECODE_GEMV_AUTO"})
    if (std::getenv(other) != nullptr) GTEST_SKIP() << other << " is set: not the default policy";
  constexpr std::int32_t k = 2048, n = 2048, wide = 8192, long_in = 10240;
  DeviceBuffer<std::uint16_t> x(8 * long_in), w(static_cast<std::size_t>(wide) * k), y(8 * wide);
  const GemmArgs rows4{x.data(), w.data(), y.data(), 4, k, n, GemmOut::kBF16};
  const GemmArgs rows8{x.data(), w.data(), y.data(), 8, k, n, GemmOut::kBF16};
  const GemmArgs out6144{x.data(), w.data(), y.data(), 4, k, 6144, GemmOut::kBF16};
  const GemmArgs out8192{x.data(), w.data(), y.data(), 4, k, wide, GemmOut::kBF16};
  // A long k (past kStreamGemvLongInAuto's 8192).
  const auto long_k = [&](std::int32_t rows) {
    return GemmArgs{x.data(), w.data(), y.data(), rows, long_in, 1024, GemmOut::kBF16};
  };
  {
    const Gemm gemm;
    EXPECT_TRUE(gemm.uses_stream_gemv(rows4));
    EXPECT_TRUE(gemm.uses_stream_gemv(rows8));
    EXPECT_TRUE(gemm.uses_stream_gemv(out6144));
    EXPECT_FALSE(gemm.uses_stream_gemv(out8192));
    EXPECT_TRUE(gemm.uses_stream_gemv(long_k(2)));
    EXPECT_FALSE(gemm.uses_stream_gemv(long_k(3)));
  }
  {
    const ScopedEnv bounds("GRAPHDECODE_GEMV_AUTO", "8,8192");
    const Gemm gemm;
    EXPECT_TRUE(gemm.uses_stream_gemv(rows8));
    EXPECT_TRUE(gemm.uses_stream_gemv(out8192));
    EXPECT_TRUE(gemm.uses_stream_gemv(long_k(2)));
    EXPECT_FALSE(gemm.uses_stream_gemv(long_k(3)));
  }
  {
    const ScopedEnv bounds("GRAPHDECODE_GEMV_AUTO", "8,6144,4");
    const Gemm gemm;
    EXPECT_TRUE(gemm.uses_stream_gemv(long_k(4)));
    EXPECT_FALSE(gemm.uses_stream_gemv(long_k(5)));
  }
  {
    const ScopedEnv bounds("GRAPHDECODE_GEMV_AUTO", "2,3072");
    const Gemm gemm;
    EXPECT_FALSE(gemm.uses_stream_gemv(rows4));
    EXPECT_FALSE(gemm.uses_stream_gemv(out6144));
  }
  for (const char* bad : {"9,3072", "0,3072", "4", "4,", "4,3072x", "a,b", "4,0", "", "4,3072,",
                          "4,3072,5", "4,3072,-1", "4,3072,2x"}) {
    const ScopedEnv bounds("GRAPHDECODE_GEMV_AUTO", bad);
    EXPECT_EQ(field_of([] { const Gemm gemm; }), "GRAPHDECODE_GEMV_AUTO") << "'" << bad << "'";
  }
}

}  // namespace
}  // namespace graphdecode
