// Streaming GEMV (rows <= 8): W through a shared-memory ring of bulk copies. See stream_gemv.h.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <string>

#include "common/align.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "common/pdl.cuh"
#include "engine/kernels/bf16_vec.cuh"
#include "engine/kernels/mbarrier.cuh"
#include "engine/kernels/stream_gemv.h"

namespace graphdecode {
namespace {

using detail::bf16_bits_to_float;
using detail::float_to_bf16_bits;
using detail::mbar_arrive;
using detail::mbar_arrive_expect_tx;
using detail::mbar_init;
using detail::mbar_wait;
using detail::round_bf16;

constexpr int kConsumerWarps = 8;
constexpr int kThreads = 32 * (1 + kConsumerWarps);  // warp 0 produces, warps 1..8 consume
constexpr int kConsumerThreads = 32 * kConsumerWarps;
constexpr int kTileRows = 8;  // W rows per tile: the mma's n
// k per stage and W row (Params::chunk_k), chosen per launch: the widest of kChunkKs up to the cap
// that k needs and that leaves kMinStages stages beside x. Alone, wider stages stream faster
// (bench_gemm, H200: 1B down 12.14 / 11.09 / 10.81 us at 1024 / 2048 / 4096, gate_up 22.35 ->
// 19.39, lm_head 153.2 -> 131.5; 8B qkv 17.05 -> 14.48), but in a decode step the 1B step was
// 6-8 us slower at 2048 than at 1024 (B = 1, L = 1024, twice; equal at B = 2-8), so the cap stays
// at 1024 (bench/results/h200_stream_gemv_chunk_2026-11-27.txt).
// GRAPHDECODE_GEMV_CHUNK=1024|2048|4096 sets the cap (A/B runs).
constexpr int kChunkKs[] = {4096, 2048, 1024};
constexpr int kDefaultMaxChunkK = 1024;
constexpr int kMinStages = 3;
constexpr int kRowPad = 16;    // bytes after each staged row: the 8 rows a warp reads hit
                               // different banks (a row is a multiple of 128 bytes otherwise)
constexpr int kMaxStages = 8;  // barrier slots (8 x 16.1 KiB in flight per SM at chunk 1024)
constexpr int kRedFloats = kConsumerWarps * kSkinnyMaxRows * kTileRows;
// Shared memory: [full, empty barriers: kMaxStages each][partials: 2 x kRedFloats][x rows][ring]
constexpr int kBarrierBytes = 2 * kMaxStages * 8;
constexpr int kRedBytes = 2 * kRedFloats * 4;
constexpr int kFixedBytes = kBarrierBytes + kRedBytes;

struct Params {
  const std::uint16_t* x;  // [rows][k]
  const std::uint16_t* w;  // [n][k]
  void* y;                 // [rows][n]
  std::int32_t rows, k, n;
  std::int32_t tiles;            // ceil(n / 8)
  std::int32_t chunk_k;          // k per stage and W row (one of kChunkKs)
  std::int32_t stage_row_bytes;  // 2 chunk_k + kRowPad
  std::int32_t stage_bytes;      // kTileRows stage rows
  std::int32_t chunks;           // ceil(k / chunk_k): stages per tile
  std::int32_t stages;           // ring depth, 2..kMaxStages
  std::int32_t x_row_bytes;      // 2k + kRowPad
  bool out_f32;
  // StreamGemvFusion (stream_gemv.h): epilogue residual add + per-CTA squares, prologue norm.
  std::uint16_t* residual;      // [rows][n] or nullptr
  float* sum_sq_out;            // [gridDim.x][rows]
  const std::uint16_t* norm_w;  // [k] or nullptr
  const float* sum_sq_in;       // [parts][rows]
  std::int32_t parts;
  float eps;
};

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

__global__ void __launch_bounds__(kThreads, 1)
    stream_gemv_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(smem);
  std::uint64_t* empty = full + kMaxStages;
  float* red = reinterpret_cast<float*>(smem + kBarrierBytes);
  unsigned char* xs = smem + kFixedBytes;
  unsigned char* ring = xs + p.rows * p.x_row_bytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tb = static_cast<int>(static_cast<std::int64_t>(blockIdx.x) * p.tiles / gridDim.x);
  const int te = static_cast<int>(static_cast<std::int64_t>(blockIdx.x + 1) * p.tiles / gridDim.x);
  const int items = (te - tb) * p.chunks;

  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == 0) {  // producer: item i = (tile tb + i / chunks, chunk i % chunks) into stage i % S
    for (int i = 0; i < items; ++i) {
      // W depends on no kernel of the step: the ring's first fill runs before the wait for the
      // kernel before this one; then wait (so this CTA triggers only after it, pdl.cuh's promise).
      if (i == p.stages) {
        pdl_wait_for_prior_grid();
        pdl_launch_dependents();
      }
      const int s = i % p.stages;
      const int tile = tb + i / p.chunks, c = i % p.chunks;
      const int valid = min(kTileRows, p.n - tile * kTileRows);
      const int kc = min(p.chunk_k, p.k - c * p.chunk_k);
      if (lane == 0) {
        mbar_wait(&empty[s], ((i / p.stages) & 1) ^ 1);  // released by the consumers
        mbar_arrive_expect_tx(&full[s], static_cast<std::uint32_t>(valid * kc * 2));
      }
      __syncwarp();
      if (lane < valid)
        bulk_copy(ring + s * p.stage_bytes + lane * p.stage_row_bytes,
                  p.w + static_cast<std::size_t>(tile * kTileRows + lane) * p.k + c * p.chunk_k,
                  static_cast<std::uint32_t>(kc * 2), &full[s]);
    }
    if (items <= p.stages) {  // the loop never reached the wait
      pdl_wait_for_prior_grid();
      pdl_launch_dependents();
    }
    return;
  }

  // Consumers: x into shared memory once (after the wait: the kernel before may write it).
  const int cw = warp - 1, ct = threadIdx.x - 32;
  const int xch = p.k / 8;  // 16-byte chunks per x row
  // The norm's weight depends on no kernel of the step: pulled into L2 before the wait, so the
  // staging after it waits on L2, not DRAM, for it.
  if (p.norm_w != nullptr)
    for (int ch = ct; ch < xch; ch += kConsumerThreads)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(p.norm_w + ch * 8));
  pdl_wait_for_prior_grid();
  pdl_launch_dependents();
  if (p.norm_w == nullptr) {
    for (int idx = ct; idx < p.rows * xch; idx += kConsumerThreads) {
      const int r = idx / xch, ch = idx - r * xch;
      *reinterpret_cast<uint4*>(xs + r * p.x_row_bytes + ch * 16) =
          *reinterpret_cast<const uint4*>(p.x + static_cast<std::size_t>(r) * p.k + ch * 8);
    }
  } else {
    // Row r's inverse RMS from the parts' sums (warp r: lanes stride the parts, then a fixed
    // xor tree), into red[r]; red is free until the first tile's partials (after the sync below).
    if (cw < p.rows) {
      float ss = 0.f;
      for (int c = lane; c < p.parts; c += 32) ss += p.sum_sq_in[c * p.rows + cw];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) red[cw] = rsqrtf(ss / static_cast<float>(p.k) + p.eps);
    }
    consumers_sync();
    for (int idx = ct; idx < p.rows * xch; idx += kConsumerThreads) {
      const int r = idx / xch, ch = idx - r * xch;
      const float inv_rms = red[r];
      const uint4 xv =
          *reinterpret_cast<const uint4*>(p.x + static_cast<std::size_t>(r) * p.k + ch * 8);
      const uint4 wv = *reinterpret_cast<const uint4*>(p.norm_w + ch * 8);
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
      *reinterpret_cast<uint4*>(xs + r * p.x_row_bytes + ch * 16) =
          make_uint4(out[0], out[1], out[2], out[3]);
    }
  }
  consumers_sync();

  const int g = lane >> 2, t = lane & 3;  // mma: W row (B column) and x row (A row) g, k quarter t
  const bool x_row = g < p.rows;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  float sq = 0.f;  // epilogue: this thread's (row, column of 8) squares of the new residual
  // The ring stage s of the next item and its barrier phase, counted: dividing the item index by
  // the runtime ring depth at every stage was a dependent chain on every warp's path.
  int s = 0;
  std::uint32_t phase = 0;
  for (int tile = tb; tile < te; ++tile) {
    // D[x row g][W rows 2t, 2t + 1] in four independent partial sums (a step's two mmas, and
    // even / odd steps), added in a fixed order after the tile: a single accumulator chained
    // every mma of a stage (the consumers' main stall at B = 1 was that fixed-latency wait).
    float acc[4][2] = {{0.f, 0.f}, {0.f, 0.f}, {0.f, 0.f}, {0.f, 0.f}};
    for (int c = 0; c < p.chunks; ++c) {
      const int nch = min(p.chunk_k, p.k - c * p.chunk_k) / 8;  // 16-byte chunks of the stage rows
      mbar_wait(&full[s], phase);
      const unsigned char* wrow = ring + s * p.stage_bytes + g * p.stage_row_bytes;
      const unsigned char* xrow = xs + g * p.x_row_bytes + c * p.chunk_k * 2;
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
      if (lane == 0) mbar_arrive(&empty[s]);  // this warp is done with stage s
      if (++s == p.stages) {
        s = 0;
        phase ^= 1u;
      }
    }
    const float acc0 = (acc[0][0] + acc[1][0]) + (acc[2][0] + acc[3][0]);
    const float acc1 = (acc[0][1] + acc[1][1]) + (acc[2][1] + acc[3][1]);
    // The tile's 8 warp partials, summed in a fixed order (bitwise reproducible). The partial
    // buffers alternate by tile, so one barrier per tile suffices (as skinny_gemm.cu).
    float* part = red + ((tile - tb) & 1) * kRedFloats;  // [warp][x row][W row]
    *reinterpret_cast<float2*>(part + (cw * kSkinnyMaxRows + g) * kTileRows + 2 * t) =
        make_float2(acc0, acc1);
    consumers_sync();
    if (ct < kSkinnyMaxRows * kTileRows) {
      const int m = ct / kTileRows, col = tile * kTileRows + ct % kTileRows;
      if (m < p.rows && col < p.n) {
        float sum = 0.f;
        for (int q = 0; q < kConsumerWarps; ++q)
          sum += part[(q * kSkinnyMaxRows + m) * kTileRows + ct % kTileRows];
        const std::size_t at = static_cast<std::size_t>(m) * p.n + col;
        if (p.out_f32) {
          static_cast<float*>(p.y)[at] = sum;
        } else {
          const std::uint16_t yb = float_to_bf16_bits(sum);
          static_cast<std::uint16_t*>(p.y)[at] = yb;
          if (p.residual != nullptr) {  // as rmsnorm_kernel's add: bf16(residual + bf16 y)
            const float r = round_bf16(bf16_bits_to_float(p.residual[at]) + bf16_bits_to_float(yb));
            p.residual[at] = float_to_bf16_bits(r);
            sq += r * r;
          }
        }
      }
    }
  }
  if (p.residual != nullptr && ct < kSkinnyMaxRows * kTileRows) {
    // Threads ct = 8 m + c (two whole warps) hold row m's squares by column c: a fixed xor tree
    // over the 8 lanes of the row, then this CTA's part.
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
    const int m = ct / kTileRows;
    if (ct % kTileRows == 0 && m < p.rows) p.sum_sq_out[blockIdx.x * p.rows + m] = sq;
  }
}

// Bytes of shared memory for x of `rows` rows and the fixed part; the ring gets the rest.
std::int64_t fixed_and_x_bytes(std::int32_t rows, std::int32_t k) {
  return kFixedBytes + static_cast<std::int64_t>(rows) * (2LL * k + kRowPad);
}

std::int64_t stage_bytes(std::int32_t chunk_k) {
  return kTileRows * (2LL * chunk_k + kRowPad);
}

std::int32_t ring_stages(const SkinnyGemmDevice& dev, std::int32_t rows, std::int32_t k,
                         std::int32_t chunk_k) {
  const std::int64_t left = dev.max_smem - fixed_and_x_bytes(rows, k);
  return static_cast<std::int32_t>(
      std::clamp<std::int64_t>(left / stage_bytes(chunk_k), 0, kMaxStages));
}

// GRAPHDECODE_GEMV_CHUNK (1024, 2048 or 4096) when the process first asks, else kDefaultMaxChunkK.
std::int32_t max_chunk_k() {
  static const std::int32_t cap = [] {
    const char* v = std::getenv("GRAPHDECODE_GEMV_CHUNK");
    const long c = v != nullptr ? std::strtol(v, nullptr, 10) : 0;
    for (const int known : kChunkKs)
      if (c == known) return known;
    return kDefaultMaxChunkK;
  }();
  return cap;
}

// The widest chunk <= max_chunk_k() that k needs (never wider than k rounded up to 1024) and that
// leaves kMinStages stages; else the narrowest (whose stage count stream_gemv_supported checks).
std::int32_t chunk_k_for(const SkinnyGemmDevice& dev, std::int32_t rows, std::int32_t k) {
  for (const int c : kChunkKs) {
    if (c > max_chunk_k() || (c > 1024 && c / 2 >= k)) continue;
    if (ring_stages(dev, rows, k, c) >= kMinStages) return c;
  }
  return kChunkKs[std::size(kChunkKs) - 1];
}

std::int32_t ring_stages(const SkinnyGemmDevice& dev, std::int32_t rows, std::int32_t k) {
  return ring_stages(dev, rows, k, chunk_k_for(dev, rows, k));
}

}  // namespace

bool stream_gemv_supported(const SkinnyGemmDevice& dev, std::int32_t rows, std::int32_t k) {
  return rows >= 1 && rows <= kSkinnyMaxRows && k > 0 && k % 8 == 0 &&
         ring_stages(dev, rows, k) >= 2;
}

std::int32_t stream_gemv_grid(const SkinnyGemmDevice& dev, std::int32_t n) {
  GD_REQUIRE(n > 0, "n", n, "must be positive");
  return std::min(dev.sm_count, (n + kTileRows - 1) / kTileRows);
}

void stream_gemv(const SkinnyGemmDevice& dev, const SkinnyGemmArgs& a, cudaStream_t stream,
                 const StreamGemvFusion& f) {
  require_skinny_args(dev, a, "stream GEMV", stream_gemv_supported(dev, a.rows, a.k),
                      "x and two stages do not fit in shared memory");
  if (f.residual != nullptr) {
    GD_REQUIRE(!a.out_f32, "out_f32", "true", "the residual epilogue writes bf16 outputs only");
    GD_REQUIRE(f.sum_sq_out != nullptr, "sum_sq_out", "nullptr",
               "the residual epilogue leaves its squares there");
  }
  if (f.norm_weight != nullptr) {
    GD_REQUIRE(aligned16(f.norm_weight), "norm_weight", f.norm_weight, "must be 16-byte aligned");
    GD_REQUIRE(f.sum_sq_in != nullptr, "sum_sq_in", "nullptr",
               "the norm prologue reads the residual's squares there");
    GD_REQUIRE(f.parts >= 1 && f.parts <= dev.sm_count, "parts", f.parts,
               "must be the grid of the GEMV that left the squares (1.." +
                   std::to_string(dev.sm_count) + ")");
    GD_REQUIRE(f.eps > 0.f, "eps", f.eps, "must be positive");
  }
  // The opt-in limit once per process (one device: the engine's model).
  static const bool opted_in = [&] {
    GD_CUDA(cudaFuncSetAttribute(stream_gemv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 dev.max_smem));
    return true;
  }();
  static_cast<void>(opted_in);
  Params p{};
  p.x = a.x;
  p.w = a.w;
  p.y = a.y;
  p.rows = a.rows;
  p.k = a.k;
  p.n = a.n;
  p.tiles = (a.n + kTileRows - 1) / kTileRows;
  p.chunk_k = chunk_k_for(dev, a.rows, a.k);
  p.stage_row_bytes = 2 * p.chunk_k + kRowPad;
  p.stage_bytes = kTileRows * p.stage_row_bytes;
  p.chunks = (a.k + p.chunk_k - 1) / p.chunk_k;
  p.stages = ring_stages(dev, a.rows, a.k, p.chunk_k);
  p.x_row_bytes = 2 * a.k + kRowPad;
  p.out_f32 = a.out_f32;
  p.residual = f.residual;
  p.sum_sq_out = f.sum_sq_out;
  p.norm_w = f.norm_weight;
  p.sum_sq_in = f.sum_sq_in;
  p.parts = f.parts;
  p.eps = f.eps;
  const std::size_t smem = static_cast<std::size_t>(fixed_and_x_bytes(a.rows, a.k)) +
                           static_cast<std::size_t>(p.stages) * p.stage_bytes;
  const int grid = stream_gemv_grid(dev, a.n);
  launch_pdl(stream_gemv_kernel, dim3(static_cast<unsigned>(grid)), dim3(kThreads), smem, stream,
             p);
}

}  // namespace graphdecode
