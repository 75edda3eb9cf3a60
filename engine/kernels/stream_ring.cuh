// The device pieces of the kernels that stream W through a shared-memory ring at rows <= 8: the
// stream GEMV (stream_gemv.cu) and the MLP block that runs gate_up, SwiGLU and down in one grid
// (stream_mlp.cu). Both have the same CTA: a producer warp that fills the ring with bulk copies
// (one per W row of a stage, completion counted on the stage's `full` mbarrier) and 8 consumer
// warps that multiply each stage by x staged once in shared memory and release it on `empty`.
// Sharing the tile code keeps the two kernels' outputs bitwise equal: a tile's sum depends only
// on its W rows, x and this code, not on which kernel or CTA runs it.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "engine/kernels/bf16_vec.cuh"
#include "engine/kernels/mbarrier.cuh"
#include "engine/kernels/skinny_gemm.h"  // kSkinnyMaxRows

namespace graphdecode::detail::ring {

constexpr int kConsumerWarps = 8;
constexpr int kThreads = 32 * (1 + kConsumerWarps);  // warp 0 produces, warps 1..8 consume
constexpr int kConsumerThreads = 32 * kConsumerWarps;
constexpr int kTileRows = 8;   // W rows per tile: the mma's n
constexpr int kRowPad = 16;    // bytes after each staged row: the 8 rows a warp reads hit
                               // different banks (a row is a multiple of 128 bytes otherwise)
constexpr int kMaxStages = 8;  // barrier slots (8 x 16.1 KiB in flight per SM at chunk 1024)
constexpr int kRedFloats = kConsumerWarps * kSkinnyMaxRows * kTileRows;
// Shared memory: [full, empty barriers: kMaxStages each][partials: 2 x kRedFloats][x rows][ring]
constexpr int kBarrierBytes = 2 * kMaxStages * 8;
constexpr int kRedBytes = 2 * kRedFloats * 4;
constexpr int kFixedBytes = kBarrierBytes + kRedBytes;
// Threads that finish a tile: thread ct = 8 m + c sums x row m, column c of the tile.
constexpr int kTileCells = kSkinnyMaxRows * kTileRows;

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
// bytes (a multiple of 16) from global src to shared dst (both 16-byte aligned), counted on bar.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, std::uint32_t bytes,
                                          std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
// The consumer warps' barrier (the producer warp is not part of it).
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
}

// (c0, c1) += A * B for m16n8k16 (bf16, fp32 accumulate); A rows 8..15 zero (as skinny_gemm.cu).
__device__ __forceinline__ void mma(float& c0, float& c1, std::uint32_t a01, std::uint32_t a45,
                                    std::uint32_t b01, std::uint32_t b23) {
  float c2 = 0.f, c3 = 0.f;
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %5}, "
      "{%7, %8}, {%0, %1, %2, %3};"
      : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
      : "r"(a01), "r"(0u), "r"(a45), "r"(b01), "r"(b23));
}

// The ring's barriers, made by thread 0 for `stages` stages (full: the producer's one arrival
// and the copies' bytes; empty: one arrival per consumer warp), then the whole CTA's barrier.
__device__ __forceinline__ void init_ring(std::uint64_t* full, std::uint64_t* empty, int stages) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

// The ring's geometry for one launch: stages of kTileRows W rows x chunk_k of k.
struct RingShape {
  std::int32_t chunk_k;          // k per stage and W row
  std::int32_t stage_row_bytes;  // 2 chunk_k + kRowPad
  std::int32_t stage_bytes;      // kTileRows stage rows
  std::int32_t stages;           // ring depth, 2..kMaxStages
};

// The producer's side of one item: waits until the consumers released stage item % stages, arms
// its barrier for `valid` rows of kc k and copies them from w (row stride
// k elements, starting at row0 and k offset k0). Warp-wide (lane 0 arms, lanes < valid copy).
// With stage_tag, stage_tag[stage] = tag first: what the stage holds, for consumers that learn it
// from the ring (read after their wait on the stage's full barrier).
__device__ __forceinline__ void produce_item(const RingShape& r, unsigned char* ring,
                                             std::uint64_t* full, std::uint64_t* empty, int item,
                                             const std::uint16_t* w, std::int64_t k, int row0,
                                             int valid, int k0, int kc, int lane,
                                             int* stage_tag = nullptr, int tag = 0) {
  const int s = item % r.stages;
  // Every lane that copies waits for the release itself (so each copy is ordered after the
  // consumers' reads by its own acquire, not through lane 0 and __syncwarp, which racecheck does
  // not follow: 2.5M hazards reported on stream_ring's reads otherwise).
  if (lane < valid || lane == 0)
    mbar_wait(&empty[s], ((item / r.stages) & 1) ^ 1);  // released by the consumers
  if (lane == 0) {
    if (stage_tag != nullptr) stage_tag[s] = tag;  // published by the arrive (release)
    mbar_arrive_expect_tx(&full[s], static_cast<std::uint32_t>(valid * kc * 2));
  }
  __syncwarp();
  if (lane < valid)
    bulk_copy(ring + s * r.stage_bytes + lane * r.stage_row_bytes,
              w + static_cast<std::size_t>(row0 + lane) * k + k0,
              static_cast<std::uint32_t>(kc * 2), &full[s]);
}

// The consumers' position in the ring: the stage of the next item and its barrier phase, counted
// (dividing the item index by the runtime ring depth at every stage was a dependent chain on
// every warp's path).
struct RingCursor {
  int s = 0;
  std::uint32_t phase = 0;
  __device__ __forceinline__ void advance(int stages) {
    if (++s == stages) {
      s = 0;
      phase ^= 1u;
    }
  }
};

// x [rows][k] (row stride k elements) into xs (row stride x_row_bytes), by the consumer thread
// ct. With norm_w set, as rmsnorm(x) (stream_gemv.h StreamGemvFusion's prologue): row r's inverse
// RMS from the parts' sums (warp r: lanes stride the parts, then a fixed xor tree) into red[r]
// first. `load` reads 16 bytes of x (a plain load, or an L2-only one for data other CTAs of the
// same grid wrote). Ends with the consumers' barrier.
template <typename Load16>
__device__ __forceinline__ void stage_x(unsigned char* xs, int x_row_bytes, const std::uint16_t* x,
                                        int rows, int k, const std::uint16_t* norm_w,
                                        const float* sum_sq_in, int parts, float eps, float* red,
                                        int cw, int lane, int ct, Load16 load) {
  const int xch = k / 8;  // 16-byte chunks per x row
  if (norm_w == nullptr) {
    for (int idx = ct; idx < rows * xch; idx += kConsumerThreads) {
      const int r = idx / xch, ch = idx - r * xch;
      *reinterpret_cast<uint4*>(xs + r * x_row_bytes + ch * 16) =
          load(x + static_cast<std::size_t>(r) * k + ch * 8);
    }
  } else {
    if (cw < rows) {
      float ss = 0.f;
      for (int c = lane; c < parts; c += 32) ss += sum_sq_in[c * rows + cw];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) red[cw] = rsqrtf(ss / static_cast<float>(k) + eps);
    }
    consumers_sync();
    for (int idx = ct; idx < rows * xch; idx += kConsumerThreads) {
      const int r = idx / xch, ch = idx - r * xch;
      const float inv_rms = red[r];
      const uint4 xv = load(x + static_cast<std::size_t>(r) * k + ch * 8);
      const uint4 wv = *reinterpret_cast<const uint4*>(norm_w + ch * 8);
      const std::uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w}, ww[4] = {wv.x, wv.y, wv.z, wv.w};
      std::uint32_t out[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        std::uint32_t packed = 0;
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // as rmsnorm_kernel: w * bf16(v * inv_rms), then bf16
          const auto xb = static_cast<std::uint16_t>(xw[i] >> (16 * h));
          const auto wb = static_cast<std::uint16_t>(ww[i] >> (16 * h));
          const float o = bf16_bits_to_float(wb) * round_bf16(bf16_bits_to_float(xb) * inv_rms);
          packed |= static_cast<std::uint32_t>(float_to_bf16_bits(o)) << (16 * h);
        }
        out[i] = packed;
      }
      *reinterpret_cast<uint4*>(xs + r * x_row_bytes + ch * 16) =
          make_uint4(out[0], out[1], out[2], out[3]);
    }
  }
  consumers_sync();
}

// One tile's products: the `chunks` stages of its kTileRows W rows (k in total) times x, by the
// consumer warp cw; lane (g, t) gets D[x row g][W rows 2t, 2t + 1] as (acc0, acc1). Four
// independent partial sums (a step's two mmas, even / odd steps) added in a fixed order after
// the tile: a single accumulator chained every mma of a stage (the consumers' main stall at
// B = 1 was that fixed-latency wait). Each stage is released on `empty` once this warp is done.
// The order depends on chunk_k only through the steps' k, so any chunk_k that is a multiple of
// 2 x kConsumerWarps x 32 gives the same bits.
__device__ __forceinline__ void tile_products(const RingShape& r, const unsigned char* ring,
                                              std::uint64_t* full, std::uint64_t* empty,
                                              RingCursor& cur, const unsigned char* xs,
                                              int x_row_bytes, int k, int chunks, int cw, int lane,
                                              bool x_row, float& acc0, float& acc1) {
  const int g = lane >> 2, t = lane & 3;  // mma: W row (B column) and x row (A row) g, k quarter t
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  float acc[4][2] = {{0.f, 0.f}, {0.f, 0.f}, {0.f, 0.f}, {0.f, 0.f}};
  for (int c = 0; c < chunks; ++c) {
    const int nch = min(r.chunk_k, k - c * r.chunk_k) / 8;  // 16-byte chunks of the stage rows
    mbar_wait(&full[cur.s], cur.phase);
    const unsigned char* wrow = ring + cur.s * r.stage_bytes + g * r.stage_row_bytes;
    const unsigned char* xrow = xs + g * x_row_bytes + c * r.chunk_k * 2;
    // Steps of 4 chunks (one per t) over the stage's k, dealt round robin to the 8 warps. The
    // same chunk index feeds A and B: k permuted alike, so each fragment is one 16-byte chunk.
    // The mma is warp-wide: lanes past the stage's last chunk multiply zeros instead.
    const auto product = [&](int step, float(&lo)[2], float(&hi)[2]) {
      const int ch = step * 4 + t;
      const bool in = ch < nch;
      const uint4 b = in ? *reinterpret_cast<const uint4*>(wrow + ch * 16) : zero;
      const uint4 a = in && x_row ? *reinterpret_cast<const uint4*>(xrow + ch * 16) : zero;
      mma(lo[0], lo[1], a.x, a.y, b.x, b.y);
      mma(hi[0], hi[1], a.z, a.w, b.z, b.w);
    };
    for (int step = cw; step * 4 < nch; step += 2 * kConsumerWarps) {
      product(step, acc[0], acc[1]);
      if ((step + kConsumerWarps) * 4 < nch) product(step + kConsumerWarps, acc[2], acc[3]);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[cur.s]);  // this warp is done with stage s
    cur.advance(r.stages);
  }
  acc0 = (acc[0][0] + acc[1][0]) + (acc[2][0] + acc[3][0]);
  acc1 = (acc[0][1] + acc[1][1]) + (acc[2][1] + acc[3][1]);
}

// The tile's 8 warp partials summed in a fixed order (bitwise reproducible): every consumer
// stores its (acc0, acc1), then thread ct < kTileCells returns the sum of x row ct / kTileRows,
// tile column ct % kTileRows (others return 0). The partial buffers alternate by `parity`, so one
// barrier per tile suffices (as skinny_gemm.cu).
__device__ __forceinline__ float tile_sum(float* red, int parity, int cw, int lane, int ct,
                                          float acc0, float acc1) {
  const int g = lane >> 2, t = lane & 3;
  float* part = red + parity * kRedFloats;  // [warp][x row][W row]
  *reinterpret_cast<float2*>(part + (cw * kSkinnyMaxRows + g) * kTileRows + 2 * t) =
      make_float2(acc0, acc1);
  consumers_sync();
  float sum = 0.f;
  if (ct < kTileCells) {
    const int m = ct / kTileRows;
    for (int q = 0; q < kConsumerWarps; ++q)
      sum += part[(q * kSkinnyMaxRows + m) * kTileRows + ct % kTileRows];
  }
  return sum;
}

// The residual epilogue of one output (StreamGemvFusion): residual[at] = bf16(old + y), old the
// residual's value there, as rmsnorm_kernel's add rounds; returns the new residual's square for
// the CTA's sum.
__device__ __forceinline__ float add_residual(std::uint16_t* residual, std::size_t at,
                                              std::uint16_t old, std::uint16_t yb) {
  const float r = round_bf16(bf16_bits_to_float(old) + bf16_bits_to_float(yb));
  residual[at] = float_to_bf16_bits(r);
  return r * r;
}

// The residual entries a thread's epilogue adds to in its CTA's first kAheadTiles tiles (tiles
// t0, t0 + 1, .. of 8 columns; thread ct < kTileCells takes row ct / 8, column ct % 8), read
// once before the tiles' products. Read after each tile's sum, the load was a global round trip
// on warp 0's path every tile (~0.5-1 us under the stream's load), which the other consumers then
// waited for at the next tile's barrier. A CTA past kAheadTiles tiles reads the rest in place.
// Only this CTA writes these entries in the grid; the caller reads after its PDL wait.
constexpr int kAheadTiles = 4;
struct ResidualAhead {
  std::uint16_t v[kAheadTiles] = {};
  __device__ __forceinline__ void load(const std::uint16_t* residual, int rows, int n, int t0,
                                       int t1, int ct) {
    const int m = ct / kTileRows;
    if (residual == nullptr || ct >= kTileCells || m >= rows) return;
#pragma unroll
    for (int i = 0; i < kAheadTiles; ++i) {
      const int col = (t0 + i) * kTileRows + ct % kTileRows;
      if (t0 + i < t1 && col < n) v[i] = residual[static_cast<std::size_t>(m) * n + col];
    }
  }
  // residual[at] += yb for the CTA's tile i (0-based), as add_residual.
  __device__ __forceinline__ float add(std::uint16_t* residual, std::size_t at, int i,
                                       std::uint16_t yb) const {
    std::uint16_t old = 0;
    bool ahead = false;
#pragma unroll
    for (int j = 0; j < kAheadTiles; ++j)  // a select chain: v stays in registers
      if (j == i) {
        old = v[j];
        ahead = true;
      }
    if (!ahead) old = residual[at];
    return add_residual(residual, at, old, yb);
  }
};

// Threads ct = 8 m + c (two whole warps) hold row m's squares by column c: a fixed xor tree over
// the 8 lanes of the row, then this CTA's part sum_sq_out[cta][m].
__device__ __forceinline__ void store_squares(float sq, float* sum_sq_out, int rows, int ct) {
  if (ct >= kTileCells) return;
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
  const int m = ct / kTileRows;
  if (ct % kTileRows == 0 && m < rows) sum_sq_out[blockIdx.x * rows + m] = sq;
}

}  // namespace graphdecode::detail::ring
