// Streaming GEMV (rows <= 8): W through a shared-memory ring of bulk copies. See stream_gemv.h.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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
using detail::mbar_arrive_expect_tx;
using detail::mbar_init;
using detail::mbar_wait;
using namespace detail::ring;  // the CTA's shape, the ring and the tile code (stream_ring.cuh)

// k per stage and W row (Params::chunk_k), chosen per launch: the widest of kChunkKs up to the cap
// that k needs and that leaves kMinStages stages beside x. Alone, wider stages stream faster
// (bench_gemm, H200: 1B down 12.14 / 11.09 / 10.81 us at 1024 / 2048 / 4096, gate_up 22.35 ->
// 19.39, lm_head 153.2 -> 131.5; 8B qkv 17.05 -> 14.48), but in a decode step only some gain, so
// the cap depends on k (stream_gemv_chunk_k):
// * 4096 for k in [kWideChunkMinK, kWideChunkEndK), the 8B's qkv and o (k 4096). t181, 8B step
//   L = 1024, cap 1024 / 2048 / 4096, two rounds: B = 1 4517.0, 4513.5 / 4458.2, 4458.9 / 4426.8 us
//   (-2.0%), B = 4 4687.5, 4686.3 / 4635.1, 4626.4 / 4630.1 (-1.2%), B = 8 4839.2, 4841.3 /
//   4814.5, 4827.7 / 4820.8 (-0.4%; at 8 rows x leaves room for 2048-wide stages only);
// * 1024 elsewhere. The 1B's qkv and o (k 2048) lost at 2048: t181 1B step B = 1 972.4 -> 989.3
//   us, B = 8 1104.2 -> 1138.4 (and 6-8 us at B = 1 in bench/results/
//   h200_stream_gemv_chunk_2026-11-27.txt); the 1B down (k 8192) lost 1-8 us at B = 1-4 at 2048
//   and 4096 (t24, h200_gemv_chunk_long_2026-11-27.txt). Longer k is unmeasured and stays at 1024.
// GRAPHDECODE_GEMV_CHUNK=1024|2048|4096 sets one cap for every k instead (A/B runs and tests).
constexpr int kChunkKs[] = {4096, 2048, 1024};
constexpr int kNarrowChunkK = 1024;
constexpr int kWideChunkK = 4096;
constexpr int kWideChunkMinK = 4096;
constexpr int kWideChunkEndK = 8192;
constexpr int kMinStages = 3;

// How the consumers stage x. kXLoads: one 16-byte load a thread at a time (the compiler does not
// hoist the next load over the store to xs, so a thread's chunks are serial L2 round trips).
// kXMulticast (GEMVs without the norm prologue): CTA pairs of a cluster each bulk-copy half of x,
// multicast to both, so the L2 serves each byte of x once a pair, not once a CTA (at B = 8 the
// down projection's x is 131 KB a CTA). bench/NOTES.md 122, t158, 1B graph us, loads /
// multicast everywhere: B = 8 L = 1024 1138.4 -> 1113.6 (-1.8%; the down GEMV 14.1 -> 13.4 us a
// layer), B = 4 1053.5 -> 1047.0 (-0.5%), B = 1 972.3 -> 992.5 (+2.0%: the cluster's start, for an
// x of 4 KB), hence the rule of kMulticastMinRows rows. Eight loads a thread in flight instead
// (each CTA from its own offset) lost 4-9% at B = 1-8. The default since NOTES 123 (t163, loads /
// from 4 rows: B = 8 1120.5 -> 1102.6 us, B = 1 equal); GRAPHDECODE_GEMV_X (x_choice_from_env)
// forces one way for A/B runs and tests.
enum XMode : int { kXLoads = 0, kXMulticast = 1 };
constexpr int kMulticastMinRows = 4;
constexpr int kXPieceBytes = 4096;  // a multicast piece of an x row
constexpr int kXBarBytes = 16;      // the multicast's x barrier, after the ring
constexpr int kXClusters = 2;       // CTAs that share x

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

__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// bytes from global src to shared dst in every CTA of the cluster in cta_mask (the same offset in
// each), counted on the barrier at bar's offset in each.
__device__ __forceinline__ void bulk_copy_multicast(void* dst, const void* src, std::uint32_t bytes,
                                                    std::uint64_t* bar, std::uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1], %2, [%3], %4;" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "h"(cta_mask)
      : "memory");
}

// x into every CTA of the pair (XMode kXMulticast): after the cluster's barrier (the peer's x
// barrier is initialized), the first consumer warp arms this CTA's x barrier for all of x and its
// lanes copy the pieces of x's rows that fall to this CTA's rank, multicast to both; every
// consumer then waits on the barrier. Every thread that arrived on the cluster's barrier waits on
// it once, warp by warp: the compiler puts a warp-wide sync before the wait, so a wait by one lane
// would hang beside lanes spinning below (t157).
__device__ __forceinline__ void stage_x_multicast(unsigned char* xs, const Params& p,
                                                  std::uint64_t* xbar, int cw, int lane) {
  cluster_wait_acquire();  // every consumer warp: each thread that arrived waits once
  if (cw == 0) {
    std::uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    const int row_bytes = 2 * p.k;
    const int pieces = (row_bytes + kXPieceBytes - 1) / kXPieceBytes;
    if (lane == 0) mbar_arrive_expect_tx(xbar, static_cast<std::uint32_t>(p.rows * row_bytes));
    for (int i = static_cast<int>(rank) + kXClusters * lane; i < p.rows * pieces;
         i += kXClusters * 32) {
      const int r = i / pieces, off = (i - r * pieces) * kXPieceBytes;
      bulk_copy_multicast(xs + r * p.x_row_bytes + off,
                          reinterpret_cast<const unsigned char*>(p.x) +
                              static_cast<std::size_t>(r) * row_bytes + off,
                          static_cast<std::uint32_t>(min(kXPieceBytes, row_bytes - off)), xbar,
                          static_cast<std::uint16_t>((1u << kXClusters) - 1));
    }
  }
  mbar_wait(xbar, 0);
}

template <int kXMode>
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

  std::uint64_t* xbar = nullptr;  // kXMulticast: after the ring
  if constexpr (kXMode == kXMulticast) {
    xbar = reinterpret_cast<std::uint64_t*>(ring + p.ring.stages * p.ring.stage_bytes);
    if (threadIdx.x == 0) mbar_init(xbar, 1);  // fenced for the cluster by init_ring
  }
  init_ring(full, empty, p.ring.stages);
  if constexpr (kXMode == kXMulticast) cluster_arrive_release();

  if (warp == 0) {  // producer: item i = (tile tb + i / chunks, chunk i % chunks) into stage i % S
    for (int i = 0; i < items; ++i) {
      // W depends on no kernel of the step: the ring's first fill runs before the wait for the
      // kernel before this one; then wait (so this CTA triggers only after it, pdl.cuh's promise).
      // The multicast's cluster wait is here too, before the first wait on a consumer: racecheck
      // lets no wait on the cluster's barrier pass until every thread waits on it, so a producer
      // blocked on the ring beside consumers blocked there deadlocked it (t160-t162; not the GPU).
      if (i == p.ring.stages) {
        if constexpr (kXMode == kXMulticast) cluster_wait_acquire();
        pdl_wait_for_prior_grid();
        pdl_launch_dependents();
      }
      const int tile = tb + i / p.chunks, c = i % p.chunks;
      produce_item(p.ring, ring, full, empty, i, p.w, p.k, tile * kTileRows,
                   min(kTileRows, p.n - tile * kTileRows), c * p.ring.chunk_k,
                   min(p.ring.chunk_k, p.k - c * p.ring.chunk_k), lane);
    }
    if (items <= p.ring.stages) {  // the loop never reached the waits
      if constexpr (kXMode == kXMulticast) cluster_wait_acquire();
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
  if constexpr (kXMode == kXMulticast) {
    stage_x_multicast(xs, p, xbar, cw, lane);
  } else {
    stage_x(xs, p.x_row_bytes, p.x, p.rows, p.k, p.norm_w, p.sum_sq_in, p.parts, p.eps, red, cw,
            lane, ct, [](const std::uint16_t* at) { return *reinterpret_cast<const uint4*>(at); });
  }

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

// GRAPHDECODE_GEMV_CHUNK (1024, 2048 or 4096) when the process first asks, else 0 (the cap by k).
std::int32_t chunk_cap_from_env() {
  static const std::int32_t cap = [] {
    const char* v = std::getenv("GRAPHDECODE_GEMV_CHUNK");
    if (v == nullptr || v[0] == '\0') return 0;
    const long c = std::strtol(v, nullptr, 10);
    for (const int known : kChunkKs)
      if (c == known) return known;
    GD_REQUIRE(false, "GRAPHDECODE_GEMV_CHUNK", v, "must be 1024, 2048 or 4096");
    return 0;
  }();
  return cap;
}

std::int32_t chunk_cap(std::int32_t k) {
  if (const std::int32_t forced = chunk_cap_from_env(); forced > 0) return forced;
  return k >= kWideChunkMinK && k < kWideChunkEndK ? kWideChunkK : kNarrowChunkK;
}

// The widest chunk <= chunk_cap(k) that k needs (never wider than k rounded up to 1024) and that
// leaves kMinStages stages; else the narrowest (whose stage count stream_gemv_supported checks).
std::int32_t chunk_k_for(const SkinnyGemmDevice& dev, std::int32_t rows, std::int32_t k) {
  const std::int32_t cap = chunk_cap(k);
  for (const int c : kChunkKs) {
    if (c > cap || (c > 1024 && c / 2 >= k)) continue;
    if (ring_stages(dev, rows, k, c) >= kMinStages) return c;
  }
  return kChunkKs[std::size(kChunkKs) - 1];
}

std::int32_t ring_stages(const SkinnyGemmDevice& dev, std::int32_t rows, std::int32_t k) {
  return ring_stages(dev, rows, k, chunk_k_for(dev, rows, k));
}

// GRAPHDECODE_GEMV_X when the process first asks: unset or "multicast": the multicast from
// kMulticastMinRows rows; "loads": kXLoads everywhere; "multicast-all": wherever it applies.
enum class XChoice { kLoads, kMulticastByRows, kMulticastAll };
XChoice x_choice_from_env() {
  static const XChoice choice = [] {
    const char* v = std::getenv("GRAPHDECODE_GEMV_X");
    if (v == nullptr || v[0] == '\0' || std::strcmp(v, "multicast") == 0)
      return XChoice::kMulticastByRows;
    if (std::strcmp(v, "loads") == 0) return XChoice::kLoads;
    GD_REQUIRE(std::strcmp(v, "multicast-all") == 0, "GRAPHDECODE_GEMV_X", v,
               "must be loads, multicast or multicast-all");
    return XChoice::kMulticastAll;
  }();
  return choice;
}

// Opts a kernel in to the device's shared memory, once per process and instantiation.
template <int kXMode>
void opt_in_smem(const SkinnyGemmDevice& dev) {
  static const bool opted_in = [&] {
    GD_CUDA(cudaFuncSetAttribute(stream_gemv_kernel<kXMode>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, dev.max_smem));
    return true;
  }();
  static_cast<void>(opted_in);
}

}  // namespace

bool stream_gemv_supported(const SkinnyGemmDevice& dev, std::int32_t rows, std::int32_t k) {
  return rows >= 1 && rows <= kSkinnyMaxRows && k > 0 && k % 8 == 0 &&
         ring_stages(dev, rows, k) >= 2;
}

std::int32_t stream_gemv_chunk_k(const SkinnyGemmDevice& dev, std::int32_t rows, std::int32_t k) {
  GD_REQUIRE(stream_gemv_supported(dev, rows, k), "k", k,
             "the stream GEMV does not take it at " + std::to_string(rows) + " rows");
  return chunk_k_for(dev, rows, k);
}

std::int32_t stream_gemv_grid(const SkinnyGemmDevice& dev, std::int32_t n) {
  GD_REQUIRE(n > 0, "n", n, "must be positive");
  return std::min(dev.sm_count, (n + kTileRows - 1) / kTileRows);
}

std::int32_t stream_gemv_resident_pairs(const SkinnyGemmDevice& dev) {
  opt_in_smem<kXMulticast>(dev);
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg = cluster_launch_config(
      dim3(static_cast<unsigned>(dev.sm_count / kXClusters * kXClusters)), dim3(kThreads),
      static_cast<std::size_t>(dev.max_smem), nullptr, dim3(kXClusters), false, attr);
  int clusters = 0;
  GD_CUDA(cudaOccupancyMaxActiveClusters(&clusters, stream_gemv_kernel<kXMulticast>, &cfg));
  return clusters;
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
  const int grid = stream_gemv_grid(dev, a.n);
  const XChoice choice = x_choice_from_env();
  XMode mode = choice == XChoice::kMulticastAll ||
                       (choice == XChoice::kMulticastByRows && a.rows >= kMulticastMinRows)
                   ? kXMulticast
                   : kXLoads;
  // The multicast takes x as it is (no norm prologue), pairs of CTAs that are all resident, and
  // its x barrier after the ring (a stage fewer where that leaves less than two: then plain loads).
  const std::int64_t mc_stages = std::min<std::int64_t>(
      p.ring.stages,
      (dev.max_smem - kXBarBytes - fixed_and_x_bytes(a.rows, a.k)) / p.ring.stage_bytes);
  if (mode == kXMulticast && (f.norm_weight != nullptr || grid % kXClusters != 0 || mc_stages < 2 ||
                              dev.x_pairs * kXClusters < grid))
    mode = kXLoads;
  if (mode == kXMulticast) p.ring.stages = static_cast<std::int32_t>(mc_stages);
  const std::size_t smem = static_cast<std::size_t>(fixed_and_x_bytes(a.rows, a.k)) +
                           static_cast<std::size_t>(p.ring.stages) * p.ring.stage_bytes +
                           (mode == kXMulticast ? kXBarBytes : 0);
  if (mode == kXLoads) {
    opt_in_smem<kXLoads>(dev);
    launch_pdl(stream_gemv_kernel<kXLoads>, dim3(static_cast<unsigned>(grid)), dim3(kThreads), smem,
               stream, p);
  } else {  // stream_gemv_resident_pairs opted the kernel in
    cudaLaunchAttribute attr[2];
    const cudaLaunchConfig_t cfg =
        cluster_launch_config(dim3(static_cast<unsigned>(grid)), dim3(kThreads), smem, stream,
                              dim3(kXClusters), pdl_enabled(), attr);
    GD_CUDA(cudaLaunchKernelEx(&cfg, stream_gemv_kernel<kXMulticast>, p));
    GD_CHECK_LAUNCH();
  }
}

}  // namespace graphdecode
