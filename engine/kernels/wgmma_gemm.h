// Warpgroup GEMM for decode batches of 9-128 rows (Hopper, sm_90a): y[rows][n] = x[rows][k] W^T,
// W [n][k] row-major bf16, fp32 accumulation, bf16 (round to nearest even) or float output. The
// same contract as the skinny GEMM and the stream GEMV (skinny_gemm.h), for the row counts between
// the stream GEMV (<= 8) and prefill; Gemm runs it at 9-64 rows (engine/gemm.h).
//
// Why: at 32-128 rows a decode layer's GEMMs are weight-bound (W is read once, x is small), and
// cuBLAS reached them at 34-86% of the bytes' time on the 1B shape at 64 rows (qkv 6.4 us for 3.0
// us of weights, o 5.9 for 2.0, gate_up 18.7 for 16.0, down 13.5 for 8.0; bench/NOTES.md 103).
// * A CTA owns 64 or 128 rows x 128 columns of y over a slice of k: a producer warp (one thread)
//   issues each stage's two tensor-map copies (W box 64 k x 128 n, x box 64 k x the rows, the
//   128-byte swizzle that wgmma reads; rows past n or `rows` read as zeros) on the stage's full
//   mbarrier, and the consumer warpgroup runs the stage's 4 x (row blocks) x 2 wgmma.m64n64k16
//   products and releases it on its empty mbarrier. (A first version where all 128 threads
//   issued cp.async copies was issue-bound at ~580 instructions per warp and tile: NOTES 103.)
// * k is split over the CTAs of a thread-block cluster (1-8, along grid y; CTA s takes k tiles s,
//   s + S, ..): each CTA leaves its fp32 partial in its shared memory, and after a cluster barrier
//   CTA r sums the partials of its share of the rows over the cluster in rank order through
//   distributed shared memory. The order is fixed, so y is bitwise reproducible (eager == graph)
//   and no global workspace, counter or reduce kernel is needed.
// * A programmatic dependent launch (common/pdl.cuh): the first stages' W copies are issued before
//   the wait for the kernel before (weights depend on no kernel of the step), x after it. In a
//   decode step this overlap is most of its gain over cuBLAS.
// Graph-safe: the grid depends on the shape only, no allocation, no host sync; each launch encodes
// its two tensor maps on the host (kernel parameters, captured with the launch). A row's output
// does not depend on the other rows (the split depends on n and k only).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/kernels/skinny_gemm.h"  // SkinnyGemmArgs, SkinnyGemmDevice

namespace graphdecode {

inline constexpr std::int32_t kWgmmaGemmMaxRows = 128;

// True when this binary has the kernel for this device (sm_90a code on a compute capability 9.0
// GPU): probed once, at the first call (a one-thread launch and a wait, then the resident-cluster
// counts of wgmma_gemm_splits: start-up only; Gemm's constructor makes that first call).
bool wgmma_gemm_available();

// True when wgmma_gemm takes (rows, k, n): available, 1 <= rows <= 128, k a positive multiple of
// 64, n a positive multiple of 8.
bool wgmma_gemm_supported(std::int32_t rows, std::int32_t k, std::int32_t n);

// CTAs of the cluster that share one tile's k (1, 2, 4 or 8), from n, k and the clusters of each
// size the device holds at once (asked at start-up): the largest split whose clusters all stay
// resident, each CTA keeping >= 4 k tiles. GRAPHDECODE_WGMMA_SPLITS=1|2|4|8 sets it (sweeps).
std::int32_t wgmma_gemm_splits(std::int32_t k, std::int32_t n);

// What the kernel does with a tile's sums.
enum class WgmmaEpilogue : std::uint8_t {
  kStore,  // y[rows][n] = the sums (bf16 or float)
  // An MLP's gate_up projection into the activation: W = [gate; up] ([n / 2] rows each, n a
  // multiple of 128), y = act [rows][n / 2] bf16, act = swiglu(gate sum, up sum) with each sum
  // rounded to bf16 first: the bits of this GEMM's kStore output followed by the swiglu kernel
  // (engine/kernels/model_kernels.h), without writing and reading gate_up or a launch between.
  kSwiGlu,
};

// The norm fusions' bounds: one 64-row block; the residual epilogue's squares come in parts of
// 128 columns (a CTA's tile); the row scale's longest k (a row's parts are held in registers; the
// 8B's hidden is 4096).
inline constexpr std::int32_t kWgmmaNormMaxRows = 64;
inline constexpr std::int32_t kWgmmaNormPart = 128;
inline constexpr std::int32_t kWgmmaRowScaleMaxK = 4096;

// A decode layer's RMSNorms without kernels of their own at 9-64 rows (the stream GEMV's
// StreamGemvFusion does it at <= 8): the GEMM before a norm (o, down) adds its output to the
// residual stream and leaves the new rows times the norm's weight and their squares; the GEMM after
// it (qkv, gate_up) multiplies by those rows and scales each row's sums by its inverse RMS:
//   rmsnorm(x) W^T = inv_rms(x) (x * weight) W^T,
// so the normed rows are never formed. Why: at 64 rows the two add + norm kernels of a 1B layer
// cost ~8.5 us for 0.5 MB each (bench/NOTES.md 118), a dependent hop between two GEMMs. The
// bits differ from the rmsnorm kernel + GEMM's (that path rounds x * inv_rms to bf16 before the
// weight; this one rounds x * weight and scales the fp32 sums), within fp32 rounding of it.
struct WgmmaNormFusion {
  // Residual epilogue (kStore, bf16, rows <= 64, n a multiple of 128), replacing the store of y
  // (y is not written; residual and weighted must not overlap x, which other CTAs still read):
  //   residual[r][c] = bf16(residual[r][c] + bf16(sum))  (as rmsnorm's residual add rounds)
  //   weighted[r][c] = bf16(residual[r][c] * norm_weight[c])
  //   sum_sq_out[t][r] = sum over tile t's 128 columns c of residual[r][c]^2 (fp32, fixed order)
  std::uint16_t* residual = nullptr;           // [rows][n] bf16
  const std::uint16_t* norm_weight = nullptr;  // [n] bf16: the next RMSNorm's weight
  std::uint16_t* weighted = nullptr;           // [rows][n] bf16
  float* sum_sq_out = nullptr;                 // [n / 128][rows]
  // Row-scale epilogue (kStore bf16 or kSwiGlu, rows <= 64, k <= kWgmmaRowScaleMaxK): x is a
  // residual epilogue's `weighted` over k = its n (the same rows), and each row's sums are
  // multiplied by
  //   inv_rms[r] = rsqrt((sum over p < parts of sum_sq_in[p][r], in p order) / k + eps)
  // before they are rounded (kSwiGlu: the gate and up sums, each, before the bf16 rounding).
  const float* sum_sq_in = nullptr;  // [parts][rows]
  std::int32_t parts = 0;            // k / 128
  float eps = 1e-5f;
  bool residual_epilogue() const noexcept { return residual != nullptr; }
  bool row_scale() const noexcept { return sum_sq_in != nullptr; }
};

// Validates `args` (graphdecode::Error names the field) and launches on `stream`. A fusion
// (above) takes one of its two forms, or none.
void wgmma_gemm(const SkinnyGemmDevice& dev, const SkinnyGemmArgs& args, cudaStream_t stream,
                WgmmaEpilogue epilogue = WgmmaEpilogue::kStore, const WgmmaNormFusion& fusion = {});

}  // namespace graphdecode
