// Device helpers shared by the engine's row kernels: 16-byte bf16 vectors and block reductions.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace graphdecode::detail {

// Eight bf16 values moved as one 16-byte load/store.
struct Vec8 {
  float v[8];
};

__device__ __forceinline__ float bf16_bits_to_float(std::uint16_t b) {
  return __uint_as_float(static_cast<std::uint32_t>(b) << 16);
}
__device__ __forceinline__ std::uint16_t float_to_bf16_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
// Rounds through bf16 and back (the value a bf16 tensor would hold).
__device__ __forceinline__ float round_bf16(float f) {
  return __bfloat162float(__float2bfloat16_rn(f));
}

// SwiGLU of one gate and one up value (floats that hold bf16 values): silu(gate) rounded to bf16,
// times up; the caller rounds the product when it stores it. The swiglu kernel and the warpgroup
// GEMM's SwiGLU epilogue share it, so the fused path gives the unfused one's bits.
__device__ __forceinline__ float swiglu_value(float gate, float up) {
  return round_bf16(gate / (1.f + expf(-gate))) * up;
}

__device__ __forceinline__ Vec8 load8(const std::uint16_t* p) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const std::uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  Vec8 out;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out.v[2 * i] = __uint_as_float(w[i] << 16);
    out.v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
  return out;
}

__device__ __forceinline__ void store8(std::uint16_t* p, const Vec8& x) {
  std::uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = static_cast<std::uint32_t>(float_to_bf16_bits(x.v[2 * i])) |
           (static_cast<std::uint32_t>(float_to_bf16_bits(x.v[2 * i + 1])) << 16);
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ void store8_zero(std::uint16_t* p) {
  *reinterpret_cast<uint4*>(p) = make_uint4(0u, 0u, 0u, 0u);
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), in a fixed order: the result is
// bitwise reproducible. Every thread gets the sum. `scratch` holds 32 floats.
__device__ __forceinline__ float block_sum(float x, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  const int nwarps = blockDim.x >> 5;
  x = lane < nwarps ? scratch[lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

}  // namespace graphdecode::detail
