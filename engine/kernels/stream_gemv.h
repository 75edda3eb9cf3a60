// Streaming GEMV for decode (Gemm::run takes it where bench_gemm measured it ahead of cuBLAS and
// of the skinny kernel: engine/gemm.h GemvMode): y[rows][n] = x[rows][k] * W^T with rows <= 8, W
// [n][k] row-major bf16, fp32 accumulation, bf16 (round to nearest even) or float output. The same
// contract as the skinny GEMM (skinny_gemm.h), built differently, for the shapes where the skinny
// kernel loses to cuBLAS (n <= 3072 at k = 2048, and lm_head; bench/results/h100_bench_gemm.txt):
// * bytes in flight without registers: a producer warp streams W through a ring of shared-memory
//   stages with bulk copies (cp.async.bulk, one per W row of a stage, completion counted on an
//   mbarrier), up to 8 stages of 8 W rows x 1024 k (16 KiB) per SM;
// * 8 consumer warps take each stage's k range in slices: m16n8k16 mma on tensor cores, the W
//   rows as the B fragment, x (staged once per CTA in shared memory) as A, rows zero-padded to 16;
//   k permuted alike in A and B as in the skinny GEMM (each fragment one 16-byte chunk); rows of a
//   stage are padded by 16 bytes so the 8 rows a warp reads fall in different banks;
// * each tile's 8 warp partials summed in a fixed order: bitwise reproducible, eager == graph;
// * a programmatic dependent launch (common/pdl.cuh): the producer fills the ring before the wait
//   for the kernel before (weights depend on no kernel of the step); x is read and y written only
//   after it; 288 threads and few registers, so the next kernel's CTAs can be resident beside it.
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

// Validates `args` (graphdecode::Error names the field) and launches on
// `stream`.
void stream_gemv(const SkinnyGemmDevice& dev, const SkinnyGemmArgs& args, cudaStream_t stream);

}  // namespace graphdecode
