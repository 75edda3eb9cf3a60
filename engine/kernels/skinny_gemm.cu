// Skinny GEMM (rows <= 8) on tensor cores, bound by the read of W. See skinny_gemm.h.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/align.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "common/pdl.cuh"
#include "engine/kernels/skinny_gemm.h"
#include "engine/kernels/stream_gemv.h"  // stream_gemv_resident_pairs

namespace graphdecode {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kTileCols = 8;                                       // the mma's n: W rows per tile
constexpr int kRedFloats = kWarps * kSkinnyMaxRows * kTileCols;    // one round's partial sums
constexpr std::size_t kRedBytes = 2 * kRedFloats * sizeof(float);  // double-buffered

struct Params {
  const std::uint16_t* x;  // [rows][k]
  const std::uint16_t* w;  // [n][k]
  void* y;                 // [rows][n]
  std::int32_t rows, k, n;
  std::int32_t nch;     // k / 8: 16-byte chunks per row
  std::int32_t splits;  // warps sharing one tile along k (power of two, <= 16)
  std::int32_t steps;   // chunk steps per warp per tile (multiple of the batch)
  std::int32_t tiles;   // ceil(n / 8)
  bool out_f32;
};

// Streaming read of W: read once, so skip L1; ask L2 for the whole 256-byte block.
__device__ __forceinline__ uint4 load_stream(const std::uint16_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void copy_async16(void* smem, const void* gmem) {
  const auto s = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}

// (c0, c1) += A * B for m16n8k16 (bf16, fp32 accumulate). A rows 0..7 are x rows (pairs a01 at
// k 2t, a45 at k 2t+8), rows 8..15 zero; B = {b01, b23} of W column g. Only D rows 0..7 are kept.
__device__ __forceinline__ void mma(float& c0, float& c1, std::uint32_t a01, std::uint32_t a45,
                                    std::uint32_t b01, std::uint32_t b23) {
  float c2 = 0.f, c3 = 0.f;  // D rows 8..15 (A rows 8..15 are zero): dropped
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %5}, "
      "{%7, %8}, {%0, %1, %2, %3};"
      : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
      : "r"(a01), "r"(0u), "r"(a45), "r"(b01), "r"(b23));
}

// Shared memory: x slices [warp][step][row][4] of uint4, each written (cp.async, first round) and
// read back only by the thread that needs it, so no barrier guards them; then the partials
// [2][warp][row][col] float of the split-k reduction.
template <int kBatch>
__global__ void __launch_bounds__(kThreads, 1)
    skinny_gemm_kernel(const __grid_constant__ Params p) {
  extern __shared__ uint4 smem[];
  float* red = reinterpret_cast<float*>(smem + kWarps * p.steps * p.rows * 4);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;    // W column (B) and x row (A) of the mma; k quarter
  const int per_round = kWarps / p.splits;  // tiles in flight per CTA
  const int slot = warp / p.splits, split = warp % p.splits;
  const std::int64_t tb = static_cast<std::int64_t>(blockIdx.x) * p.tiles / gridDim.x;
  const std::int64_t te = static_cast<std::int64_t>(blockIdx.x + 1) * p.tiles / gridDim.x;
  const int bpr = p.steps / kBatch;  // register batches per round
  const int batches = static_cast<int>((te - tb + per_round - 1) / per_round) * bpr;
  // Chunk of step j: (split * steps + j) * 4 + t. Same chunk for A and B: k permuted alike.
  const int chunk0 = split * p.steps * 4 + t;
  const bool x_row = g < p.rows;
  uint4* x_mine = smem + (warp * p.steps * p.rows + g) * 4 + t;  // + j * rows * 4
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

  // Batch b (b >= batches loads nothing): W into registers (load_w); in the first round x into
  // smem (stage_x: one cp.async group per batch, also when empty).
  auto load_w = [&](uint4(&wv)[kBatch], int b) {
    const int r = b / bpr, j0 = (b - r * bpr) * kBatch;
    const std::int64_t tile = tb + static_cast<std::int64_t>(r) * per_round + slot;
    const std::int64_t col = tile * kTileCols + g;
    const bool ok = tile < te && col < p.n;
    const std::uint16_t* wrow = p.w + (ok ? col * p.k : 0);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int c = chunk0 + (j0 + u) * 4;
      wv[u] = ok && c < p.nch ? load_stream(wrow + c * 8) : zero;
    }
  };
  auto stage_x = [&](int b) {
    const int r = b / bpr, j0 = (b - r * bpr) * kBatch;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int c = chunk0 + (j0 + u) * 4;
      if (r == 0 && x_row && c < p.nch)
        copy_async16(x_mine + (j0 + u) * p.rows * 4,
                     p.x + static_cast<std::size_t>(g) * p.k + c * 8);
    }
    asm volatile("cp.async.commit_group;");
  };

  float acc0 = 0.f, acc1 = 0.f;  // D[row g][cols 2t, 2t + 1] of this warp's slice
  auto finish_round = [&](int r) {
    float* part = red + (r & 1) * kRedFloats;  // [warp][row][col]
    *reinterpret_cast<float2*>(part + (warp * kSkinnyMaxRows + g) * kTileCols + 2 * t) =
        make_float2(acc0, acc1);
    acc0 = acc1 = 0.f;
    // One barrier per round: buffer r & 1 is rewritten only after the next round's barrier.
    __syncthreads();
    for (int i = threadIdx.x; i < per_round * kSkinnyMaxRows * kTileCols; i += kThreads) {
      const int s = i / (kSkinnyMaxRows * kTileCols), m = (i / kTileCols) % kSkinnyMaxRows;
      const int c = i % kTileCols;
      const std::int64_t tile = tb + static_cast<std::int64_t>(r) * per_round + s;
      const std::int64_t col = tile * kTileCols + c;
      if (m >= p.rows || tile >= te || col >= p.n) continue;
      float sum = 0.f;  // fixed order over the splits: bitwise reproducible
      for (int q = 0; q < p.splits; ++q)
        sum += part[((s * p.splits + q) * kSkinnyMaxRows + m) * kTileCols + c];
      const std::size_t at = static_cast<std::size_t>(m) * p.n + col;
      if (p.out_f32)
        static_cast<float*>(p.y)[at] = sum;
      else
        static_cast<__nv_bfloat16*>(p.y)[at] = __float2bfloat16_rn(sum);
    }
  };

  auto compute = [&](const uint4(&wv)[kBatch], int b) {
    asm volatile("cp.async.wait_group 1;" ::: "memory");  // this batch's x (first round)
    const int r = b / bpr, j0 = (b - r * bpr) * kBatch;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int c = chunk0 + (j0 + u) * 4;
      const uint4 a = x_row && c < p.nch ? x_mine[(j0 + u) * p.rows * 4] : zero;
      mma(acc0, acc1, a.x, a.y, wv[u].x, wv[u].y);
      mma(acc0, acc1, a.z, a.w, wv[u].z, wv[u].w);
    }
    if (j0 + kBatch == p.steps) finish_round(r);
  };

  // Two register batches: the next batch's loads are in flight while this one is multiplied,
  // across round ends (barriers) too. W depends on no kernel of the step, so the first two batches
  // are read before the wait for the kernel before this one (a PDL launch: their reads overlap
  // that kernel's tail); x and y only after it.
  uint4 wa[kBatch], wb[kBatch];
  load_w(wa, 0);
  load_w(wb, 1);
  pdl_wait_for_prior_grid();
  pdl_launch_dependents();
  stage_x(0);
  stage_x(1);
  for (int b = 0; b < batches; b += 2) {
    compute(wa, b);  // the groups of batches <= b + 1 are committed: wait_group 1 covers b
    if (b + 1 == batches) break;
    load_w(wa, b + 2);
    stage_x(b + 2);
    compute(wb, b + 1);
    load_w(wb, b + 3);
    stage_x(b + 3);
  }
}

struct Plan {
  std::int32_t splits = 1, steps = 0, batch = 4;
};

// Split k over as many warps (<= 16) as keep >= 4 steps each: k >= 2048 gives 16 splits, one tile
// per round, so a CTA reads x once; smaller k runs several tiles per round. Batch 8 when a warp
// has >= 8 steps per tile, else 4.
Plan plan(std::int32_t k) {
  const std::int32_t nch = k / 8;
  Plan pl;
  // 4 chunks a step, >= 4 steps a warp at twice the splits.
  while (pl.splits < kWarps && nch >= 4 * 4 * (2 * pl.splits)) pl.splits *= 2;
  const std::int32_t steps = (nch + 4 * pl.splits - 1) / (4 * pl.splits);
  pl.batch = steps >= 8 ? 8 : 4;
  pl.steps = (steps + pl.batch - 1) / pl.batch * pl.batch;
  return pl;
}

}  // namespace

SkinnyGemmDevice SkinnyGemmDevice::current() {
  int dev = 0;
  GD_CUDA(cudaGetDevice(&dev));
  SkinnyGemmDevice d;
  GD_CUDA(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, dev));
  GD_CUDA(cudaDeviceGetAttribute(&d.max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  GD_CUDA(cudaFuncSetAttribute(skinny_gemm_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               d.max_smem));
  GD_CUDA(cudaFuncSetAttribute(skinny_gemm_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               d.max_smem));
  d.x_pairs = stream_gemv_resident_pairs(d);
  return d;
}

std::size_t skinny_gemm_smem_bytes(std::int32_t rows, std::int32_t k) {
  const Plan pl = plan(k);
  return static_cast<std::size_t>(kWarps) * pl.steps * rows * 4 * sizeof(uint4) + kRedBytes;
}

bool skinny_gemm_supported(const SkinnyGemmDevice& dev, std::int32_t rows, std::int32_t k) {
  return rows >= 1 && rows <= kSkinnyMaxRows && k > 0 && k % 8 == 0 &&
         skinny_gemm_smem_bytes(rows, k) <= static_cast<std::size_t>(dev.max_smem);
}

void require_skinny_args(const SkinnyGemmDevice& dev, const SkinnyGemmArgs& a, const char* kernel,
                         bool fits, const char* why_not) {
  GD_REQUIRE(dev.sm_count > 0, "dev.sm_count", dev.sm_count, "use SkinnyGemmDevice::current()");
  GD_REQUIRE(a.rows >= 1 && a.rows <= kSkinnyMaxRows, "rows", a.rows,
             std::string(kernel) + " takes 1..8");
  GD_REQUIRE(a.k > 0 && a.k % 8 == 0, "k", a.k, "must be a positive multiple of 8");
  GD_REQUIRE(a.n > 0, "n", a.n, "must be positive");
  GD_REQUIRE(fits, "rows * k", a.rows * a.k, why_not);
  GD_REQUIRE(a.x != nullptr && aligned16(a.x), "x", a.x, "must be non-null and 16-byte aligned");
  GD_REQUIRE(a.w != nullptr && aligned16(a.w), "w", a.w, "must be non-null and 16-byte aligned");
  GD_REQUIRE(a.y != nullptr, "y", "nullptr", "must be non-null");
}

void skinny_gemm(const SkinnyGemmDevice& dev, const SkinnyGemmArgs& a, cudaStream_t stream) {
  require_skinny_args(dev, a, "skinny GEMM", skinny_gemm_supported(dev, a.rows, a.k),
                      "x does not fit in shared memory");
  const Plan pl = plan(a.k);
  const Params p{a.x,      a.w,     a.y,       a.rows,   a.k,
                 a.n,      a.k / 8, pl.splits, pl.steps, (a.n + kTileCols - 1) / kTileCols,
                 a.out_f32};
  const int grid = std::min(dev.sm_count, p.tiles);  // persistent: one CTA per SM at most
  const std::size_t smem = skinny_gemm_smem_bytes(a.rows, a.k);
  launch_pdl(pl.batch == 8 ? skinny_gemm_kernel<8> : skinny_gemm_kernel<4>,
             dim3(static_cast<unsigned>(grid)), dim3(kThreads), smem, stream, p);
}

}  // namespace graphdecode
