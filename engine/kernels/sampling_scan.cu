// Sampling pass 1 (sampling_kernels.cuh): argmax and the 12-bit key histogram of each chunk, then,
// in the row's last CTA, the plan.
#include <cuda_bf16.h>

#include <cfloat>

#include "common/cuda_check.h"
#include "engine/kernels/sampling_kernels.cuh"

namespace graphdecode::sampling {
namespace {

constexpr int kPerThread = kBuckets / kScanThreads;  // buckets each thread owns in the plan: 16
// 3 CTAs per SM (<= 85 registers): 24 warps keep the loads in flight through the histogram's
// barriers.
constexpr int kScanMinBlocks = 3;

// A part of a log-sum-exp: a max logit and the sum of exp((l - max) / T) over its logits (0 when
// none is finite: the max may then be -inf).
struct DrawPart {
  float max;
  float sum;
};

struct ScanShared {
  u32 a[kBuckets];  // counts
  u32 b[kBuckets];  // approximate masses (fixed point, kApproxFracBits)
  u64 red64[kScanThreads / 32];
  double redd[kScanThreads / 32];
  u32 red32[kScanThreads / 32];
  u32 lim[kScanThreads / 32];
  DrawPart part[kScanThreads / 32];  // draw rows: the warps' log-sum-exp parts
  u32 staged, base;  // candidate rows: indices staged in a (see scan_kernel), their first slot
  bool last;
  // Plan scalars.
  std::int32_t bk, lo, hi;
  u32 above_k, ge_lo, ge_hi1, ge_bk0, count_bk;
};

// The plan of row r, by the row's last scan CTA (all threads). Thread t owns buckets
// [16t, 16t + 16): a larger t holds larger keys. Not inlined: it runs once per row, and apart it
// keeps the streaming body's registers (no spills) and instruction footprint small.
__device__ __noinline__ void make_plan(const Launch& L, int r, const RowParams& rp,
                                       ScanShared& sh) {
  RowState& st = L.ws.state(r);
  RowHist& h = L.ws.hist(r);
  const int tid = threadIdx.x;
  const u64 am = __ldcg(&st.argmax);
  const int greedy = am != 0 ? static_cast<int>(packed_index(am)) : 0;
  const float top = am != 0 ? key_to_float(packed_key(am)) : 0.f;
  const bool sample_it = samples(rp, am, top);

  // For top-p, each bucket's approximate mass A (units: the top token's mass = 1) becomes a bound
  // pair in shared memory (the histogram bins are free now): lower = A - E, upper = A + E, E the
  // error bound. Buckets are strided over the threads here (the non-empty ones are a narrow band),
  // then owned in contiguous runs of 16 for the scans.
  float* lower = reinterpret_cast<float*>(sh.a);
  float* upper = reinterpret_cast<float*>(sh.b);
  const bool masses = needs_masses(rp);
  if (masses) {
#pragma unroll 4
    for (int b = tid; b < kBuckets; b += kScanThreads) {  // 4 buckets' loads in flight
      const u32 n = __ldcg(&h.count[b]);
      const double dm = __ldcg(&h.mass[b]);
      const u32 mk = __ldcg(&h.maxkey[b]);
      h.mass[b] = 0.0;
      h.maxkey[b] = 0;
      float A = 0.f, E = 0.f;
      if (n != 0 && sample_it) {
        // A = sum exp((l - top) / T) = mass * exp((bucket top - top) / T), in logs: no overflow.
        if (dm > 0.0)
          A = expf(logf(static_cast<float>(dm)) + (bucket_top_value(b) - top) * rp.inv_t);
        // Rounding to 2^-18 loses <= 2^-19 of a CTA's bucket reference (<= mk) per logit.
        E = static_cast<float>(n) * 0x1p-19f * expf((key_to_float(mk) - top) * rp.inv_t) +
            static_cast<float>(kApproxSlack) * A;
        if (!(A < INFINITY) || !(E < INFINITY)) A = 0.f, E = INFINITY;
      }
      lower[b] = A - E > 0.f ? A - E : 0.f;
      upper[b] = A + E;
    }
    __syncthreads();  // counts read above before their owners clear them below
  }
  const int b0 = tid * kPerThread;
  u32 cnt[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) cnt[j] = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    cnt[j] = __ldcg(&h.count[b0 + j]);
    h.count[b0 + j] = 0;
  }
  if (tid == 0) {
    sh.bk = -1;
    sh.lo = sh.hi = kBuckets;
  }
  __syncthreads();  // every thread has read st.argmax and the histogram
  if (tid == 0) {
    st.argmax = 0;
    st.ticket = 0;
  }
  if (!sample_it) {  // a non-finite max or 1 / T: the argmax (resolve writes it)
    if (tid == 0) st.top = top, st.greedy = greedy, st.mode = kModeDone;
    return;
  }

  // Top-k: the bucket where the count from the top reaches k.
  u32 own = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) own += cnt[j];
  const u32 above_me = block_suffix<kScanThreads>(own, sh.red32);
  if (rp.k_on) {
    const u32 k = static_cast<u32>(rp.top_k);
    u32 run = above_me;
#pragma unroll
    for (int j = kPerThread - 1; j >= 0; --j) {
      if (run < k && k <= run + cnt[j]) sh.bk = b0 + j, sh.above_k = run;
      run += cnt[j];
    }
  }
  __syncthreads();
  const int bk = sh.bk;
  const int bk0 = rp.k_on ? bk : 0;  // lowest bucket of the top-k set

  int lo = bk, hi = bk;
  if (p_in_candidates(rp)) {  // every bucket of the top-k set: resolve decides top-p exactly
    lo = bk;
    hi = kBuckets - 1;
  } else if (rp.p_on) {
    // Bounds on Z (the top-k set's mass) and on C(b), the mass of buckets above b. The top
    // token of bucket b is kept iff C(b) < p Z: possibly when C_lo(b) < p Z_hi, surely when
    // C_hi(b) < p Z_lo.
    double lo_part = 0, hi_part = 0, own_lo = 0, own_hi = 0;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int b = b0 + j;
      if (b < bk0) lower[b] = 0.f, upper[b] = 0.f;
      own_lo += lower[b];
      own_hi += upper[b];
      if (!rp.k_on || b > bk) lo_part += lower[b];  // bucket bk is only partly in the set
      hi_part += upper[b];
    }
    const double z_lo = fmax(block_sum<kScanThreads>(lo_part, sh.redd), 1.0);  // top token: 1
    const double z_hi = fmax(block_sum<kScanThreads>(hi_part, sh.redd), z_lo);
    const double p = rp.top_p;
    double c_lo = block_suffix<kScanThreads>(own_lo, sh.redd);
    double c_hi = block_suffix<kScanThreads>(own_hi, sh.redd);
#pragma unroll
    for (int j = kPerThread - 1; j >= 0; --j) {
      const int b = b0 + j;
      if (cnt[j] != 0 && b >= bk0) {
        if (c_lo < p * z_hi) atomicMin(&sh.lo, b);
        if (c_hi < p * z_lo) atomicMin(&sh.hi, b);
      }
      c_lo += lower[b];
      c_hi += upper[b];
    }
    __syncthreads();
    hi = sh.hi < kBuckets ? sh.hi : static_cast<int>(bucket_of(key_of(top)));
    lo = sh.lo < hi ? sh.lo : hi;
  }

  // Tokens at or above a bucket, from the counts: n_cand and below.
  u32 ge = above_me;
#pragma unroll
  for (int j = kPerThread - 1; j >= 0; --j) {
    const int b = b0 + j;
    ge += cnt[j];  // tokens in buckets >= b
    if (b == lo) sh.ge_lo = ge;
    if (b == hi + 1) sh.ge_hi1 = ge;
    if (b == bk0) sh.ge_bk0 = ge;
    if (b == bk) sh.count_bk = cnt[j];
  }
  if (tid == 0 && hi + 1 >= kBuckets) sh.ge_hi1 = 0;
  __syncthreads();
  if (tid == 0) {
    const u32 n_cand = sh.ge_lo - sh.ge_hi1 + (rp.k_on && bk < lo ? sh.count_bk : 0u);
    st.top = top, st.greedy = greedy;
    st.mode = n_cand > static_cast<u32>(L.cand_limit) ? kModeExact : kModeFast;
    st.bk = rp.k_on ? bk : -1;
    st.lo = lo, st.hi = hi;
    st.above_k = rp.k_on ? sh.above_k : 0;
    st.below = rp.p_on ? sh.ge_bk0 - sh.ge_lo : 0;
  }
}

// The plan of a scan_candidates row, by the row's last scan CTA (thread 0): the argmax, and the
// mode from the candidate count (every CTA's appends are ordered before its ticket). A row that
// is not sampled drops its candidates here, since resolve clears the count only for sampled rows.
__device__ void make_candidate_plan(const Launch& L, int r, const RowParams& rp) {
  RowState& st = L.ws.state(r);
  const u64 am = __ldcg(&st.argmax);
  const float top = am != 0 ? key_to_float(packed_key(am)) : 0.f;
  const u32 n = __ldcg(&st.cand_count);
  const bool sample_it = samples(rp, am, top);
  st.argmax = 0;
  st.ticket = 0;
  st.top = top;
  st.greedy = am != 0 ? static_cast<int>(packed_index(am)) : 0;
  st.mode = !sample_it ? kModeDone : n > static_cast<u32>(L.cand_limit) ? kModeExact : kModeCand;
  if (!sample_it) st.cand_count = 0;
  st.bk = -1;
  st.lo = 0, st.hi = kBuckets - 1;  // resolve's range: every candidate
  st.above_k = 0, st.below = 0;
}

// Two parts merged: the larger max, each sum rescaled to it. Fast exponentials: any floor gives
// the same token; its precision only moves how many tokens the filter lists.
__device__ __forceinline__ DrawPart merge_parts(DrawPart a, DrawPart b, float inv_t) {
  const float m = fmaxf(a.max, b.max);
  const float sa = a.sum > 0.f ? a.sum * __expf((a.max - m) * inv_t) : 0.f;
  const float sb = b.sum > 0.f ? b.sum * __expf((b.max - m) * inv_t) : 0.f;
  return DrawPart{m, sa + sb};
}
__device__ __forceinline__ DrawPart shfl_xor_part(DrawPart p, int o) {
  return DrawPart{__shfl_xor_sync(kFull, p.max, o), __shfl_xor_sync(kFull, p.sum, o)};
}

// A draw row's chunk (kDrawFloorMargin): its log-sum-exp of scaled logits, log sum exp(l / T),
// merged into RowState::draw_lse with one atomicMax, from the logits in registers and the thread's
// max logit; the warps' parts merged by shuffles, then by warp 0 after one barrier (all threads).
template <typename T, int kU>
__device__ __forceinline__ void draw_lse(const Launch& L, int r, int c, float inv_t,
                                         const float (&v)[kU][VecOf<T>::kWidth], float thread_max,
                                         DrawPart* part) {
  constexpr int W = VecOf<T>::kWidth;
  const int tid = threadIdx.x, lane = tid & 31;
  DrawPart p{thread_max, 0.f};
  if (p.max > -INFINITY) {  // -inf logits (masked tokens) add nothing
    const int base = c * L.chunk;
    const bool whole = base + L.chunk <= L.a.vocab;  // most chunks: no index tests
#pragma unroll
    for (int j = 0; j < kU; ++j)
#pragma unroll
      for (int e = 0; e < W; ++e)
        if (whole || base + (j * kScanThreads + tid) * W + e < L.a.vocab)
          p.sum += __expf((v[j][e] - p.max) * inv_t);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) p = merge_parts(p, shfl_xor_part(p, o), inv_t);
  if (lane == 0) part[tid >> 5] = p;
  __syncthreads();
  if (tid >= 32) return;
  p = lane < kScanThreads / 32 ? part[lane] : DrawPart{-INFINITY, 0.f};
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) p = merge_parts(p, shfl_xor_part(p, o), inv_t);
  const float lse = p.max * inv_t + __logf(p.sum);
  if (lane == 0 && p.sum > 0.f && lse == lse) atomicMax(&L.ws.state(r).draw_lse, key_of(lse));
}

template <typename T, int kU>
__global__ void __launch_bounds__(kScanThreads, kScanMinBlocks)
    scan_kernel(const __grid_constant__ Launch L) {
  constexpr int W = VecOf<T>::kWidth;
  const SamplingArgs& a = L.a;
  const int r = blockIdx.x / L.chunks;
  const int c = blockIdx.x - r * L.chunks;
  if (blockIdx.x == 0 && threadIdx.x == 0) {  // the filter's and check's item counters, before
    RowState& st0 = L.ws.state(0);            // their waits on this grid (dynamic items)
    st0.filter_next = 0;
    st0.check_next = 0;
  }
  if (r >= *a.num_rows) return;
  __shared__ ScanShared sh;
  const int tid = threadIdx.x;
  const RowParams rp = row_params(L, r);
  const bool cand = scan_candidates(L, rp);  // candidates instead of a histogram
  const bool hist = has_plan(rp);
  const bool masses = needs_masses(rp);
  pdl_launch_dependents();  // launched plainly: the filter's CTAs may become resident now
  const T* row = static_cast<const T*>(a.logits) + static_cast<std::int64_t>(r) * a.row_stride;
  const int vocab = a.vocab;
  const int base = c * L.chunk;
  float v[kU][W] = {};
#pragma unroll
  for (int j = 0; j < kU; ++j)
    load_vec(row, base + (j * kScanThreads + tid) * W, vocab, L.vec_ok, v[j]);
  auto index = [&](int j, int e) { return base + (j * kScanThreads + tid) * W + e; };
  if (hist && !cand)  // cleared while the loads are in flight
    for (int b = tid; b < kBuckets; b += kScanThreads) {
      sh.a[b] = 0;
      if (masses) sh.b[b] = 0;
    }

  u64 best = 0;
#pragma unroll
  for (int j = 0; j < kU; ++j)
#pragma unroll
    for (int e = 0; e < W; ++e) {
      const int i = index(j, e);
      if (i < vocab && v[j][e] == v[j][e]) {
        const u64 pk = pack_max(key_of(v[j][e]), static_cast<u32>(i));
        best = pk > best ? pk : best;
      }
    }
  RowState& st = L.ws.state(r);
  if (!hist) {  // greedy, temperature only or draw: one atomic per warp, no ticket
    const float thread_max = best != 0 ? key_to_float(packed_key(best)) : -INFINITY;
    best = warp_max(best);
    if ((tid & 31) == 0 && best != 0) atomicMax(&st.argmax, best);
    if (rp.draw && L.draw_floor) draw_lse<T, kU>(L, r, c, rp.inv_t, v, thread_max, sh.part);
    return;
  }
  // With top-k (k <= 256) only keys >= lim matter: the k-th largest key of the row is >= the
  // k-th largest of any k logits of it, and the m = ceil(k / 8) largest thread maxima of each of
  // the 8 warps are 8m >= k distinct logits >= lim = the smallest of the warps' m-th largest.
  // Everything the plan reads (the k-th key's bucket, counts above it, masses of the top-k set)
  // only involves keys >= the k-th largest, so the histogram skips the rest: ~1-2% of a
  // near-flat chunk at k = 50 instead of all of it.
  u32 lim = 0;
  if (rp.k_on && rp.top_k <= kScanThreads) {
    u32 mine = packed_key(best);  // this thread's max (0: none)
    u32 kth = 0;
    for (int i = 0; i < (rp.top_k + 7) / 8; ++i) {  // the warp's m-th largest thread max
      kth = __reduce_max_sync(kFull, mine);
      if ((tid & 31) == __ffs(__ballot_sync(kFull, mine == kth)) - 1) mine = 0;
    }
    if ((tid & 31) == 0) sh.lim[tid >> 5] = kth;
  }
  if (cand && tid == 0) sh.staged = 0;
  best = block_max<kScanThreads>(best, sh.red64);  // also orders the clear, sh.lim and sh.staged
  if (rp.k_on && rp.top_k <= kScanThreads) {
    lim = sh.lim[0];
#pragma unroll
    for (int w = 1; w < kScanThreads / 32; ++w) lim = sh.lim[w] < lim ? sh.lim[w] : lim;
  }

  if (cand) {
    // Every logit at or above lim: a superset of the row's top-k set (see above), ~150 of a
    // near-flat 8192-logit chunk at k = 50. Their indices are staged in shared memory (the
    // histogram's bins, unused by these rows) with one shared atomic per warp and vector, then
    // appended to the row's list with one global atomic per CTA: appended warp by warp, each warp
    // waited on ~8 dependent global atomics on one address per row (the draw filter's appends
    // did the same and ran at twice the temperature-only filter's time, ncu call t38). The list's
    // real length decides in the plan (overflow: exact). The candidates' keys are read again
    // (from L2) when written: the loaded logits can die after their bit masks (the bf16 variant
    // spilled keeping them).
    u64* list = L.ws.cand(r);
    u32* stage = sh.a;
    const auto append = [&](u32 at, int i) {
      if (at < static_cast<u32>(L.ws.cap))
        list[at] = (static_cast<u64>(key_of(to_float(row[i]))) << 32) | static_cast<u32>(i);
    };
    u32 masks[kU];
#pragma unroll
    for (int j = 0; j < kU; ++j) {
      masks[j] = 0;
#pragma unroll
      for (int e = 0; e < W; ++e)
        if (index(j, e) < vocab && key_of(v[j][e]) >= lim) masks[j] |= 1u << e;
    }
#pragma unroll 1  // unrolled, the compiler hoists the reloads and spills (ptxas, 2026-11-27)
    for (int j = 0; j < kU; ++j) {
      const u32 bits = masks[j];
      if (!__any_sync(kFull, bits != 0)) continue;
      u32 pos = warp_reserve(&sh.staged, __popc(bits));
#pragma unroll
      for (int e = 0; e < W; ++e) {
        if (!((bits >> e) & 1u)) continue;
        const int i = index(j, e);
        if (pos < static_cast<u32>(kBuckets))
          stage[pos] = static_cast<u32>(i);
        else  // past the stage (a chunk of near-equal logits): straight to the list
          append(atomicAdd(&st.cand_count, 1u), i);
        ++pos;
      }
    }
    __syncthreads();
    const u32 n = min(sh.staged, static_cast<u32>(kBuckets));
    if (tid == 0) sh.base = n != 0 ? atomicAdd(&st.cand_count, n) : 0u;
    __syncthreads();
    for (u32 q = tid; q < n; q += kScanThreads) append(sh.base + q, static_cast<int>(stage[q]));
  } else {
    RowHist& h = L.ws.hist(r);
    if (!masses) {
#pragma unroll
      for (int j = 0; j < kU; ++j)
#pragma unroll
        for (int e = 0; e < W; ++e) {
          const u32 key = key_of(v[j][e]);
          warp_add<u32>(sh.a, bucket_of(key), index(j, e) < vocab && key >= lim ? 1u : 0u);
        }
    } else {
      // Approximate masses relative to a per-CTA bucket reference: min(bucket top value, chunk
      // max), >= every logit of the bucket here, so each term is in (0, 1], and equal to the
      // chunk's max in its bucket (the mass that dominates Z at low temperature keeps its
      // precision).
      const float chunk_max = best != 0 ? key_to_float(packed_key(best)) : -INFINITY;
#pragma unroll
      for (int j = 0; j < kU; ++j)
#pragma unroll
        for (int e = 0; e < W; ++e) {
          const u32 key = key_of(v[j][e]);
          const bool ok = index(j, e) < vocab && key >= lim;
          const u32 d = bucket_of(key);
          const float ref = fminf(bucket_top_value(d), chunk_max);
          const float m = expf((v[j][e] - ref) * rp.inv_t);
          const u32 q = ok && m > 0.f ? __float2uint_rn(m * (1 << kApproxFracBits)) : 0u;
          warp_add2(sh.a, sh.b, d, ok ? 1u : 0u, q);
        }
    }
    __syncthreads();
    for (int b = tid; b < kBuckets; b += kScanThreads) {
      const u32 n = sh.a[b];
      if (n == 0) continue;
      atomicAdd(&h.count[b], n);
      if (!masses) continue;
      const float ref = fminf(bucket_top_value(b), key_to_float(packed_key(best)));
      atomicMax(&h.maxkey[b], key_of(ref));
      const u32 q = sh.b[b];
      if (q != 0) {
        const double shift = (static_cast<double>(ref) - static_cast<double>(bucket_top_value(b))) *
                             static_cast<double>(rp.inv_t);
        atomicAdd(&h.mass[b], q * 0x1p-18 * exp(shift));
      }
    }
  }

  if (tid == 0 && best != 0) atomicMax(&st.argmax, best);
  // Last-CTA detection: every CTA's global atomics are ordered before its ticket.
  __threadfence();
  __syncthreads();
  if (tid == 0) sh.last = atomicAdd(&st.ticket, 1u) == static_cast<u32>(L.chunks - 1);
  __syncthreads();
  if (!sh.last) return;
  __threadfence();
  if (cand) {
    if (tid == 0) make_candidate_plan(L, r, rp);
  } else {
    make_plan(L, r, rp, sh);
  }
}

template <typename T, int kU>
void launch(const Launch& L, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(L.chunks) * static_cast<unsigned>(L.a.max_rows);
  scan_kernel<T, kU><<<grid, kScanThreads, 0, stream>>>(L);
  GD_CHECK_LAUNCH();
}

}  // namespace

void launch_scan(const Launch& L, cudaStream_t stream) {
  with_chunk_shape(L, [&]<typename T, int kU>() { launch<T, kU>(L, stream); });
}

}  // namespace graphdecode::sampling
