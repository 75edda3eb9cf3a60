// Sampling pass 2 (sampling_kernels.cuh): with the row's plan, score the sure-kept tokens, sum the
// exact masses top-p needs, and compact the boundary buckets' tokens into the candidate list.
#include <cuda_bf16.h>

#include "common/cuda_check.h"
#include "engine/kernels/sampling_kernels.cuh"

namespace graphdecode::sampling {
namespace {

struct FilterShared {
  u64 red[kScanThreads / 32];
};

template <typename T, int kU>
__global__ void __launch_bounds__(kScanThreads) filter_kernel(const __grid_constant__ Launch L) {
  constexpr int W = VecOf<T>::kWidth;
  const SamplingArgs& a = L.a;
  // Rows in the reverse of the scan's order: the rows it read last are the likeliest in L2.
  const int lin = static_cast<int>(gridDim.x - 1 - blockIdx.x);
  const int r = lin / L.chunks;
  const int c = lin - r * L.chunks;
  if (r >= *a.num_rows) return;
  RowState& st = L.ws.state(r);
  if (st.mode != kModeFast) return;
  __shared__ FilterShared sh;
  const int tid = threadIdx.x, lane = tid & 31;
  const RowParams rp = row_params(a, r);
  const float top = st.top;
  const int bk = st.bk, lo = st.lo, hi = st.hi;
  const std::uint64_t seed = a.seed[r], step = a.step[r];

  const T* row = static_cast<const T*>(a.logits) + static_cast<std::int64_t>(r) * a.row_stride;
  const int vocab = a.vocab;
  const int base = c * L.chunk;
  float v[kU][W] = {};
#pragma unroll
  for (int j = 0; j < kU; ++j)
    load_vec(row, base + (j * kScanThreads + tid) * W, vocab, L.vec_ok, v[j]);

  u64* cand = L.ws.cand(r);
  u64 s_hi = 0, s_mid = 0, best = 0;
#pragma unroll
  for (int j = 0; j < kU; ++j) {
    const int i0 = base + (j * kScanThreads + tid) * W;
    u32 score_bits = 0, cand_bits = 0;
#pragma unroll
    for (int e = 0; e < W; ++e) {
      if (i0 + e >= vocab) continue;
      const float x = scaled_logit(v[j][e], top, rp.inv_t);
      const int d = static_cast<int>(bucket_of(key_of(v[j][e])));
      if (d > hi) {  // kept for sure
        if (rp.p_on) s_hi += mass_of_x(x);
        if (x >= -kGumbelSpan) score_bits |= 1u << e;
      } else if (d >= lo || d == bk) {
        cand_bits |= 1u << e;
      } else if (rp.p_on && d > bk) {  // in the top-k set, below the range: counts for Z
        s_mid += mass_of_x(x);
      }
    }
    // Gumbel-max over the sure-kept tokens; one Philox call per group of 4 that needs it.
#pragma unroll
    for (int g = 0; g < W / 4; ++g) {
      if (((score_bits >> (4 * g)) & 0xfu) == 0) continue;
      const Philox4 rnd = sampling_random(seed, step, static_cast<u32>(i0 / 4 + g));
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (!((score_bits >> (4 * g + e)) & 1u)) continue;
        const float s = score_of(v[j][4 * g + e], top, rp.inv_t, rnd.v[e]);
        if (s == s) {
          const u64 pk = pack_max(key_of(s), static_cast<u32>(i0 + 4 * g + e));
          best = pk > best ? pk : best;
        }
      }
    }
    // Append the candidates: one atomic per warp and vector.
    const u32 n = __popc(cand_bits);
    u32 incl = n;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const u32 y = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl += y;
    }
    const u32 total = __shfl_sync(kFull, incl, 31);
    if (total != 0) {
      u32 pos = 0;
      if (lane == 31) pos = atomicAdd(&st.cand_count, total);
      pos = __shfl_sync(kFull, pos, 31) + incl - n;
#pragma unroll
      for (int e = 0; e < W; ++e) {
        if (!((cand_bits >> e) & 1u)) continue;
        if (pos < static_cast<u32>(L.ws.cap))
          cand[pos] = (static_cast<u64>(key_of(v[j][e])) << 32) | static_cast<u32>(i0 + e);
        ++pos;
      }
    }
  }

  // One atomic per CTA and quantity.
  s_hi = block_sum<kScanThreads>(s_hi, sh.red);
  s_mid = block_sum<kScanThreads>(s_mid, sh.red);
  best = block_max<kScanThreads>(best, sh.red);
  if (tid == 0) {
    if (s_hi != 0) atomicAdd(&st.s_hi, s_hi);
    if (s_mid != 0) atomicAdd(&st.s_mid, s_mid);
    if (best != 0) atomicMax(&st.best, best);
  }
}

template <typename T, int kU>
void launch(const Launch& L, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(L.chunks) * static_cast<unsigned>(L.a.max_rows);
  filter_kernel<T, kU><<<grid, kScanThreads, 0, stream>>>(L);
  GD_CHECK_LAUNCH();
}

}  // namespace

void launch_filter(const Launch& L, cudaStream_t stream) {
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
