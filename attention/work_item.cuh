// What one CTA of the attention kernel works on: a work item (request, KV head, query tile, KV
// chunk), found either in the planner's plan or by planning the batch inside the CTA.
#pragma once

#include "attention/attention_params.cuh"
#include "attention/attention_plan.cuh"
#include "attention/attention_trace.cuh"
#include "common/request_rules.h"

namespace graphdecode::attn {

struct WorkItem {
  int request, kv_head, chunk;
  int tok0, tokens;  // query tokens [tok0, tok0 + tokens) of the request
  int rows;          // tokens * group
  int q_begin;       // first query row of the request in q / out
  int q_len;
  int kv_len;
  int kb, ke;  // keys [kb, ke) this item may read
  int pos0;    // position of token tok0 (causal); unused in cross mode
  int window;
  bool split;  // write partials instead of out
  int chunks;  // chunks of the request (all tiles and heads share the count)
  int item;    // this CTA's work item; item - chunk is the first chunk of its (head, tile)
  int part_off;
  int slot;  // the request's page-table row
};

// The plan of the request that owns an item, with the request's own fields.
struct ItemSource {
  int request, item_start, tiles, chunks, chunk_size, first_key, key_end, part_off;
  int q_begin, q_len, kv_len, slot;
};

// Fills `w` for work item `item` of `src`'s request; false if the item has no work.
__device__ __forceinline__ bool fill_work_item(const KernelParams& p, int item,
                                               const ItemSource& src, WorkItem& w) {
  if (src.tiles == 0 || src.chunks == 0) return false;
  const int chunks = src.chunks, tiles = src.tiles;
  const int local = item - src.item_start;
  if (local < 0 || local >= tiles * chunks * p.kv.num_kv_heads) return false;
  w.request = src.request;
  const int head_tile = udiv(local, chunks);  // local >= 0
  w.chunk = local - head_tile * chunks;
  int tile;
  if constexpr (kLongestTilesFirst) {
    // Heads inner, query tiles outer from the last: a causal request's longest tiles (most keys)
    // are claimed first, so the short ones fill the last wave (the merge counts chunks per (head,
    // tile): the chunks stay innermost). The division is by a constant of the call (FastDivmod):
    // this code is fetched cold by every CTA of a decode step (bench/NOTES.md 96).
    const int rev = p.kv_heads_div.div(head_tile);
    w.kv_head = head_tile - rev * p.kv.num_kv_heads;
    tile = tiles - 1 - rev;
  } else {
    w.kv_head = udiv(head_tile, tiles);
    tile = head_tile - w.kv_head * tiles;
  }
  w.q_begin = src.q_begin;
  w.q_len = src.q_len;
  w.kv_len = src.kv_len;
  const bool decode_layout = w.q_len * p.call.group <= kDecodeRows;
  const int tpt = decode_layout ? w.q_len : p.call.tokens_per_tile;
  w.tok0 = tile * tpt;
  w.tokens = min(tpt, w.q_len - w.tok0);
  w.rows = w.tokens * p.call.group;
  w.window = read_window(p.call.batch, p.call.causal);
  w.split = chunks > 1;
  w.chunks = chunks;
  w.item = item;
  w.part_off = src.part_off;
  w.slot = src.slot;

  // Keys of this chunk, then narrowed to what this tile's queries can see.
  const int first = src.first_key, end = src.key_end, size = src.chunk_size;
  w.kb = 0;
  w.ke = 0;
  w.pos0 = p.call.causal ? w.kv_len - w.q_len + w.tok0 : 0;
  if (end > first) {
    const int c = udiv(first, size) + w.chunk;  // first >= 0
    w.kb = max(first, c * size);
    w.ke = min(end, (c + 1) * size);
    if (p.call.causal) {
      w.kb = max(w.kb, first_visible_key(w.pos0, w.window));
      w.ke = min(w.ke, w.pos0 + w.tokens);  // the tile's last query sees up to its own position
    }
  }
  return true;
}

// From the planner's plan: the item's request comes from one load of item_request (issued with the
// total), then every per-request field in one more round of independent loads. `total`: the call's
// work items.
__device__ __forceinline__ bool planned_work_item(const KernelParams& p, int item, WorkItem& w,
                                                  int& total) {
  total = *p.call.plan.total_items;
  const int r = p.call.plan.item_request[item];  // stale beyond `total`; then unused
  if (item >= total || r < 0 || r >= p.call.max_batch) return false;  // uniform over the CTA
  ItemSource src;
  src.request = r;
  src.item_start = p.call.plan.item_start[r];
  src.tiles = p.call.plan.num_tiles[r];
  src.chunks = p.call.plan.num_chunks[r];
  src.chunk_size = p.call.plan.chunk_size[r];
  src.first_key = p.call.plan.first_key[r];
  src.key_end = p.call.plan.key_end[r];
  src.part_off = p.call.plan.part_off[r];
  src.q_begin = p.call.batch.q_start[r];
  src.q_len = p.call.batch.q_start[r + 1] - src.q_begin;
  src.kv_len = p.call.batch.kv_len[r];
  src.slot = p.call.batch.slot[r];
  return fill_work_item(p, item, src, w);
}

// Planned inside the CTA (p.self_plan; the batch has at most kThreads requests): thread i reads
// request i, the block runs the planner's passes (same functions, so the same plan), and the
// thread whose request owns `item` hands its fields over through shared memory. This removes the
// planner launch and its grid-completion wait from a standalone call (bench/NOTES.md 18); what a
// CTA pays instead is the planning code, fetched cold (NOTES 88).
// kAlone (kAlonePlan, attention_policy.h): a batch of one request is planned by that request's
// thread alone (plan_round's kAlone form: no scans, one barrier to hand the item over), the same
// plan.
template <bool kAlone>
__device__ __forceinline__ bool self_planned_work_item(const KernelParams& p, int item, WorkItem& w,
                                                       int& total) {
  __shared__ int s_warp[kThreads / 32 + 1];
  __shared__ int s_sum[kThreads / 32];
  __shared__ ItemSource s_src;
  __shared__ int s_found;
  const PlanParams& pp = p.call;
  const int n = read_num_requests(pp.batch, pp.max_batch);  // max_batch <= kThreads
  const int window = read_window(pp.batch, pp.causal);
  GD_TRACE_AFTER(0, n);
  const int r = threadIdx.x;
  const bool live = r < n;
  RequestShape s;
  int slot = 0;
  if (live) {
    slot = pp.batch.slot[r];  // issued with request_shape's loads, not after them
    s = request_shape(pp, r, window);
  }
  GD_TRACE_AFTER(1, s.tiles + slot);
  // kAlone and one request (n is uniform): its thread plans alone, without the block's scans.
  const bool alone = kAlone && n == 1;
  __shared__ int s_total;             // alone: the total, from the one thread that knows it
  if (threadIdx.x == 0) s_found = 0;  // published by the barriers below
  int total_base = 0;
  if (!pp.deterministic)
    total_base = alone ? s.tiles * pp.num_kv_heads
                       : block_sum<kThreads>(live ? s.tiles * pp.num_kv_heads : 0, s_sum);
  GD_TRACE_AFTER(2, total_base);
  const AdaptiveSplit split = adaptive_split(pp, total_base);
  int parts_total = 0, items_total = 0;
  RequestPlan rp;
  if (alone) {
    if (live) {
      rp = plan_round<kThreads, true>(pp, true, s, split, 0, 0, parts_total, items_total, nullptr);
      s_total = min(items_total, pp.max_work);
    }
  } else {
    rp = plan_round<kThreads>(pp, live, s, split, 0, 0, parts_total, items_total, s_warp);
  }
  GD_TRACE_AFTER(3, items_total);
  if (!alone) total = min(items_total, pp.max_work);  // as the planner's total_items
  const int items = rp.chunks * rp.tiles * pp.num_kv_heads;
  if (live && item >= rp.item_off && item < rp.item_off + items) {
    s_src = ItemSource{r,         rp.item_off, rp.tiles,       rp.chunks,
                       rp.chunk,  s.first_key, s.last_key + 1, rp.part_off,
                       s.q_begin, s.q_len,     s.kv_len,       slot};
    s_found = 1;
  }
  __syncthreads();
  if (alone) total = s_total;
  if (!s_found) return false;  // uniform over the CTA
  return fill_work_item(p, item, s_src, w);
}

// Tile row -> (token of the request, query head): rows are (token, head-in-group) pairs.
__device__ __forceinline__ void row_token_head(const KernelParams& p, const WorkItem& w, int row,
                                               int& tok, int& head) {
  const int t = p.group_div.div(row);
  tok = w.tok0 + t;
  head = w.kv_head * p.call.group + (row - t * p.call.group);
}

}  // namespace graphdecode::attn
