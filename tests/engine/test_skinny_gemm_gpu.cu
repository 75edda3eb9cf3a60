// GPU: the skinny GEMM (rows <= 8, engine/kernels/skinny_gemm.h) through Gemm::run against a
// float64 reference and against the cuBLAS path of the same Gemm (set_skinny(false)); the
// fallbacks to cuBLAS; graph replay bitwise equal to eager; bad arguments.
//
// Fresh random data per run (the seed is printed; GRAPHDECODE_SEED reproduces). Outputs are
// poisoned (NaN) with a guard past the end: every element must be written, nothing past it.
//
// Tolerances: gemm_check.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attention/reference.h"
#include "attention_check.h"
#include "common/buffers.h"
#include "common/stream.h"
#include "engine/gemm.h"
#include "engine/kernels/skinny_gemm.h"
#include "engine/kernels/stream_gemv.h"
#include "gemm_check.h"
#include "gemm_test_data.h"
#include "graphs/cuda_graph.h"
#include "support/device_vectors.h"
#include "support/field_of.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;
using reference::bf16_to_float;
using reference::float_to_bf16;
using Bits = std::vector<std::uint16_t>;

class SkinnyGemmGpu : public GpuTest {};

::testing::AssertionResult run_gemm(const Gemm& gemm, const GemmArgs& args, cudaStream_t s,
                                    std::vector<double>& got) {
  return run_into(args, s, got, [&](const GemmArgs& a) { gemm.run(a, s); });
}

// The stream GEMV (engine/kernels/stream_gemv.h) on the same arguments.
SkinnyGemmArgs skinny_args(const GemmArgs& a) {
  return {a.x, a.w, a.y, a.rows, a.in, a.out, a.out_type == GemmOut::kF32};
}
::testing::AssertionResult run_stream(const SkinnyGemmDevice& dev, const GemmArgs& args,
                                      cudaStream_t s, std::vector<double>& got) {
  return run_into(args, s, got, [&](const GemmArgs& a) { stream_gemv(dev, skinny_args(a), s); });
}

TEST_F(SkinnyGemmGpu, MatchesFloat64AndCublas) {
  SCOPED_TRACE(seed_note());
  std::printf("%s\n", seed_note().c_str());
  Rng rng = test_rng();
  Stream s;
  Gemm gemm;
  std::vector<std::pair<int, int>> shapes{{64, 8}, {2048, 1000}, {1000, 1001}};  // {k, n}
  if (!sanitize_mode()) shapes.insert(shapes.begin(), {{2048, 3072}, {8192, 2048}});
  for (const auto& [k, n] : shapes)
    for (bool exact : {false, true}) {
      const Bits w = random_bits(rng, static_cast<std::size_t>(n) * k, exact);
      auto dw = to_device(w, s);
      for (int rows : {1, 2, 3, 5, 8}) {
        const Problem p = make_problem(rng, rows, k, n, exact, &w);
        auto dx = to_device(p.x, s);
        for (GemmOut out : {GemmOut::kBF16, GemmOut::kF32}) {
          SCOPED_TRACE(case_name(rows, k, n, exact, out));
          const GemmArgs args{dx.data(), dw.data(), nullptr, rows, k, n, out};
          std::vector<double> skinny, cublas;
          gemm.set_skinny(true);
          ASSERT_TRUE(gemm.uses_skinny(args));
          ASSERT_TRUE(run_gemm(gemm, args, s, skinny));
          gemm.set_skinny(false);
          ASSERT_FALSE(gemm.uses_skinny(args));
          ASSERT_TRUE(run_gemm(gemm, args, s, cublas));
          EXPECT_TRUE(matches(p, skinny, nullptr, out)) << "skinny";
          EXPECT_TRUE(matches(p, cublas, nullptr, out)) << "cuBLAS";
          EXPECT_TRUE(matches(p, skinny, &cublas, out)) << "skinny vs cuBLAS";
        }
      }
    }
}

// GRAPHDECODE_PLAIN_GEMM=1 (racecheck runs, engine/kernels/plain_gemm.h): every GEMM of the Gemm
// runs the plain kernel, any shape, against the float64 reference (exact inputs: bit for bit).
TEST_F(SkinnyGemmGpu, PlainGemmFromTheEnvironmentMatchesFloat64) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  ASSERT_EQ(setenv("GRAPHDECODE_PLAIN_GEMM", "1", 1), 0);
  Gemm gemm;
  ASSERT_EQ(unsetenv("GRAPHDECODE_PLAIN_GEMM"), 0);
  ASSERT_TRUE(gemm.plain());
  EXPECT_FALSE(Gemm().plain());
  for (const auto& [k, n] : std::vector<std::pair<int, int>>{{37, 129}, {2048, 300}, {8, 1}})
    for (bool exact : {false, true})
      for (int rows : {1, 7, 70}) {
        const Problem p = make_problem(rng, rows, k, n, exact);
        auto dx = to_device(p.x, s);
        auto dw = to_device(p.w, s);
        for (GemmOut out : {GemmOut::kBF16, GemmOut::kF32}) {
          SCOPED_TRACE(case_name(rows, k, n, exact, out));
          std::vector<double> got;
          ASSERT_TRUE(run_gemm(gemm, {dx.data(), dw.data(), nullptr, rows, k, n, out}, s, got));
          EXPECT_TRUE(matches(p, got, nullptr, out));
        }
      }
}

// Shapes the skinny kernel does not take still run (through cuBLAS) and are right.
TEST_F(SkinnyGemmGpu, FallsBackToCublas) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  Gemm gemm;
  gemm.set_skinny(true);
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  struct Case {
    int rows, k, n, offset;  // offset: elements added to x (2 bytes breaks 16-byte alignment)
    bool skinny;
  };
  const Case cases[] = {{9, 2048, 256, 0, false},
                        {4, 100, 64, 0, false},
                        {8, 16384, 64, 0, false},  // 8 x 16384 bf16 = 256 KiB: no shared fit
                        {4, 16384, 64, 0, skinny_gemm_supported(dev, 4, 16384)},
                        {2, 2048, 64, 1, false}};
  for (const Case& c : cases) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " k " + std::to_string(c.k) + " offset " +
                 std::to_string(c.offset));
    const Problem p = make_problem(rng, c.rows, c.k, c.n, false);
    Bits xs(c.offset);
    xs.insert(xs.end(), p.x.begin(), p.x.end());
    auto dx = to_device(xs, s), dw = to_device(p.w, s);
    const GemmArgs args{dx.data() + c.offset, dw.data(), nullptr, c.rows, c.k, c.n, GemmOut::kF32};
    EXPECT_EQ(gemm.uses_skinny(args), c.skinny);
    std::vector<double> got;
    ASSERT_TRUE(run_gemm(gemm, args, s, got));
    EXPECT_TRUE(matches(p, got, nullptr, GemmOut::kF32));
  }
  EXPECT_FALSE(skinny_gemm_supported(dev, 8, 16384));
  EXPECT_FALSE(skinny_gemm_supported(dev, 0, 2048));
}

// Captured in a CUDA graph, the skinny GEMM replays bitwise equal to eager, replay after replay.
TEST_F(SkinnyGemmGpu, GraphReplayBitwiseEqualsEager) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  Gemm gemm;
  gemm.set_skinny(true);
  const Problem p = make_problem(rng, 5, 2048, 3072, false);
  auto dx = to_device(p.x, s), dw = to_device(p.w, s);
  DeviceBuffer<std::uint16_t> y16(p.ref.size());
  DeviceBuffer<float> y32(p.ref.size());
  const GemmArgs a16{dx.data(), dw.data(), y16.data(), p.rows, p.k, p.n, GemmOut::kBF16};
  const GemmArgs a32{dx.data(), dw.data(), y32.data(), p.rows, p.k, p.n, GemmOut::kF32};
  ASSERT_TRUE(gemm.uses_skinny(a16) && gemm.uses_skinny(a32));
  const auto snapshot = [&] {
    Bits h16(y16.size());
    std::vector<float> h32(y32.size());
    y16.download(h16.data(), h16.size(), s);
    y32.download(h32.data(), h32.size(), s);
    GD_CUDA(cudaStreamSynchronize(s));
    std::vector<std::uint8_t> bytes(h16.size() * 2 + h32.size() * 4);
    std::memcpy(bytes.data(), h16.data(), h16.size() * 2);
    std::memcpy(bytes.data() + h16.size() * 2, h32.data(), h32.size() * 4);
    return bytes;
  };
  gemm.run(a16, s);
  gemm.run(a32, s);
  const auto eager = snapshot();
  const CudaGraph graph = CudaGraph::capture(s, [&] {
    gemm.run(a16, s);
    gemm.run(a32, s);
  });
  for (int replay = 0; replay < 3; ++replay) {
    y16.fill_bytes(0xff, s);
    y32.fill_bytes(0xff, s);
    graph.launch(s);
    EXPECT_TRUE(snapshot() == eager) << "replay " << replay;
  }
}

// The stream GEMV against float64 (exact inputs: bit for bit) at the decode shapes and at edges:
// a partial last tile (n % 8 != 0), a partial last stage (k 1000 in one 1024-wide stage, k 5000
// in two 4096-wide ones at rows 1 and 3 and in three 2048-wide ones at rows 8, whose x leaves
// room for 2048), one short stage (k 64), x at its largest (rows 8 x k 8192: fewer ring stages),
// the 8B's qkv (4096-wide stages), lm_head's n; every element written. Stage widths by k are
// StreamGemvStageWidthFollowsK's; GRAPHDECODE_GEMV_CHUNK=2048 or 4096 runs every k wider.
TEST_F(SkinnyGemmGpu, StreamGemvMatchesFloat64) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  std::vector<std::pair<int, int>> shapes{
      {64, 8}, {1000, 1001}, {2048, 1000}, {5000, 72}};  // {k, n}
  if (!sanitize_mode())
    shapes.insert(shapes.end(), {{2048, 3072}, {8192, 2048}, {4096, 6144}, {2048, 128256}});
  for (const auto& [k, n] : shapes)
    for (bool exact : {false, true}) {
      if (n > 100000 && exact) continue;  // lm_head: the float64 reference once is enough
      const Bits w = random_bits(rng, static_cast<std::size_t>(n) * k, exact);
      auto dw = to_device(w, s);
      for (int rows : {1, 3, 8}) {
        if (n > 100000 && rows == 3) continue;
        const Problem p = make_problem(rng, rows, k, n, exact, &w);
        auto dx = to_device(p.x, s);
        for (GemmOut out : {GemmOut::kBF16, GemmOut::kF32}) {
          SCOPED_TRACE(case_name(rows, k, n, exact, out));
          ASSERT_TRUE(stream_gemv_supported(dev, rows, k));
          std::vector<double> got;
          ASSERT_TRUE(run_stream(dev, {dx.data(), dw.data(), nullptr, rows, k, n, out}, s, got));
          EXPECT_TRUE(matches(p, got, nullptr, out));
        }
      }
    }
}

// The stream GEMV's default x staging from 4 rows is the multicast over CTA pairs, which falls back
// to plain loads where the pairs of a full grid are not all resident. On the H200 it was measured
// on (132 SMs, one CTA an SM) they are: this test says whether the default runs that path here.
TEST_F(SkinnyGemmGpu, StreamGemvMulticastPairsOfAFullGridAreResident) {
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  EXPECT_GE(dev.x_pairs, dev.sm_count / 2) << "sm_count " << dev.sm_count;
  EXPECT_EQ(stream_gemv_resident_pairs(dev), dev.x_pairs);
}

// The ring's stage width by k, as measured in decode steps (stream_gemv.cu kChunkKs): 4096 for k in
// [4096, 8192) (the 8B's qkv and o), narrower where x leaves room for fewer than three such
// stages; 1024 for the 1B's k 2048 and 8192, the 8B down's 14336 and a k under a stage.
TEST_F(SkinnyGemmGpu, StreamGemvStageWidthFollowsK) {
  if (std::getenv("GRAPHDECODE_GEMV_CHUNK") != nullptr)
    GTEST_SKIP() << "SKIPPED: GRAPHDECODE_GEMV_CHUNK sets one width for every k";
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  ASSERT_EQ(dev.max_smem, 232448) << "the widths below are the H100's and H200's 227 KiB";
  EXPECT_EQ(stream_gemv_chunk_k(dev, 1, 4096), 4096);
  EXPECT_EQ(stream_gemv_chunk_k(dev, 3, 4096), 4096);
  EXPECT_EQ(stream_gemv_chunk_k(dev, 1, 5000), 4096);
  EXPECT_EQ(stream_gemv_chunk_k(dev, 1, 8184), 4096);
  // From 4 rows at k 4096 (x 32 KiB and more) three 4096-wide stages no longer fit.
  EXPECT_EQ(stream_gemv_chunk_k(dev, 4, 4096), 2048);
  EXPECT_EQ(stream_gemv_chunk_k(dev, 8, 4096), 2048);
  EXPECT_EQ(stream_gemv_chunk_k(dev, 8, 5000), 2048);
  for (int rows : {1, 8}) {
    SCOPED_TRACE(rows);
    EXPECT_EQ(stream_gemv_chunk_k(dev, rows, 64), 1024);
    EXPECT_EQ(stream_gemv_chunk_k(dev, rows, 2048), 1024);
    EXPECT_EQ(stream_gemv_chunk_k(dev, rows, 4088), 1024);
    EXPECT_EQ(stream_gemv_chunk_k(dev, rows, 8192), 1024);
  }
  EXPECT_EQ(stream_gemv_chunk_k(dev, 1, 14336), 1024);
  EXPECT_THROW(stream_gemv_chunk_k(dev, 1, 4100), Error);  // k not a multiple of 8
}

// Captured in a graph (a programmatic dependent of the GEMM before it), the stream GEMV replays
// bitwise equal to eager, replay after replay.
TEST_F(SkinnyGemmGpu, StreamGemvGraphReplayBitwiseEqualsEager) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  const Problem p = make_problem(rng, 5, 2048, 3072, false);
  auto dx = to_device(p.x, s), dw = to_device(p.w, s);
  DeviceBuffer<float> y1(p.ref.size()), y2(p.ref.size());
  const SkinnyGemmArgs a1{dx.data(), dw.data(), y1.data(), p.rows, p.k, p.n, true};
  const SkinnyGemmArgs a2{dx.data(), dw.data(), y2.data(), p.rows, p.k, p.n, true};
  const auto snapshot = [&] {
    std::vector<float> h(2 * y1.size());
    y1.download(h.data(), y1.size(), s);
    y2.download(h.data() + y1.size(), y2.size(), s);
    GD_CUDA(cudaStreamSynchronize(s));
    return h;
  };
  stream_gemv(dev, a1, s);
  stream_gemv(dev, a2, s);
  const std::vector<float> eager = snapshot();
  const CudaGraph graph = CudaGraph::capture(s, [&] {
    stream_gemv(dev, a1, s);
    stream_gemv(dev, a2, s);
  });
  for (int replay = 0; replay < 3; ++replay) {
    y1.fill_bytes(0xff, s);
    y2.fill_bytes(0xff, s);
    graph.launch(s);
    const std::vector<float> got = snapshot();
    EXPECT_EQ(std::memcmp(got.data(), eager.data(), got.size() * sizeof(float)), 0)
        << "replay " << replay;
  }
}

// Gemm's default choice: the stream GEMV at rows <= kStreamGemvMaxRowsAuto (8) and out <=
// kStreamGemvMaxOutAuto (6144: the 1B and 8B qkv, o and down projections; a k past
// kStreamGemvLongInAuto, the 8B down's, only at rows <= 2), cuBLAS elsewhere (gate_up's n, 9
// rows; the skinny kernel never by default); an explicit skinny mode and GRAPHDECODE_GEMV=off
// (kOff) keep it out. Where it runs, Gemm::run's output is bitwise the stream GEMV's and within
// the float64 bound.
TEST_F(SkinnyGemmGpu, GemmTakesTheStreamGemvWhereItWasMeasuredAhead) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  Gemm gemm;
  ASSERT_EQ(gemm.gemv_mode(), Gemm::GemvMode::kAuto);
  const Bits w = random_bits(rng, static_cast<std::size_t>(3072) * 2048, false);
  auto dw = to_device(w, s);
  DeviceBuffer<std::uint16_t> big_x(8 * 8192);
  const auto args = [&](int rows, int k, int n) {
    return GemmArgs{big_x.data(), dw.data(), nullptr, rows, k, n, GemmOut::kBF16};
  };
  for (int rows : {1, 2, 4, 5, 8}) {
    EXPECT_TRUE(gemm.uses_stream_gemv(args(rows, 2048, 3072))) << "qkv, rows " << rows;
    EXPECT_TRUE(gemm.uses_stream_gemv(args(rows, 2048, 2048))) << "o, rows " << rows;
    EXPECT_TRUE(gemm.uses_stream_gemv(args(rows, 8192, 768))) << "down-like, rows " << rows;
    EXPECT_FALSE(gemm.uses_skinny(args(rows, 8192, 768))) << "the stream GEMV comes first";
    EXPECT_TRUE(gemm.uses_stream_gemv(args(rows, 4096, 4096))) << "8B o, rows " << rows;
    EXPECT_TRUE(gemm.uses_stream_gemv(args(rows, 4096, 6144))) << "8B qkv, rows " << rows;
    // A long k (the 8B down's 14336) only at rows <= 2, where the MLP block needs it.
    EXPECT_EQ(gemm.uses_stream_gemv(args(rows, 14336, 4096)), rows <= 2) << "8B down, " << rows;
    EXPECT_FALSE(gemm.uses_skinny(args(rows, 14336, 4096))) << "8B down: no skinny, rows " << rows;
    EXPECT_FALSE(gemm.uses_stream_gemv(args(rows, 2048, 16384))) << "gate_up, rows " << rows;
  }
  EXPECT_FALSE(gemm.uses_stream_gemv(args(9, 2048, 3072))) << "9 rows: cuBLAS";
  EXPECT_FALSE(gemm.uses_stream_gemv(args(1, 2048, 6145))) << "out past the bound: cuBLAS";
  gemm.set_skinny(true);
  EXPECT_FALSE(gemm.uses_stream_gemv(args(1, 2048, 3072))) << "an explicit skinny mode";
  EXPECT_TRUE(gemm.uses_skinny(args(1, 2048, 3072)));
  gemm.set_skinny_mode(Gemm::SkinnyMode::kAuto);
  gemm.set_gemv_mode(Gemm::GemvMode::kOff);
  EXPECT_FALSE(gemm.uses_stream_gemv(args(1, 2048, 3072))) << "GEMV off";
  gemm.set_gemv_mode(Gemm::GemvMode::kAuto);
  for (int rows : {1, 3}) {
    const Problem p = make_problem(rng, rows, 2048, 3072, false, &w);
    auto dx = to_device(p.x, s);
    const GemmArgs a{dx.data(), dw.data(), nullptr, rows, 2048, 3072, GemmOut::kBF16};
    ASSERT_TRUE(gemm.uses_stream_gemv(a));
    std::vector<double> via_gemm, direct;
    ASSERT_TRUE(run_gemm(gemm, a, s, via_gemm));
    ASSERT_TRUE(run_stream(dev, a, s, direct));
    EXPECT_EQ(via_gemm, direct) << "rows " << rows;
    EXPECT_TRUE(matches(p, via_gemm, nullptr, GemmOut::kBF16)) << "rows " << rows;
  }
}

TEST_F(SkinnyGemmGpu, StreamGemvRejectsBadArguments) {
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  Stream s;
  DeviceBuffer<std::uint16_t> x(8 * 64 + 8), w(64 * 64);
  DeviceBuffer<float> y(8 * 64);
  const SkinnyGemmArgs good{x.data(), w.data(), y.data(), 8, 64, 64, true};
  auto field = [&](auto edit) {
    SkinnyGemmArgs a = good;
    edit(a);
    return field_of([&] { stream_gemv(dev, a, s); });
  };
  EXPECT_EQ(field([](SkinnyGemmArgs& a) { a.rows = 9; }), "rows");
  EXPECT_EQ(field([](SkinnyGemmArgs& a) { a.k = 60; }), "k");
  EXPECT_EQ(field([](SkinnyGemmArgs& a) { a.n = 0; }), "n");
  EXPECT_EQ(field([&](SkinnyGemmArgs& a) { a.x = x.data() + 1; }), "x");
  EXPECT_EQ(field([](SkinnyGemmArgs& a) { a.w = nullptr; }), "w");
  EXPECT_EQ(field([](SkinnyGemmArgs& a) { a.k = 1 << 20; }), "rows * k");
  EXPECT_FALSE(stream_gemv_supported(dev, 8, 1 << 20));
  GD_CUDA(cudaStreamSynchronize(s));
}

TEST_F(SkinnyGemmGpu, RejectsBadArguments) {
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  Stream s;
  DeviceBuffer<std::uint16_t> x(8 * 64 + 8), w(64 * 64);
  DeviceBuffer<float> y(8 * 64);
  x.fill_bytes(0, s);
  w.fill_bytes(0, s);
  const SkinnyGemmArgs good{x.data(), w.data(), y.data(), 8, 64, 64, true};
  EXPECT_NO_THROW(skinny_gemm(dev, good, s));
  auto bad = [&](auto edit) {
    SkinnyGemmArgs a = good;
    edit(a);
    EXPECT_THROW(skinny_gemm(dev, a, s), Error);
  };
  bad([](SkinnyGemmArgs& a) { a.rows = 0; });
  bad([](SkinnyGemmArgs& a) { a.rows = 9; });
  bad([](SkinnyGemmArgs& a) { a.k = 60; });
  bad([](SkinnyGemmArgs& a) { a.n = 0; });
  bad([&](SkinnyGemmArgs& a) { a.x = x.data() + 1; });
  bad([](SkinnyGemmArgs& a) { a.w = nullptr; });
  bad([](SkinnyGemmArgs& a) { a.y = nullptr; });
  EXPECT_THROW(skinny_gemm(SkinnyGemmDevice{}, good, s), Error);
  GD_CUDA(cudaStreamSynchronize(s));
}

}  // namespace
}  // namespace graphdecode
