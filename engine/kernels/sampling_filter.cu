// Sampling pass 2 (sampling_kernels.cuh): with the row's plan, score the sure-kept tokens, sum the
// exact masses top-p needs, and compact the boundary buckets' tokens into the candidate list; a
// draw row's last CTA keeps its best-scored candidates as its picks.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/atomics.cuh"
#include "common/cuda_check.h"
#include "engine/kernels/sampling_kernels.cuh"

namespace graphdecode::sampling {
namespace {

// A draw item's tokens that pass the cheap bounds wait in a per-warp list in shared memory and are
// tested against the table and scored by the warp together: tested where they stood, ~5% of a
// near-flat row's tokens at T 0.8 (the draw floor is low) put the table test and the two
// logarithms in ~80% of a warp's token slots (one lane is enough), and the draw filter took twice
// the temperature-only filter's time (ncu, calls t38-t39: 116 vs 55 us at B = 128). 32 x 8 slots:
// a whole vector of every lane fits after a drain.
constexpr int kDrawDefer = 256;

struct DrawDefer {
  u64 token[kDrawDefer];  // float bits << 32 | index
  u32 word[kDrawDefer];   // the token's random word
};

struct FilterShared {
  float table[kGumbelTableSize];
  u64 red[kScanThreads / 32];
  u64 pick[kDrawPicks];
  u32 last;     // this CTA ran the row's last draw item
  int next[2];  // the CTA's next item (dynamic items), two slots
  DrawDefer defer[kScanThreads / 32];
};

// What a (row, chunk) item does (one instance of filter_item each):
//   kPlanned  a row with a plan: sure-kept tokens scored, boundary tokens listed, top-p masses;
//   kAllKept  no plan (temperature only), no row stats: every token is kept, nothing is summed;
// (Draw rows have their own item, draw_item.)
enum class Item { kPlanned, kAllKept };

template <typename T, int kU, Item kItem>
__device__ void filter_item(const Launch& L, int r, int c, const RowParams& rp, const RowPlan& plan,
                            const FilterShared& sh, u64* red) {
  constexpr int W = VecOf<T>::kWidth;
  constexpr bool kPlanned = kItem == Item::kPlanned;
  const SamplingArgs& a = L.a;
  const int tid = threadIdx.x;
  const T* row = static_cast<const T*>(a.logits) + static_cast<std::int64_t>(r) * a.row_stride;
  const int vocab = a.vocab;
  const int base = c * L.chunk;
  float v[kU][W] = {};
#pragma unroll
  for (int j = 0; j < kU; ++j)
    load_vec(row, base + (j * kScanThreads + tid) * W, vocab, L.vec_ok, v[j]);
  RowState& st = L.ws.state(r);
  const float top = plan.top;
  const int bk = plan.bk, lo = plan.lo, hi = plan.hi;
  const std::uint64_t seed = a.seed[r], step = a.step[r];
  u64* cand = L.ws.cand(r);
  u64 s_hi = 0, s_mid = 0;
  // The sure-kept tokens' exact mass: top-p's total needs it, and so does the row's Z when the
  // caller asks for row stats (then every row sums it).
  const bool sum_hi = rp.p_on || a.row_stats != nullptr;
  // The top token is kept in every row, so its score (x = 0: its noise alone) is one the kept set
  // reaches: a floor from the start for the CTAs that find no score of the row yet (temperature-
  // only rows: 122 -> 93 us at B = 128 with the cheap bound, call t28; draw_item keeps it fixed).
  // Rows with a plan start from the row's best alone (as temperature-only rows also do): their
  // filter is light (most tokens lie below the range or kGumbelSpan), and the extra Philox call
  // cost them ~2% (t28).
  ScoreMax m = score_max(sh.table, packed_key(__ldcg(&st.best)));
  if constexpr (!kPlanned)
    m.raise(key_of(score_of(top, top, rp.inv_t, token_word(seed, step, plan.greedy))));
#pragma unroll
  for (int j = 0; j < kU; ++j) {
    const int i0 = base + (j * kScanThreads + tid) * W;
    u32 score_bits = 0, cand_bits = 0;  // tokens to offer; tokens to append
    if constexpr (!kPlanned) {
#pragma unroll
      for (int e = 0; e < W; ++e) {
        if (i0 + e >= vocab) continue;
        score_bits |= 1u << e;
      }
#pragma unroll
      for (int g = 0; g < W / 4; ++g) {
        const u32 live = (score_bits >> (4 * g)) & 0xfu;
        const u32 i = static_cast<u32>(i0 + 4 * g);
        offer_group(m, sh.table, &v[j][4 * g], live, top, rp.inv_t, seed, step, i);
      }
    } else {
#pragma unroll
      for (int e = 0; e < W; ++e) {
        if (i0 + e >= vocab) continue;
        const float x = scaled_logit(v[j][e], top, rp.inv_t);
        const int d = static_cast<int>(bucket_of(key_of(v[j][e])));
        if (d > hi) {  // kept for sure
          if (sum_hi) s_hi += mass_of_x(x);
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
        for (int e = 0; e < 4; ++e)
          if ((score_bits >> (4 * g + e)) & 1u)
            offer(m, sh.table, v[j][4 * g + e], top, rp.inv_t, rnd.v[e],
                  static_cast<u32>(i0 + 4 * g + e));
      }
    }
    m.raise(__reduce_max_sync(kFull, m.floor));  // the warp's best bounds every lane
    // Append the candidates: one atomic per warp and vector. Most vectors of a row hold none (a
    // top-k set of 50 is ~0.04% of 128k logits), so one vote skips the warp's prefix scan.
    if (kItem != Item::kAllKept && __any_sync(kFull, cand_bits != 0)) {
      u32 pos = warp_reserve(&st.cand_count, __popc(cand_bits));
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
  if constexpr (kPlanned) s_hi = block_sum<kScanThreads>(s_hi, red);
  if constexpr (kPlanned) s_mid = block_sum<kScanThreads>(s_mid, red);
  const u64 best = block_max<kScanThreads>(m.best, red);
  if (tid == 0) {
    if (s_hi != 0) atomicAdd(&st.s_hi, s_hi);
    if (s_mid != 0) atomicAdd(&st.s_mid, s_mid);
    if (best != 0) atomicMax(&st.best, best);
  }
}

// The warp's deferred draw tokens d[0 .. n) (warp-uniform n; all lanes): the table bound, then the
// exact score of those it lets through; the scores that reach the fixed floor are appended to
// the row's candidate list as pack_max(score key, index), one atomic per warp and round.
__device__ __forceinline__ void drain_draw(const DrawDefer& d, u32 n, const ScoreMax& m,
                                           const float* table, float top, float inv_t, u32 cap,
                                           u32* count, u64* cand) {
  __syncwarp();  // the lanes' list writes
  for (u32 q0 = 0; q0 < n; q0 += 32) {
    const u32 q = q0 + (threadIdx.x & 31);
    u64 pk = 0;
    if (q < n) {
      const u64 t = d.token[q];
      const u32 word = d.word[q];
      const float v = __uint_as_float(static_cast<u32>(t >> 32));
      if (!(scaled_logit(v, top, inv_t) + table[word >> 24] < m.floor_value)) {
        pk = exact_score(v, top, inv_t, word, static_cast<u32>(t));
        if (packed_key(pk) < m.floor) pk = 0;
      }
    }
    if (__any_sync(kFull, pk != 0)) {
      const u32 pos = warp_reserve(count, pk != 0 ? 1u : 0u);
      if (pk != 0 && pos < cap) cand[pos] = pk;
    }
  }
  __syncwarp();  // the list is reused
}

// The key of a draw row's floor score max_c L_c - kDrawFloorMargin (sampling_kernels.cuh) from
// the scan's largest chunk log-sum-exp of l / T (`lse`, a key; 0: none); 0 when it is not finite.
__device__ __forceinline__ u32 draw_floor_key(u32 lse, float top, float inv_t) {
  const float f = key_to_float(lse) - top * inv_t - kDrawFloorMargin;
  return lse != 0 && f > -INFINITY && f < INFINITY ? key_of(f) : 0u;
}

// A draw row's (row, chunk) item (sampling_kernels.cuh, kDrawMinTopP): every token whose score
// reaches the draw floor (the larger of the top token's score and the chunks' largest log-sum-exp
// less kDrawFloorMargin: a fixed floor, since other scores may belong to tokens top-p drops) listed
// as a candidate, pack_max(score key, index). The streaming loop applies the cheap bounds only
// (the word's top byte, then its top nibble: noise <= table[16], ~2.7 against table[1]'s ~5.5,
// which alone let a third of a near-flat row through at the top token's score, the floor before
// the draw floor); the rest wait in the warp's list (drain_draw). Not inlined: apart, the other
// items keep their registers.
template <typename T, int kU>
__device__ __noinline__ void draw_item(const Launch& L, int r, int c, const RowParams& rp,
                                       const RowPlan& plan, FilterShared& sh) {
  constexpr int W = VecOf<T>::kWidth;
  static_assert(32 * W <= kDrawDefer, "a vector of every lane must fit the list after a drain");
  const SamplingArgs& a = L.a;
  const int tid = threadIdx.x;
  const T* row = static_cast<const T*>(a.logits) + static_cast<std::int64_t>(r) * a.row_stride;
  const int vocab = a.vocab;
  const int base = c * L.chunk;
  float v[kU][W] = {};
#pragma unroll
  for (int j = 0; j < kU; ++j)
    load_vec(row, base + (j * kScanThreads + tid) * W, vocab, L.vec_ok, v[j]);
  RowState& st = L.ws.state(r);
  const float top = plan.top, inv_t = rp.inv_t;
  const std::uint64_t seed = a.seed[r], step = a.step[r];
  const u32 cap = static_cast<u32>(L.ws.cap);
  u64* cand = L.ws.cand(r);
  DrawDefer& d = sh.defer[tid >> 5];
  ScoreMax m = score_max(sh.table, 0u);
  m.raise(key_of(score_of(top, top, inv_t, token_word(seed, step, plan.greedy))));
  if (L.draw_floor) m.raise(draw_floor_key(__ldcg(&st.draw_lse), top, inv_t));
  const float bound16 = sh.table[16];
  u32 n = 0;  // deferred tokens in the warp's list (warp-uniform)
#pragma unroll
  for (int j = 0; j < kU; ++j) {
    const int i0 = base + (j * kScanThreads + tid) * W;
    u32 flag = 0, word[W];
#pragma unroll
    for (int g = 0; g < W / 4; ++g) {
      float x[4];
      u32 near = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        x[e] = scaled_logit(v[j][4 * g + e], top, inv_t);
        word[4 * g + e] = 0;
        if (i0 + 4 * g + e < vocab && x[e] >= -kGumbelSpan) near |= 1u << e;
      }
      if (near == 0) continue;
      const Philox4 rnd = sampling_random(seed, step, static_cast<u32>(i0 / 4 + g));
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        word[4 * g + e] = rnd.v[e];
        if (((near >> e) & 1u) && !below_floor_cheap(m, x[e], rnd.v[e]) &&
            !(rnd.v[e] >= (1u << 28) && x[e] + bound16 < m.floor_value))
          flag |= 1u << (4 * g + e);
      }
    }
    if (!__any_sync(kFull, flag != 0)) continue;
    const u32 mine = __popc(flag);
    const u32 incl = warp_inclusive_sum(mine);
    const u32 total = __shfl_sync(kFull, incl, 31);
    if (n + total > static_cast<u32>(kDrawDefer)) {
      drain_draw(d, n, m, sh.table, top, inv_t, cap, &st.cand_count, cand);
      n = 0;
    }
    u32 pos = n + incl - mine;
#pragma unroll
    for (int e = 0; e < W; ++e) {
      if (!((flag >> e) & 1u)) continue;
      d.token[pos] = (static_cast<u64>(__float_as_uint(v[j][e])) << 32) | static_cast<u32>(i0 + e);
      d.word[pos] = word[e];
      ++pos;
    }
    n += total;
  }
  if (n != 0) drain_draw(d, n, m, sh.table, top, inv_t, cap, &st.cand_count, cand);
}

// Inserts v into the descending top[0 .. kDrawPicks) (unrolled: the array stays in registers).
__device__ __forceinline__ void insert_top(u64 (&top)[kDrawPicks], u64 v) {
#pragma unroll
  for (int j = 0; j < kDrawPicks; ++j) {
    const u64 t = top[j];
    top[j] = v > t ? v : t;
    v = v > t ? t : v;
  }
}

// A draw item's arrival (all threads): the row's last item takes the kDrawPicks best candidates,
// best first, with their logits' keys, as the row's picks, resets the ticket, and lists the row
// for the check pass unless it has nothing to sum. A list that overflowed gets no picks (resolve
// takes the exact path). The arrival is attention/split_merge.cuh's: after the barrier thread 0
// alone counts with an acq_rel atomic (cumulative over the barrier, so every thread's appends are
// visible before the count); full fences in every thread cost a third of a small merge there.
// Not inlined: inlined, its pick registers made the small-chunk filter spill (ptxas: 36 bytes).
template <typename T>
__device__ __noinline__ void draw_arrive(const Launch& L, int r, float top_logit,
                                         FilterShared& sh) {
  RowState& st = L.ws.state(r);
  const int tid = threadIdx.x;
  __syncthreads();
  if (tid == 0) sh.last = atomic_add_acq_rel_gpu(&st.ticket, 1u) == static_cast<u32>(L.chunks - 1);
  __syncthreads();
  if (!sh.last) return;
  const u32 n = __ldcg(&st.cand_count);
  const u64* cand = L.ws.cand(r);
  u64 top[kDrawPicks] = {};
  if (n <= static_cast<u32>(L.cand_limit))
    for (u32 i = tid; i < n; i += kScanThreads) insert_top(top, __ldcg(&cand[i]));
  for (int j = 0; j < kDrawPicks; ++j) {  // pop the block's best kDrawPicks (unique values)
    const u64 b = block_max<kScanThreads>(top[0], sh.red);
    if (tid == 0) sh.pick[j] = b;
    if (b != 0 && top[0] == b) {
#pragma unroll
      for (int q = 0; q + 1 < kDrawPicks; ++q) top[q] = top[q + 1];
      top[kDrawPicks - 1] = 0;
    }
  }
  __syncthreads();
  if (tid < kDrawPicks) {  // one logit load each, in parallel
    const u64 p = sh.pick[tid];
    const T* row =
        static_cast<const T*>(L.a.logits) + static_cast<std::int64_t>(r) * L.a.row_stride;
    const u32 key = p != 0 ? key_of(to_float(row[packed_index(p)])) : 0u;
    st.pick[tid] = p;
    st.pick_key[tid] = key;
    if (tid == 0) {
      st.ticket = 0;
      if (p != 0 && key != key_of(top_logit)) {  // else: the exact path, or pick 0 kept outright
        const u32 at = atomicAdd(&L.ws.state(0).draw_count, 1u);
        if (at < static_cast<u32>(L.a.max_rows)) L.ws.state(static_cast<int>(at)).draw_list = r;
      }
    }
  }
}

// A grid of at most kFilterBlocksPerSm CTAs per SM loops over the live rows' (row, chunk) items,
// rows in the reverse of the scan's order (the rows it read last are the likeliest in L2). After
// its first, a CTA takes its items from a counter (Launch::dynamic_items): draw items take 8-34 us
// (a row's cost follows its floor), and the static stride left the SMs that drew slow items
// running ~30 us after the median SM was done (per-item stamps, bench/NOTES 135).
template <typename T, int kU, int kBlocks>
__global__ void __launch_bounds__(kScanThreads, kBlocks)
    filter_kernel(const __grid_constant__ Launch L) {
  __shared__ FilterShared sh;
  fill_gumbel_table(sh.table);  // before the wait: overlaps the scan's tail
  __syncthreads();
  pdl_wait_for_prior_grid();
  pdl_launch_dependents();
  const int live = min(*L.a.num_rows, L.a.max_rows);
  const int items = L.chunks * live;
  RowState& st0 = L.ws.state(0);
  int item = static_cast<int>(blockIdx.x);
  for (int k = 0; item < items; ++k) {
    // The CTA's next item: taken now, so the atomic's latency overlaps the plan's reads.
    u32 taken = 0;
    if (L.dynamic_items && threadIdx.x == 0) taken = atomicAdd(&st0.filter_next, 1u);
    const int lin = items - 1 - item;
    const int r = lin / L.chunks;
    const RowParams rp = row_params(L, r);
    const RowPlan plan = row_plan(L.ws, r, rp);
    // Stored once the plan is in (its reads and the atomic overlap); the static path adds the
    // stride after the item: a next item held in a register across the item's calls made
    // draw_item spill (ptxas, float at 3 CTAs an SM: 116 / 200 bytes; now 16 / 16, main 20 / 72).
    // Two slots: slot k is rewritten at k + 2, after every thread passed the barrier of k + 1.
    if (L.dynamic_items && threadIdx.x == 0) sh.next[k & 1] = static_cast<int>(gridDim.x + taken);
    const int c = lin - r * L.chunks;
    if (plan.mode == kModeDraw) {  // uniform over the CTA
      draw_item<T, kU>(L, r, c, rp, plan, sh);
      draw_arrive<T>(L, r, plan.top, sh);
    } else if (plan.mode == kModeFast) {
      if (!has_plan(rp) && L.a.row_stats == nullptr)
        filter_item<T, kU, Item::kAllKept>(L, r, c, rp, plan, sh, sh.red);
      else
        filter_item<T, kU, Item::kPlanned>(L, r, c, rp, plan, sh, sh.red);
    }
    if (!L.dynamic_items) {
      item += static_cast<int>(gridDim.x);
      continue;
    }
    __syncthreads();
    item = sh.next[k & 1];
  }
}

// CTAs per SM of a filter launch: kFilterBlocksPerSm at the large chunk, whose body needs ~80
// registers; the small chunk's (<= 56 registers) keeps 4, one wave of items up to 8 rows.
// GRAPHDECODE_SAMPLING_FILTER_BLOCKS=4 (read once) runs 4 everywhere, as before (A/B runs).
bool filter_blocks_forced_4() {
  static const bool forced = [] {
    const char* v = std::getenv("GRAPHDECODE_SAMPLING_FILTER_BLOCKS");
    return v != nullptr && std::strcmp(v, "4") == 0;
  }();
  return forced;
}

template <typename T, int kU>
void launch(const Launch& L, cudaStream_t stream) {
  constexpr bool kLarge = kU * VecOf<T>::kWidth * kScanThreads == kLargeChunk;
  constexpr int kBlocks = kLarge ? kFilterBlocksPerSm : 4;
  const int items = L.chunks * L.a.max_rows;
  const int per_sm = filter_blocks_forced_4() ? 4 : kBlocks;
  const auto grid = dim3(static_cast<unsigned>(std::min(items, per_sm * L.sms)));
  if (per_sm == 4)
    launch_pdl(filter_kernel<T, kU, 4>, grid, dim3(kScanThreads), 0, stream, L);
  else
    launch_pdl(filter_kernel<T, kU, kFilterBlocksPerSm>, grid, dim3(kScanThreads), 0, stream, L);
}

}  // namespace

void launch_filter(const Launch& L, cudaStream_t stream) {
  with_chunk_shape(L, [&]<typename T, int kU>() { launch<T, kU>(L, stream); });
}

}  // namespace graphdecode::sampling
