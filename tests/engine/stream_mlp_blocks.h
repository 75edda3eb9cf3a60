// The MLP block's test pieces (engine/kernels/stream_mlp.h), shared by test_stream_mlp_gpu.cu and
// test_stream_mlp_next_gpu.cu: random weights, the four kernels the block replaces, one block's
// buffers and launch arguments, and the checks of its outputs and grid words.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/buffers.h"
#include "common/cuda_check.h"
#include "engine/kernels/model_kernels.h"
#include "engine/kernels/stream_gemv.h"
#include "engine/kernels/stream_mlp.h"
#include "gemm_test_data.h"
#include "support/device_vectors.h"

namespace graphdecode::testing {

using Bits = std::vector<std::uint16_t>;

struct MlpWeights {
  int hidden = 0, inter = 0;
  Bits norm_w, gate_up, down;
  DeviceBuffer<std::uint16_t> d_norm, d_gate_up, d_down;
};

inline MlpWeights make_weights(Rng& rng, int hidden, int inter, cudaStream_t s) {
  MlpWeights w;
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
struct BlockOutputs {
  Bits act, y, residual;
  std::vector<float> sq;
};

constexpr int kParts = 7;  // the squares' parts the block reads (any split)
constexpr float kEps = 1e-5f;

// The four kernels it replaces: the stream GEMV normed into gate_up, swiglu, the stream GEMV with
// the residual epilogue.
inline BlockOutputs run_chain(const SkinnyGemmDevice& dev, const MlpWeights& w, int rows,
                              const Bits& res, const std::vector<float>& sq_in, int parts_in,
                              cudaStream_t s) {
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
inline DeviceBuffer<T> zeroed(std::size_t n, cudaStream_t s) {
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

inline void make_block(const SkinnyGemmDevice& dev, const MlpWeights& w, int rows, const Bits& res,
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

inline BlockOutputs read_block(BlockBuffers& b, cudaStream_t s) {
  return {to_host(b.act, s), to_host(b.y, s), to_host(b.res, s), to_host(b.sq_out, s)};
}

// Fresh residual rows and their squares into a block's inputs (before a graph replay).
inline void upload_inputs(BlockBuffers& b, const Bits& res, const std::vector<float>& sq_in,
                          cudaStream_t s) {
  GD_CUDA(cudaMemcpyAsync(b.res.data(), res.data(), res.size() * sizeof(res[0]),
                          cudaMemcpyHostToDevice, s));
  GD_CUDA(cudaMemcpyAsync(b.sq_in.data(), sq_in.data(), sq_in.size() * sizeof(sq_in[0]),
                          cudaMemcpyHostToDevice, s));
}

// The same bits (the guard part is a NaN pattern, which == would call unequal).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Bitwise equal, the guard row / part of the block's outputs still poisoned.
inline void expect_same(const BlockOutputs& got, const BlockOutputs& want, int rows, int h,
                        int inter) {
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

// Every CTA of every launch arrived once; the claims reset, no timeout.
inline void expect_launches(const std::vector<std::uint32_t>& words, std::uint64_t arrivals) {
  std::uint64_t got = 0;
  std::memcpy(&got, words.data(), sizeof(got));
  EXPECT_EQ(got, arrivals) << "arrivals: every CTA of every launch once";
  EXPECT_EQ(words[2], 0u) << "claims left";
  EXPECT_EQ(words[3], 0u) << "barrier timeouts";
}

}  // namespace graphdecode::testing
