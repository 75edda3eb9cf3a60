// Streaming GEMV for decode (Gemm::run takes it where bench_gemm measured it ahead of cuBLAS and
// of the skinny kernel: engine/gemm.h GemvMode): y[rows][n] = x[rows][k] * W^T with rows <= 8, W
// [n][k] row-major bf16, fp32 accumulation, bf16 (round to nearest even) or float output. The same
// contract as the skinny GEMM (skinny_gemm.h), built differently, for the shapes where the skinny
// kernel loses to cuBLAS (n <= 3072 at k = 2048, and lm_head; bench/results/h100_bench_gemm.txt):
// * bytes in flight without registers: a producer warp streams W through a ring of shared-memory
//   stages with bulk copies (cp.async.bulk, one per W row of a stage, completion counted on an
//   mbarrier), up to 8 stages of 8 W rows x 1024, 2048 or 4096 k (16-64 KiB) per SM
//   (stream_gemv_chunk_k);
// * 8 consumer warps take each stage's k range in slices: m16n8k16 mma on tensor cores, the W
//   rows as the B fragment, x (staged once per CTA in shared memory) as A, rows zero-padded to 16;
//   k permuted alike in A and B as in the skinny GEMM (each fragment one 16-byte chunk); rows of a
//   stage are padded by 16 bytes so the 8 rows a warp reads fall in different banks;
// * each tile's 8 warp partials summed in a fixed order: bitwise reproducible, eager == graph;
// * a programmatic dependent launch (common/pdl.cuh): the producer fills the ring before the wait
//   for the kernel before (weights depend on no kernel of the step); x is read and y written only
//   after it; 288 threads and few registers, so the next kernel's CTAs can be resident beside it.
// * from 4 rows, for GEMVs without the norm prologue (stream_gemv.cu XMode): x by CTA pairs of a
//   cluster, each bulk-copying half of it to both (1B step -2% at B = 8); plain loads where the
//   pairs are not all resident (SkinnyGemmDevice::x_pairs). GRAPHDECODE_GEMV_X=loads turns it off.
// Graph-safe: fixed grid, no allocation, no host sync.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/kernels/skinny_gemm.h"  // SkinnyGemmArgs, SkinnyGemmDevice, kSkinnyMaxRows

namespace graphdecode {

// True when stream_gemv takes (rows, k) on `dev`: 1 <= rows <= 8, k a positive multiple of 8, and
// x plus at least two stages fit in shared memory.
bool stream_gemv_supported(const SkinnyGemmDevice& dev, std::int32_t rows, std::int32_t k);

// A decode layer's input RMSNorm without a kernel of its own: the GEMV before it (the MLP down
// projection) adds its output to the residual stream and leaves each CTA's sum of squares of the
// new residual rows; the GEMV after it (qkv) scales the residual while staging it as x. The sums
// are per CTA (each owns whole columns), so no CTA waits on another and the staging, which every
// CTA does before its first product, gains no reduction.
struct StreamGemvFusion {
  // Epilogue, when `residual` is set (bf16 output only): after y = bf16(x W^T),
  //   residual[r][c] = bf16(residual[r][c] + y[r][c])  (as rmsnorm's residual add rounds)
  // and sum_sq_out[cta][r] = sum over that CTA's columns c of residual[r][c]^2 (fp32, fixed order).
  std::uint16_t* residual = nullptr;  // [rows][n] bf16
  float* sum_sq_out = nullptr;        // [stream_gemv_grid(dev, n)][rows]
  // Prologue, when `norm_weight` is set: x is a residual stream whose squares `sum_sq_in` holds
  // (an epilogue above over n = k); the product runs on rmsnorm(x) as model_kernels.h computes it,
  //   x'[r][i] = bf16(norm_weight[i] * bf16(x[r][i] * rsqrt(sum_c sum_sq_in[c][r] / k + eps))),
  // with the sum over c in a fixed order (bitwise reproducible; it differs from the rmsnorm
  // kernel's order, so the two agree to fp32 rounding, not bitwise).
  const std::uint16_t* norm_weight = nullptr;  // [k] bf16, 16-byte aligned
  const float* sum_sq_in = nullptr;            // [parts][rows]
  std::int32_t parts = 0;
  float eps = 1e-5f;
};

// CTA pairs of the multicast kernel the device holds at once (SkinnyGemmDevice::current asks, so
// no launch inside a graph capture does); opts that kernel in to the device's shared memory.
std::int32_t stream_gemv_resident_pairs(const SkinnyGemmDevice& dev);

// The k of one ring stage a launch over (rows, k) takes: 4096 for k in [4096, 8192) and 1024
// elsewhere (measured in decode steps: stream_gemv.cu), narrower where x leaves too little room,
// or the cap GRAPHDECODE_GEMV_CHUNK sets. Throws graphdecode::Error where !stream_gemv_supported.
std::int32_t stream_gemv_chunk_k(const SkinnyGemmDevice& dev, std::int32_t rows, std::int32_t k);

// CTAs of a stream GEMV launch over n outputs (one per SM at most): the `parts` of the sums an
// epilogue leaves.
std::int32_t stream_gemv_grid(const SkinnyGemmDevice& dev, std::int32_t n);

// Validates `args` and `fusion` (graphdecode::Error names the field) and launches on `stream`.
void stream_gemv(const SkinnyGemmDevice& dev, const SkinnyGemmArgs& args, cudaStream_t stream,
                 const StreamGemvFusion& fusion = {});

}  // namespace graphdecode
