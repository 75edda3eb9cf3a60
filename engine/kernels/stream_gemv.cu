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
#include "engine/kernels/stream_gemv.h"
#include "engine/kernels/stream_ring.cuh"

namespace graphdecode {
namespace {

using detail::float_to_bf16_bits;
using namespace detail::ring;  // the CTA's shape, the ring and the tile code (stream_ring.cuh)

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

struct Params {
  const std::uint16_t* x;  // [rows][k]
  const std::uint16_t* w;  // [n][k]
  void* y;                 // [rows][n]
  std::int32_t rows, k, n;
  std::int32_t tiles;        // ceil(n / 8)
  RingShape ring;            // stages of 8 W rows x ring.chunk_k
  std::int32_t chunks;       // ceil(k / chunk_k): stages per tile
  std::int32_t x_row_bytes;  // 2k + kRowPad
  bool out_f32;
  // StreamGemvFusion (stream_gemv.h): epilogue residual add + per-CTA squares, prologue norm.
  std::uint16_t* residual;      // [rows][n] or nullptr
  float* sum_sq_out;            // [gridDim.x][rows]
  const std::uint16_t* norm_w;  // [k] or nullptr
  const float* sum_sq_in;       // [parts][rows]
  std::int32_t parts;
  float eps;
};

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

  init_ring(full, empty, p.ring.stages);

  if (warp == 0) {  // producer: item i = (tile tb + i / chunks, chunk i % chunks) into stage i % S
    for (int i = 0; i < items; ++i) {
      // W depends on no kernel of the step: the ring's first fill runs before the wait for the
      // kernel before this one; then wait (so this CTA triggers only after it, pdl.cuh's promise).
      if (i == p.ring.stages) {
        pdl_wait_for_prior_grid();
        pdl_launch_dependents();
      }
      const int tile = tb + i / p.chunks, c = i % p.chunks;
      produce_item(p.ring, ring, full, empty, i, p.w, p.k, tile * kTileRows,
                   min(kTileRows, p.n - tile * kTileRows), c * p.ring.chunk_k,
                   min(p.ring.chunk_k, p.k - c * p.ring.chunk_k), lane);
    }
    if (items <= p.ring.stages) {  // the loop never reached the wait
      pdl_wait_for_prior_grid();
      pdl_launch_dependents();
    }
    return;
  }

  // Consumers: x into shared memory once (after the wait: the kernel before may write it).
  const int cw = warp - 1, ct = threadIdx.x - 32;
  // The norm's weight depends on no kernel of the step: pulled into L2 before the wait, so the
  // staging after it waits on L2, not DRAM, for it.
  if (p.norm_w != nullptr)
    for (int ch = ct; ch < p.k / 8; ch += kConsumerThreads)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(p.norm_w + ch * 8));
  pdl_wait_for_prior_grid();
  pdl_launch_dependents();
  ResidualAhead ahead;  // in flight while x is staged
  ahead.load(p.residual, p.rows, p.n, tb, te, ct);
  stage_x(xs, p.x_row_bytes, p.x, p.rows, p.k, p.norm_w, p.sum_sq_in, p.parts, p.eps, red, cw, lane,
          ct, [](const std::uint16_t* at) { return *reinterpret_cast<const uint4*>(at); });

  const bool x_row = (lane >> 2) < p.rows;
  float sq = 0.f;  // epilogue: this thread's (row, column of 8) squares of the new residual
  RingCursor cur;
  for (int tile = tb; tile < te; ++tile) {
    float acc0, acc1;
    tile_products(p.ring, ring, full, empty, cur, xs, p.x_row_bytes, p.k, p.chunks, cw, lane, x_row,
                  acc0, acc1);
    const float sum = tile_sum(red, (tile - tb) & 1, cw, lane, ct, acc0, acc1);
    if (ct < kTileCells) {
      const int m = ct / kTileRows, col = tile * kTileRows + ct % kTileRows;
      if (m < p.rows && col < p.n) {
        const std::size_t at = static_cast<std::size_t>(m) * p.n + col;
        if (p.out_f32) {
          static_cast<float*>(p.y)[at] = sum;
        } else {
          const std::uint16_t yb = float_to_bf16_bits(sum);
          static_cast<std::uint16_t*>(p.y)[at] = yb;
          if (p.residual != nullptr) sq += ahead.add(p.residual, at, tile - tb, yb);
        }
      }
    }
  }
  if (p.residual != nullptr) store_squares(sq, p.sum_sq_out, p.rows, ct);
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
  p.ring.chunk_k = chunk_k_for(dev, a.rows, a.k);
  p.ring.stage_row_bytes = 2 * p.ring.chunk_k + kRowPad;
  p.ring.stage_bytes = kTileRows * p.ring.stage_row_bytes;
  p.ring.stages = ring_stages(dev, a.rows, a.k, p.ring.chunk_k);
  p.chunks = (a.k + p.ring.chunk_k - 1) / p.ring.chunk_k;
  p.x_row_bytes = 2 * a.k + kRowPad;
  p.out_f32 = a.out_f32;
  p.residual = f.residual;
  p.sum_sq_out = f.sum_sq_out;
  p.norm_w = f.norm_weight;
  p.sum_sq_in = f.sum_sq_in;
  p.parts = f.parts;
  p.eps = f.eps;
  const std::size_t smem = static_cast<std::size_t>(fixed_and_x_bytes(a.rows, a.k)) +
                           static_cast<std::size_t>(p.ring.stages) * p.ring.stage_bytes;
  const int grid = stream_gemv_grid(dev, a.n);
  launch_pdl(stream_gemv_kernel, dim3(static_cast<unsigned>(grid)), dim3(kThreads), smem, stream,
             p);
}

}  // namespace graphdecode
