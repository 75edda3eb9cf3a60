// A plain bf16 GEMM of our own, y[rows][n] = x[rows][k] * W^T (W [n][k] row-major, fp32
// accumulation, bf16 or float output): one warp per output element, lanes striding k. Slow and
// simple; no shared memory.
//
// Why it exists: compute-sanitizer racecheck (2025.3, H200) cannot filter cuBLAS out of an
// engine: excluding its Hopper kernels (--kernel-name-exclude kns=nvjet) or keeping only ours
// (--kernel-name kns=graphdecode) fails with an internal sanitizer error at their first launch,
// and instrumenting them costs host memory (test_llama_model_gpu: 15 GB and 177 s with cuBLAS,
// 5 GB and 29 s with this kernel) and reports hazards racecheck cannot order (TMA / async proxy).
// With GRAPHDECODE_PLAIN_GEMM=1 (scripts/sanitize.sh sets it for racecheck) the engine's GEMMs
// run here instead (engine/gemm.h), so racecheck sees only our kernels.
#pragma once

#include <cuda_runtime.h>

#include "engine/kernels/skinny_gemm.h"

namespace graphdecode {

// Any rows, k, n >= 1; no alignment needs. Graph-safe (fixed grid, no allocation).
void plain_gemm(const SkinnyGemmArgs& args, cudaStream_t stream);

}  // namespace graphdecode
