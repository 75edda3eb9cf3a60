// Sampling pass 3 (sampling_kernels.cuh): one CTA per sampled row finds the exact thresholds among
// the row's candidates, checks the plan with exact integers, and draws; rows the plan could not
// settle are decided by the exact whole-row algorithm (radix select over the row, then Gumbel-max).
#include <cuda_bf16.h>

#include <algorithm>

#include "common/cuda_check.h"
#include "engine/kernels/sampling_kernels.cuh"

namespace graphdecode::sampling {
namespace {

constexpr int kWarps = kResolveThreads / 32;
// Keys a lane loads before counting any in exact_row's block_select, and Philox groups a thread
// loads before scoring any in its scoring pass (loads in flight over the row in global memory).
constexpr int kSelectIlp = 8;
constexpr int kScoreGroups = 2;

struct ResolveShared {
  float table[kGumbelTableSize];
  u64 hist64[256];
  u32 hist32[256];
  u64 red[kWarps];
  u32 digit;
  u64 rem;
  u64 s_hi, s_mid, best;
  u32 n;
  u32 keep;  // the smallest kept key (row stats), set before the draw's block_max
};

// Radix select (8-bit digits) over keys key_at(0 .. n-1) weighted by weight_of(i, key) (0 = not
// counted): returns the key K with weight(key > K) < rem <= weight(key >= K), where rem =
// rem_of(total weight), clamped to [1, total]. Every thread gets K. When every weighted key has
// the top byte `top_byte` (>= 0), the walk starts one level lower: 3 levels instead of 4.
// kIlp: keys a lane loads before counting any (kSelectIlp over a row in global memory; 1 over
// candidates in shared memory, where 8 bought little and grew the kernel's code ~40%).
template <int kIlp, typename W, typename KeyAt, typename WeightOf, typename RemOf>
__device__ u32 block_select(int n, KeyAt key_at, WeightOf weight_of, RemOf rem_of, W* hist,
                            ResolveShared& sh, int top_byte = -1) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int start = top_byte >= 0 ? 16 : 24;
  u32 prefix = top_byte >= 0 ? static_cast<u32>(top_byte) << 24 : 0u;
  u64 rem = 0;
  for (int shift = start; shift >= 0; shift -= 8) {
    const u32 mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
    __syncthreads();  // the previous level's readers of sh are done
    for (int b = threadIdx.x; b < 256; b += kResolveThreads) hist[b] = 0;
    __syncthreads();
    // kIlp keys a lane loaded before any is counted (warp-uniform trip counts): one load at a
    // time, the exact path waited on ~250 dependent loads a lane a level over a 128k row. Each
    // warp still counts its indices in the same order; the counts are integers either way.
    for (int i0 = warp * 32; i0 < n; i0 += kResolveThreads * kIlp) {
      u32 key[kIlp];
#pragma unroll
      for (int q = 0; q < kIlp; ++q) {
        const int i = i0 + q * kResolveThreads + lane;
        key[q] = i < n ? key_at(i) : 0u;
      }
#pragma unroll
      for (int q = 0; q < kIlp; ++q) {
        if (i0 + q * kResolveThreads >= n) break;  // the warp's indices are all past n
        const int i = i0 + q * kResolveThreads + lane;
        W w = 0;
        if (i < n && (key[q] & mask) == prefix) w = weight_of(i, key[q]);
        warp_add<W>(hist, (key[q] >> shift) & 0xffu, w);
      }
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l owns buckets 255 - 8l .. 248 - 8l, scanned from the top down.
      u64 local = 0;
#pragma unroll
      for (int b = 0; b < 8; ++b) local += hist[255 - 8 * lane - b];
      const u64 incl = warp_inclusive_sum(local);
      const u64 total = __shfl_sync(kFull, incl, 31);
      if (shift == start) rem = rem_of(total);
      if (rem > total) rem = total;  // never with consistent weights; keeps the walk defined
      if (rem == 0) rem = 1;
      const u64 excl = incl - local;
      if (total == 0) {
        if (lane == 0) sh.digit = 0, sh.rem = 1;
      } else if (excl < rem && rem <= incl) {
        u64 c = excl;
        for (int b = 0; b < 8; ++b) {
          const int bucket = 255 - 8 * lane - b;
          const u64 h = hist[bucket];
          if (c + h >= rem) {
            sh.digit = static_cast<u32>(bucket);
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

// The exact whole-row algorithm, as the definition reads (the plan's fallback).
template <typename T>
__device__ int exact_row(const Launch& L, int r, const RowParams& rp, float top, int greedy,
                         ResolveShared& sh) {
  const SamplingArgs& a = L.a;
  const T* row = static_cast<const T*>(a.logits) + static_cast<std::int64_t>(r) * a.row_stride;
  const int vocab = a.vocab;
  auto key_at = [&](int i) { return key_of(to_float(row[i])); };
  u32 thr_k = 0;
  if (rp.k_on) {
    const u64 k = static_cast<u64>(rp.top_k);
    thr_k = block_select<kSelectIlp, u32>(
        vocab, key_at, [](int, u32) { return 1u; }, [&](u64) { return k; }, sh.hist32, sh);
  }
  u32 thr = thr_k;
  if (rp.p_on) {
    thr = block_select<kSelectIlp, u64>(
        vocab, key_at,
        [&](int, u32 key) -> u64 {
          return key >= thr_k ? mass_of(key_to_float(key), top, rp.inv_t) : 0ull;
        },
        [&](u64 total) { return top_p_target(rp.top_p, total); }, sh.hist64, sh);
  }
  const std::uint64_t seed = a.seed[r], step = a.step[r];
  ScoreMax m = score_max(sh.table, 0);
  // kScoreGroups groups of 4 loaded before any is scored; each thread offers its tokens in the
  // same order as one group at a time would.
  for (int g0 = threadIdx.x; 4 * g0 < vocab; g0 += kResolveThreads * kScoreGroups) {
    float v[kScoreGroups][4];
#pragma unroll
    for (int q = 0; q < kScoreGroups; ++q)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = 4 * (g0 + q * kResolveThreads) + j;
        v[q][j] = i < vocab ? to_float(row[i]) : -INFINITY;
      }
#pragma unroll
    for (int q = 0; q < kScoreGroups; ++q) {
      const int g = g0 + q * kResolveThreads;
      bool any = false;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = 4 * g + j;
        any |= i < vocab && key_of(v[q][j]) >= thr &&
               scaled_logit(v[q][j], top, rp.inv_t) >= -kGumbelSpan;
      }
      if (!any) continue;
      const Philox4 rnd = sampling_random(seed, step, static_cast<u32>(g));
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (4 * g + j < vocab && key_of(v[q][j]) >= thr)
          offer(m, sh.table, v[q][j], top, rp.inv_t, rnd.v[j], static_cast<u32>(4 * g + j));
    }
  }
  if (threadIdx.x == 0) sh.keep = thr;  // read after block_max's barriers
  const u64 best = block_max<kResolveThreads>(m.best, sh.red);
  return best != 0 ? static_cast<int>(packed_index(best)) : greedy;
}

// SamplingArgs::row_stats of a sampled row: its kept set {key >= keep} and their exact mass Z. On
// the fast path Z is the filter's sure-kept mass plus the kept candidates' (those in [lo, hi]: the
// others lie below the threshold); on the exact path one more pass over the row (the rare
// fallback). Not inlined: the row loop's registers stay as they were without stats.
template <typename T>
__device__ __noinline__ void write_row_stats(const Launch& L, int r, const RowParams& rp, float top,
                                             bool fast, const u64* cs, int n, int lo, int hi,
                                             ResolveShared& sh) {
  const SamplingArgs& a = L.a;
  const u32 keep = sh.keep;
  u64 z = 0;
  if (fast) {
    for (int i = threadIdx.x; i < n; i += kResolveThreads) {
      const u32 key = static_cast<u32>(cs[i] >> 32);
      const int d = static_cast<int>(bucket_of(key));
      if (key >= keep && d >= lo && d <= hi) z += mass_of(key_to_float(key), top, rp.inv_t);
    }
  } else {
    const T* row = static_cast<const T*>(a.logits) + static_cast<std::int64_t>(r) * a.row_stride;
    for (int i = threadIdx.x; i < a.vocab; i += kResolveThreads) {
      const float v = to_float(row[i]);
      if (key_of(v) >= keep) z += mass_of(v, top, rp.inv_t);
    }
  }
  z = block_sum<kResolveThreads>(z, sh.red);
  if (threadIdx.x == 0)
    a.row_stats[r] = SamplingRowStats{(fast ? sh.s_hi : 0ull) + z, top, rp.inv_t, keep, -1};
}

// The stats of a row whose token is its argmax (sampling.h, SamplingRowStats).
__device__ __forceinline__ SamplingRowStats point_stats(float top, int greedy) {
  return SamplingRowStats{1ull, top, 0.f, key_of(top), greedy};
}

// A draw row (kDrawMinTopP; thread 0): the first of its picks, best score first, that top-p keeps,
// from the check pass's exact sums, or -1 when none of them is (the exact path decides). Resets
// the sums for the next call.
__device__ int draw_decide(RowState& st, const RowParams& rp, float top) {
  u32 key[kDrawPicks];
  draw_keys(st, key);
  int token = -1;
  if (key[0] != ~0u && key[0] == key_of(top)) {  // nothing strictly above pick 0: kept
    token = static_cast<int>(packed_index(st.pick[0]));
  } else {
    const u64 target = top_p_target(rp.top_p, st.z);
    for (int j = 0; j < kDrawPicks && token < 0; ++j)
      if (key[j] != ~0u && st.above[j] < target) token = static_cast<int>(packed_index(st.pick[j]));
  }
  st.z = 0;
  for (int j = 0; j < kDrawPicks; ++j) st.above[j] = 0;
  return token;
}

// One sampled row (all threads).
template <typename T>
__device__ void resolve_row(const Launch& L, int r, const RowParams& rp, const RowPlan& plan,
                            u64* cs, ResolveShared& sh) {
  const SamplingArgs& a = L.a;
  RowState& st = L.ws.state(r);
  const int tid = threadIdx.x;
  const int mode = plan.mode;
  const float top = plan.top;
  const int greedy = plan.greedy;
  if (tid == 0) {  // take the filter's accumulators and clear them for the next call
    sh.n = st.cand_count, sh.s_hi = st.s_hi, sh.s_mid = st.s_mid, sh.best = st.best;
    st.cand_count = 0, st.s_hi = 0, st.s_mid = 0, st.best = 0;
  }
  __syncthreads();
  const int n = static_cast<int>(sh.n);
  SamplingPath path = SamplingPath::kFast;
  int token = greedy;
  // The plan's candidate count can undercount (the top-k histogram skips logits below its
  // bound), so the list's real length decides.
  if (mode == kModeCand && sh.n <= static_cast<u32>(L.cand_limit)) {
    // The scan's list holds every logit of the top-k set (and more): both thresholds are exact
    // selections over it, with nothing kept outside it.
    const u64* cand = L.ws.cand(r);
    for (int i = tid; i < n; i += kResolveThreads) cs[i] = cand[i];
    __syncthreads();
    auto key_at = [&](int i) { return static_cast<u32>(cs[i] >> 32); };
    const u64 k = static_cast<u64>(rp.top_k);
    const u32 thr_k = block_select<1, u32>(
        n, key_at, [](int, u32) { return 1u; }, [&](u64) { return k; }, sh.hist32, sh);
    u32 thr = thr_k;
    if (rp.p_on) {
      u64 z = 0;  // the top-k set's mass
      for (int i = tid; i < n; i += kResolveThreads) {
        const u32 key = key_at(i);
        if (key >= thr_k) z += mass_of(key_to_float(key), top, rp.inv_t);
      }
      z = block_sum<kResolveThreads>(z, sh.red);
      const u64 rem = top_p_target(rp.top_p, z);
      thr = block_select<1, u64>(
          n, key_at,
          [&](int, u32 key) -> u64 {
            return key >= thr_k ? mass_of(key_to_float(key), top, rp.inv_t) : 0ull;
          },
          [&](u64) { return rem; }, sh.hist64, sh);
    }
    if (tid == 0) sh.keep = thr;  // read after block_max's barriers
    const std::uint64_t seed = a.seed[r], step = a.step[r];
    ScoreMax m = score_max(sh.table, 0);
    for (int i = tid; i < n; i += kResolveThreads) {
      const u32 key = key_at(i);
      if (key < thr) continue;
      const u32 idx = static_cast<u32>(cs[i]);
      const Philox4 rnd = sampling_random(seed, step, idx / 4);
      offer(m, sh.table, key_to_float(key), top, rp.inv_t, rnd.v[idx % 4], idx);
    }
    const u64 best = block_max<kResolveThreads>(m.best, sh.red);
    token = best != 0 ? static_cast<int>(packed_index(best)) : greedy;
  } else if (mode == kModeCand) {
    path = SamplingPath::kExactOverflow;
  } else if (mode == kModeFast && sh.n <= static_cast<u32>(L.cand_limit)) {
    const u64* cand = L.ws.cand(r);
    for (int i = tid; i < n; i += kResolveThreads) cs[i] = cand[i];
    __syncthreads();
    const int bk = plan.bk, lo = plan.lo, hi = plan.hi;
    auto key_at = [&](int i) { return static_cast<u32>(cs[i] >> 32); };
    auto in_range = [&](u32 key) {
      const int d = static_cast<int>(bucket_of(key));
      return d >= lo && d <= hi;
    };
    u32 thr_k = 0;
    if (rp.k_on) {  // the (k - above_k)-th largest key of bucket bk
      const u64 want = static_cast<u64>(rp.top_k) - plan.above_k;
      thr_k = block_select<1, u32>(
          n, key_at, [&](int, u32 key) { return static_cast<int>(bucket_of(key)) == bk ? 1u : 0u; },
          [&](u64) { return want; }, sh.hist32, sh, bk >> 4);
    }
    u32 thr = thr_k;
    bool ok = true;
    if (rp.p_on) {
      u64 z = 0, w = 0;  // candidate mass in the top-k set, and inside the range
      for (int i = tid; i < n; i += kResolveThreads) {
        const u32 key = key_at(i);
        if (key < thr_k) continue;
        const u64 m = mass_of(key_to_float(key), top, rp.inv_t);
        z += m;
        if (in_range(key)) w += m;
      }
      z = block_sum<kResolveThreads>(z, sh.red);
      w = block_sum<kResolveThreads>(w, sh.red);
      const u64 rem = top_p_target(rp.top_p, sh.s_hi + sh.s_mid + z);
      // Exact check of the plan: the top candidate is kept (so is everything above the range),
      // and nothing below the range is (all of it has >= rem of mass above it).
      ok = sh.s_hi < rem && (plan.below == 0 || sh.s_hi + w >= rem);
      if (ok) {
        const u64 rem_in = rem - sh.s_hi;
        thr = block_select<1, u64>(
            n, key_at,
            [&](int, u32 key) -> u64 {
              return key >= thr_k && in_range(key) ? mass_of(key_to_float(key), top, rp.inv_t)
                                                   : 0ull;
            },
            [&](u64) { return rem_in; }, sh.hist64, sh, (lo >> 4) == (hi >> 4) ? lo >> 4 : -1);
      }
    }
    if (ok) {
      if (tid == 0) sh.keep = thr;  // read after block_max's barriers
      const std::uint64_t seed = a.seed[r], step = a.step[r];
      ScoreMax m = score_max(sh.table, packed_key(sh.best));  // the sure-kept tokens' best score
      for (int i = tid; i < n; i += kResolveThreads) {
        const u32 key = key_at(i);
        if (key < thr || !in_range(key)) continue;
        const u32 idx = static_cast<u32>(cs[i]);
        const Philox4 rnd = sampling_random(seed, step, idx / 4);
        offer(m, sh.table, key_to_float(key), top, rp.inv_t, rnd.v[idx % 4], idx);
      }
      u64 best = block_max<kResolveThreads>(m.best, sh.red);
      best = best > sh.best ? best : sh.best;
      token = best != 0 ? static_cast<int>(packed_index(best)) : greedy;
    } else {
      path = SamplingPath::kExactCheck;
    }
  } else if (mode == kModeDraw && sh.n <= static_cast<u32>(L.cand_limit)) {
    if (tid == 0) sh.digit = static_cast<u32>(draw_decide(st, rp, top));  // free outside selects
    __syncthreads();
    token = static_cast<int>(sh.digit);
    if (token < 0) path = SamplingPath::kExactCheck;
  } else {
    path = SamplingPath::kExactOverflow;
  }
  if (path != SamplingPath::kFast) token = exact_row<T>(L, r, rp, top, greedy, sh);
  if (tid == 0) {
    a.tokens[r] = token;
    if (a.path) a.path[r] = static_cast<std::int32_t>(path);
  }
  if (a.row_stats != nullptr) {
    write_row_stats<T>(L, r, rp, top, path == SamplingPath::kFast, cs, n, plan.lo, plan.hi, sh);
  }
}

// At most one CTA per SM (the candidate list's shared memory), looping over the rows.
template <typename T>
__global__ void __launch_bounds__(kResolveThreads, 1)
    resolve_kernel(const __grid_constant__ Launch L) {
  extern __shared__ u64 cs[];  // [ws.cap] candidates: key << 32 | index
  __shared__ ResolveShared sh;
  fill_gumbel_table(sh.table);  // before the wait: overlaps the filter's tail
  pdl_wait_for_prior_grid();
  pdl_launch_dependents();
  const int live = *L.a.num_rows;
  if (blockIdx.x == 0 && threadIdx.x == 0) L.ws.state(0).draw_count = 0;  // for the next call
  for (int r = blockIdx.x; r < live && r < L.a.max_rows; r += gridDim.x) {
    const RowParams rp = row_params(L, r);
    __syncthreads();  // the previous row's readers of sh and of the row state are done
    const RowPlan plan = row_plan(L.ws, r, rp);
    __syncthreads();  // every thread has its plan (read from the argmax when the row has none)
    if (threadIdx.x == 0 && !has_plan(rp)) {  // for the next call
      L.ws.state(r).argmax = 0;
      L.ws.state(r).draw_lse = 0;
    }
    if (plan.mode == kModeDone) {
      if (threadIdx.x == 0) {
        L.a.tokens[r] = plan.greedy;
        if (L.a.path) L.a.path[r] = static_cast<std::int32_t>(SamplingPath::kGreedy);
        if (L.a.row_stats) L.a.row_stats[r] = point_stats(plan.top, plan.greedy);
      }
      continue;
    }
    resolve_row<T>(L, r, rp, plan, cs, sh);
  }
}

template <typename T>
void launch(const Launch& L, cudaStream_t stream) {
  const int smem = L.ws.cap * static_cast<int>(sizeof(u64));
  GD_CUDA(
      cudaFuncSetAttribute(resolve_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  launch_pdl(resolve_kernel<T>, dim3(static_cast<unsigned>(std::min(L.a.max_rows, L.sms))),
             dim3(kResolveThreads), static_cast<std::size_t>(smem), stream, L);
}

}  // namespace

void launch_resolve(const Launch& L, cudaStream_t stream) {
  if (L.a.logits_type == LogitsType::kFloat32)
    launch<float>(L, stream);
  else
    launch<__nv_bfloat16>(L, stream);
}

}  // namespace graphdecode::sampling
