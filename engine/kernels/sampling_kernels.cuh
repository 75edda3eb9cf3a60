// Internals of device sampling (sampling.h) shared by its passes: tuning constants, the
// workspace layout, the launch parameters, chunk loads and the Gumbel-max bounds (the warp / block
// primitives: sampling_primitives.cuh).
//
// The passes, in stream order (each a kernel; the token never depends on how a row is chunked):
//   scan    (sampling_scan.cu)    CTA per (row, chunk): argmax into the row's 64-bit atomicMax
//           (greedy and temperature-only rows stop there: their plan follows from the argmax);
//           for rows with top-k or top-p, a 12-bit histogram of the order keys (counts; for top-p
//           also approximate masses relative to a per-CTA bucket reference), merged into the row's
//           global histogram. The row's last CTA (arrival ticket) writes the plan: the top-k
//           bucket and the top-p bucket range [lo, hi] (top-p with top-k <= 256: [top-k bucket,
//           top bucket], the whole top-k set; p_in_candidates).
//           Draw rows (top-p >= kDrawMinTopP alone) have no histogram either: their plan follows
//           from the argmax.
//   filter  (sampling_filter.cu)  a persistent grid over the (row, chunk) items, rows in reverse
//           order (the rows the scan read last are still in L2): tokens in buckets above hi are
//           kept for sure: scored,
//           their exact masses summed; tokens of the top-k bucket and of [lo, hi] are appended
//           to the row's candidate list; tokens between the top-k bucket and lo add their exact
//           mass to the top-p total.
//   resolve (sampling_resolve.cu) CTAs looping over rows: the exact thresholds among the
//           candidates, an exact integer check that [lo, hi] held the top-p threshold, the best
//           candidate score, the token (every live row's, greedy ones too). Otherwise (overflow,
//           failed check) the exact whole-row algorithm. With SamplingArgs::row_stats, each row's
//           kept set and exact Z (the filter then sums the sure-kept mass of every row).
//   check   (sampling_check.cu)   draw rows only (kDrawMinTopP): a persistent grid over their
//           (row, chunk) items sums the row's exact mass Z and, for each of the row's picks, the
//           exact mass of strictly larger logits.
//   Draw rows: the scan merges each chunk's log-sum-exp into the row (RowState::draw_lse), the
//           filter lists the tokens whose score reaches the draw floor (kDrawFloorMargin), and
//           the row's last filter CTA (arrival ticket) keeps the kDrawPicks best as the row's
//           picks; the check pass sums their masses; resolve draws the first pick top-p keeps.
// Every counter a call relies on being zero is reset by the pass that consumes it (draw_lse,
// which the filter reads, by resolve: the filter's CTAs cannot tell when the row's last read is
// done). Filter,
// check and resolve are programmatic dependent launches (PDL) of the pass before them: their CTAs
// become resident while it drains, build their Gumbel bound table (filter, resolve), then wait
// (griddepcontrol.wait) before their first read of the workspace; the scan, launched plainly, lets
// them start at once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/pdl.cuh"
#include "engine/kernels/sampling.h"
#include "engine/kernels/sampling_math.h"
#include "engine/kernels/sampling_primitives.cuh"

namespace graphdecode::sampling {

// ---- tuning constants --------------------------------------------------------------------------
// 256 threads for the streaming passes: 16-byte loads, 32 logits per thread in registers at the
// large chunk, 6 CTAs per SM with the 32 KB histogram.
constexpr int kScanThreads = 256;
// Logits per CTA: 2048 when max_rows <= kSmallBatch (63 CTAs per 128k row: a lone row still
// spreads over half the SMs), else 8192 (16 CTAs per 128k row; per-CTA fixed costs, histogram
// clears and merges, stay small against 32 logits per thread). Both are multiples of 8 so vectors
// and Philox groups of 4 never straddle a chunk.
constexpr int kSmallChunk = 2048;
constexpr int kLargeChunk = 8192;
constexpr int kSmallBatch = 8;
// Candidate list per row: the boundary buckets of near-flat 128k-256k rows hold 2k-8k tokens;
// 16384 x 8 bytes = 128 KB of the resolve CTA's shared memory.
constexpr int kMaxCandidates = 16384;
// The resolve CTA: 16 warps; the exact whole-row path walks a 128k row in 16 strides. One CTA per
// SM at most (the candidate list takes 128 KB), looping over rows.
constexpr int kResolveThreads = 512;
// Filter CTAs resident per SM (<= 80 registers); the grid loops over (row, chunk) items, so rows
// the filter skips (greedy, exact) cost a load each instead of a CTA launch each. At 4 (<= 64
// registers) the filter and its exact-score call spilled: ncu of temperature-only rows at B = 256
// had 3.6M local-memory requests (bench/results/h200_ncu_sampling_2026-11-27.txt).
constexpr int kFilterBlocksPerSm = 3;
// Top-k <= kScanCandMaxTopK (with or without top-p) at the large chunk: the scan appends every
// logit at or above its CTA's bound of the k-th key (~1.5-2.5% of a near-flat 8192-logit chunk at
// k = 50-64: ~2-3k candidates of a 128k row) to the row's candidate list and builds no histogram;
// the filter skips the row and resolve finds both thresholds exactly among the candidates. Larger
// k loosens the bound (at k = 256 it is the smallest thread maximum: ~17% of a flat chunk, past
// the list), and so do small chunks (8 logits a thread: ~5%, ~14k of a 256k row), so those rows
// keep the histogram plan.
constexpr int kScanCandMaxTopK = 64;
// Top-p without top-k, p >= kDrawMinTopP, no row stats ("draw" rows): no histogram and no plan.
// The filter lists every token whose Gumbel score reaches the draw floor (kDrawFloorMargin: the
// top token's score or higher; the kept set's best score is among them unless it lies below the
// floor) and the row's last filter CTA keeps the kDrawPicks best scores as its picks; the check
// pass sums, over the whole grid, the row's exact mass Z and for each pick the exact mass of
// strictly larger logits; resolve draws the first pick top-p keeps (the kept set's argmax: the
// same token as the plan's). Each pick is kept with probability about p or more, so all
// kDrawPicks are rejected with probability about (1 - p)^kDrawPicks (6.6e-5 at p = 0.7): the
// whole-row exact path then decides (~1.4 ms for a 128k row). Below 0.7 the histogram plan stays
// (3.9e-3 at p = 0.5, and p = 1e-6 keeps one token: the picks would miss it). At 0.7 rather than
// 0.8 (call t210, 1B step, p 0.7 rows): sampled / greedy 1.052-1.159 on the histogram plan ->
// 1.012-1.068 drawn at B = 1-256. When resolve summed the picks' masses in one pass over the row
// in one CTA (~30 us a peaked row, ~80 a flat one, call t33), draw rows were kept to the large
// chunk; with the grid-wide check they run at both.
constexpr float kDrawMinTopP = 0.7f;
constexpr int kDrawPicks = 8;
// The draw floor: a draw row lists the tokens whose score reaches F = max(the top token's score,
// max_c L_c - kDrawFloorMargin), L_c = log sum_{i in chunk c} exp(x_i), x_i = (l_i - max) / T.
// Any floor gives the same token (a kept set whose best score lies below F has no listed token
// kept, and resolve takes the exact path); the floor bounds how many scores reach it: the scores
// are Gumbel(x_i), so token i reaches L_c - m with probability ~ p_i e^m, and each chunk lists
// ~e^4 = 55 of its tokens (~900 of a 16-chunk row, ~3.5k of a 63-chunk one) whatever the row's
// shape and temperature. Without it the list held ~Z e^-G tokens (Z = sum_i exp(x_i), G the top
// token's noise): on near-flat 128k rows at T 1.2, Z ~ 6e3, and ~5% of rows passed the 16,384
// slots and took the exact path (~1.4 ms in one CTA; bench/NOTES 137). max_c L_c <= log Z, so the
// kept set's best score (Gumbel with location >= log(p Z)) falls below F with probability at most
// exp(-p e^4) (~3e-17 at p = 0.7). Each scan CTA of a draw row takes its chunk's log-sum-exp and
// merges it with one atomicMax (RowState::draw_lse), no arrival ticket: the row's log Z itself
// (per-chunk parts merged by the row's last CTA, call t210) was more code for no less time. The
// price is the scan's exponentials: bench_sampling top-p 0.95 B = 128 peaked 128 -> 145 us, in
// the step within noise (bench/NOTES 138).
constexpr float kDrawFloorMargin = 4.f;
// Gumbel bound table: gumbel_of is non-increasing in the random word, so gumbel_of(t << 24) +
// slack bounds every word whose top byte is t. A token whose (l - max) / T plus that bound is below
// a score already reached cannot win and skips the two logarithms. The slack covers the ulp-level
// wiggles of logf / log1pf and the rounding of the bound's addition (scores are below 64).
constexpr int kGumbelTableSize = 256;
constexpr float kGumbelTableSlack = 1e-4f;
// Approximate per-CTA bucket masses: exp((l - bucket max) / T) in u32 fixed point with 18
// fractional bits (8192 logits x 2^18 = 2^31 fits); rounding error <= 2^-19 per logit.
constexpr int kApproxFracBits = 18;
// Relative slack on the approximate masses (float exp, double rescaling): the real error is
// ~1e-6; the range only has to contain the threshold, and the exact check backs it.
constexpr double kApproxSlack = 1e-4;

// ---- workspace
// -----------------------------------------------------------------------------------
// kModeCand: the scan wrote the candidates (scan_candidates); the filter skips the row.
// kModeDraw: a draw row (kDrawMinTopP): the filter lists the candidates (pack_max(score key,
// index), not key << 32 | index) and picks, the check sums the masses.
enum RowMode : std::int32_t {
  kModeDone = 0,
  kModeFast = 1,
  kModeExact = 2,
  kModeCand = 3,
  kModeDraw = 4
};

// Per-row state. Counters (argmax .. cand_count) are zero between calls; the plan is written by
// the scan's last CTA before the filter and resolve passes read it.
struct alignas(128) RowState {
  u64 argmax;      // scan: atomicMax of pack_max(key, index); reset by the plan
  u64 s_hi;        // filter: exact mass of the sure-kept tokens; reset by resolve
  u64 s_mid;       // filter: exact mass of top-k-set tokens below the range; reset by resolve
  u64 best;        // filter: atomicMax of pack_max(score key, index); reset by resolve
  u32 ticket;      // scan: arrived CTAs; reset by the plan
  u32 cand_count;  // filter (or scan, kModeCand): candidates appended; reset by resolve or plan
  // The plan.
  float top;            // max logit
  std::int32_t greedy;  // its index
  std::int32_t mode;    // RowMode
  std::int32_t bk;      // bucket holding the k-th largest key; -1 = top-k off
  std::int32_t lo, hi;  // top-p bucket range (top-k only: bk, bk; top-p within a top-k <= 256:
                        // bk, kBuckets - 1; neither: -1, -1)
  u32 above_k;          // tokens in buckets above bk
  u32 below;            // tokens of the top-k set's buckets below lo (0: nothing to check)
  // Draw rows. The filter's last CTA of the row (st.ticket) writes the picks before the check and
  // resolve passes read them; z and above are zero between calls (resolve resets them).
  u64 pick[kDrawPicks];      // the best-scored candidates, best first: pack_max(score key,
                             // index), 0 = none (also every pick when the list overflowed)
  u32 pick_key[kDrawPicks];  // their logits' order keys
  u64 z;                     // check: the row's exact mass Z
  u64 above[kDrawPicks];     // check: the exact mass of logits strictly above pick j's (only
                             // for the picks draw_keys() keeps)
  // The draw rows the check pass sums, listed by the filter: row i's block holds the i-th, row 0's
  // their count (zero between calls: resolve resets it). Listed in the order their last filter
  // items finished; rows with nothing to sum (no picks, pick 0 at the max logit) are not listed.
  u32 draw_list;
  u32 draw_count;
  // Row 0's block only: the filter's and the check's item counters (dynamic items); the scan
  // zeroes them (every pass that reads them waits on the scan's end; the bench's partial graphs
  // run the scan and filter without resolve).
  u32 filter_next;
  u32 check_next;
  // Draw rows: the largest log-sum-exp of a chunk's scaled logits, key_of(log sum exp(l / T)), by
  // atomicMax from the scan (kDrawFloorMargin); 0 = none. Zero between calls: resolve resets it.
  u32 draw_lse;
};

struct RowHist {  // zero between calls; the plan clears it
  u32 count[kBuckets];
  u32 maxkey[kBuckets];   // largest key of the CTAs' bucket references (top-p)
  double mass[kBuckets];  // sum of exp((l - bucket_top_value) / T) (top-p)
};

// One row's block of the workspace; the layout depends on vocab only, so a call with fewer rows
// uses the same blocks.
__host__ __device__ constexpr std::size_t candidate_capacity(std::int32_t vocab) {
  return static_cast<std::size_t>(vocab < kMaxCandidates ? vocab : kMaxCandidates);
}
__host__ __device__ constexpr std::size_t row_block_bytes(std::int32_t vocab) {
  return sizeof(RowState) + sizeof(RowHist) + ((candidate_capacity(vocab) * 8 + 127) / 128) * 128;
}

struct Workspace {
  unsigned char* base = nullptr;
  std::size_t row_bytes = 0;
  std::int32_t cap = 0;  // candidate slots per row

  __device__ RowState& state(int r) const {
    return *reinterpret_cast<RowState*>(base + static_cast<std::size_t>(r) * row_bytes);
  }
  __device__ RowHist& hist(int r) const {
    return *reinterpret_cast<RowHist*>(base + static_cast<std::size_t>(r) * row_bytes +
                                       sizeof(RowState));
  }
  __device__ u64* cand(int r) const {
    return reinterpret_cast<u64*>(base + static_cast<std::size_t>(r) * row_bytes +
                                  sizeof(RowState) + sizeof(RowHist));
  }
};

// ---- launch parameters -------------------------------------------------------------------------
struct Launch {
  SamplingArgs a;  // row_stride resolved
  Workspace ws;
  std::int32_t chunk = 0;       // logits per scan / filter CTA
  std::int32_t chunks = 0;      // CTAs per row
  std::int32_t cand_limit = 0;  // candidates allowed before the exact path (<= ws.cap)
  std::int32_t sms = 0;         // multiprocessors of the device
  bool vec_ok = false;          // rows are 16-byte aligned: vector loads
  bool scan_cand = true;        // scan_candidates rows on (GRAPHDECODE_SAMPLING_SCAN_CAND=0: off)
  bool p_draw = true;           // draw rows on (GRAPHDECODE_SAMPLING_P_DRAW=0: off)
  bool dynamic_items = true;    // filter items from a counter
                                // (GRAPHDECODE_SAMPLING_DYNAMIC=0: the static stride)
  bool dynamic_check = true;    // check items too (GRAPHDECODE_SAMPLING_DYNAMIC_CHECK=0: off)
  bool draw_floor = true;       // the draw floor (kDrawFloorMargin; GRAPHDECODE_SAMPLING_DRAW_
                                // FLOOR=0: the top token's score alone)
  float draw_min_top_p = kDrawMinTopP;  // GRAPHDECODE_SAMPLING_DRAW_MIN_P (A/B runs)
};

// Checks args (graphdecode::Error naming the field) and lays out the launch (sampling.cu).
Launch make_launch(const SamplingArgs& args);
void launch_scan(const Launch& L, cudaStream_t stream);     // sampling_scan.cu
void launch_filter(const Launch& L, cudaStream_t stream);   // sampling_filter.cu
void launch_check(const Launch& L, cudaStream_t stream);    // sampling_check.cu
void launch_resolve(const Launch& L, cudaStream_t stream);  // sampling_resolve.cu

// ---- per-row parameters ------------------------------------------------------------------------
struct RowParams {
  float inv_t;
  float top_p;
  std::int32_t top_k;
  bool sampled, k_on, p_on;
  bool draw;  // a draw row (kDrawMinTopP)
};

__device__ __forceinline__ RowParams row_params(const Launch& L, int r) {
  const SamplingArgs& a = L.a;
  RowParams p;
  const float t = a.temperature[r];
  p.sampled = t > 0.f;
  p.inv_t = 1.f / t;
  p.top_k = a.top_k[r];
  p.top_p = a.top_p[r];
  p.k_on = p.sampled && top_k_on(p.top_k, a.vocab);
  p.p_on = p.sampled && top_p_on(p.top_p);
  p.draw = L.p_draw && p.p_on && !p.k_on && p.top_p >= L.draw_min_top_p && a.row_stats == nullptr;
  return p;
}

// ---- the row's plan
// ------------------------------------------------------------------------------ Rows with top-k or
// top-p get their plan from the scan's last CTA (RowState). Greedy, temperature-only and draw rows
// have no histogram and no ticket: their plan follows from the argmax, which the passes after the
// scan read from RowState::argmax (resolve clears it).
struct RowPlan {
  std::int32_t mode;  // RowMode
  float top;
  std::int32_t greedy;
  std::int32_t bk, lo, hi;
  u32 above_k, below;
};

__device__ __forceinline__ bool has_plan(const RowParams& rp) {
  return rp.k_on || (rp.p_on && !rp.draw);
}

// Top-p inside a bounded top-k set (k <= kScanThreads, the scan's bounded histogram): the whole
// top-k set is few enough to be the row's candidates, so the plan takes every bucket from the
// k-th key's up, and resolve finds both thresholds exactly among them. The scan then needs no mass
// histogram for the row (counts above the bound only, as top-k alone), and the filter scores
// nothing for it.
__device__ __forceinline__ bool p_in_candidates(const RowParams& rp) {
  return rp.k_on && rp.p_on && rp.top_k <= kScanThreads;
}
// The scan writes the row's candidates itself (kScanCandMaxTopK): no histogram, no filter pass.
__device__ __forceinline__ bool scan_candidates(const Launch& L, const RowParams& rp) {
  return L.scan_cand && L.chunk == kLargeChunk && rp.k_on && rp.top_k <= kScanCandMaxTopK;
}
// The scan's approximate bucket masses are needed: top-p over more than a bounded top-k set.
__device__ __forceinline__ bool needs_masses(const RowParams& rp) {
  return rp.p_on && !p_in_candidates(rp);
}

// Whether a row is sampled: T > 0, a non-NaN max that is finite, a finite 1 / T (sampling.h).
__device__ __forceinline__ bool samples(const RowParams& rp, u64 argmax, float top) {
  return rp.sampled && argmax != 0 && isfinite(top) && isfinite(rp.inv_t);
}

__device__ __forceinline__ RowPlan row_plan(const Workspace& ws, int r, const RowParams& rp) {
  const RowState& st = ws.state(r);
  RowPlan p;
  if (has_plan(rp)) {
    p.mode = st.mode, p.top = st.top, p.greedy = st.greedy;
    p.bk = st.bk, p.lo = st.lo, p.hi = st.hi, p.above_k = st.above_k, p.below = st.below;
  } else {
    const u64 am = __ldcg(&st.argmax);
    p.greedy = am != 0 ? static_cast<std::int32_t>(packed_index(am)) : 0;
    p.top = am != 0 ? key_to_float(packed_key(am)) : 0.f;
    p.mode = !samples(rp, am, p.top) ? kModeDone : rp.draw ? kModeDraw : kModeFast;
    p.bk = p.lo = p.hi = -1;  // every token is kept
    p.above_k = p.below = 0;
  }
  return p;
}

// ---- chunk loads -------------------------------------------------------------------------------
template <typename T>
struct VecOf;
template <>
struct VecOf<float> {
  static constexpr int kWidth = 4;  // 16 bytes
};
template <>
struct VecOf<__nv_bfloat16> {
  static constexpr int kWidth = 8;
};

// Calls f.template operator()<T, kU>() for the call's logits type T (float or bf16) and its chunk:
// kU vectors of 16 bytes a thread (the streaming passes' unrolled loads).
template <typename F>
void with_chunk_shape(const Launch& L, F&& f) {
  constexpr int kF = VecOf<float>::kWidth, kB = VecOf<__nv_bfloat16>::kWidth;
  const bool small = L.chunk == kSmallChunk;
  if (L.a.logits_type == LogitsType::kFloat32) {
    if (small)
      f.template operator()<float, kSmallChunk / (kScanThreads * kF)>();
    else
      f.template operator()<float, kLargeChunk / (kScanThreads * kF)>();
  } else {
    if (small)
      f.template operator()<__nv_bfloat16, kSmallChunk / (kScanThreads * kB)>();
    else
      f.template operator()<__nv_bfloat16, kLargeChunk / (kScanThreads * kB)>();
  }
}

__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// Logits i0 .. i0 + W - 1 of a row as floats; i0 is a multiple of W. Out-of-row slots are left
// as they are (callers test i < vocab).
template <typename T>
__device__ __forceinline__ void load_vec(const T* row, int i0, int vocab, bool vec_ok,
                                         float (&out)[VecOf<T>::kWidth]) {
  constexpr int W = VecOf<T>::kWidth;
  if (vec_ok && i0 + W <= vocab) {
    const uint4 raw = *reinterpret_cast<const uint4*>(row + i0);
    if constexpr (W == 4) {
      out[0] = __uint_as_float(raw.x), out[1] = __uint_as_float(raw.y);
      out[2] = __uint_as_float(raw.z), out[3] = __uint_as_float(raw.w);
    } else {
      const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        out[2 * j] = __uint_as_float(w[j] << 16);
        out[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j)
      if (i0 + j < vocab) out[j] = to_float(row[i0 + j]);
  }
}

// ---- Gumbel-max with bounds -------------------------------------------------------------------
__device__ __forceinline__ void fill_gumbel_table(float* table) {
  for (int t = threadIdx.x; t < kGumbelTableSize; t += blockDim.x)
    table[t] = gumbel_of(static_cast<u32>(t) << 24) + kGumbelTableSlack;
}

// The running Gumbel-max of a thread: `best` = pack_max(score key, index) of its best exact score;
// `floor` = the key of a score some token of the row reached (its own, or shared by its warp or
// the row); 0 = none. The skip test compares in floats: `floor_value` = key_to_float(floor), NaN
// for none (every comparison with it is false: nothing is skipped); key_of is monotone, so
// b < floor_value iff key_of(b) < floor for the finite bounds offered. `bound1` = table[1], the
// bound of every word whose top byte is not 0 (see offer).
struct ScoreMax {
  u64 best = 0;
  u32 floor = 0;
  float floor_value = 0.f;
  float bound1 = 0.f;

  __device__ void raise(u32 key) {
    if (key > floor) floor = key, floor_value = key_to_float(key);
  }
};

__device__ __forceinline__ ScoreMax score_max(const float* table, u32 floor) {
  ScoreMax m;
  m.floor = floor;
  m.floor_value = key_to_float(floor);  // NaN for 0
  m.bound1 = table[1];
  return m;
}

// pack_max(score key, i) of token i's exact score, 0 for NaN. Not inlined: the bound test lets
// few tokens get here, and one copy of the two logarithms instead of one per unrolled element
// keeps the streaming loops in the instruction cache (ncu: 32% of the filter's stalls were
// instruction fetch with it inlined).
static __device__ __noinline__ u64 exact_score(float v, float top, float inv_t, u32 word, u32 i) {
  const float s = score_of(v, top, inv_t, word);
  return s == s ? pack_max(key_of(s), i) : 0ull;
}

// The bound tests of token i (scaled logit x, random word `word`) and, when they pass, its exact
// score offered to the running max. A word whose top byte is not 0 (255 in 256) has noise <=
// table[1]: the table values fall by > 0.1 per step, far beyond the ulp wiggles the slack covers,
// and float addition is monotone, so x + table[1] < floor implies x + table[t] < floor. That test
// skips most tokens of a near-flat row without the table's random shared-memory reads (ncu: 2.9-way
// bank conflicts).
__device__ __forceinline__ bool below_floor_cheap(const ScoreMax& m, float x, u32 word) {
  return word >= (1u << 24) && x + m.bound1 < m.floor_value;
}
__device__ __forceinline__ void offer_bounded(ScoreMax& m, const float* table, float v, float x,
                                              float top, float inv_t, u32 word, u32 i) {
  if (x + table[word >> 24] < m.floor_value) return;
  const u64 pk = exact_score(v, top, inv_t, word, i);
  if (pk == 0) return;
  m.best = pk > m.best ? pk : m.best;
  m.raise(packed_key(pk));
}

// Offers token i (logit v, random word `word`) to the running max: skipped when it cannot reach
// the top token (x < -kGumbelSpan) or when its bound is strictly below `floor`; else scored
// exactly. Never changes the argmax, only how many scores are computed.
__device__ __forceinline__ void offer(ScoreMax& m, const float* table, float v, float top,
                                      float inv_t, u32 word, u32 i) {
  const float x = scaled_logit(v, top, inv_t);
  if (!(x >= -kGumbelSpan) || below_floor_cheap(m, x, word)) return;
  offer_bounded(m, table, v, x, top, inv_t, word, i);
}

// offer() for the Philox group of tokens i0 .. i0 + 3 (i0 a multiple of 4), those with bit e of
// `live` set: the group's words only when a token is within kGumbelSpan of the top, and the cheap
// bound of all four before any branch (the streaming loop's common case: nothing passes).
__device__ __forceinline__ void offer_group(ScoreMax& m, const float* table, const float* v,
                                            u32 live, float top, float inv_t, std::uint64_t seed,
                                            std::uint64_t step, u32 i0) {
  float x[4];
  u32 near = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    x[e] = scaled_logit(v[e], top, inv_t);
    if (((live >> e) & 1u) && x[e] >= -kGumbelSpan) near |= 1u << e;
  }
  if (near == 0) return;
  const Philox4 rnd = sampling_random(seed, step, i0 / 4);
  u32 pass = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e)
    if (((near >> e) & 1u) && !below_floor_cheap(m, x[e], rnd.v[e])) pass |= 1u << e;
  if (pass == 0) return;
#pragma unroll
  for (int e = 0; e < 4; ++e)
    if ((pass >> e) & 1u) offer_bounded(m, table, v[e], x[e], top, inv_t, rnd.v[e], i0 + e);
}

// The picks' logit keys the check pass sums masses above, from the row's picks (draw rows): pick
// 0's, and those of the later picks whose logit lies strictly above it. The mass above a logit only
// grows as the logit falls, so once pick 0 is rejected every pick whose logit is at most its own is
// too; those (and missing picks) get ~0u: never exceeded, never decided on. A near-flat row's pick
// 0 is a softmax draw, mostly in its top ~10%, so few tokens lie above the keys.
__device__ __forceinline__ void draw_keys(const RowState& st, u32 (&key)[kDrawPicks]) {
  const u32 key0 = st.pick[0] != 0 ? st.pick_key[0] : ~0u;
#pragma unroll
  for (int j = 0; j < kDrawPicks; ++j)
    key[j] = st.pick[j] != 0 && (j == 0 || st.pick_key[j] > key0) ? st.pick_key[j] : ~0u;
}

// The random word of token i for a request's (seed, step) (a select, not an indexed read of the
// Philox result: that would go through local memory).
__device__ __forceinline__ u32 token_word(std::uint64_t seed, std::uint64_t step, u32 i) {
  const Philox4 r = sampling_random(seed, step, i / 4);
  const u32 e = i % 4;
  return e == 0 ? r.v[0] : e == 1 ? r.v[1] : e == 2 ? r.v[2] : r.v[3];
}

}  // namespace graphdecode::sampling
