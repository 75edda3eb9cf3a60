// GPU: the MLP block that also runs the next layer's qkv GEMV (StreamMlpArgs::w_next,
// engine/kernels/stream_mlp.h) against the kernels it replaces.
// - Bitwise: act, y, the residual and the squares as without it (the four kernels' bits), and
//   next_y equal to the stream GEMV with its norm prologue on that residual and those squares;
//   on the 1B shape (qkv 3072 wide) at rows 1, 2, 5 and 8, and on a small one whose 17 next
//   tiles leave most of its 33 CTAs without one. BlockOutputs poisoned first, guard rows untouched.
// - Float64: next_y within the GEMM bound of rmsnorm(residual) W_next^T.
// - Two launches back to back on one sync word block, then a graph of two layers' blocks
//   replayed on fresh inputs: two barrier rounds a launch, the words reset, no timeout.
// - Bad arguments: a graphdecode::Error naming the field.
// Fresh random data per run (the seed is printed; GRAPHDECODE_SEED reproduces).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/buffers.h"
#include "common/cuda_check.h"
#include "common/stream.h"
#include "engine/kernels/stream_gemv.h"
#include "engine/kernels/stream_mlp.h"
#include "gemm_test_data.h"
#include "graphs/cuda_graph.h"
#include "stream_mlp_blocks.h"
#include "support/device_vectors.h"
#include "support/field_of.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;
using reference::bf16_to_float;

class StreamMlpNextGpu : public GpuTest {};

// The next layer's qkv weights and input norm, and the block's next_y (one guard row).
struct Next {
  int n = 0;
  Bits w, norm_w;
  DeviceBuffer<std::uint16_t> d_w, d_norm, y;
};

Next make_next(Rng& rng, int hidden, int n, int rows, cudaStream_t s) {
  Next x;
  x.n = n;
  x.w = random_bits(rng, static_cast<std::size_t>(n) * hidden, false);
  x.norm_w = random_bits(rng, hidden, false);
  x.d_w = to_device(x.w, s);
  x.d_norm = to_device(x.norm_w, s);
  x.y = DeviceBuffer<std::uint16_t>(static_cast<std::size_t>(rows + 1) * n);
  x.y.fill_bytes(0xff, s);
  return x;
}

void attach(BlockBuffers& b, Next& x) {
  b.args.w_next = x.d_w.data();
  b.args.next_norm_weight = x.d_norm.data();
  b.args.next_y = x.y.data();
  b.args.next_n = x.n;
}

// What the stream GEMV with its norm prologue gives on the residual and squares a block left.
Bits gemv_after(const SkinnyGemmDevice& dev, const Next& x, int rows, int h,
                const BlockOutputs& block, cudaStream_t s) {
  auto res = to_device(block.residual, s);
  auto sq = to_device(block.sq, s);
  DeviceBuffer<std::uint16_t> y(static_cast<std::size_t>(rows) * x.n);
  y.fill_bytes(0xff, s);
  StreamGemvFusion pro;
  pro.norm_weight = x.d_norm.data();
  pro.sum_sq_in = sq.data();
  pro.parts = stream_mlp_grid(dev, h);
  pro.eps = kEps;
  stream_gemv(dev, {res.data(), x.d_w.data(), y.data(), rows, h, x.n, false}, s, pro);
  return to_host(y, s);
}

// next_y's rows equal `want`, its guard row still poisoned.
void expect_next_y(const Bits& got, const Bits& want, int rows, int n) {
  const auto cells = static_cast<std::size_t>(rows) * n;
  ASSERT_EQ(want.size(), cells);
  for (std::size_t i = 0; i < cells; ++i) ASSERT_EQ(got[i], want[i]) << "next_y element " << i;
  for (std::size_t i = cells; i < got.size(); ++i)
    ASSERT_EQ(got[i], 0xffff) << "next_y guard row element " << i - cells;
}

// next_y within the float64 bound of rmsnorm(residual, norm_w) W^T (x rounded twice to bf16,
// the fp32 sums, the output rounded).
void expect_next_near_float64(const Next& x, int rows, int h, const Bits& residual,
                              const Bits& got) {
  for (int r = 0; r < rows; ++r) {
    const std::uint16_t* xr = residual.data() + static_cast<std::size_t>(r) * h;
    double ss = 0;
    for (int i = 0; i < h; ++i)
      ss += static_cast<double>(bf16_to_float(xr[i])) * bf16_to_float(xr[i]);
    const double inv = 1.0 / std::sqrt(ss / h + kEps);
    for (int c = 0; c < x.n; ++c) {
      const std::uint16_t* wr = x.w.data() + static_cast<std::size_t>(c) * h;
      double y = 0, mag = 0;
      for (int i = 0; i < h; ++i) {
        const double p =
            bf16_to_float(x.norm_w[i]) * bf16_to_float(xr[i]) * inv * bf16_to_float(wr[i]);
        y += p;
        mag += std::abs(p);
      }
      const double tol = std::ldexp(mag, -7) + std::ldexp(std::abs(y), -8) +
                         (h / 16.0 + 16.0) * std::ldexp(mag, -23);
      ASSERT_NEAR(bf16_to_float(got[static_cast<std::size_t>(r) * x.n + c]), y, tol)
          << "next_y row " << r << " col " << c;
    }
  }
}

TEST_F(StreamMlpNextGpu, RunsTheNextLayersGemvBitwise) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  DeviceBuffer<std::int32_t> flag = zeroed<std::int32_t>(1, s.get());
  struct Shape {
    int hidden, inter, next_n;
    std::vector<int> rows;
  };
  for (const Shape& sh : {Shape{2048, 8192, 3072, {1, 2, 5, 8}}, Shape{264, 1000, 136, {3}}}) {
    const MlpWeights w = make_weights(rng, sh.hidden, sh.inter, s.get());
    DeviceBuffer<std::uint32_t> sync = zeroed<std::uint32_t>(kStreamMlpSyncWords, s.get());
    std::uint64_t arrivals = 0;
    const auto grid = static_cast<std::uint64_t>(stream_mlp_grid(dev, sh.hidden));
    for (int rows : sh.rows) {
      SCOPED_TRACE("hidden " + std::to_string(sh.hidden) + " next_n " + std::to_string(sh.next_n) +
                   " rows " + std::to_string(rows));
      Bits res = random_bits(rng, static_cast<std::size_t>(rows + 1) * sh.hidden, false);
      const std::vector<float> sq_in = split_squares(res, rows, sh.hidden, kParts);
      const BlockOutputs want = run_chain(dev, w, rows, res, sq_in, kParts, s.get());
      // Twice back to back on one sync (with 33 CTAs the second launch's CTAs are resident while
      // the first runs): the same bits.
      Next nx = make_next(rng, sh.hidden, sh.next_n, rows, s.get());
      Next again = make_next(rng, sh.hidden, sh.next_n, rows, s.get());
      again.w = nx.w;
      again.norm_w = nx.norm_w;
      again.d_w = to_device(nx.w, s.get());
      again.d_norm = to_device(nx.norm_w, s.get());
      BlockBuffers b, b2;
      make_block(dev, w, rows, res, sq_in, sync, flag, b, s.get());
      make_block(dev, w, rows, res, sq_in, sync, flag, b2, s.get());
      attach(b, nx);
      attach(b2, again);
      stream_mlp(dev, b.args, s.get());
      stream_mlp(dev, b2.args, s.get());
      arrivals += 4 * grid;
      const BlockOutputs got = read_block(b, s.get());
      expect_same(got, want, rows, sh.hidden, sh.inter);
      const Bits next_y = to_host(nx.y, s.get());
      expect_next_y(next_y, gemv_after(dev, nx, rows, sh.hidden, got, s.get()), rows, sh.next_n);
      ASSERT_EQ(to_host(again.y, s.get()), next_y) << "the second launch's next_y";
      if (rows <= 2 || sh.hidden < 2048)
        expect_next_near_float64(nx, rows, sh.hidden, got.residual, next_y);
    }
    expect_launches(to_host(sync, s.get()), arrivals);
  }
  EXPECT_EQ(to_host(flag, s.get())[0], 0);
}

// Two layers' blocks in one graph, as the model runs them: block 1 also runs layer 2's GEMV, from
// the residual and squares it leaves; block 2 reads them. Replayed three times on fresh inputs,
// eager chains as the reference; the cooperative launch the model uses.
TEST_F(StreamMlpNextGpu, GraphOfTwoLayersReplaysOnFreshInputs) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  const int h = 2048, inter = 8192, rows = 1, n = 3072;
  const MlpWeights w1 = make_weights(rng, h, inter, s.get()),
                   w2 = make_weights(rng, h, inter, s.get());
  DeviceBuffer<std::uint32_t> sync1 = zeroed<std::uint32_t>(kStreamMlpSyncWords, s.get()),
                              sync2 = zeroed<std::uint32_t>(kStreamMlpSyncWords, s.get());
  DeviceBuffer<std::int32_t> flag = zeroed<std::int32_t>(1, s.get());
  Bits res = random_bits(rng, static_cast<std::size_t>(rows + 1) * h, false);
  Next nx = make_next(rng, h, n, rows, s.get());
  BlockBuffers b1, b2;
  make_block(dev, w1, rows, res, split_squares(res, rows, h, kParts), sync1, flag, b1, s.get());
  make_block(dev, w2, rows, res, split_squares(res, rows, h, kParts), sync2, flag, b2, s.get());
  attach(b1, nx);
  b1.args.cooperative = b2.args.cooperative = true;
  b2.args.x = b1.res.data();
  b2.args.residual = b1.res.data();
  b2.args.sum_sq_in = b1.sq_out.data();
  b2.args.parts = stream_mlp_grid(dev, h);
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
    nx.y.fill_bytes(0xff, s.get());
    graph.launch(s.get());
    const BlockOutputs want1 = run_chain(dev, w1, rows, res, sq_in, kParts, s.get());
    const BlockOutputs want2 = run_chain(
        dev, w2, rows, want1.residual, std::vector<float>(want1.sq.begin(), want1.sq.end() - rows),
        stream_mlp_grid(dev, h), s.get());
    ASSERT_NO_FATAL_FAILURE(expect_next_y(to_host(nx.y, s.get()),
                                          gemv_after(dev, nx, rows, h, want1, s.get()), rows, n));
    ASSERT_EQ(to_host(b2.y, s.get()), want2.y) << "block 2 y";
    ASSERT_EQ(to_host(b1.res, s.get()), want2.residual) << "the residual after both blocks";
  }
  expect_launches(to_host(sync1, s.get()), 2ull * 3 * stream_mlp_grid(dev, h));
  expect_launches(to_host(sync2, s.get()), 3ull * stream_mlp_grid(dev, h));
  EXPECT_EQ(to_host(flag, s.get())[0], 0);
}

TEST_F(StreamMlpNextGpu, BadArgumentsAreRefusedByName) {
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  const int h = 256, inter = 512, rows = 2, n = 64;
  DeviceBuffer<std::uint16_t> x(rows * h + 8), nw(h), gu(2 * inter * h), down(h * inter),
      act(rows * inter), y(rows * h), wn(n * h), ny(rows * n + 8);
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
  ok.residual = x.data();
  ok.sum_sq_out = sq.data();
  ok.sync = sync.data();
  ok.rows = rows;
  ok.hidden = h;
  ok.inter = inter;
  ok.w_next = wn.data();
  ok.next_norm_weight = nw.data();
  ok.next_y = ny.data();
  ok.next_n = n;
  const auto field = [&](auto edit) {
    StreamMlpArgs a = ok;
    edit(a);
    return field_of([&] { stream_mlp(dev, a, s.get()); });
  };
  EXPECT_EQ(field([](StreamMlpArgs& a) { a.next_n = 12; }), "next_n");
  EXPECT_EQ(field([](StreamMlpArgs& a) { a.next_n = 0; }), "next_n");
  EXPECT_EQ(field([](StreamMlpArgs& a) { a.w_next = nullptr; }), "w_next");
  EXPECT_EQ(field([](StreamMlpArgs& a) { a.next_norm_weight = nullptr; }), "next_norm_weight");
  EXPECT_EQ(field([&](StreamMlpArgs& a) { a.next_y = ny.data() + 1; }), "next_y");
  EXPECT_EQ(field([](StreamMlpArgs& a) {
              a.residual = nullptr;
              a.sum_sq_out = nullptr;
            }),
            "residual");
  EXPECT_EQ(field([](StreamMlpArgs& a) { a.fma = true; }), "fma");
  GD_CUDA(cudaStreamSynchronize(s.get()));
}

}  // namespace
}  // namespace graphdecode
