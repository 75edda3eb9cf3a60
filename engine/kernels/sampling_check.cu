// Sampling pass 3 of draw rows (sampling_kernels.cuh, kDrawMinTopP): over every (row, chunk) item
// of the draw rows, the row's exact mass Z and, for each pick draw_keys() keeps, the exact mass of
// strictly larger logits; one atomic per CTA and sum. Resolve then only compares. Measured and
// dropped (calls t39-t40, B = 128 flat p 0.95): Z summed by the filter instead (the filter +21
// us, the check -1), and the tokens above pick 0 deferred to per-warp lists as the filter's are
// (the check 57 -> 68 us: its compare-and-adds were not what it waits on).
#include <cuda_bf16.h>

#include <algorithm>

#include "common/cuda_check.h"
#include "engine/kernels/sampling_kernels.cuh"

namespace graphdecode::sampling {
namespace {

constexpr int kSums = kDrawPicks + 1;  // Z, then above[0 .. kDrawPicks)
// CTAs per SM: the filter's occupancy (the body holds a chunk's 32 logits a thread as it does).
constexpr int kCheckBlocksPerSm = kFilterBlocksPerSm;

struct CheckShared {
  u64 red[kScanThreads / 32][kSums];
  int next[2];  // the CTA's next item (dynamic items), two slots
};

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
#pragma unroll
  for (int j = 0; j < kU; ++j) {
    const int i0 = base + (j * kScanThreads + tid) * W;
#pragma unroll
    for (int e = 0; e < W; ++e) {
      if (i0 + e >= a.vocab) continue;
      const u64 m = mass_of(v[j][e], top, inv_t);
      z += m;
      const u32 k = key_of(v[j][e]);
      if (k <= key[0]) continue;  // the common case: below every pick kept in play
#pragma unroll
      for (int q = 0; q < kDrawPicks; ++q)
        if (k > key[q]) above[q] += m;
    }
  }
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
  RowState& st0 = L.ws.state(0);
  int item = static_cast<int>(blockIdx.x);
  for (int k = 0; item < items; ++k) {
    // As the filter's loop: the next item from a counter, taken before this one's reads.
    u32 taken = 0;
    if (L.dynamic_check && threadIdx.x == 0) taken = atomicAdd(&st0.check_next, 1u);
    const int at = item / L.chunks;
    const int r = static_cast<int>(__ldcg(&L.ws.state(listed - 1 - at).draw_list));
    const RowState& st = L.ws.state(r);
    const float inv_t = 1.f / L.a.temperature[r];  // row_params' inv_t
    const float top = key_to_float(packed_key(__ldcg(&st.argmax)));
    u32 key[kDrawPicks];
    draw_keys(st, key);
    check_item<T, kU>(L, r, item - at * L.chunks, top, inv_t, key, sh);
    if (!L.dynamic_check) {
      item += static_cast<int>(gridDim.x);
      continue;
    }
    if (threadIdx.x == 0) sh.next[k & 1] = static_cast<int>(gridDim.x + taken);  // slot k: k + 2
    __syncthreads();
    item = sh.next[k & 1];
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
  with_chunk_shape(L, [&]<typename T, int kU>() { launch<T, kU>(L, stream); });
}

}  // namespace graphdecode::sampling
