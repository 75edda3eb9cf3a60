// Skinny GEMM for decode: y[rows][n] = x[rows][k] * W^T with rows <= 8, W [n][k] row-major bf16
// (Hugging Face nn.Linear), fp32 accumulation, bf16 (round to nearest even) or float output.
//
// At rows <= 8 a linear layer is a matrix-vector product bound by reading W once, so the kernel
// is built for bandwidth:
// * persistent: one CTA of 512 threads (16 warps) per SM (grid min(SMs, tiles)); CTA b owns a
//   contiguous range of 8-column tiles (8 W rows each), one tile per round when k >= 2048;
// * the 16 warps split k (16 slices when k >= 2048); each thread reads 16-byte W chunks with
//   ld.global.nc.L1::no_allocate.L2::256B (4 threads cover 64 contiguous bytes of a row, 8 rows
//   per warp load) into two register batches of 4 (k 2048) or 8 (k >= 4096) loads: 4..16 loads
//   in flight per thread, 32..128 KiB per SM, across round ends too;
// * products on tensor cores (mma.m16n8k16, bf16 in, fp32 accumulate): the W chunk is the B
//   fragment (n = the tile's 8 columns), the x chunk the A fragment (m = the rows, zero-padded
//   to 16). k is permuted alike in A and B (a dot product allows it), so each fragment is one
//   16-byte chunk: no shuffles, and rows is a runtime value (one kernel for 1..8);
// * x [rows][k] is staged in shared memory once per CTA, during the first round (cp.async,
//   overlapped with the W loads); each thread keeps exactly the x chunks it multiplies, so no
//   barrier guards them, and later tiles read them from shared memory;
// * the k slices of a tile are summed through shared memory in a fixed order (one barrier per
//   round): bitwise reproducible, the same in eager and in graph replay.
// * a programmatic dependent launch (common/pdl.cuh): the first two register batches of W are
//   read before the wait for the kernel before it (weights depend on no kernel of the step), x is
//   read and y written only after it.
// Graph-safe: fixed grid, no allocation, no host sync. Like cuBLAS, all `rows` rows are computed
// (rows past the live tokens are harmless: rows are independent).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace graphdecode {

struct SkinnyGemmArgs {
  const std::uint16_t* x = nullptr;  // [rows][k] bf16, 16-byte aligned
  const std::uint16_t* w = nullptr;  // [n][k] bf16, 16-byte aligned
  void* y = nullptr;                 // [rows][n] bf16 or float (out_f32)
  std::int32_t rows = 0;             // 1..kSkinnyMaxRows
  std::int32_t k = 0;                // multiple of 8
  std::int32_t n = 0;
  bool out_f32 = false;
};

inline constexpr std::int32_t kSkinnyMaxRows = 8;

// Per-device limits, asked once (SkinnyGemmDevice::current also raises the kernel's dynamic shared
// memory limit to the device's opt-in maximum, so no launch ever needs to).
struct SkinnyGemmDevice {
  std::int32_t sm_count = 0;
  std::int32_t max_smem = 0;  // bytes of dynamic shared memory a block may opt in to
  std::int32_t x_pairs = 0;   // stream GEMV CTA pairs resident at once (its multicast x; 0: none)
  static SkinnyGemmDevice current();
};

// Dynamic shared memory of one launch: x [rows][k] bf16 (k rounded up to the warps' slices) plus
// the split-k partials (8 KiB).
std::size_t skinny_gemm_smem_bytes(std::int32_t rows, std::int32_t k);

// True when skinny_gemm handles (rows, k) on `dev`: 1 <= rows <= 8, k a positive multiple of 8 and
// x fits in shared memory (rows * k up to ~110K elements on an H100: k 8192 at rows 8, k 16384
// at rows <= 6). Alignment of the pointers is the caller's to check.
bool skinny_gemm_supported(const SkinnyGemmDevice& dev, std::int32_t rows, std::int32_t k);

// Validates `args` (graphdecode::Error names the field) and launches on `stream`.
void skinny_gemm(const SkinnyGemmDevice& dev, const SkinnyGemmArgs& args, cudaStream_t stream);

// The argument checks the skinny GEMM and the stream GEMV (stream_gemv.h) share: `dev` made by
// current(), rows in 1..8, k a positive multiple of 8, n positive, `fits` (the kernel's own
// shared-memory test; `why_not` says what did not fit), x and w non-null and 16-byte aligned, y
// non-null. A graphdecode::Error names the first field that fails; `kernel` names the kernel.
void require_skinny_args(const SkinnyGemmDevice& dev, const SkinnyGemmArgs& args,
                         const char* kernel, bool fits, const char* why_not);

}  // namespace graphdecode
