// A plain bf16 GEMM of our own, y[rows][n] = x[rows][k] * W^T (W [n][k] row-major, fp32
// accumulation, bf16 or float output): one warp per output element, lanes striding k. Slow and
// simple; no shared memory.
//
// Why it exists: compute-sanitizer racecheck (2025.3, H200) cannot check an engine that calls
// cuBLAS. Instrumenting cuBLAS's Hopper kernels (nvjet_sm90_*) grows the tool's host memory by
// ~1.2 GB/s (an engine test passed 20 GB in 17 s), and excluding them (--kernel-name-exclude
// kns=nvjet) or filtering to ours (--kernel-name kns=graphdecode) makes the tool fail with an
// internal error at their first launch. With GRAPHDECODE_PLAIN_GEMM=1 (scripts/sanitize.sh sets it
// for racecheck) the engine's GEMMs run here instead (engine/gemm.h), so racecheck sees only our
// kernels, every one of which it then checks.
#pragma once

#include <cuda_runtime.h>

#include "engine/kernels/skinny_gemm.h"

namespace graphdecode {

// Any rows, k, n >= 1; no alignment needs. Graph-safe (fixed grid, no allocation).
void plain_gemm(const SkinnyGemmArgs& args, cudaStream_t stream);

}  // namespace graphdecode
