// Device-side planner: turns the step's device-resident lengths into a per-request work plan.
// plan_kernel: one block, launched inside the captured graph before the attention kernel. The same
// passes (request_shape, plan_round) also run inside every CTA of a self-planning launch
// (work_item.cuh), so both give the same plan.
//
// Work of request r = num_kv_heads x num_tiles x num_chunks CTAs:
//   tiles : its query tokens, packed with the GQA group as rows (token x head-in-group); a request
//           with q_len * group <= 16 is one decode-layout tile, else tiles of kMaxRows / group
//           tokens.
//   chunks: its visible key span [first_key, kv_len) cut at multiples of chunk_size. In
//           deterministic mode chunk_size is fixed, so chunking depends on the request alone; in
//           adaptive mode it is chosen so the whole batch fills the GPU.
// Malformed lengths (kv_len < q_len in causal mode, kv_len > capacity, tokens past capacity)
// cannot throw on the device: such a request gets an empty key span (its rows come out 0 / -inf)
// or no tiles, so nothing reads or writes out of bounds.
#pragma once

#include "attention/attention_params.cuh"
#include "common/pdl.cuh"
#include "common/request_rules.h"

namespace graphdecode::attn {

// Division of non-negative ints as unsigned: about half the code of a signed division, and the
// planning code runs cold in every CTA of a self-planning launch (instruction fetch is its cost).
__host__ __device__ __forceinline__ int udiv(int a, int b) {
  return static_cast<int>(static_cast<unsigned>(a) / static_cast<unsigned>(b));
}

struct RequestShape {
  int q_begin = 0;  // first query row of the request
  int q_len = 0;
  int kv_len = 0;
  int first_key = 0;  // inclusive
  int last_key = -1;  // inclusive; < first_key means no visible key
  int tiles = 0;
};

__device__ __forceinline__ RequestShape request_shape(const PlanParams& p, int r, int window) {
  // The three loads come before any test and the tests are selects, so they are one memory round
  // trip, not a chain of dependent ones on the critical path of every self-planned call (the
  // caller issues the slot's load with them; bench/NOTES.md 84).
  const int q0 = p.batch.q_start[r];
  const int q1 = p.batch.q_start[r + 1];
  const int kv = p.batch.kv_len[r];
  const bool q_ok = q0 >= 0 && q1 >= q0 && q1 <= p.max_q_tokens;  // else out of capacity: no tiles
  RequestShape s;
  s.q_begin = q_ok ? q0 : 0;
  s.q_len = q_ok ? q1 - q0 : 0;
  s.kv_len = q_ok ? kv : 0;
  const bool lengths_ok =
      s.kv_len >= 0 && s.kv_len <= p.max_kv_len && (!p.causal || s.kv_len >= s.q_len);
  if (lengths_ok && s.kv_len > 0) {
    s.first_key = p.causal ? step_first_key(s.kv_len - s.q_len, window) : 0;
    s.last_key = s.kv_len - 1;
  }
  if (s.q_len > 0) {
    s.tiles = s.q_len * p.group <= kDecodeRows
                  ? 1
                  : udiv(s.q_len + p.tokens_per_tile - 1, p.tokens_per_tile);
  }
  return s;
}

__host__ __device__ __forceinline__ int round_up_tile(int keys) {
  return (keys + kBlockN - 1) / kBlockN * kBlockN;
}

__device__ __forceinline__ int chunks_of(const RequestShape& s, int chunk_size) {
  if (s.tiles == 0) return 0;
  if (s.last_key < s.first_key) return 1;  // one item that writes zeros / -inf
  return udiv(s.last_key, chunk_size) - udiv(s.first_key, chunk_size) + 1;  // keys >= 0
}

// Exclusive prefix sum over a block of kBlock threads (warp shuffles + one shared array of warp
// totals); `total` gets the block's sum. Small code on purpose: planning runs cold, on the critical
// path of every attention launch.
template <int kBlock>
__device__ __forceinline__ int block_exclusive_sum(int v, int& total,
                                                   int* s_warp /*[kBlock/32 + 1]*/) {
  constexpr int kWarps = kBlock / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) s_warp[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    int acc = 0;
    for (int i = 0; i < kWarps; ++i) {
      const int t = s_warp[i];
      s_warp[i] = acc;
      acc += t;
    }
    s_warp[kWarps] = acc;
  }
  __syncthreads();
  const int before = s_warp[warp] + x - v;
  total = s_warp[kWarps];
  __syncthreads();  // s_warp is reused by the next call
  return before;
}

// Sum over a block of kBlock threads (values >= 0 whose total fits an int).
template <int kBlock>
__device__ __forceinline__ int block_sum(int v, int* s_warp /*[kBlock/32]*/) {
  const int w = __reduce_add_sync(0xffffffffu, v);
  if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = w;
  __syncthreads();
  int total = 0;
#pragma unroll
  for (int i = 0; i < kBlock / 32; ++i) total += s_warp[i];
  __syncthreads();  // s_warp is reused by the next call
  return total;
}

// Adaptive mode's split of a batch: chunks per request, and the shortest chunk it may cut.
struct AdaptiveSplit {
  int chunks = 1;                  // per request (anchored chunking may add one)
  int min_keys = kMinSplitTokens;  // no chunk shorter (a multiple of kBlockN)
  bool wave = false;               // the wave split's chunks (chunk_size_for)
};

// A batch of `total_base` unsplit CTAs:
// * under one wave (target_ctas): chunks per request so that it becomes about target_ctas. Floor,
//   not ceil: anchored chunking may add one chunk, and one wave of CTAs beats a wave and a bit.
// * from one wave to kWaveSplitMaxWaves: the CTAs run in rounds of target_ctas, and a last round
//   of fewer than kWaveTailShare of a wave takes as long as that share (too few CTAs per SM to
//   keep the memory busy). The chunk count up to p.wave_chunks with the least predicted time per
//   chunk, where it beats fewer chunks by 1/kWaveSplitGain. d64 Llama-1B B = 64: 512 items on
//   396 resident CTAs leave a last round of 116.
// Host-callable (as chunk_size_for): tests/attention/test_attention_split_rule.cu pins the rule's
// choices on the CPU.
__host__ __device__ __forceinline__ int wave_rounds_time(int items, int target) {
  const int full = udiv(items, target), tail = items - full * target;
  return full * target + (tail > 0 ? max(tail, target * kWaveTailShare / 100) : 0);
}

__host__ __device__ __forceinline__ AdaptiveSplit adaptive_split(const PlanParams& p,
                                                                 int total_base) {
  AdaptiveSplit a;
  if (p.deterministic || total_base <= 0) return a;
  if (total_base < p.target_ctas) {
    a.chunks = min(kMaxAdaptiveChunks, max(1, udiv(p.target_ctas, total_base)));
    return a;
  }
  if (p.wave_chunks <= 1 || total_base >= kWaveSplitMaxWaves * p.target_ctas) return a;
  // total_base x wave_chunks < kWaveSplitMaxWaves x kMaxWaveSplitChunks x target_ctas: int.
  int best = 1, best_time = wave_rounds_time(total_base, p.target_ctas);
  for (int c = 2; c <= p.wave_chunks; ++c) {
    const int time = wave_rounds_time(total_base * c, p.target_ctas);
    // time / c < best_time / best x (1 - 1/kWaveSplitGain), multiplied out
    if (time * best * kWaveSplitGain < best_time * c * (kWaveSplitGain - 1)) {
      best = c;
      best_time = time;
    }
  }
  a.chunks = best;
  a.min_keys = p.wave_min_keys;
  a.wave = best > 1;
  return a;
}

// Keys per chunk of one request (kNoSplit = one chunk).
__host__ __device__ __forceinline__ int chunk_size_for(const PlanParams& p, const RequestShape& s,
                                                       const AdaptiveSplit& a) {
  if (p.deterministic) return p.split_tokens;
  if (a.chunks <= 1 || s.last_key < s.first_key) return kNoSplit;
  const int span = s.last_key - s.first_key + 1;
  if (a.wave) {  // as many chunks as fit min_keys each, up to a.chunks: no short remainder
    const int n = min(a.chunks, udiv(span, a.min_keys));
    return n <= 1 ? kNoSplit : round_up_tile(udiv(span + n - 1, n));
  }
  const int per = udiv(span + a.chunks - 1, a.chunks);
  const int chunk = max(a.min_keys, round_up_tile(per));
  // Chunks under kFineChunkTokens keys: at most kMaxFineChunks of them per request, none under
  // kFineFloorTokens unless kFewFineChunks chunks are already shorter (attention_policy.h).
  const int many = round_up_tile((span + kMaxFineChunks - 1) / kMaxFineChunks);
  const int few = round_up_tile((span + kFewFineChunks - 1) / kFewFineChunks);
  return max(chunk, min(kFineChunkTokens, max(many, min(kFineFloorTokens, few))));
}

// One request's share of the plan, from a block-wide pass over up to kBlock requests (thread i =
// request base + i). Offsets are absolute (the carries of earlier rounds included).
// Counts are ints: request_shape keeps every request within the capacities, so item and partial
// sums stay under max_work / max_partials (< 2^31, checked at construction) in deterministic mode,
// and adaptive mode splits only batches of fewer than kWaveSplitMaxWaves x target_ctas unsplit
// items, into at most kMaxAdaptiveChunks + 1 chunks under one wave and kMaxWaveSplitChunks + 1
// above it (< 2^31 partial entries for any target_ctas an attention config can have).
struct RequestPlan {
  int chunk = kNoSplit;  // keys per chunk
  int chunks = 0;        // 0: the request gets no work (no tiles, or past the work capacity)
  int tiles = 0;
  int part_off = 0;  // first partial entry
  int item_off = 0;  // first work item
};

// kAlone: the round has one request and only its thread calls (no scan: its offsets are the
// carries, the totals its own counts), the same plan as a block pass with one live thread.
template <int kBlock, bool kAlone = false>
__device__ __forceinline__ RequestPlan plan_round(const PlanParams& p, bool live,
                                                  const RequestShape& s, const AdaptiveSplit& split,
                                                  int parts_carry, int items_carry,
                                                  int& parts_total, int& items_total, int* s_warp) {
  RequestPlan rp;
  rp.chunk = live ? chunk_size_for(p, s, split) : kNoSplit;
  int chunks = live ? chunks_of(s, rp.chunk) : 0;
  const int parts = chunks > 1 ? chunks * s.q_len * p.num_q_heads : 0;
  if constexpr (kAlone) {
    rp.part_off = parts_carry;
    parts_total = parts;
  } else {
    rp.part_off = parts_carry + block_exclusive_sum<kBlock>(parts, parts_total, s_warp);
  }
  if (chunks > 1 && rp.part_off + parts > p.max_partials) {
    // Adaptive mode only (deterministic capacity always fits): fall back to one chunk.
    rp.chunk = kNoSplit;
    chunks = chunks_of(s, rp.chunk);
  }
  const int items = chunks * s.tiles * p.num_kv_heads;
  if constexpr (kAlone) {
    rp.item_off = items_carry;
    items_total = items;
  } else {
    rp.item_off = items_carry + block_exclusive_sum<kBlock>(items, items_total, s_warp);
  }
  const bool fits = rp.item_off + items <= p.max_work;
  rp.chunks = fits ? chunks : 0;
  rp.tiles = fits ? s.tiles : 0;
  return rp;
}

__global__ void __launch_bounds__(kPlanThreads) plan_kernel(const __grid_constant__ PlanParams p) {
  __shared__ int s_warp[kPlanThreads / 32 + 1];
  __shared__ int s_sum[kPlanThreads / 32];
  __shared__ int s_first_item[kPlanThreads + 1];  // work items of this round's requests, by request
  // The attention kernel may be scheduled now (PDL); it waits for this grid's writes itself.
  pdl_launch_dependents();
  const int n = read_num_requests(p.batch, p.max_batch);
  const int window = read_window(p.batch, p.causal);
  // Up to kPlanThreads requests (the common case) are read once and kept in registers.
  const bool one_round = n <= kPlanThreads;
  RequestShape mine;
  if (one_round && static_cast<int>(threadIdx.x) < n) mine = request_shape(p, threadIdx.x, window);
  const auto shape_of = [&](int r) { return one_round ? mine : request_shape(p, r, window); };

  // Pass 1 (adaptive mode): how many CTAs the batch makes without splitting.
  // (tiles <= tiles capacity and tiles capacity x heads < 2^31: the sum fits an int.)
  int total_base = 0;
  if (!p.deterministic) {
    for (int base = 0; base < n; base += kPlanThreads) {
      const int r = base + threadIdx.x;
      total_base += block_sum<kPlanThreads>(r < n ? shape_of(r).tiles * p.num_kv_heads : 0, s_sum);
    }
  }
  const AdaptiveSplit split = adaptive_split(p, total_base);

  // Pass 2: chunking, partial offsets and work offsets, request by request in rounds.
  int items_carry = 0, parts_carry = 0;
  for (int base = 0; base < n; base += kPlanThreads) {
    const int r = base + threadIdx.x;
    const RequestShape s = r < n ? shape_of(r) : RequestShape{};
    int parts_total = 0, items_total = 0;
    const RequestPlan rp = plan_round<kPlanThreads>(p, r < n, s, split, parts_carry, items_carry,
                                                    parts_total, items_total, s_warp);
    if (r < n) {
      p.plan.item_start[r] = min(rp.item_off, p.max_work);
      p.plan.num_tiles[r] = rp.tiles;
      p.plan.num_chunks[r] = rp.chunks;
      p.plan.chunk_size[r] = rp.chunk;
      p.plan.first_key[r] = s.first_key;
      p.plan.key_end[r] = s.last_key + 1;
      p.plan.part_off[r] = rp.part_off;
    }
    // item -> request for this round's items, written by the whole block (a request may own
    // thousands of items): each item finds its request by binary search over the round's starts.
    const int round_n = min(kPlanThreads, n - base);
    if (static_cast<int>(threadIdx.x) < round_n)
      s_first_item[threadIdx.x] = rp.item_off - items_carry;
    if (threadIdx.x == 0) s_first_item[round_n] = items_total;
    __syncthreads();
    const int round_end = min(items_carry + items_total, p.max_work);
    for (int item = items_carry + threadIdx.x; item < round_end; item += kPlanThreads) {
      const int local = item - items_carry;
      int lo = 0, hi = round_n - 1;  // last request whose first item <= local
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (s_first_item[mid] <= local)
          lo = mid;
        else
          hi = mid - 1;
      }
      p.plan.item_request[item] = base + lo;
    }
    __syncthreads();  // s_first_item is rewritten by the next round
    items_carry += items_total;
    parts_carry += parts_total;
  }
  if (threadIdx.x == 0) {
    const int total = min(items_carry, p.max_work);
    p.plan.item_start[n] = total;
    *p.plan.total_items = total;
  }
}

}  // namespace graphdecode::attn
