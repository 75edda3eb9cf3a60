// GPU: the warpgroup GEMM (rows 1-128, engine/kernels/wgmma_gemm.h) against a float64 reference and
// cuBLAS, at k splits of 1-8 over the cluster, one and two 64-row blocks, partial column tiles;
// a row's output independent of the other rows (bitwise); graph replay bitwise equal to eager;
// the SwiGLU epilogue bitwise equal to the GEMM and the swiglu kernel; bad arguments; where Gemm
// takes it by default (rows 9-64, k up to 8192), a model's bound for wide outputs, and
// GRAPHDECODE_WGMMA_AUTO's bounds (max_in, min_out; they leave a model's rule out); the norm
// fusions (the residual epilogue and the row scale) against their definitions. Fresh random
// data per run (GRAPHDECODE_SEED reproduces). Outputs are poisoned (NaN) with a guard past the end
// (gemm_check.h): every element written, nothing past it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "common/buffers.h"
#include "common/stream.h"
#include "engine/gemm.h"
#include "engine/kernels/model_kernels.h"
#include "engine/kernels/wgmma_gemm.h"
#include "gemm_check.h"
#include "gemm_test_data.h"
#include "graphs/cuda_graph.h"
#include "support/device_vectors.h"
#include "support/field_of.h"
#include "support/gpu_test.h"
#include "support/scoped_env.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;
using Bits = std::vector<std::uint16_t>;

class WgmmaGemmGpu : public GpuTest {};

SkinnyGemmArgs wgmma_args(const GemmArgs& a) {
  return {a.x, a.w, a.y, a.rows, a.in, a.out, a.out_type == GemmOut::kF32};
}
::testing::AssertionResult run_wgmma(const SkinnyGemmDevice& dev, const GemmArgs& args,
                                     cudaStream_t s, std::vector<double>& got) {
  return run_into(args, s, got, [&](const GemmArgs& a) { wgmma_gemm(dev, wgmma_args(a), s); });
}

TEST_F(WgmmaGemmGpu, MatchesFloat64AndCublas) {
  if (!wgmma_gemm_available()) GTEST_SKIP() << "no sm_90a device code for this GPU";
  SCOPED_TRACE(seed_note());
  std::printf("%s\n", seed_note().c_str());
  Rng rng = test_rng();
  Stream s;
  Gemm gemm;
  gemm.set_gemv_mode(Gemm::GemvMode::kOff);
  gemm.set_skinny(false);
  gemm.set_wgmma(false);  // cuBLAS
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  // {k, n}: splits 1 (k 256), 2 (512 x 1000: a partial last column tile), 8 (8192 x 264, 2048 x
  // 3072: the 1B qkv).
  std::vector<std::pair<int, int>> shapes{{256, 136}, {512, 1000}, {8192, 264}};
  if (!sanitize_mode()) shapes.push_back({2048, 3072});
  for (const auto& [k, n] : shapes) {
    SCOPED_TRACE("splits " + std::to_string(wgmma_gemm_splits(k, n)));
    for (bool exact : {false, true}) {
      const Bits w = random_bits(rng, static_cast<std::size_t>(n) * k, exact);
      auto dw = to_device(w, s);
      for (int rows : {1, 9, 33, 64, 65, 100, 128}) {
        if (k * n > 2048 * 1024 && rows > 64 && sanitize_mode()) continue;
        const Problem p = make_problem(rng, rows, k, n, exact, &w);
        auto dx = to_device(p.x, s);
        for (GemmOut out : {GemmOut::kBF16, GemmOut::kF32}) {
          SCOPED_TRACE(case_name(rows, k, n, exact, out));
          const GemmArgs args{dx.data(), dw.data(), nullptr, rows, k, n, out};
          std::vector<double> got, cublas;
          ASSERT_TRUE(run_wgmma(dev, args, s, got));
          ASSERT_TRUE(run_into(args, s, cublas, [&](const GemmArgs& a) { gemm.run(a, s); }));
          EXPECT_TRUE(matches(p, got, nullptr, out)) << "warpgroup GEMM";
          EXPECT_TRUE(matches(p, got, &cublas, out)) << "warpgroup GEMM vs cuBLAS";
        }
      }
    }
  }
}

// A row's output depends on that row alone: the first rows of a 1..128-row call equal, bit for
// bit, the same rows computed in a call of fewer rows (one 64-row block or two; a decode batch's
// rows against a larger bucket's). And a captured launch replays the eager bits.
TEST_F(WgmmaGemmGpu, RowsAreIndependentAndGraphEqualsEagerBitwise) {
  if (!wgmma_gemm_available()) GTEST_SKIP() << "no sm_90a device code for this GPU";
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  const int k = 4096, n = 1024;
  const Bits w = random_bits(rng, static_cast<std::size_t>(n) * k, false);
  const Bits x = random_bits(rng, static_cast<std::size_t>(128) * k, false);
  auto dw = to_device(w, s), dx = to_device(x, s);
  std::vector<double> all;
  ASSERT_TRUE(run_wgmma(dev, {dx.data(), dw.data(), nullptr, 128, k, n, GemmOut::kBF16}, s, all));
  for (int rows : {1, 17, 64, 100}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    std::vector<double> few;
    ASSERT_TRUE(
        run_wgmma(dev, {dx.data(), dw.data(), nullptr, rows, k, n, GemmOut::kBF16}, s, few));
    for (std::size_t i = 0; i < few.size(); ++i)
      ASSERT_EQ(few[i], all[i]) << "row " << i / n << " col " << i % n;
  }
  // Graph: captured once, replayed on fresh x; each replay equals an eager run.
  DeviceBuffer<std::uint16_t> y_graph(static_cast<std::size_t>(100) * n),
      y_eager(static_cast<std::size_t>(100) * n);
  const SkinnyGemmArgs ga{dx.data(), dw.data(), y_graph.data(), 100, k, n, false};
  CudaGraph g = CudaGraph::capture(s, [&] { wgmma_gemm(dev, ga, s); });
  for (int rep = 0; rep < 2; ++rep) {
    const Bits xr = random_bits(rng, x.size(), false);
    dx.upload(xr.data(), xr.size(), s);
    g.launch(s);
    wgmma_gemm(dev, {dx.data(), dw.data(), y_eager.data(), 100, k, n, false}, s);
    ASSERT_EQ(to_host(y_graph, s), to_host(y_eager, s)) << "replay " << rep;
  }
}

// The SwiGLU epilogue (WgmmaEpilogue::kSwiGlu): act equals, bit for bit, this GEMM's bf16 gate_up
// followed by the swiglu kernel (the model's unfused path), at splits 1-8 and one or two row
// blocks, every element written; and it is within bounds of silu(g) u from float64 sums.
TEST_F(WgmmaGemmGpu, SwiGluEpilogueEqualsGemmThenSwigluBitwise) {
  if (!wgmma_gemm_available()) GTEST_SKIP() << "no sm_90a device code for this GPU";
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  std::vector<std::pair<int, int>> shapes{{256, 64}, {512, 192}};  // {k, inter}
  if (!sanitize_mode()) shapes.push_back({8192, 1024});
  DeviceBuffer<std::int32_t> num_rows(1);
  for (const auto& [k, inter] : shapes) {
    const int n = 2 * inter;
    SCOPED_TRACE("k " + std::to_string(k) + " inter " + std::to_string(inter) + " splits " +
                 std::to_string(wgmma_gemm_splits(k, n)));
    const Bits w = random_bits(rng, static_cast<std::size_t>(n) * k, false);
    auto dw = to_device(w, s);
    for (int rows : {1, 9, 64, 65, 128}) {
      SCOPED_TRACE("rows " + std::to_string(rows));
      const Problem p = make_problem(rng, rows, k, n, false, &w);
      auto dx = to_device(p.x, s);
      const std::vector<std::int32_t> live{rows};
      num_rows.upload(live.data(), 1, s);
      DeviceBuffer<std::uint16_t> gate_up(static_cast<std::size_t>(rows) * n);
      const GemmArgs act_args{dx.data(), dw.data(), nullptr, rows, k, inter, GemmOut::kBF16};
      std::vector<double> fused, unfused;
      ASSERT_TRUE(run_into(act_args, s, fused, [&](const GemmArgs& a) {
        wgmma_gemm(dev, {a.x, a.w, a.y, rows, k, n, false}, s, WgmmaEpilogue::kSwiGlu);
      }));
      ASSERT_TRUE(run_into(act_args, s, unfused, [&](const GemmArgs& a) {
        wgmma_gemm(dev, {a.x, a.w, gate_up.data(), rows, k, n, false}, s);
        SwiGluArgs sw;
        sw.gate_up = gate_up.data();
        sw.out = static_cast<std::uint16_t*>(a.y);
        sw.num_rows = num_rows.data();
        sw.max_rows = rows;
        sw.inter = inter;
        swiglu(sw, s);
      }));
      for (std::size_t i = 0; i < fused.size(); ++i)
        ASSERT_EQ(fused[i], unfused[i]) << "row " << i / inter << " col " << i % inter;
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < inter; ++j) {
          const std::size_t gi = static_cast<std::size_t>(r) * n + j, ui = gi + inter;
          const double g = p.ref[gi], u = p.ref[ui];
          const double tg = bound(p, gi, GemmOut::kBF16), tu = bound(p, ui, GemmOut::kBF16);
          const double silu = g / (1.0 + std::exp(-g)), want = silu * u;
          // silu' is within [-0.1, 1.1]; silu(g) is rounded to bf16 and so is the product.
          const double tol = 2.0 * (1.1 * tg * std::abs(u) + (std::abs(silu) + 1.1 * tg) * tu) +
                             std::ldexp(std::abs(silu * u), -7) + 1e-30;
          const double got = fused[static_cast<std::size_t>(r) * inter + j];
          ASSERT_LE(std::abs(got - want), tol) << "row " << r << " col " << j << " want " << want;
        }
    }
  }
}

// WgmmaNormFusion (wgmma_gemm.h). The residual epilogue: residual and weighted equal, bit for
// bit, the fp32 add and product of this GEMM's own bf16 output rounded as the contract says, the
// squares within fp32 of float64, a guard row past `rows` untouched, every element written. The
// row scale: bf16 of this GEMM's own fp32 sums times an inverse RMS from the parts (1 ulp of bf16
// at most, rsqrtf against 1 / sqrt), for kStore and kSwiGlu (silu(g) u from the scaled, rounded
// g and u). Splits 1-8, rows 1-64; the 1B o and down shapes (the down's k: residual epilogue only).
TEST_F(WgmmaGemmGpu, NormFusionsMatchTheirDefinitions) {
  if (!wgmma_gemm_available()) GTEST_SKIP() << "no sm_90a device code for this GPU";
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  const auto f32 = reference::bf16_to_float;
  std::vector<std::pair<int, int>> shapes{{256, 256}, {512, 384}};  // {k, n}
  if (!sanitize_mode()) {
    shapes.push_back({2048, 2048});  // the 1B o projection (splits 8)
    shapes.push_back({8192, 2048});  // the 1B down projection
  }
  for (const auto& [k, n] : shapes) {
    SCOPED_TRACE("k " + std::to_string(k) + " n " + std::to_string(n) + " splits " +
                 std::to_string(wgmma_gemm_splits(k, n)));
    const Bits w = random_bits(rng, static_cast<std::size_t>(n) * k, false);
    const Bits g = random_bits(rng, static_cast<std::size_t>(n), false);
    auto dw = to_device(w, s), dg = to_device(g, s);
    for (int rows : {1, 9, 33, 64}) {
      SCOPED_TRACE("rows " + std::to_string(rows));
      const std::size_t cells = static_cast<std::size_t>(rows) * n;
      const Bits x = random_bits(rng, static_cast<std::size_t>(rows) * k, false);
      Bits res = random_bits(rng, cells + n, false);  // + a guard row
      auto dx = to_device(x, s);
      // The GEMM's own bf16 output: what the epilogue adds.
      DeviceBuffer<std::uint16_t> dy(cells);
      wgmma_gemm(dev, {dx.data(), dw.data(), dy.data(), rows, k, n, false}, s);
      const Bits y = to_host(dy, s);
      auto dres = to_device(res, s);
      DeviceBuffer<std::uint16_t> weighted(cells + n);
      DeviceBuffer<float> sq(static_cast<std::size_t>(n / 128) * rows + 64);
      weighted.fill_bytes(0xff, s);
      sq.fill_bytes(0xff, s);
      WgmmaNormFusion f;
      f.residual = dres.data();
      f.norm_weight = dg.data();
      f.weighted = weighted.data();
      f.sum_sq_out = sq.data();
      wgmma_gemm(dev, {dx.data(), dw.data(), dy.data(), rows, k, n, false}, s,
                 WgmmaEpilogue::kStore, f);
      const Bits res_got = to_host(dres, s), weighted_got = to_host(weighted, s);
      const std::vector<float> sq_got = to_host(sq, s);
      for (std::size_t i = 0; i < cells; ++i) {
        const std::uint16_t want = reference::float_to_bf16(f32(res[i]) + f32(y[i]));
        ASSERT_EQ(res_got[i], want) << "residual row " << i / n << " col " << i % n;
        ASSERT_EQ(weighted_got[i], reference::float_to_bf16(f32(want) * f32(g[i % n])))
            << "weighted row " << i / n << " col " << i % n;
      }
      for (std::size_t i = cells; i < cells + n; ++i) {
        ASSERT_EQ(res_got[i], res[i]) << "residual guard " << i - cells;
        ASSERT_EQ(weighted_got[i], 0xffff) << "weighted guard " << i - cells;
      }
      for (int t = 0; t < n / 128; ++t)
        for (int r = 0; r < rows; ++r) {
          double want = 0;
          for (int c = t * 128; c < (t + 1) * 128; ++c) {
            const double v = f32(res_got[static_cast<std::size_t>(r) * n + c]);
            want += v * v;
          }
          const float got = sq_got[static_cast<std::size_t>(t) * rows + r];
          ASSERT_LE(std::abs(got - want), 1e-5 * want + 1e-30)
              << "squares tile " << t << " row " << r;
        }
      for (std::size_t i = static_cast<std::size_t>(n / 128) * rows; i < sq_got.size(); ++i)
        ASSERT_TRUE(std::isnan(sq_got[i])) << "squares guard " << i;

      // The row scale over x (here any bf16 rows), parts of k / 128 squares each.
      if (k > kWgmmaRowScaleMaxK) continue;  // the down projection's k: residual epilogue only
      const int parts = k / 128;
      std::vector<float> parts_sq(static_cast<std::size_t>(parts) * rows);
      std::uniform_real_distribution<float> mag(0.2f, 2.f);
      for (float& v : parts_sq) v = mag(rng) * 128.f / 3.f;
      auto dsq = to_device(parts_sq, s);
      std::vector<double> inv(rows);
      for (int r = 0; r < rows; ++r) {
        float ss = 0.f;
        for (int q = 0; q < parts; ++q) ss += parts_sq[static_cast<std::size_t>(q) * rows + r];
        inv[r] = 1.0 / std::sqrt(static_cast<double>(ss / static_cast<float>(k) + 1e-5f));
      }
      WgmmaNormFusion rs;
      rs.sum_sq_in = dsq.data();
      rs.parts = parts;
      rs.eps = 1e-5f;
      std::vector<double> sums, scaled;
      const GemmArgs plain_args{dx.data(), dw.data(), nullptr, rows, k, n, GemmOut::kF32};
      ASSERT_TRUE(run_wgmma(dev, plain_args, s, sums));
      ASSERT_TRUE(run_into({dx.data(), dw.data(), nullptr, rows, k, n, GemmOut::kBF16}, s, scaled,
                           [&](const GemmArgs& a) {
                             wgmma_gemm(dev, wgmma_args(a), s, WgmmaEpilogue::kStore, rs);
                           }));
      for (std::size_t i = 0; i < cells; ++i) {
        const double want = sums[i] * inv[i / n];
        ASSERT_LE(std::abs(scaled[i] - want), std::ldexp(std::abs(want), -7) + 1e-30)
            << "scaled row " << i / n << " col " << i % n << " want " << want;
      }
      // kSwiGlu: W = [gate; up] over n / 2 each.
      const int inter = n / 2;
      std::vector<double> act;
      ASSERT_TRUE(run_into(
          {dx.data(), dw.data(), nullptr, rows, k, inter, GemmOut::kBF16}, s, act,
          [&](const GemmArgs& a) {
            wgmma_gemm(dev, {a.x, a.w, a.y, rows, k, n, false}, s, WgmmaEpilogue::kSwiGlu, rs);
          }));
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < inter; ++j) {
          const std::size_t at = static_cast<std::size_t>(r) * n + j;
          const double gs = sums[at] * inv[r], us = sums[at + inter] * inv[r];
          const double gr = reference::bf16_to_float(reference::float_to_bf16(float(gs)));
          const double ur = reference::bf16_to_float(reference::float_to_bf16(float(us)));
          const double want = gr / (1.0 + std::exp(-gr)) * ur;
          // g and u may round 1 bf16 ulp apart from gr and ur (rsqrtf); silu' <= 1.1.
          const double tol = std::ldexp(1.1 * std::abs(gs) * std::abs(ur) + std::abs(want), -6) +
                             std::ldexp(std::abs(gr) * 1.1 * std::abs(us), -7) + 1e-30;
          ASSERT_LE(std::abs(act[static_cast<std::size_t>(r) * inter + j] - want), tol)
              << "act row " << r << " col " << j << " want " << want;
        }
    }
  }
}

TEST_F(WgmmaGemmGpu, BadArgumentsNameTheField) {
  if (!wgmma_gemm_available()) GTEST_SKIP() << "no sm_90a device code for this GPU";
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  DeviceBuffer<std::uint16_t> buf(1 << 16);
  std::uint16_t* p = buf.data();
  const auto field = [&](SkinnyGemmArgs a) { return field_of([&] { wgmma_gemm(dev, a, s); }); };
  EXPECT_EQ(field({p, p, p, 0, 64, 8, false}), "rows");
  EXPECT_EQ(field({p, p, p, 129, 64, 8, false}), "rows");
  EXPECT_EQ(field({p, p, p, 4, 72, 8, false}), "k");
  EXPECT_EQ(field({p, p, p, 4, 64, 12, false}), "n");
  const auto swiglu_field = [&](SkinnyGemmArgs a) {
    return field_of([&] { wgmma_gemm(dev, a, s, WgmmaEpilogue::kSwiGlu); });
  };
  EXPECT_EQ(swiglu_field({p, p, p, 4, 64, 192, false}), "n");  // inter 96: not a multiple of 64
  EXPECT_EQ(swiglu_field({p, p, p, 4, 64, 256, true}), "out_f32");
  EXPECT_EQ(field({p + 1, p, p, 4, 64, 8, false}), "x");
  EXPECT_EQ(field({p, nullptr, p, 4, 64, 8, false}), "w");
  EXPECT_EQ(field({p, p, nullptr, 4, 64, 8, false}), "y");
  DeviceBuffer<float> sq(1024);
  WgmmaNormFusion res;  // the residual epilogue
  res.residual = p;
  res.norm_weight = p;
  res.weighted = p;
  res.sum_sq_out = sq.data();
  WgmmaNormFusion scale;  // the row scale
  scale.sum_sq_in = sq.data();
  scale.parts = 2;
  const auto fused_field = [&](SkinnyGemmArgs a, const WgmmaNormFusion& f,
                               WgmmaEpilogue e = WgmmaEpilogue::kStore) {
    return field_of([&] { wgmma_gemm(dev, a, s, e, f); });
  };
  EXPECT_EQ(fused_field({p, p, p, 65, 256, 128, false}, res), "rows");
  EXPECT_EQ(fused_field({p, p, p, 4, 256, 136, false}, res), "n");
  EXPECT_EQ(fused_field({p, p, p, 4, 256, 128, true}, res), "epilogue");
  EXPECT_EQ(fused_field({p, p, p, 4, 256, 256, false}, res, WgmmaEpilogue::kSwiGlu), "epilogue");
  res.weighted = nullptr;
  EXPECT_EQ(fused_field({p, p, p, 4, 256, 128, false}, res), "fusion");
  EXPECT_EQ(fused_field({p, p, p, 65, 256, 128, false}, scale), "rows");
  EXPECT_EQ(fused_field({p, p, p, 4, 384, 128, false}, scale), "parts");  // k / 128 = 3
  EXPECT_EQ(fused_field({p, p, p, 4, 8192, 128, false}, scale), "k");
  scale.eps = 0.f;
  EXPECT_EQ(fused_field({p, p, p, 4, 256, 128, false}, scale), "eps");
  EXPECT_FALSE(wgmma_gemm_supported(4, 72, 8));
  EXPECT_FALSE(wgmma_gemm_supported(129, 64, 8));
  EXPECT_TRUE(wgmma_gemm_supported(128, 64, 8));
}

TEST_F(WgmmaGemmGpu, GemmTakesItWhereItWasMeasuredAhead) {
  if (!wgmma_gemm_available()) GTEST_SKIP() << "no sm_90a device code for this GPU";
  for (const char* other : {"GRAPHDECODE_WGMMA_GEMM", "GRAPHDECODE_WGMMA_AUTO",
                            "GRAPHDECODE_PLAIN_GEMM", "GRAPHDECODE_GEMV", "GRAPHDECODE_SKINNY"})
    if (std::getenv(other) != nullptr) GTEST_SKIP() << other << " is set: not the default policy";
  DeviceBuffer<std::uint16_t> buf(1024);  // the rule reads pointers' alignment, not the data
  std::uint16_t* p = buf.data();
  const auto args = [&](std::int32_t rows, std::int32_t in, std::int32_t out) {
    return GemmArgs{p, p, p, rows, in, out, GemmOut::kBF16};
  };
  {
    const Gemm gemm;
    EXPECT_FALSE(gemm.wgmma_routing_from_env()) << "a model's rule applies";
    for (std::int32_t rows : {9, 33, 64}) {
      EXPECT_TRUE(gemm.uses_wgmma(args(rows, 2048, 3072))) << "1B qkv, rows " << rows;
      EXPECT_TRUE(gemm.uses_wgmma(args(rows, 8192, 2048))) << "1B down, rows " << rows;
      EXPECT_TRUE(gemm.uses_wgmma(args(rows, 4096, 28672))) << "8B gate_up, rows " << rows;
      EXPECT_FALSE(gemm.uses_wgmma(args(rows, 14336, 4096))) << "8B down: cuBLAS, rows " << rows;
      EXPECT_FALSE(gemm.uses_wgmma(args(rows, 8256, 2048))) << "k past 8192, rows " << rows;
    }
    EXPECT_FALSE(gemm.uses_wgmma(args(8, 2048, 3072))) << "8 rows: the stream GEMV";
    EXPECT_FALSE(gemm.uses_wgmma(args(65, 2048, 3072))) << "65 rows: cuBLAS";
  }
  {
    Gemm gemm;  // LlamaModel's rule on the 8B: 33 rows, the gate_up and lm_head from 32
    gemm.set_wgmma_min_rows(33, 32, 2 * 14336);
    EXPECT_TRUE(gemm.uses_wgmma(args(32, 4096, 28672))) << "8B gate_up at 32 rows";
    EXPECT_TRUE(gemm.uses_wgmma(args(32, 4096, 128256))) << "8B lm_head at 32 rows";
    EXPECT_FALSE(gemm.uses_wgmma(args(32, 4096, 6144))) << "8B qkv at 32 rows: cuBLAS";
    EXPECT_FALSE(gemm.uses_wgmma(args(31, 4096, 28672))) << "8B gate_up at 31 rows: cuBLAS";
    EXPECT_FALSE(gemm.uses_wgmma(args(16, 4096, 28672))) << "8B gate_up at 16 rows: cuBLAS";
    EXPECT_TRUE(gemm.uses_wgmma(args(33, 4096, 6144))) << "8B qkv at 33 rows";
    EXPECT_FALSE(gemm.uses_wgmma(args(64, 14336, 4096))) << "8B down: cuBLAS";
    gemm.set_wgmma_min_rows(33);
    EXPECT_FALSE(gemm.uses_wgmma(args(32, 4096, 28672))) << "wide outputs left out: 33 rows";
  }
  {
    const ScopedEnv bounds("GRAPHDECODE_WGMMA_AUTO", "9,128,4096,16384");
    const Gemm gemm;
    EXPECT_TRUE(gemm.uses_wgmma(args(128, 14336, 4096)));
    EXPECT_FALSE(gemm.uses_wgmma(args(64, 16448, 4096))) << "k past max_in";
    EXPECT_FALSE(gemm.uses_wgmma(args(64, 4096, 4104))) << "out past max_out";
  }
  {
    const ScopedEnv bounds("GRAPHDECODE_WGMMA_AUTO", "33,128,200000,8192,6145");
    const Gemm gemm;
    EXPECT_TRUE(gemm.uses_wgmma(args(128, 4096, 28672))) << "8B gate_up at 128 rows";
    EXPECT_FALSE(gemm.uses_wgmma(args(64, 4096, 6144))) << "8B qkv: out under min_out";
    EXPECT_FALSE(gemm.uses_wgmma(args(32, 4096, 28672))) << "rows under min_rows";
  }
  {
    const ScopedEnv bounds("GRAPHDECODE_WGMMA_AUTO", "9,64,65536");
    const Gemm gemm;
    EXPECT_TRUE(gemm.wgmma_routing_from_env()) << "a sweep's bounds hold, a model's rule left out";
    EXPECT_FALSE(gemm.uses_wgmma(args(64, 14336, 4096))) << "max_in left out: the default";
  }
  {
    const ScopedEnv on("GRAPHDECODE_WGMMA_GEMM", "on");
    EXPECT_TRUE(Gemm().wgmma_routing_from_env()) << "GRAPHDECODE_WGMMA_GEMM=on";
  }
  for (const char* bad :
       {"9,64", "0,64,100", "9,129,100", "9,64,0", "9,64,100,", "9,64,100,0", "9,64,100,-5",
        "9,64,100,8x", "9,64,100,8,0", "9,64,100,8,101", "9,64,100,8,1,1", "9,64,100,8,", ""}) {
    const ScopedEnv bounds("GRAPHDECODE_WGMMA_AUTO", bad);
    EXPECT_EQ(field_of([] { const Gemm gemm; }), "GRAPHDECODE_WGMMA_AUTO") << "'" << bad << "'";
  }
}

}  // namespace
}  // namespace graphdecode
