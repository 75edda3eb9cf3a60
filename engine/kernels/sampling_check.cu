// Sampling pass 3 of draw rows (sampling_kernels.cuh, kDrawMinTopP): over every (row, chunk) item
// of the draw rows, the row's exact mass Z and, for each pick draw_keys() keeps, the exact mass of
// strictly larger logits; one atomic per CTA and sum. Resolve then only compares.
#include <cuda_bf16.h>

#include <algorithm>

#include "common/cuda_check.h"
#include "engine/kernels/sampling_kernels.cuh"

namespace graphdecode::sampling {
namespace {

constexpr int kSums = kDrawPicks + 1;  // Z, then above[0 .. kDrawPicks)
// CTAs per SM: the filter's occupancy (the body holds a chunk's 32 logits a thread as it does).
constexpr int kCheckBlocksPerSm = kFilterBlocksPerSm;

// The tokens above pick 0's logit wait in a per-warp list in shared memory (their mass and key)
// and are summed into the picks' masses by the warp together: summed where they stood, the ~20%
// of a near-flat row's tokens above a softmax draw put the eight compare-and-adds in nearly every
// token slot of a warp (one lane is enough; ncu, calls t38-t39: 57 us at B = 128 flat p 0.95).
// 32 x 8 slots: a whole vector of every lane fits after a drain.
constexpr int kCheckDefer = 256;

struct CheckDefer {
  u64 mass[kCheckDefer];
  u32 key[kCheckDefer];
};

struct CheckShared {
  u64 red[kScanThreads / 32][kSums];
  CheckDefer defer[kScanThreads / 32];
};

// Adds the warp's deferred tokens d[0 .. n) (warp-uniform n) to the lanes' pick masses.
__device__ __forceinline__ void drain_check(const CheckDefer& d, u32 n,
                                            const u32 (&key)[kDrawPicks],
                                            u64 (&above)[kDrawPicks]) {
  __syncwarp();  // the lanes' list writes
  for (u32 q = threadIdx.x & 31; q < n; q += 32) {
    const u64 m = d.mass[q];
    const u32 k = d.key[q];
#pragma unroll
    for (int p = 0; p < kDrawPicks; ++p)
      if (k > key[p]) above[p] += m;
  }
  __syncwarp();  // the list is reused
}

// One (row, chunk) item: key[] from draw_keys (key[0] < the top logit's key).
template <typename T, int kU>
__device__ void check_item(const Launch& L, int r, int c, float top, float inv_t,
                           const u32 (&key)[kDrawPicks], CheckShared& sh) {
  constexpr int W = VecOf<T>::kWidth;
  const SamplingArgs& a = L.a;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const T* row = static_cast<const T*>(a.logits) + static_cast<std::int64_t>(r) * a.row_stride;
  const int base = c * L.chunk;
  float v[kU][W] = {};
#pragma unroll
  for (int j = 0; j < kU; ++j)
    load_vec(row, base + (j * kScanThreads + tid) * W, a.vocab, L.vec_ok, v[j]);
  u64 z = 0, above[kDrawPicks] = {};
  CheckDefer& d = sh.defer[warp];
  u32 n = 0;  // deferred tokens in the warp's list (warp-uniform)
#pragma unroll
  for (int j = 0; j < kU; ++j) {
    const int i0 = base + (j * kScanThreads + tid) * W;
    u64 mv[W];
    u32 flag = 0;
#pragma unroll
    for (int e = 0; e < W; ++e) {
      mv[e] = 0;
      if (i0 + e >= a.vocab) continue;
      mv[e] = mass_of(v[j][e], top, inv_t);
      z += mv[e];
      if (key_of(v[j][e]) > key[0]) flag |= 1u << e;  // else below every pick kept in play
    }
    if (!__any_sync(kFull, flag != 0)) continue;
    const u32 mine = __popc(flag);
    const u32 incl = warp_inclusive_sum(mine);
    const u32 total = __shfl_sync(kFull, incl, 31);
    if (n + total > static_cast<u32>(kCheckDefer)) {
      drain_check(d, n, key, above);
      n = 0;
    }
    u32 pos = n + incl - mine;
#pragma unroll
    for (int e = 0; e < W; ++e) {
      if (!((flag >> e) & 1u)) continue;
      d.mass[pos] = mv[e];
      d.key[pos] = key_of(v[j][e]);
      ++pos;
    }
    n += total;
  }
  if (n != 0) drain_check(d, n, key, above);
  z = warp_sum(z);
#pragma unroll
  for (int q = 0; q < kDrawPicks; ++q) above[q] = warp_sum(above[q]);
  __syncthreads();  // the previous item's readers of sh are done
  if (lane == 0) {
    sh.red[warp][0] = z;
#pragma unroll
    for (int q = 0; q < kDrawPicks; ++q) sh.red[warp][q + 1] = above[q];
  }
  __syncthreads();
  if (tid < kSums) {
    u64 s = 0;
#pragma unroll
    for (int w = 0; w < kScanThreads / 32; ++w) s += sh.red[w][tid];
    RowState& st = L.ws.state(r);
    if (s != 0) atomicAdd(tid == 0 ? &st.z : &st.above[tid - 1], s);
  }
}

// A grid of at most kCheckBlocksPerSm CTAs per SM loops over the (listed row, chunk) items, the
// rows listed last first (their filter items ran last: the likeliest in L2). With no draw row
// listed (greedy and other steps) every CTA reads the count and exits.
template <typename T, int kU>
__global__ void __launch_bounds__(kScanThreads, kCheckBlocksPerSm)
    check_kernel(const __grid_constant__ Launch L) {
  __shared__ CheckShared sh;
  pdl_wait_for_prior_grid();
  pdl_launch_dependents();
  const int listed =
      static_cast<int>(min(__ldcg(&L.ws.state(0).draw_count), static_cast<u32>(L.a.max_rows)));
  const int items = listed * L.chunks;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int at = item / L.chunks;
    const int r = static_cast<int>(__ldcg(&L.ws.state(listed - 1 - at).draw_list));
    const RowState& st = L.ws.state(r);
    const float inv_t = 1.f / L.a.temperature[r];  // row_params' inv_t
    const float top = key_to_float(packed_key(__ldcg(&st.argmax)));
    u32 key[kDrawPicks];
    draw_keys(st, key);
    check_item<T, kU>(L, r, item - at * L.chunks, top, inv_t, key, sh);
  }
}

template <typename T, int kU>
void launch(const Launch& L, cudaStream_t stream) {
  const int items = L.chunks * L.a.max_rows;
  const auto grid = dim3(static_cast<unsigned>(std::min(items, kCheckBlocksPerSm * L.sms)));
  launch_pdl(check_kernel<T, kU>, grid, dim3(kScanThreads), 0, stream, L);
}

}  // namespace

void launch_check(const Launch& L, cudaStream_t stream) {
  constexpr int kF = VecOf<float>::kWidth, kB = VecOf<__nv_bfloat16>::kWidth;
  const bool small = L.chunk == kSmallChunk;
  if (L.a.logits_type == LogitsType::kFloat32) {
    if (small)
      launch<float, kSmallChunk / (kScanThreads * kF)>(L, stream);
    else
      launch<float, kLargeChunk / (kScanThreads * kF)>(L, stream);
  } else {
    if (small)
      launch<__nv_bfloat16, kSmallChunk / (kScanThreads * kB)>(L, stream);
    else
      launch<__nv_bfloat16, kLargeChunk / (kScanThreads * kB)>(L, stream);
  }
}

}  // namespace graphdecode::sampling
