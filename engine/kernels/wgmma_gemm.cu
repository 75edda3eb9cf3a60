// Warpgroup GEMM for 9-128 rows: W and x through a cp.async ring, wgmma products, k split over a
// thread-block cluster and summed through distributed shared memory. See wgmma_gemm.h.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "attention/mma_utils.cuh"
#include "attention/wgmma.cuh"
#include "common/align.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "common/pdl.cuh"
#include "engine/kernels/wgmma_gemm.h"

namespace graphdecode {
namespace {

namespace cg = cooperative_groups;
using attn::cp_async_16;
using attn::cp_async_16_policy;
using attn::cp_async_commit;
using attn::cp_async_wait;
using attn::fence_proxy_async_shared;
using attn::l2_evict_first_policy;
using attn::smem_addr;
using attn::sw128_desc;
using attn::swizzled_offset;
using attn::wgmma_commit;
using attn::wgmma_fence;
using attn::wgmma_fence_operands;
using attn::wgmma_wait;

constexpr int kThreads = 128;                     // one warpgroup
constexpr int kBK = 64;                           // k per tile: one 128-byte (swizzle) row
constexpr int kNBlocks = 2;                       // 64-column blocks of y per CTA
constexpr int kBN = 64 * kNBlocks;                // 128 columns per CTA
constexpr int kBlockBytes = 64 * kBK * 2;         // one 64-row block of a k tile: 8 KiB
constexpr int kMaxSplits = 8;                     // portable cluster size
constexpr int kMinTilesPerSplit = 4;              // k tiles per CTA at least (ring fill)
constexpr int kCtasPerSm = 2;                     // the shared memory below leaves room for two
constexpr int kRedStride = kBN + 4;               // floats per row of the partial (bank spread)
constexpr int kSmemBudget = 96 * 1024;            // ring bytes: two CTAs per SM
constexpr int kAlignSlack = 1024;                 // the swizzle's period (dynamic smem base)

// Ring stages: 4 with 64 rows (3 x 8 KiB a stage), 3 with 128 (4 x 8 KiB): 96 KiB either way.
// (One CTA per SM with a 192 KiB ring was slower: bench_gemm 1B down, 64 rows, 21.5 -> 33.3 us.)
template <int kMBlocks>
constexpr int stages() {
  return kSmemBudget / ((kMBlocks + kNBlocks) * kBlockBytes);
}
template <int kMBlocks>
constexpr int smem_bytes() {
  return stages<kMBlocks>() * (kMBlocks + kNBlocks) * kBlockBytes + kAlignSlack;
}
static_assert(64 * 2 * kRedStride * 4 <= kSmemBudget, "the partial reuses the ring");

struct Params {
  const std::uint16_t* x;  // [rows][k]
  const std::uint16_t* w;  // [n][k]
  void* y;                 // [rows][n]
  std::int32_t rows, k, n;
  std::int32_t k_tiles;  // k / 64
  bool out_f32;
};

__device__ int g_wgmma_probe;
__global__ void wgmma_probe_kernel() {
  g_wgmma_probe = GD_ATTN_HAS_WGMMA;
}

// Grid (n / 128 tiles, splits), cluster (1, splits): CTA (t, s) computes y's 128 columns of tile
// t over k tiles s, s + S, .., and the cluster sums them.
template <int kMBlocks>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    wgmma_gemm_kernel(const __grid_constant__ Params p) {
#if GD_ATTN_HAS_WGMMA
  constexpr int kStages = stages<kMBlocks>();
  constexpr int kStageBytes = (kMBlocks + kNBlocks) * kBlockBytes;
  constexpr int kRows = 64 * kMBlocks;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<std::uintptr_t>(smem_raw) + kAlignSlack - 1) &
      ~static_cast<std::uintptr_t>(kAlignSlack - 1));
  cg::cluster_group cluster = cg::this_cluster();
  const int splits = static_cast<int>(gridDim.y), split = static_cast<int>(blockIdx.y);
  // k tiles split, split + splits, ..: the cluster's CTAs, which run together, read adjacent
  // 128-byte pieces of the same W rows at once (a DRAM page per row, not 128 bytes of one per
  // CTA and tile: the contiguous ranges of t92 held the DRAM at ~20% of its bandwidth, ncu t94).
  const int tiles = (p.k_tiles - split + splits - 1) / splits;
  const auto k_tile = [&](int t) { return split + t * splits; };
  const int n0 = static_cast<int>(blockIdx.x) * kBN;
  // Stage s: x's row blocks, then W's column blocks, 8 KiB each, each a multiple of 1024 bytes.
  const auto block = [&](int s, int b) {
    return reinterpret_cast<std::uint16_t*>(smem + s * kStageBytes + b * kBlockBytes);
  };
  const std::uint64_t w_policy = l2_evict_first_policy();  // W streams through once
  // Thread i copies 16-byte chunk i % 8 of rows i / 8 + 16 j: a warp reads 4 rows' 128 bytes.
  const auto load_w = [&](int kt, int s) {
#pragma unroll
    for (int i = threadIdx.x; i < kBN * 8; i += kThreads) {
      const int row = i / 8, ch = i % 8, col = n0 + row;
      const bool valid = col < p.n;
      const std::uint16_t* src =
          p.w + static_cast<std::size_t>(valid ? col : 0) * p.k + kt * kBK + ch * 8;
      cp_async_16_policy(block(s, kMBlocks + row / 64) + swizzled_offset<64>(row % 64, ch), src,
                         valid, w_policy);
    }
  };
  const auto load_x = [&](int kt, int s) {
#pragma unroll
    for (int i = threadIdx.x; i < kRows * 8; i += kThreads) {
      const int row = i / 8, ch = i % 8;
      const bool valid = row < p.rows;
      const std::uint16_t* src =
          p.x + static_cast<std::size_t>(valid ? row : 0) * p.k + kt * kBK + ch * 8;
      cp_async_16(block(s, row / 64) + swizzled_offset<64>(row % 64, ch), src, valid);
    }
  };

  // The first stages' W before the wait; x after it. Group 0 holds those W and tile 0's x.
  for (int t = 0; t < kStages - 1; ++t)
    if (t < tiles) load_w(k_tile(t), t);
  pdl_wait_for_prior_grid();
  pdl_launch_dependents();
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < tiles) load_x(k_tile(t), t);
    cp_async_commit();
  }

  float acc[kMBlocks][kNBlocks][8][4];
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
    for (int nb = 0; nb < kNBlocks; ++nb)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mb][nb][j][e] = 0.f;

#pragma unroll 1
  for (int it = 0; it < tiles; ++it) {
    cp_async_wait<kStages - 2>();  // tile it's group
    fence_proxy_async_shared();    // this thread's copies, to the wgmma's (async) proxy
    __syncthreads();               // everyone's copies; every warp is past tile it - 1's products
    const int nxt = it + kStages - 1;  // into the stage tile it - 1 used
    if (nxt < tiles) {
      load_w(k_tile(nxt), nxt % kStages);
      load_x(k_tile(nxt), nxt % kStages);
    }
    cp_async_commit();
    const int s = it % kStages;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      const unsigned step = (kk * 32) >> 4;  // 32 bytes along the swizzled rows, 16-byte units
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int nb = 0; nb < kNBlocks; ++nb)
          attn::wgmma_64x64x16_ss<__nv_bfloat16>(
              acc[mb][nb], sw128_desc(smem_addr(block(s, mb))) + step,
              sw128_desc(smem_addr(block(s, kMBlocks + nb))) + step, true);
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb) wgmma_fence_operands(acc[mb][nb]);
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring becomes the partial

  // This CTA's partial: red[row][col], rows and columns of the tile (the m16n8 layout per warp).
  float* red = reinterpret_cast<float*>(smem);
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t4 = threadIdx.x % 4;
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
    for (int nb = 0; nb < kNBlocks; ++nb)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = mb * 64 + warp * 16 + g + 8 * h, col = nb * 64 + j * 8 + 2 * t4;
          *reinterpret_cast<float2*>(red + row * kRedStride + col) =
              make_float2(acc[mb][nb][j][2 * h], acc[mb][nb][j][2 * h + 1]);
        }
  cluster.sync();  // every partial of the cluster written

  // CTA `split` sums its share of the rows over the cluster's partials in rank order.
  const int live = min(p.rows, kRows);
  const int r0 = split * live / splits, r1 = (split + 1) * live / splits;
  for (int e = threadIdx.x; e < (r1 - r0) * (kBN / 4); e += kThreads) {
    const int row = r0 + e / (kBN / 4), c = (e % (kBN / 4)) * 4, col = n0 + c;
    if (col >= p.n) continue;
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int r = 0; r < splits; ++r) {
      const float4 v = *reinterpret_cast<const float4*>(
          cluster.map_shared_rank(red, static_cast<unsigned>(r)) + row * kRedStride + c);
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    const std::size_t at = static_cast<std::size_t>(row) * p.n + col;
    if (p.out_f32) {
      *reinterpret_cast<float4*>(static_cast<float*>(p.y) + at) = sum;
    } else {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(sum.x, sum.y);
      const __nv_bfloat162 hi = __floats2bfloat162_rn(sum.z, sum.w);
      uint2 packed;
      packed.x = *reinterpret_cast<const std::uint32_t*>(&lo);
      packed.y = *reinterpret_cast<const std::uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(static_cast<std::uint16_t*>(p.y) + at) = packed;
    }
  }
  cluster.sync();  // no CTA leaves while another still reads its partial
#endif
}

template <int kMBlocks>
void set_smem_limit() {
  GD_CUDA(cudaFuncSetAttribute(wgmma_gemm_kernel<kMBlocks>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               smem_bytes<kMBlocks>()));
}

}  // namespace

bool wgmma_gemm_available() {
  static const bool available = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        major != 9)
      return false;
    wgmma_probe_kernel<<<1, 1>>>();
    if (cudaGetLastError() != cudaSuccess) return false;  // no image for this device
    int has = 0;
    GD_CUDA(cudaMemcpyFromSymbol(&has, g_wgmma_probe, sizeof(has)));
    if (has != 1) return false;
    set_smem_limit<1>();
    set_smem_limit<2>();
    return true;
  }();
  return available;
}

bool wgmma_gemm_supported(std::int32_t rows, std::int32_t k, std::int32_t n) {
  return rows >= 1 && rows <= kWgmmaGemmMaxRows && k > 0 && k % kBK == 0 && n > 0 && n % 8 == 0 &&
         wgmma_gemm_available();
}

std::int32_t wgmma_gemm_splits(const SkinnyGemmDevice& dev, std::int32_t k, std::int32_t n) {
  const std::int32_t n_tiles = (n + kBN - 1) / kBN, k_tiles = k / kBK;
  const std::int32_t slots = kCtasPerSm * std::max(dev.sm_count, 1);
  std::int32_t s = 1;
  while (2 * s <= kMaxSplits && k_tiles / (2 * s) >= kMinTilesPerSplit && n_tiles * 2 * s <= slots)
    s *= 2;
  return s;
}

void wgmma_gemm(const SkinnyGemmDevice& dev, const SkinnyGemmArgs& a, cudaStream_t stream) {
  GD_REQUIRE(dev.sm_count > 0, "dev.sm_count", dev.sm_count, "use SkinnyGemmDevice::current()");
  GD_REQUIRE(a.rows >= 1 && a.rows <= kWgmmaGemmMaxRows, "rows", a.rows,
             "the warpgroup GEMM takes 1..128");
  GD_REQUIRE(a.k > 0 && a.k % kBK == 0, "k", a.k, "must be a positive multiple of 64");
  GD_REQUIRE(a.n > 0 && a.n % 8 == 0, "n", a.n, "must be a positive multiple of 8");
  GD_REQUIRE(a.x != nullptr && aligned16(a.x), "x", a.x, "must be non-null and 16-byte aligned");
  GD_REQUIRE(a.w != nullptr && aligned16(a.w), "w", a.w, "must be non-null and 16-byte aligned");
  GD_REQUIRE(a.y != nullptr && aligned16(a.y), "y", a.y, "must be non-null and 16-byte aligned");
  GD_REQUIRE(wgmma_gemm_available(), "device", "no sm_90a code",
             "the warpgroup GEMM needs a Hopper GPU and a build for sm_90a");
  const Params p{a.x, a.w, a.y, a.rows, a.k, a.n, a.k / kBK, a.out_f32};
  const std::int32_t splits = wgmma_gemm_splits(dev, a.k, a.n);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>((a.n + kBN - 1) / kBN), static_cast<unsigned>(splits));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = static_cast<unsigned>(splits);
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 2 : 1;
  if (a.rows <= 64) {
    cfg.dynamicSmemBytes = smem_bytes<1>();
    GD_CUDA(cudaLaunchKernelEx(&cfg, wgmma_gemm_kernel<1>, p));
  } else {
    cfg.dynamicSmemBytes = smem_bytes<2>();
    GD_CUDA(cudaLaunchKernelEx(&cfg, wgmma_gemm_kernel<2>, p));
  }
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
