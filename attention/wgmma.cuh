// Hopper warpgroup MMA (wgmma, sm_90a) for the extend layout (attend_wgmma.cuh): shared-memory
// matrix descriptors of the tiles kv_tile_copy.cuh writes, the m64n64k16 products the layout needs
// (S = Q K^T with both operands in shared memory, O += P V with P in registers), and the fences
// around them.
//
// The tiles' 64-column slabs (one at head dim 64) have 128-byte rows, and their chunk ^ (row % 8)
// is the hardware's 128-byte swizzle (address bits 4-6 XOR bits 7-9) as long as each slab starts
// on a 1024-byte boundary. Q and K are then "K-major" operands (the reduction dimension, head dim,
// contiguous), V an "MN-major" one (its N dimension, head dim, contiguous).
#pragma once

#include <cstdint>

#include "attention/mma_utils.cuh"

namespace graphdecode::attn {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GD_ATTN_HAS_WGMMA 1
#else
#define GD_ATTN_HAS_WGMMA 0
#endif

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride byte
// offsets (all in 16-byte units) and the swizzle mode in bits 62-63 (1 = 128 bytes).
// K-major tile of rows x 64 elements (Q, K): 8-row groups 1024 bytes apart (stride offset); the
// leading offset is unused in this mode (1 by convention). MN-major tile (V, keys x 64 dims): the
// reduction runs over rows, 8-row groups 1024 bytes apart (stride offset); the leading offset
// steps between 64-wide column blocks, of which head dim 64 has one.
__device__ __forceinline__ std::uint64_t sw128_desc(std::uint32_t smem_byte_addr) {
  constexpr std::uint64_t kLeading = 1, kStride = 1024 >> 4, kSwizzle128 = 1;
  return static_cast<std::uint64_t>((smem_byte_addr & 0x3FFFF) >> 4) | (kLeading << 16) |
         (kStride << 32) | (kSwizzle128 << 62);
}

// Makes this thread's generic-proxy shared-memory writes (cp.async, st.shared) visible to the
// async proxy that wgmma reads its shared operands through; then a barrier publishes them.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Orders the registers written by ordinary instructions before the wgmma that reads them.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits for every committed wgmma group of this warpgroup but the kPending newest.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
  wgmma_wait<0>();
}
// Redefines accumulator registers after a wait, so that the compiler does not move their reads
// above it (it sees the wgmma's asm, not the hardware, write them).
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[8][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

#define GD_WGMMA_D32                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define GD_WGMMA_D32_OPERANDS(d)                                                                  \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// D (64 x 64, fp32) = A (64 x 16, K-major, shared) * B (16 x 64 as 64 rows x 16, K-major, shared)
// (+ D when accumulate). Thread t of the warpgroup holds D rows 16 (t / 32) + (t % 32) / 4 (+ 8)
// and columns 8 j + 2 (t % 4) (+ 1): acc[j][e] is row + 8 (e / 2), column 8 j + 2 (t % 4) + e % 2,
// the mma.sync m16n8 accumulator layout, one block per 8 columns.
__device__ __forceinline__ void wgmma_fence_operands(uint32_t (&r)[4][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[j][e])::"memory");
}

template <typename T>
__device__ __forceinline__ void wgmma_64x64x16_ss(float (&acc)[8][4], std::uint64_t desc_a,
                                                  std::uint64_t desc_b, bool accumulate);
template <typename T>
__device__ __forceinline__ void wgmma_64x64x16_rs_mn(float (&acc)[8][4], const uint32_t (&a)[4],
                                                     std::uint64_t desc_b);

#define GD_WGMMA_SS(TYPE)                                                          \
  asm volatile(                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                 \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " GD_WGMMA_D32 \
      ", %32, %33, p, 1, 1, 0, 0;\n}\n"                                            \
      : GD_WGMMA_D32_OPERANDS(d)                                                   \
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)))
// A (64 x 16) from registers in the mma.sync m16n8k16 A layout per warp (rows 16 warp ..), B
// (16 x 64) MN-major in shared memory (transposed, imm-trans-b = 1); always accumulates.
#define GD_WGMMA_RS_MN(TYPE)                                                                \
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " GD_WGMMA_D32 \
               ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"                                 \
               : GD_WGMMA_D32_OPERANDS(d)                                                   \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b))

#if GD_ATTN_HAS_WGMMA
template <>
__device__ __forceinline__ void wgmma_64x64x16_ss<__nv_bfloat16>(float (&acc)[8][4],
                                                                 std::uint64_t desc_a,
                                                                 std::uint64_t desc_b,
                                                                 bool accumulate) {
  float* d = &acc[0][0];
  GD_WGMMA_SS("bf16");
}
template <>
__device__ __forceinline__ void wgmma_64x64x16_ss<__half>(float (&acc)[8][4], std::uint64_t desc_a,
                                                          std::uint64_t desc_b, bool accumulate) {
  float* d = &acc[0][0];
  GD_WGMMA_SS("f16");
}
template <>
__device__ __forceinline__ void wgmma_64x64x16_rs_mn<__nv_bfloat16>(float (&acc)[8][4],
                                                                    const uint32_t (&a)[4],
                                                                    std::uint64_t desc_b) {
  float* d = &acc[0][0];
  GD_WGMMA_RS_MN("bf16");
}
template <>
__device__ __forceinline__ void wgmma_64x64x16_rs_mn<__half>(float (&acc)[8][4],
                                                             const uint32_t (&a)[4],
                                                             std::uint64_t desc_b) {
  float* d = &acc[0][0];
  GD_WGMMA_RS_MN("f16");
}
#endif

#undef GD_WGMMA_SS
#undef GD_WGMMA_RS_MN
#undef GD_WGMMA_D32_OPERANDS
#undef GD_WGMMA_D32

}  // namespace graphdecode::attn
