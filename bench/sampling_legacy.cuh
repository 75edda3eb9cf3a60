// The device sampling kernel before the chunked rewrite (git history: engine/kernels/sampling.cu
// up to the `sampling` branch), kept for bench_sampling's comparison only: one 1024-thread CTA
// per row, up to ~10 passes over the row with shared-memory atomics. Same contract as sample().
#pragma once

#include <cuda_bf16.h>

#include <climits>
#include <cstdint>

#include "common/cuda_check.h"
#include "engine/kernels/philox.h"
#include "engine/kernels/sampling.h"

namespace graphdecode::bench::legacy {
namespace {
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBuckets = 256;                  // radix digit: 8 bits, 4 levels over a 32-bit key
constexpr float kMassScale = 1099511627776.f;  // 2^40: fixed-point probability (p <= 1)

using u64 = unsigned long long;

__device__ __forceinline__ float load_logit(const float* row, int i) {
  return row[i];
}
__device__ __forceinline__ float load_logit(const __nv_bfloat16* row, int i) {
  return __bfloat162float(row[i]);
}
__device__ __forceinline__ std::uint32_t key_of(float v) {
  return float_order_key(__float_as_uint(v));
}

struct Shared {
  u64 hist[kBuckets];
  float best_v[kWarps];
  int best_i[kWarps];
  std::uint32_t digit;
  u64 rem;
};

// Argmax over the block, lowest index on ties; idx INT_MAX = "none". Every thread gets the result.
__device__ int block_argmax(float v, int idx, Shared& sh) {
  auto better = [](float v2, int i2, float v1, int i1) {
    if (i2 == INT_MAX) return false;
    if (i1 == INT_MAX) return true;
    return v2 > v1 || (v2 == v1 && i2 < i1);
  };
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
    if (better(v2, i2, v, idx)) v = v2, idx = i2;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // sh.best_* may still be read by a previous call
  if (lane == 0) sh.best_v[warp] = v, sh.best_i[warp] = idx;
  __syncthreads();
  v = sh.best_v[lane];
  idx = sh.best_i[lane];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
    if (better(v2, i2, v, idx)) v = v2, idx = i2;
  }
  return idx;
}

// Fixed-point probability of logit v: exp((v - lmax) / T) * 2^40, truncated. One definition for
// every pass, so the radix levels see the same weights.
__device__ __forceinline__ u64 mass_of(float v, float lmax, float inv_t) {
  return __float2ull_rz(expf((v - lmax) * inv_t) * kMassScale);
}

// Radix select over the order keys of the row's elements with key >= min_key, weighted by 1
// (kMass = false) or by mass_of (kMass = true): returns the key K with
//   weight(key > K) < rem <= weight(key >= K).
// For kMass, rem is computed at the first level as max(1, ceil(top_p * total weight)).
template <bool kMass, typename T>
__device__ std::uint32_t radix_select(const T* row, int vocab, std::uint32_t min_key, u64 rem,
                                      float top_p, float lmax, float inv_t, Shared& sh) {
  std::uint32_t prefix = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    const std::uint32_t mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
    __syncthreads();  // the previous level's readers of sh are done
    if (threadIdx.x < kBuckets) sh.hist[threadIdx.x] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float v = load_logit(row, i);
      const std::uint32_t key = key_of(v);
      if (key < min_key || (key & mask) != prefix) continue;
      const u64 w = kMass ? mass_of(v, lmax, inv_t) : 1ull;
      if (w != 0) atomicAdd(&sh.hist[(key >> shift) & 0xffu], w);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l owns buckets 255 - 8l .. 248 - 8l, scanned from the top down.
      const int lane = threadIdx.x;
      u64 local = 0;
#pragma unroll
      for (int b = 0; b < 8; ++b) local += sh.hist[255 - 8 * lane - b];
      u64 incl = local;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const u64 up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += up;
      }
      const u64 total = __shfl_sync(0xffffffffu, incl, 31);
      if (kMass && shift == 24) {
        const double want = static_cast<double>(top_p) * static_cast<double>(total);
        rem = want >= static_cast<double>(total) ? total : static_cast<u64>(ceil(want));
      }
      if (rem > total) rem = total;  // never with consistent weights; keeps the walk defined
      if (rem == 0) rem = 1;
      const u64 excl = incl - local;
      if (total == 0) {
        if (lane == 0) sh.digit = 0, sh.rem = 1;
      } else if (excl < rem && rem <= incl) {
        u64 c = excl;
        for (int b = 0; b < 8; ++b) {
          const int bucket = 255 - 8 * lane - b;
          const u64 h = sh.hist[bucket];
          if (c + h >= rem) {
            sh.digit = static_cast<std::uint32_t>(bucket);
            sh.rem = rem - c;
            break;
          }
          c += h;
        }
      }
    }
    __syncthreads();
    prefix |= sh.digit << shift;
    rem = sh.rem;
  }
  return prefix;
}

// Gumbel noise in float from one random word: u = (r + 1/2) 2^-32 in (0, 1) (rounded toward zero,
// so never 1), E = -log1p(-u) exponential(1) with full precision near 0, G = -log(E).
__device__ __forceinline__ float gumbel(std::uint32_t r) {
  const float u = fmaf(__uint2float_rz(r), 2.3283064365386963e-10f, 1.1641532182693481e-10f);
  return -logf(-log1pf(-fminf(u, 0.99999994f)));
}

template <typename T>
__global__ void __launch_bounds__(kThreads) sample_kernel(const __grid_constant__ SamplingArgs a) {
  const int r = blockIdx.x;
  if (r >= *a.num_rows) return;
  __shared__ Shared sh;
  const T* row = static_cast<const T*>(a.logits) + static_cast<std::int64_t>(r) * a.row_stride;
  const int vocab = a.vocab;

  // Pass 1: argmax, lowest index on ties (each thread walks increasing indices).
  float best = -INFINITY;
  int best_i = INT_MAX;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = load_logit(row, i);
    if (v > best || (best_i == INT_MAX && v == v)) best = v, best_i = i;
  }
  const int greedy = block_argmax(best, best_i, sh);
  const float temperature = a.temperature[r];
  if (!(temperature > 0.f) || greedy == INT_MAX) {
    if (threadIdx.x == 0) a.tokens[r] = greedy == INT_MAX ? 0 : greedy;
    return;
  }
  const float top = load_logit(row, greedy);
  const float inv_t = 1.f / temperature;

  // Thresholds: keep keys >= thr.
  std::uint32_t thr = 0;
  const int k = a.top_k[r];
  if (k > 0 && k < vocab)
    thr = radix_select<false>(row, vocab, 0u, static_cast<u64>(k), 0.f, top, inv_t, sh);
  const float top_p = a.top_p[r];
  if (top_p < 1.f) thr = radix_select<true>(row, vocab, thr, 0ull, top_p, top, inv_t, sh);

  // Gumbel-max over the kept set; group g covers indices 4g .. 4g + 3.
  const std::uint64_t seed = a.seed[r], step = a.step[r];
  float best_s = -INFINITY;
  int best_si = INT_MAX;
  for (int g = threadIdx.x; 4 * g < vocab; g += kThreads) {
    const Philox4 rnd = sampling_random(seed, step, static_cast<std::uint32_t>(g));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = 4 * g + j;
      if (i >= vocab) break;
      const float v = load_logit(row, i);
      if (key_of(v) < thr) continue;
      const float s = (v - top) * inv_t + gumbel(rnd.v[j]);
      if (s > best_s || (best_si == INT_MAX && s == s)) best_s = s, best_si = i;
    }
  }
  const int token = block_argmax(best_s, best_si, sh);
  if (threadIdx.x == 0) a.tokens[r] = token == INT_MAX ? greedy : token;
}

// Launches the legacy kernel on args (workspace fields unused).
void sample(const SamplingArgs& args, cudaStream_t stream) {
  SamplingArgs a = args;
  if (a.row_stride == 0) a.row_stride = a.vocab;
  if (a.logits_type == LogitsType::kFloat32)
    sample_kernel<float><<<a.max_rows, kThreads, 0, stream>>>(a);
  else
    sample_kernel<__nv_bfloat16><<<a.max_rows, kThreads, 0, stream>>>(a);
  GD_CHECK_LAUNCH();
}

}  // namespace
}  // namespace graphdecode::bench::legacy
