// GPU: the MLP block in one grid (engine/kernels/stream_mlp.h) against what it replaces.
// - Bitwise: act, y, the residual and each CTA's squares equal the stream GEMV with its norm
//   prologue into gate_up, the swiglu kernel and the stream GEMV with its residual epilogue, on
//   the 1B shape at rows 1, 2, 5 and 8 (the ring's two stage widths), on a shape with CTAs that
//   own no act tile, and on one whose k is not a multiple of a stage; outputs poisoned first,
//   guard rows past them untouched.
// - Float64: y within the GEMM bound of act W_down^T; act within the bound of the SwiGLU of the
//   normed products.
// - Graph: two blocks back to back (the second reads the first's residual) captured once and
//   replayed on fresh inputs equal eager runs; the grid barrier resets itself.
// - A cooperative launch (StreamMlpArgs::cooperative): the same bits, eager and in a graph.
// - CUDA-core consumers (StreamMlpArgs::fma, rows 1-2): float64 bounds, the residual and the
//   squares, the same bits twice.
// - Bad arguments: a graphdecode::Error naming the field.
// Fresh random data per run (the seed is printed; GRAPHDECODE_SEED reproduces).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attention/reference.h"
#include "attention_check.h"
#include "common/buffers.h"
#include "common/cuda_check.h"
#include "common/stream.h"
#include "engine/kernels/model_kernels.h"
#include "engine/kernels/stream_gemv.h"
#include "engine/kernels/stream_mlp.h"
#include "gemm_test_data.h"
#include "graphs/cuda_graph.h"
#include "support/device_vectors.h"
#include "support/field_of.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;
using reference::bf16_to_float;
using Bits = std::vector<std::uint16_t>;

class StreamMlpGpu : public GpuTest {};

struct Weights {
  int hidden = 0, inter = 0;
  Bits norm_w, gate_up, down;
  DeviceBuffer<std::uint16_t> d_norm, d_gate_up, d_down;
};

Weights make_weights(Rng& rng, int hidden, int inter, cudaStream_t s) {
  Weights w;
  w.hidden = hidden;
  w.inter = inter;
  w.norm_w = random_bits(rng, hidden, false);
  w.gate_up = random_bits(rng, static_cast<std::size_t>(2) * inter * hidden, false);
  w.down = random_bits(rng, static_cast<std::size_t>(hidden) * inter, false);
  w.d_norm = to_device(w.norm_w, s);
  w.d_gate_up = to_device(w.gate_up, s);
  w.d_down = to_device(w.down, s);
  return w;
}

// What one block leaves: act, y, the residual and the squares (+ one guard row / part each).
struct Outputs {
  Bits act, y, residual;
  std::vector<float> sq;
};

constexpr int kParts = 7;  // the squares' parts the block reads (any split)
constexpr float kEps = 1e-5f;

// The four kernels it replaces: the stream GEMV normed into gate_up, swiglu, the stream GEMV with
// the residual epilogue.
Outputs run_chain(const SkinnyGemmDevice& dev, const Weights& w, int rows, const Bits& res,
                  const std::vector<float>& sq_in, int parts_in, cudaStream_t s) {
  const int h = w.hidden, inter = w.inter, parts = stream_mlp_grid(dev, h);
  auto dres = to_device(res, s);
  auto dsq_in = to_device(sq_in, s);
  DeviceBuffer<std::uint16_t> gate_up(static_cast<std::size_t>(rows) * 2 * inter);
  DeviceBuffer<std::uint16_t> act(static_cast<std::size_t>(rows + 1) * inter);
  DeviceBuffer<std::uint16_t> y(static_cast<std::size_t>(rows + 1) * h);
  DeviceBuffer<float> sq(static_cast<std::size_t>(parts + 1) * rows);
  for (auto* b : {&gate_up, &act, &y}) b->fill_bytes(0xff, s);
  sq.fill_bytes(0xff, s);
  StreamGemvFusion pro;
  pro.norm_weight = w.d_norm.data();
  pro.sum_sq_in = dsq_in.data();
  pro.parts = parts_in;
  pro.eps = kEps;
  stream_gemv(dev, {dres.data(), w.d_gate_up.data(), gate_up.data(), rows, h, 2 * inter, false}, s,
              pro);
  auto live = to_device(std::vector<std::int32_t>{rows}, s);
  SwiGluArgs g;
  g.gate_up = gate_up.data();
  g.out = act.data();
  g.num_rows = live.data();
  g.max_rows = rows;
  g.inter = inter;
  swiglu(g, s);
  StreamGemvFusion epi;
  epi.residual = dres.data();
  epi.sum_sq_out = sq.data();
  stream_gemv(dev, {act.data(), w.d_down.data(), y.data(), rows, inter, h, false}, s, epi);
  return {to_host(act, s), to_host(y, s), to_host(dres, s), to_host(sq, s)};
}

// n zeroed elements: the grid's sync words and the error flag start at zero.
template <typename T>
DeviceBuffer<T> zeroed(std::size_t n, cudaStream_t s) {
  DeviceBuffer<T> b(n);
  b.fill_bytes(0, s);
  return b;
}

// Device buffers of one block's launch; residual aliases x, as in the model.
struct BlockBuffers {
  DeviceBuffer<std::uint16_t> res, act, y;
  DeviceBuffer<float> sq_in, sq_out;
  StreamMlpArgs args;
};

void make_block(const SkinnyGemmDevice& dev, const Weights& w, int rows, const Bits& res,
                const std::vector<float>& sq_in, DeviceBuffer<std::uint32_t>& sync,
                DeviceBuffer<std::int32_t>& flag, BlockBuffers& b, cudaStream_t s) {
  const int h = w.hidden, inter = w.inter;
  b.res = to_device(res, s);
  b.sq_in = to_device(sq_in, s);
  b.act = DeviceBuffer<std::uint16_t>(static_cast<std::size_t>(rows + 1) * inter);
  b.y = DeviceBuffer<std::uint16_t>(static_cast<std::size_t>(rows + 1) * h);
  b.sq_out = DeviceBuffer<float>(static_cast<std::size_t>(stream_mlp_grid(dev, h) + 1) * rows);
  b.act.fill_bytes(0xff, s);
  b.y.fill_bytes(0xff, s);
  b.sq_out.fill_bytes(0xff, s);
  StreamMlpArgs& a = b.args;
  a.x = b.res.data();
  a.norm_weight = w.d_norm.data();
  a.sum_sq_in = b.sq_in.data();
  a.parts = kParts;
  a.eps = kEps;
  a.w_gate_up = w.d_gate_up.data();
  a.w_down = w.d_down.data();
  a.act = b.act.data();
  a.y = b.y.data();
  a.residual = b.res.data();
  a.sum_sq_out = b.sq_out.data();
  a.sync = sync.data();
  a.error_flag = flag.data();
  a.rows = rows;
  a.hidden = h;
  a.inter = inter;
}

Outputs read_block(BlockBuffers& b, cudaStream_t s) {
  return {to_host(b.act, s), to_host(b.y, s), to_host(b.res, s), to_host(b.sq_out, s)};
}

// Fresh residual rows and their squares into a block's inputs (before a graph replay).
void upload_inputs(BlockBuffers& b, const Bits& res, const std::vector<float>& sq_in,
                   cudaStream_t s) {
  GD_CUDA(cudaMemcpyAsync(b.res.data(), res.data(), res.size() * sizeof(res[0]),
                          cudaMemcpyHostToDevice, s));
  GD_CUDA(cudaMemcpyAsync(b.sq_in.data(), sq_in.data(), sq_in.size() * sizeof(sq_in[0]),
                          cudaMemcpyHostToDevice, s));
}

// The same bits (the guard part is a NaN pattern, which == would call unequal).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Bitwise equal, the guard row / part of the block's outputs still poisoned.
void expect_same(const Outputs& got, const Outputs& want, int rows, int h, int inter) {
  const auto act_cells = static_cast<std::size_t>(rows) * inter;
  const auto y_cells = static_cast<std::size_t>(rows) * h;
  for (std::size_t i = 0; i < act_cells; ++i)
    ASSERT_EQ(got.act[i], want.act[i]) << "act element " << i;
  for (std::size_t i = act_cells; i < got.act.size(); ++i)
    ASSERT_EQ(got.act[i], 0xffff) << "act guard row element " << i - act_cells;
  for (std::size_t i = 0; i < y_cells; ++i) ASSERT_EQ(got.y[i], want.y[i]) << "y element " << i;
  for (std::size_t i = y_cells; i < got.y.size(); ++i)
    ASSERT_EQ(got.y[i], 0xffff) << "y guard row element " << i - y_cells;
  ASSERT_EQ(got.residual, want.residual) << "residual";
  const std::size_t parts_cells = got.sq.size() - static_cast<std::size_t>(rows);
  for (std::size_t i = 0; i < parts_cells; ++i) {
    ASSERT_TRUE(std::isfinite(got.sq[i])) << "squares element " << i << " unwritten";
    ASSERT_EQ(got.sq[i], want.sq[i]) << "squares element " << i;
  }
  for (std::size_t i = parts_cells; i < got.sq.size(); ++i)
    ASSERT_TRUE(std::isnan(got.sq[i])) << "guard part element " << i - parts_cells << " written";
}

// act within the float64 bound of swiglu(normed W_gate^T, normed W_up^T) and y of act W_down^T.
void expect_near_float64(const Weights& w, int rows, const Bits& res, const Outputs& got) {
  const int h = w.hidden, inter = w.inter;
  for (int r = 0; r < rows; ++r) {
    const std::uint16_t* xr = res.data() + static_cast<std::size_t>(r) * h;
    double ss = 0;
    for (int i = 0; i < h; ++i)
      ss += static_cast<double>(bf16_to_float(xr[i])) * bf16_to_float(xr[i]);
    const double inv = 1.0 / std::sqrt(ss / h + kEps);
    std::vector<double> xn(h);
    for (int i = 0; i < h; ++i) xn[i] = bf16_to_float(w.norm_w[i]) * bf16_to_float(xr[i]) * inv;
    std::vector<double> act(inter);
    for (int j = 0; j < inter; ++j) {
      double g = 0, gm = 0, u = 0, um = 0;
      const std::uint16_t* wg = w.gate_up.data() + static_cast<std::size_t>(j) * h;
      const std::uint16_t* wu = w.gate_up.data() + static_cast<std::size_t>(inter + j) * h;
      for (int i = 0; i < h; ++i) {
        const double pg = xn[i] * bf16_to_float(wg[i]), pu = xn[i] * bf16_to_float(wu[i]);
        g += pg;
        gm += std::abs(pg);
        u += pu;
        um += std::abs(pu);
      }
      // x' rounded twice to bf16 (2^-7 of each product), the fp32 sums, gate and up rounded.
      const double eg = std::ldexp(gm, -7) + std::ldexp(std::abs(g), -8) + h * std::ldexp(gm, -23);
      const double eu = std::ldexp(um, -7) + std::ldexp(std::abs(u), -8) + h * std::ldexp(um, -23);
      const double silu = g / (1 + std::exp(-g));
      const double ref = silu * u;
      const double tol = 1.1 * (std::abs(u) * eg + (std::abs(silu) + 1.1 * eg) * eu) +
                         std::ldexp(std::abs(ref), -7) + 1e-30;
      const double v = bf16_to_float(got.act[static_cast<std::size_t>(r) * inter + j]);
      ASSERT_NEAR(v, ref, tol) << "act row " << r << " col " << j;
      act[j] = v;
    }
    for (int c = 0; c < h; ++c) {
      double y = 0, mag = 0;
      const std::uint16_t* wd = w.down.data() + static_cast<std::size_t>(c) * inter;
      for (int j = 0; j < inter; ++j) {
        const double p = act[j] * bf16_to_float(wd[j]);
        y += p;
        mag += std::abs(p);
      }
      const double tol = std::ldexp(std::abs(y), -8) + (inter / 16.0 + 16.0) * std::ldexp(mag, -23);
      ASSERT_NEAR(bf16_to_float(got.y[static_cast<std::size_t>(r) * h + c]), y, tol)
          << "y row " << r << " col " << c;
    }
  }
}

// Every CTA of every launch arrived once; the claims reset, no timeout.
void expect_launches(const std::vector<std::uint32_t>& words, std::uint64_t arrivals) {
  std::uint64_t got = 0;
  std::memcpy(&got, words.data(), sizeof(got));
  EXPECT_EQ(got, arrivals) << "arrivals: every CTA of every launch once";
  EXPECT_EQ(words[2], 0u) << "claims left";
  EXPECT_EQ(words[3], 0u) << "barrier timeouts";
}

TEST_F(StreamMlpGpu, EqualsTheFourKernelsBitwise) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  DeviceBuffer<std::int32_t> flag = zeroed<std::int32_t>(1, s.get());
  struct Shape {
    int hidden, inter;
    std::vector<int> rows;
  };
  // The 1B shape; CTAs with no act tile (64 act tiles, stream_mlp_grid CTAs); k = 264, not a
  // multiple of a stage, and 33 CTAs.
  for (const Shape& sh :
       {Shape{2048, 8192, {1, 2, 5, 8}}, Shape{2048, 512, {1, 8}}, Shape{264, 1000, {3}}}) {
    const Weights w = make_weights(rng, sh.hidden, sh.inter, s.get());
    // One sync block per shape: every launch on one has the same grid (stream_mlp.h).
    DeviceBuffer<std::uint32_t> sync = zeroed<std::uint32_t>(kStreamMlpSyncWords, s.get());
    std::uint64_t arrivals = 0;
    for (int rows : sh.rows) {
      SCOPED_TRACE("hidden " + std::to_string(sh.hidden) + " inter " + std::to_string(sh.inter) +
                   " rows " + std::to_string(rows));
      ASSERT_TRUE(stream_mlp_supported(dev, rows, sh.hidden, sh.inter));
      Bits res = random_bits(rng, static_cast<std::size_t>(rows + 1) * sh.hidden, false);
      const std::vector<float> sq_in = split_squares(res, rows, sh.hidden, kParts);
      const Outputs want = run_chain(dev, w, rows, res, sq_in, kParts, s.get());
      // With the residual epilogue, then without it (y alone, the residual untouched), launched
      // back to back on one sync: with 33 CTAs the second launch's CTAs are resident while the
      // first runs.
      BlockBuffers b, plain;
      make_block(dev, w, rows, res, sq_in, sync, flag, b, s.get());
      make_block(dev, w, rows, res, sq_in, sync, flag, plain, s.get());
      plain.args.residual = nullptr;
      plain.args.sum_sq_out = nullptr;
      stream_mlp(dev, b.args, s.get());
      stream_mlp(dev, plain.args, s.get());
      arrivals += 2ull * static_cast<std::uint64_t>(stream_mlp_grid(dev, sh.hidden));
      const Outputs got = read_block(b, s.get());
      expect_same(got, want, rows, sh.hidden, sh.inter);
      if (sh.inter <= 1000 || rows <= 2) expect_near_float64(w, rows, res, got);
      ASSERT_EQ(to_host(plain.y, s.get()), got.y) << "y without the epilogue";
      ASSERT_EQ(to_host(plain.res, s.get()), res) << "the residual was written";
    }
    expect_launches(to_host(sync, s.get()), arrivals);
  }
  EXPECT_EQ(to_host(flag, s.get())[0], 0);
}

TEST_F(StreamMlpGpu, GraphOfTwoBlocksReplaysOnFreshInputs) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  const int h = 2048, inter = 8192, rows = 2;
  const Weights w1 = make_weights(rng, h, inter, s.get()),
                w2 = make_weights(rng, h, inter, s.get());
  // One sync block per launch site, as the model's layers.
  DeviceBuffer<std::uint32_t> sync1 = zeroed<std::uint32_t>(kStreamMlpSyncWords, s.get()),
                              sync2 = zeroed<std::uint32_t>(kStreamMlpSyncWords, s.get());
  DeviceBuffer<std::int32_t> flag = zeroed<std::int32_t>(1, s.get());
  // Block 2 reads block 1's residual and squares: the buffers of a model's layers.
  Bits res = random_bits(rng, static_cast<std::size_t>(rows + 1) * h, false);
  BlockBuffers b1, b2;
  make_block(dev, w1, rows, res, split_squares(res, rows, h, kParts), sync1, flag, b1, s.get());
  make_block(dev, w2, rows, res, split_squares(res, rows, h, kParts), sync2, flag, b2, s.get());
  b2.args.x = b1.res.data();
  b2.args.residual = b1.res.data();
  b2.args.sum_sq_in = b1.sq_out.data();
  b2.args.parts = stream_mlp_grid(dev, h);
  b2.args.sum_sq_out = b2.sq_out.data();
  GD_CUDA(cudaStreamSynchronize(s.get()));
  const CudaGraph graph = CudaGraph::capture(s.get(), [&] {
    stream_mlp(dev, b1.args, s.get());
    stream_mlp(dev, b2.args, s.get());
  });
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    res = random_bits(rng, static_cast<std::size_t>(rows + 1) * h, false);
    const std::vector<float> sq_in = split_squares(res, rows, h, kParts);
    upload_inputs(b1, res, sq_in, s.get());
    graph.launch(s.get());
    // Eager: the first block's chain, then the second's on its outputs.
    const Outputs want1 = run_chain(dev, w1, rows, res, sq_in, kParts, s.get());
    const Outputs want2 = run_chain(dev, w2, rows, want1.residual,
                                    std::vector<float>(want1.sq.begin(), want1.sq.end() - rows),
                                    stream_mlp_grid(dev, h), s.get());
    ASSERT_EQ(to_host(b1.y, s.get()), want1.y) << "block 1 y";
    ASSERT_TRUE(same_bits(to_host(b1.sq_out, s.get()), want1.sq)) << "block 1 squares";
    ASSERT_EQ(to_host(b1.res, s.get()), want2.residual) << "the residual after both blocks";
    ASSERT_EQ(to_host(b2.y, s.get()), want2.y) << "block 2 y";
    ASSERT_TRUE(same_bits(to_host(b2.sq_out, s.get()), want2.sq)) << "block 2 squares";
  }
  expect_launches(to_host(sync1, s.get()), 3ull * stream_mlp_grid(dev, h));
  expect_launches(to_host(sync2, s.get()), 3ull * stream_mlp_grid(dev, h));
  EXPECT_EQ(to_host(flag, s.get())[0], 0);
}

// StreamMlpArgs::cooperative: the same bits as the chain, eager and as a graph replayed twice on
// fresh inputs, and the barrier's words as after any launch.
TEST_F(StreamMlpGpu, CooperativeLaunchGivesTheSameBits) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  const int h = 2048, inter = 8192, rows = 1;
  const Weights w = make_weights(rng, h, inter, s.get());
  DeviceBuffer<std::uint32_t> sync = zeroed<std::uint32_t>(kStreamMlpSyncWords, s.get());
  DeviceBuffer<std::int32_t> flag = zeroed<std::int32_t>(1, s.get());
  Bits res = random_bits(rng, static_cast<std::size_t>(rows + 1) * h, false);
  std::vector<float> sq_in = split_squares(res, rows, h, kParts);
  BlockBuffers b;
  make_block(dev, w, rows, res, sq_in, sync, flag, b, s.get());
  b.args.cooperative = true;
  stream_mlp(dev, b.args, s.get());
  expect_same(read_block(b, s.get()), run_chain(dev, w, rows, res, sq_in, kParts, s.get()), rows, h,
              inter);
  GD_CUDA(cudaStreamSynchronize(s.get()));
  const CudaGraph graph = CudaGraph::capture(s.get(), [&] { stream_mlp(dev, b.args, s.get()); });
  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    res = random_bits(rng, static_cast<std::size_t>(rows + 1) * h, false);
    sq_in = split_squares(res, rows, h, kParts);
    upload_inputs(b, res, sq_in, s.get());
    graph.launch(s.get());
    const Outputs want = run_chain(dev, w, rows, res, sq_in, kParts, s.get());
    ASSERT_EQ(to_host(b.y, s.get()), want.y) << "y";
    ASSERT_EQ(to_host(b.res, s.get()), want.residual) << "residual";
  }
  expect_launches(to_host(sync, s.get()), 3ull * stream_mlp_grid(dev, h));
  EXPECT_EQ(to_host(flag, s.get())[0], 0);
}

// StreamMlpArgs::fma (CUDA-core consumers, rows 1-2): act and y within the float64 bounds, the
// residual bf16(residual + y), each CTA's squares within fp32 of the float64 sum over its columns
// (the stream GEMV's column split), and the same bits when run twice.
TEST_F(StreamMlpGpu, FmaConsumersMatchFloat64) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  DeviceBuffer<std::int32_t> flag = zeroed<std::int32_t>(1, s.get());
  for (const auto& [h, inter] : {std::pair{2048, 8192}, std::pair{264, 1000}}) {
    const Weights w = make_weights(rng, h, inter, s.get());
    DeviceBuffer<std::uint32_t> sync = zeroed<std::uint32_t>(kStreamMlpSyncWords, s.get());
    std::uint64_t arrivals = 0;
    for (int rows : {1, 2}) {
      SCOPED_TRACE("hidden " + std::to_string(h) + " rows " + std::to_string(rows));
      const Bits res = random_bits(rng, static_cast<std::size_t>(rows + 1) * h, false);
      const std::vector<float> sq_in = split_squares(res, rows, h, kParts);
      BlockBuffers b, again;
      make_block(dev, w, rows, res, sq_in, sync, flag, b, s.get());
      make_block(dev, w, rows, res, sq_in, sync, flag, again, s.get());
      b.args.fma = again.args.fma = true;
      stream_mlp(dev, b.args, s.get());
      stream_mlp(dev, again.args, s.get());
      arrivals += 2ull * stream_mlp_grid(dev, h);
      const Outputs got = read_block(b, s.get()), got2 = read_block(again, s.get());
      expect_near_float64(w, rows, res, got);
      ASSERT_EQ(got.act, got2.act) << "act differs between two runs";
      ASSERT_EQ(got.y, got2.y) << "y differs between two runs";
      const auto cells = static_cast<std::size_t>(rows) * h;
      for (std::size_t i = 0; i < cells; ++i)
        ASSERT_EQ(got.residual[i],
                  reference::float_to_bf16(bf16_to_float(res[i]) + bf16_to_float(got.y[i])))
            << "residual element " << i;
      for (std::size_t i = cells; i < res.size(); ++i)
        ASSERT_EQ(got.residual[i], res[i]) << "guard row element " << i - cells;
      const int parts = stream_mlp_grid(dev, h), tiles = (h + 7) / 8;
      for (int p = 0; p < parts; ++p) {
        const int c0 = static_cast<int>(static_cast<std::int64_t>(p) * tiles / parts) * 8;
        const int c1 =
            std::min(h, static_cast<int>(static_cast<std::int64_t>(p + 1) * tiles / parts) * 8);
        for (int r = 0; r < rows; ++r) {
          double want = 0;
          for (int c = c0; c < c1; ++c) {
            const double v = bf16_to_float(got.residual[static_cast<std::size_t>(r) * h + c]);
            want += v * v;
          }
          const float part = got.sq[static_cast<std::size_t>(p) * rows + r];
          ASSERT_TRUE(std::isfinite(part)) << "part " << p << " row " << r << " unwritten";
          EXPECT_NEAR(part, want, 1e-5 * want + 1e-30) << "part " << p << " row " << r;
        }
      }
    }
    expect_launches(to_host(sync, s.get()), arrivals);
  }
  EXPECT_EQ(to_host(flag, s.get())[0], 0);
}

TEST_F(StreamMlpGpu, BadArgumentsAreRefusedByName) {
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  const int h = 256, inter = 512, rows = 2;
  DeviceBuffer<std::uint16_t> x(rows * h + 8), nw(h), gu(2 * inter * h), down(h * inter),
      act(rows * inter), y(rows * h);
  DeviceBuffer<float> sq(static_cast<std::size_t>(dev.sm_count) * rows);
  DeviceBuffer<std::uint32_t> sync(kStreamMlpSyncWords);
  StreamMlpArgs ok;
  ok.x = x.data();
  ok.norm_weight = nw.data();
  ok.sum_sq_in = sq.data();
  ok.parts = 3;
  ok.w_gate_up = gu.data();
  ok.w_down = down.data();
  ok.act = act.data();
  ok.y = y.data();
  ok.sync = sync.data();
  ok.rows = rows;
  ok.hidden = h;
  ok.inter = inter;
  const auto field = [&](auto edit) {
    StreamMlpArgs a = ok;
    edit(a);
    return field_of([&] { stream_mlp(dev, a, s.get()); });
  };
  EXPECT_EQ(field([](StreamMlpArgs& a) { a.rows = 9; }), "rows");
  EXPECT_EQ(field([](StreamMlpArgs& a) { a.rows = 0; }), "rows");
  EXPECT_EQ(field([](StreamMlpArgs& a) { a.hidden = 12; }), "hidden");
  EXPECT_EQ(field([](StreamMlpArgs& a) { a.inter = -8; }), "inter");
  EXPECT_EQ(field([&](StreamMlpArgs& a) { a.x = x.data() + 1; }), "x");
  EXPECT_EQ(field([](StreamMlpArgs& a) { a.w_down = nullptr; }), "w_down");
  EXPECT_EQ(field([](StreamMlpArgs& a) { a.sum_sq_in = nullptr; }), "sum_sq_in");
  EXPECT_EQ(field([&](StreamMlpArgs& a) { a.parts = dev.sm_count + 1; }), "parts");
  EXPECT_EQ(field([](StreamMlpArgs& a) { a.eps = 0.f; }), "eps");
  EXPECT_EQ(field([&](StreamMlpArgs& a) { a.residual = x.data(); }), "sum_sq_out");
  EXPECT_EQ(field([](StreamMlpArgs& a) { a.sync = nullptr; }), "sync");
  EXPECT_EQ(field([](StreamMlpArgs& a) {
              a.fma = true;
              a.rows = 3;
            }),
            "rows");
  EXPECT_EQ(field([&](StreamMlpArgs& a) { a.sync = sync.data() + 1; }), "sync");
  // x of 8 rows of 16384 does not leave four stages.
  EXPECT_FALSE(stream_mlp_supported(dev, 8, 2048, 16384));
  EXPECT_TRUE(stream_mlp_supported(dev, 8, 2048, 8192));
  GD_CUDA(cudaStreamSynchronize(s.get()));
}

}  // namespace
}  // namespace graphdecode
