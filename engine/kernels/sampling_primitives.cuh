// Warp and block primitives of device sampling (sampling_kernels.cuh): sums, maxima, scans,
// aggregated histogram adds and list reservations, over u32 / u64 / double.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace graphdecode::sampling {

using u64 = unsigned long long;
using u32 = std::uint32_t;

// ---- warp primitives (called by all 32 lanes) --------------------------------------------------
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ u64 warp_sum(u64 v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}
__device__ __forceinline__ u32 warp_sum(u32 v) {
  return __reduce_add_sync(kFull, v);
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}
__device__ __forceinline__ u64 warp_max(u64 v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const u64 w = __shfl_xor_sync(kFull, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// hist[bin] += w with one atomic per warp when every contributing lane has the same bin (ties and
// near-constant rows: the case where per-lane atomics would serialize 32 deep), else per lane.
template <typename W>
__device__ __forceinline__ void warp_add(W* hist, u32 bin, W w) {
  const unsigned live = __ballot_sync(kFull, w != 0);
  if (live == 0) return;
  const int leader = __ffs(live) - 1;
  const u32 bin0 = __shfl_sync(kFull, bin, leader);
  if (__all_sync(kFull, w == 0 || bin == bin0)) {
    const W s = warp_sum(w);
    if ((threadIdx.x & 31) == leader) atomicAdd(&hist[bin0], s);
  } else if (w != 0) {
    atomicAdd(&hist[bin], w);
  }
}

// Sum of v over lanes 0 .. this lane (an inclusive scan).
template <typename T>
__device__ __forceinline__ T warp_inclusive_sum(T v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += y;
  }
  return v;
}

// Reserves `n` (this lane's count) consecutive slots of a list whose length is *count, with one
// atomic per warp (an inclusive scan of the lanes' counts); returns this lane's first slot.
__device__ __forceinline__ u32 warp_reserve(u32* count, u32 n) {
  const int lane = threadIdx.x & 31;
  const u32 incl = warp_inclusive_sum(n);
  const u32 total = __shfl_sync(kFull, incl, 31);
  u32 pos = 0;
  if (lane == 31) pos = atomicAdd(count, total);
  return __shfl_sync(kFull, pos, 31) + incl - n;
}

// a[bin] += wa and b[bin] += wb (u32), aggregated like warp_add.
__device__ __forceinline__ void warp_add2(u32* a, u32* b, u32 bin, u32 wa, u32 wb) {
  const unsigned live = __ballot_sync(kFull, wa != 0);
  if (live == 0) return;
  const int leader = __ffs(live) - 1;
  const u32 bin0 = __shfl_sync(kFull, bin, leader);
  if (__all_sync(kFull, wa == 0 || bin == bin0)) {
    const u32 sa = __reduce_add_sync(kFull, wa), sb = __reduce_add_sync(kFull, wb);
    if ((threadIdx.x & 31) == leader) {
      atomicAdd(&a[bin0], sa);
      if (sb != 0) atomicAdd(&b[bin0], sb);
    }
  } else if (wa != 0) {
    atomicAdd(&a[bin], wa);
    if (wb != 0) atomicAdd(&b[bin], wb);
  }
}

// ---- block primitives (called by every thread; scratch holds one value per warp) ---------------
template <int NT, typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  T s = 0;
#pragma unroll
  for (int w = 0; w < NT / 32; ++w) s += scratch[w];
  return s;
}

template <int NT>
__device__ __forceinline__ u64 block_max(u64 v, u64* scratch) {
  v = warp_max(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  u64 m = 0;
#pragma unroll
  for (int w = 0; w < NT / 32; ++w) m = scratch[w] > m ? scratch[w] : m;
  return m;
}

// Sum of v over the threads with a larger index (an exclusive suffix scan).
template <int NT, typename T>
__device__ __forceinline__ T block_suffix(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T incl = v;  // sum over lanes >= lane
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_down_sync(kFull, incl, o);
    if (lane + o < 32) incl += y;
  }
  __syncthreads();
  if (lane == 0) scratch[warp] = incl;
  __syncthreads();
  T above = incl - v;
#pragma unroll
  for (int w = 0; w < NT / 32; ++w)
    if (w > warp) above += scratch[w];
  return above;
}

}  // namespace graphdecode::sampling
