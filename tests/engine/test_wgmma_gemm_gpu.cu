// GPU: the warpgroup GEMM (rows 1-128, engine/kernels/wgmma_gemm.h) against a float64 reference and
// cuBLAS, at k splits of 1-8 over the cluster, one and two 64-row blocks, partial column tiles;
// a row's output independent of the other rows (bitwise); graph replay bitwise equal to eager;
// the SwiGLU epilogue bitwise equal to the GEMM and the swiglu kernel; bad arguments; where Gemm
// takes it by default (rows 9-64, k up to 8192), a model's bound for wide outputs, and
// GRAPHDECODE_WGMMA_AUTO's bounds (max_in, min_out; they leave a model's rule out). Fresh random
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
