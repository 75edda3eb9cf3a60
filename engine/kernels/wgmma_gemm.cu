// Warpgroup GEMM for 9-128 rows: W and x through a ring of tensor-map copies issued by a producer
// warp, wgmma products, k split over a thread-block cluster and summed through distributed shared
// memory. See wgmma_gemm.h.
#include <cooperative_groups.h>
#include <cuda.h>          // CUtensorMap (the encoder is the driver's, reached through the runtime)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "attention/mma_utils.cuh"
#include "attention/wgmma.cuh"
#include "common/align.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "common/pdl.cuh"
#include "engine/kernels/bf16_vec.cuh"
#include "engine/kernels/mbarrier.cuh"
#include "engine/kernels/wgmma_gemm.h"

namespace graphdecode {
namespace {

using detail::mbar_arrive;
using detail::mbar_arrive_expect_tx;
using detail::mbar_init;
using detail::mbar_wait;
using detail::round_bf16;
using detail::swiglu_value;

namespace cg = cooperative_groups;
using attn::smem_addr;
using attn::sw128_desc;
using attn::wgmma_commit;
using attn::wgmma_fence;
using attn::wgmma_fence_operands;
using attn::wgmma_wait;

constexpr int kConsumerThreads = 128;            // one warpgroup: warps 0-3
constexpr int kThreads = kConsumerThreads + 32;  // warp 4 produces (one thread issues)
constexpr int kBK = 64;                          // k per tile: one 128-byte (swizzle) row
constexpr int kNBlocks = 2;                      // 64-column blocks of y per CTA
constexpr int kBN = 64 * kNBlocks;               // 128 columns per CTA
constexpr int kBlockBytes = 64 * kBK * 2;        // one 64-row block of a k tile: 8 KiB
constexpr int kMaxSplits = 8;                    // portable cluster size
constexpr int kMinTilesPerSplit = 4;             // k tiles per CTA at least (ring fill)
constexpr int kCtasPerSm = 2;                    // the shared memory below leaves room for two
constexpr int kRedStride = kBN + 4;              // floats per row of the partial (bank spread)
constexpr int kSmemBudget = 96 * 1024;           // ring bytes: two CTAs per SM
constexpr int kAlignSlack = 1024;                // the swizzle's period (dynamic smem base)
constexpr int kMaxStages = 8;                    // barrier slots

// Ring stages: 4 with 64 rows (3 x 8 KiB a stage), 3 with 128 (4 x 8 KiB): 96 KiB either way, so
// two CTAs share an SM (one CTA with a 192 KiB ring was slower, bench/NOTES.md 103 t93).
template <int kMBlocks>
constexpr int stages() {
  return kSmemBudget / ((kMBlocks + kNBlocks) * kBlockBytes);
}
template <int kMBlocks>
constexpr int smem_bytes() {
  return stages<kMBlocks>() * (kMBlocks + kNBlocks) * kBlockBytes + kAlignSlack;
}
static_assert(64 * 2 * kRedStride * 4 <= kSmemBudget, "the partial reuses the ring");
static_assert(stages<1>() <= kMaxStages && stages<2>() <= kMaxStages, "barrier slots");

struct Params {
  CUtensorMap w_map;  // W [n][k]: box 64 k x 128 n (SwiGLU: 64 n), 128-byte swizzle; rows past n
                      // read as 0
  CUtensorMap x_map;  // x [rows][k]: box 64 k x 64 kMBlocks rows; rows past `rows` read as 0
  void* y;            // [rows][n]; SwiGLU: [rows][inter] bf16
  std::int32_t rows, n;
  std::int32_t k_tiles;  // k / 64
  std::int32_t inter;    // > 0: the SwiGLU epilogue (W = [gate; up], inter rows each, inter % 64
                         // == 0): tile t takes gate rows 64t.. and up rows inter + 64t..
  bool out_f32;
  // WgmmaNormFusion (wgmma_gemm.h): the residual epilogue when `residual` is set, the row scale
  // when `sum_sq_in` is.
  std::uint16_t* residual;           // [rows][n]
  const std::uint16_t* norm_weight;  // [n]
  std::uint16_t* weighted;           // [rows][n]
  float* sum_sq_out;                 // [n / 128][rows]
  const float* sum_sq_in;            // [parts][rows]
  std::int32_t parts;
  float k_f, eps;  // k as a float (the row scale divides by it, as rmsnorm does)
};

static_assert(kWgmmaNormPart == kBN && kWgmmaNormMaxRows == 64, "a CTA's tile, one row block");
constexpr int kRowScaleMaxParts = kWgmmaRowScaleMaxK / kBN;  // registers of one row's parts
// The residual epilogue's rows a thread visits: warp w takes rows r0 + w, r0 + w + 5, .. of at
// most 64 (one row block, splits 1), so 13 a thread at most; each thread keeps its 4 columns.
constexpr int kResidualVisits = (64 + kThreads / 32 - 1) / (kThreads / 32);

__device__ int g_wgmma_probe;
__global__ void wgmma_probe_kernel() {
  g_wgmma_probe = GD_ATTN_HAS_WGMMA;
}

// Four floats as four bf16 (round to nearest even), in order.
__device__ __forceinline__ uint2 pack_bf16x4(const float (&v)[4]) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(v[2], v[3]);
  uint2 packed;
  packed.x = *reinterpret_cast<const std::uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const std::uint32_t*>(&hi);
  return packed;
}

// The box of `map` at (c0 innermost, c1) into shared dst (1024-byte aligned), counted on bar.
__device__ __forceinline__ void tensor_copy_2d(void* dst, const CUtensorMap* map, int c0, int c1,
                                               std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3}], [%4];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}

// Grid (n / 128 tiles, splits), cluster (1, splits): CTA (t, s) computes y's 128 columns of tile
// t over k tiles s, s + S, .., and the cluster sums them (SwiGLU: the 64 gate and 64 up columns
// of act's columns 64t.., each summed as the plain GEMM sums it, then combined). Warp 4's first
// lane issues each stage's two tensor copies (W, then x) on the stage's full barrier; the consumer
// warpgroup waits on it, runs the stage's products and releases the stage (one arrival per warp on
// its empty barrier).
// Which WgmmaNormFusion form an instance compiles (a template parameter, so the plain instances
// keep their registers: the residual epilogue's read-ahead took the one-block kernel from 90 to
// 124 registers as a runtime branch).
enum class Fusion : std::uint8_t { kNone, kResidual, kRowScale };

template <int kMBlocks, Fusion kFusion = Fusion::kNone>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    wgmma_gemm_kernel(const __grid_constant__ Params p) {
  static_assert(kFusion == Fusion::kNone || kMBlocks == 1, "the fusions take one row block");
#if GD_ATTN_HAS_WGMMA
  constexpr int kStages = stages<kMBlocks>();
  constexpr int kStageBytes = (kMBlocks + kNBlocks) * kBlockBytes;
  constexpr int kRows = 64 * kMBlocks;
  extern __shared__ unsigned char smem_raw[];
  __shared__ std::uint64_t full[kMaxStages], empty[kMaxStages];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<std::uintptr_t>(smem_raw) + kAlignSlack - 1) &
      ~static_cast<std::uintptr_t>(kAlignSlack - 1));
  cg::cluster_group cluster = cg::this_cluster();
  const int splits = static_cast<int>(gridDim.y), split = static_cast<int>(blockIdx.y);
  // k tiles split, split + splits, ..: the cluster's CTAs read adjacent pieces of W's rows.
  const int tiles = (p.k_tiles - split + splits - 1) / splits;
  const int n0 = static_cast<int>(blockIdx.x) * kBN;
  const int a0 = static_cast<int>(blockIdx.x) * 64;  // SwiGLU: the tile's first gate row
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Stage s: x's row blocks, then W's column blocks, 8 KiB each, each a multiple of 1024 bytes.
  const auto block = [&](int s, int b) { return smem + s * kStageBytes + b * kBlockBytes; };
  // A stage's W: one 128-row box, or (SwiGLU) 64 gate rows and the 64 up rows of the same columns.
  const auto copy_w = [&](int s, int kc) {
    if (p.inter > 0) {
      tensor_copy_2d(block(s, kMBlocks), &p.w_map, kc, a0, &full[s]);
      tensor_copy_2d(block(s, kMBlocks + 1), &p.w_map, kc, p.inter + a0, &full[s]);
    } else {
      tensor_copy_2d(block(s, kMBlocks), &p.w_map, kc, n0, &full[s]);
    }
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerThreads / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == kConsumerThreads / 32) {  // producer
    if (lane == 0) {
      // W depends on no kernel of the step: the first stages' W before the wait for the kernel
      // before; their x (and every later stage) after it.
      const int first = min(kStages, tiles);
      for (int t = 0; t < first; ++t) {
        mbar_arrive_expect_tx(&full[t], kStageBytes);
        copy_w(t, (split + t * splits) * kBK);
      }
      pdl_wait_for_prior_grid();
      pdl_launch_dependents();
      for (int t = 0; t < first; ++t)
        tensor_copy_2d(block(t, 0), &p.x_map, (split + t * splits) * kBK, 0, &full[t]);
      for (int t = first; t < tiles; ++t) {
        const int s = t % kStages;
        mbar_wait(&empty[s], ((t / kStages) & 1) ^ 1);  // released by the consumers
        mbar_arrive_expect_tx(&full[s], kStageBytes);
        const int kc = (split + t * splits) * kBK;
        copy_w(s, kc);
        tensor_copy_2d(block(s, 0), &p.x_map, kc, 0, &full[s]);
      }
    } else {
      pdl_wait_for_prior_grid();
    }
  } else {
    pdl_wait_for_prior_grid();  // y may still be read by the kernel before
  }

  // Row scale: each of this CTA's rows' inverse RMS from the squares the GEMM before left (after
  // the wait; the loads overlap the first stage's x copy, and all of a row's parts are loaded
  // before any is added: one round trip, not one per part, which held the consumers for several
  // us; bench/NOTES.md 141). Thread i sums row r0 + i's parts in p order: the same value in
  // every CTA that reads the row.
  const int live = min(p.rows, kRows);
  const int r0 = split * live / splits, r1 = (split + 1) * live / splits;
  __shared__ float inv_rms[kRows];
  if constexpr (kFusion == Fusion::kRowScale) {
    if (static_cast<int>(threadIdx.x) < r1 - r0) {
      const int row = r0 + static_cast<int>(threadIdx.x);
      float part[kRowScaleMaxParts];
#pragma unroll
      for (int q = 0; q < kRowScaleMaxParts; ++q)
        part[q] = q < p.parts ? p.sum_sq_in[q * p.rows + row] : 0.f;
      float ss = 0.f;
#pragma unroll
      for (int q = 0; q < kRowScaleMaxParts; ++q)
        if (q < p.parts) ss += part[q];
      inv_rms[row] = rsqrtf(ss / p.k_f + p.eps);
    }
    __syncwarp();  // warps 0-1 converged again before the .aligned wgmma instructions
  }

  float acc[kMBlocks][kNBlocks][8][4] = {};

  if (warp < kConsumerThreads / 32) {
#pragma unroll 1
    for (int it = 0; it < tiles; ++it) {
      const int s = it % kStages;
      mbar_wait(&full[s], (it / kStages) & 1);
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
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
  }
  __syncthreads();  // every stage consumed (so every copy landed): the ring becomes the partial

  // This CTA's partial: red[row][col], rows and columns of the tile (the m16n8 layout per warp).
  float* red = reinterpret_cast<float*>(smem);
  const int g = lane / 4, t4 = lane % 4;
  if (warp < kConsumerThreads / 32) {
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
  }
  // Residual epilogue: this thread's residual entries and norm weights, read before the barrier
  // (the weights depend on no kernel; the residual was last written before this kernel's wait).
  constexpr bool add_residual = kFusion == Fusion::kResidual;
  uint2 res_in[kResidualVisits];
  uint2 weight4 = make_uint2(0u, 0u);
  if constexpr (add_residual) {
    weight4 = *reinterpret_cast<const uint2*>(p.norm_weight + n0 + lane * 4);
#pragma unroll
    for (int i = 0; i < kResidualVisits; ++i) {
      const int row = r0 + warp + i * (kThreads / 32);
      if (row < r1)
        res_in[i] = *reinterpret_cast<const uint2*>(
            p.residual + static_cast<std::size_t>(row) * p.n + n0 + lane * 4);
    }
  }
  cluster.sync();  // every partial of the cluster written

  // CTA `split` sums its share of the rows over the cluster's partials in rank order.
  if (p.inter > 0) {  // act[row][a0 + c] = swiglu(bf16(gate sum), bf16(up sum)), 4 columns a thread
    for (int e = threadIdx.x; e < (r1 - r0) * 16; e += kThreads) {
      const int row = r0 + e / 16, c = (e % 16) * 4;
      float4 gate = make_float4(0.f, 0.f, 0.f, 0.f), up = gate;
      for (int r = 0; r < splits; ++r) {
        const float* part =
            cluster.map_shared_rank(red, static_cast<unsigned>(r)) + row * kRedStride;
        const float4 g4 = *reinterpret_cast<const float4*>(part + c);
        const float4 u4 = *reinterpret_cast<const float4*>(part + 64 + c);
        gate.x += g4.x;
        gate.y += g4.y;
        gate.z += g4.z;
        gate.w += g4.w;
        up.x += u4.x;
        up.y += u4.y;
        up.z += u4.z;
        up.w += u4.w;
      }
      if (kFusion == Fusion::kRowScale) {
        const float s = inv_rms[row];
        gate = make_float4(gate.x * s, gate.y * s, gate.z * s, gate.w * s);
        up = make_float4(up.x * s, up.y * s, up.z * s, up.w * s);
      }
      const __nv_bfloat162 lo =
          __floats2bfloat162_rn(swiglu_value(round_bf16(gate.x), round_bf16(up.x)),
                                swiglu_value(round_bf16(gate.y), round_bf16(up.y)));
      const __nv_bfloat162 hi =
          __floats2bfloat162_rn(swiglu_value(round_bf16(gate.z), round_bf16(up.z)),
                                swiglu_value(round_bf16(gate.w), round_bf16(up.w)));
      uint2 packed;
      packed.x = *reinterpret_cast<const std::uint32_t*>(&lo);
      packed.y = *reinterpret_cast<const std::uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(static_cast<std::uint16_t*>(p.y) +
                                static_cast<std::size_t>(row) * p.inter + a0 + c) = packed;
    }
    cluster.sync();  // no CTA leaves while another still reads its partial
    return;
  }
  if constexpr (add_residual) {  // warp w: rows r0 + w + 5i, lane l: columns 4l.. of the tile
#pragma unroll
    for (int i = 0; i < kResidualVisits; ++i) {
      const int row = r0 + warp + i * (kThreads / 32);
      if (row >= r1) break;  // warp-uniform
      float sum[4] = {};
      for (int r = 0; r < splits; ++r) {
        const float4 v = *reinterpret_cast<const float4*>(
            cluster.map_shared_rank(red, static_cast<unsigned>(r)) + row * kRedStride + lane * 4);
        sum[0] += v.x;
        sum[1] += v.y;
        sum[2] += v.z;
        sum[3] += v.w;
      }
      const auto* res_h = reinterpret_cast<const __nv_bfloat16*>(&res_in[i]);
      const auto* w_h = reinterpret_cast<const __nv_bfloat16*>(&weight4);
      float res[4], weighted[4], ss = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        res[j] = round_bf16(__bfloat162float(res_h[j]) + round_bf16(sum[j]));
        weighted[j] = res[j] * __bfloat162float(w_h[j]);
        ss += res[j] * res[j];
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      const std::size_t at = static_cast<std::size_t>(row) * p.n + n0 + lane * 4;
      *reinterpret_cast<uint2*>(p.residual + at) = pack_bf16x4(res);
      *reinterpret_cast<uint2*>(p.weighted + at) = pack_bf16x4(weighted);
      if (lane == 0) p.sum_sq_out[static_cast<std::size_t>(blockIdx.x) * p.rows + row] = ss;
    }
  } else {
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
      if (kFusion == Fusion::kRowScale) {
        const float s = inv_rms[row];
        sum = make_float4(sum.x * s, sum.y * s, sum.z * s, sum.w * s);
      }
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
  }
  cluster.sync();  // no CTA leaves while another still reads its partial
#endif
}

// The driver's tensor-map encoder, looked up once through the runtime (no link to libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    GD_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                             &found));
    GD_REQUIRE(found == cudaDriverEntryPointSuccess && f != nullptr, "cuTensorMapEncodeTiled",
               static_cast<int>(found), "the driver has no tensor-map encoder");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A row-major bf16 matrix [rows][k] as a 2-D tensor map, box 64 k x box_rows rows, the 128-byte
// swizzle; rows past `rows` read as zeros.
CUtensorMap encode_map(const std::uint16_t* m, std::int32_t rows, std::int32_t k,
                       std::int32_t box_rows, const char* field) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k) * 2};  // bytes, of dim 1
  const cuuint32_t box[2] = {kBK, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<std::uint16_t*>(m), dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  GD_REQUIRE(r == CUDA_SUCCESS, field, static_cast<int>(r),
             "cuTensorMapEncodeTiled refused the tensor map (rows " + std::to_string(rows) +
                 ", k " + std::to_string(k) + ")");
  return map;
}

// Clusters of 1, 2, 4 and 8 CTAs the device holds at once (cudaOccupancyMaxActiveClusters),
// filled by wgmma_gemm_available() at start-up. A cluster's CTAs share a GPC, so this is below
// SMs * 2 / splits: on GPCs of 16-18 SMs, 32 clusters of 8 (the 8B o and down projections) did
// not all fit side by side, and the last ones ran as a second wave.
std::int32_t g_resident_clusters[kMaxSplits + 1] = {};

void count_resident_clusters(int sms) {
  for (int s = 1; s <= kMaxSplits; s *= 2) {
    cudaLaunchAttribute attr[2];
    const cudaLaunchConfig_t cfg = cluster_launch_config(
        dim3(static_cast<unsigned>(std::max(sms, 1) * kCtasPerSm), static_cast<unsigned>(s)),
        dim3(kThreads), smem_bytes<1>(), nullptr, dim3(1, static_cast<unsigned>(s)), false, attr);
    int clusters = 0;
    GD_CUDA(cudaOccupancyMaxActiveClusters(&clusters, wgmma_gemm_kernel<1>, &cfg));
    g_resident_clusters[s] = std::max(clusters, 1);
  }
}

template <int kMBlocks, Fusion kFusion = Fusion::kNone>
void set_smem_limit() {
  GD_CUDA(cudaFuncSetAttribute(wgmma_gemm_kernel<kMBlocks, kFusion>,
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
    set_smem_limit<1, Fusion::kResidual>();
    set_smem_limit<1, Fusion::kRowScale>();
    int sms = 0;
    GD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    count_resident_clusters(sms);
    return true;
  }();
  return available;
}

bool wgmma_gemm_supported(std::int32_t rows, std::int32_t k, std::int32_t n) {
  return rows >= 1 && rows <= kWgmmaGemmMaxRows && k > 0 && k % kBK == 0 && n > 0 && n % 8 == 0 &&
         wgmma_gemm_available();
}

namespace {

// GRAPHDECODE_WGMMA_SPLITS (1, 2, 4 or 8) sets the split wherever k allows it, residency aside
// (sweeps); 0 = the rule below. Anything else is refused.
std::int32_t splits_from_env() {
  static const std::int32_t forced = [] {
    const char* v = std::getenv("GRAPHDECODE_WGMMA_SPLITS");
    if (v == nullptr) return 0;
    const int c = std::atoi(v);
    GD_REQUIRE(c == 1 || c == 2 || c == 4 || c == 8, "GRAPHDECODE_WGMMA_SPLITS", v,
               "must be 1, 2, 4 or 8");
    return static_cast<std::int32_t>(c);
  }();
  return forced;
}

}  // namespace

std::int32_t wgmma_gemm_splits(std::int32_t k, std::int32_t n) {
  if (!wgmma_gemm_available()) return 1;
  const std::int32_t n_tiles = (n + kBN - 1) / kBN, k_tiles = k / kBK;
  const std::int32_t forced = splits_from_env();
  std::int32_t s = 1;
  // Split k while every CTA keeps a few tiles and the n tiles' clusters are resident together.
  while (2 * s <= kMaxSplits && k_tiles / (2 * s) >= kMinTilesPerSplit &&
         (forced != 0 ? 2 * s <= forced : n_tiles <= g_resident_clusters[2 * s]))
    s *= 2;
  return s;
}

void wgmma_gemm(const SkinnyGemmDevice& dev, const SkinnyGemmArgs& a, cudaStream_t stream,
                WgmmaEpilogue epilogue, const WgmmaNormFusion& f) {
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
  const bool swiglu = epilogue == WgmmaEpilogue::kSwiGlu;
  if (swiglu) {
    GD_REQUIRE(a.n % 128 == 0, "n", a.n,
               "the SwiGLU epilogue takes W = [gate; up] with a multiple of 64 rows each");
    GD_REQUIRE(!a.out_f32, "out_f32", "true", "the SwiGLU epilogue writes bf16");
  }
  GD_REQUIRE(!(f.residual_epilogue() && f.row_scale()), "fusion", "both forms",
             "a GEMM takes the residual epilogue or the row scale, not both");
  if (f.residual_epilogue()) {
    GD_REQUIRE(!swiglu && !a.out_f32, "epilogue", swiglu ? "SwiGLU" : "float",
               "the residual epilogue stores bf16 sums");
    GD_REQUIRE(a.rows <= 64, "rows", a.rows, "the residual epilogue takes one row block (<= 64)");
    GD_REQUIRE(a.n % kBN == 0, "n", a.n, "the residual epilogue takes whole 128-column tiles");
    GD_REQUIRE(aligned16(f.residual) && f.norm_weight != nullptr && aligned16(f.norm_weight) &&
                   f.weighted != nullptr && aligned16(f.weighted) && f.sum_sq_out != nullptr,
               "fusion", "residual/norm_weight/weighted/sum_sq_out",
               "the residual epilogue needs all four, 16-byte aligned");
  }
  if (f.row_scale()) {
    GD_REQUIRE(a.rows <= 64, "rows", a.rows, "the row scale takes one row block (<= 64)");
    GD_REQUIRE(a.k <= kWgmmaRowScaleMaxK, "k", a.k,
               "the row scale takes k <= " + std::to_string(kWgmmaRowScaleMaxK));
    GD_REQUIRE(f.parts >= 1 && f.parts * kBN == a.k, "parts", f.parts,
               "must be k / 128 (the residual epilogue's tiles over the row)");
    GD_REQUIRE(f.eps > 0.f, "eps", f.eps, "must be positive");
  }
  const int m_blocks = a.rows <= 64 ? 1 : 2;
  Params p{};
  p.residual = f.residual;
  p.norm_weight = f.norm_weight;
  p.weighted = f.weighted;
  p.sum_sq_out = f.sum_sq_out;
  p.sum_sq_in = f.sum_sq_in;
  p.parts = f.parts;
  p.k_f = static_cast<float>(a.k);
  p.eps = f.eps;
  p.w_map = encode_map(a.w, a.n, a.k, swiglu ? 64 : kBN, "w");
  p.x_map = encode_map(a.x, a.rows, a.k, 64 * m_blocks, "x");
  p.y = a.y;
  p.rows = a.rows;
  p.n = a.n;
  p.k_tiles = a.k / kBK;
  p.out_f32 = a.out_f32;
  p.inter = swiglu ? a.n / 2 : 0;
  const std::int32_t splits = wgmma_gemm_splits(a.k, a.n);
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg = cluster_launch_config(
      dim3(static_cast<unsigned>((a.n + kBN - 1) / kBN), static_cast<unsigned>(splits)),
      dim3(kThreads), m_blocks == 1 ? smem_bytes<1>() : smem_bytes<2>(), stream,
      dim3(1, static_cast<unsigned>(splits)), pdl_enabled(), attr);
  if (f.residual_epilogue())
    GD_CUDA(cudaLaunchKernelEx(&cfg, wgmma_gemm_kernel<1, Fusion::kResidual>, p));
  else if (f.row_scale())
    GD_CUDA(cudaLaunchKernelEx(&cfg, wgmma_gemm_kernel<1, Fusion::kRowScale>, p));
  else if (m_blocks == 1)
    GD_CUDA(cudaLaunchKernelEx(&cfg, wgmma_gemm_kernel<1>, p));
  else
    GD_CUDA(cudaLaunchKernelEx(&cfg, wgmma_gemm_kernel<2>, p));
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
