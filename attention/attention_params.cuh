// Internal, trivially copyable parameters of the attention kernels (passed as __grid_constant__),
// and the kernels' structural constants; their tuning is in attention_policy.h.
#pragma once

#include <cstdint>

#include "attention/attention_policy.h"
#include "attention/paged_attention.h"
#include "common/fast_divmod.h"
#include "memory/kv_layout.h"

namespace graphdecode::attn {

constexpr int kThreads = 128;    // 4 warps per CTA
constexpr int kBlockN = 64;      // keys per shared-memory tile; chunks are multiples of it
constexpr int kMaxRows = 64;     // query rows (token x head-in-group) per CTA, extend layout
constexpr int kWideRows = 128;   // ... in the wide-tile kernel (attention_kernel<T, D, true>)
constexpr int kDecodeRows = 16;  // a tile of <= 16 rows runs the decode layout (warps split KV)
constexpr int kPlanThreads = 256;
constexpr int kNoSplit = 1 << 30;  // chunk size meaning "one chunk" (a multiple of kBlockN)
// Adaptive mode cuts a request into at most this many chunks (sizes the partial buffers).
constexpr int kMaxAdaptiveChunks = 64;

// Per-request plan written by the device planner. [max_batch (+1)] each.
struct PlanView {
  std::int32_t* item_start;   // [max_batch + 1] first work item of each request; [n] = total
  std::int32_t* num_tiles;    // [max_batch] query tiles
  std::int32_t* num_chunks;   // [max_batch] KV chunks (1 = written directly, no merge)
  std::int32_t* chunk_size;   // [max_batch] keys per chunk, anchored at multiples of it
  std::int32_t* first_key;    // [max_batch] first key any query of the request may see
  std::int32_t* key_end;      // [max_batch] one past its last key (<= first_key: no key)
  std::int32_t* total_items;  // [1] work items of the step (= item_start[n]), readable at once
  std::int32_t* part_off;     // [max_batch] first partial entry (token, head, chunk) of the request
  std::int32_t* item_request;  // [max_work] request of each work item < total_items (a CTA finds
                               // its request in one load instead of searching item_start)
};

struct PlanParams {
  AttentionBatch batch;
  PlanView plan;
  std::int32_t max_batch;
  std::int32_t max_q_tokens;
  std::int32_t max_kv_len;
  std::int32_t num_kv_heads;
  std::int32_t num_q_heads;
  std::int32_t group;
  std::int32_t tokens_per_tile;  // extend layout: kMaxRows / group (wide tiles: kWideRows / group)
  bool causal;
  bool deterministic;
  std::int32_t split_tokens;   // deterministic chunk size
  std::int32_t target_ctas;    // adaptive mode: split until about this many CTAs
  std::int32_t wave_chunks;    // adaptive mode past one wave: at most this many chunks (1 = off)
  std::int32_t wave_min_keys;  // ...of at least this many keys (a multiple of kBlockN)
  std::int64_t max_partials;   // capacity of the partial buffers (entries)
  std::int32_t max_work;       // capacity of the work list (CTAs of the attention grid)
};

struct KernelParams {
  // The call's batch, plan buffers, shapes and capacities: what plan_kernel gets, and what every
  // CTA plans the batch from when self_plan is set.
  PlanParams call;
  const void* q;  // [total_q][num_q_heads][head_dim]
  void* out;      // [total_q][num_q_heads][head_dim]
  float* lse;     // [total_q][num_q_heads] or nullptr
  PagedKvView kv;
  float* partial_o;            // [max_partials][head_dim]
  float* partial_lse;          // [max_partials], log2 domain
  std::int32_t* merge_count;   // [max_work] chunks finished per (request, head, tile); 0 at rest
  std::int32_t* work_counter;  // [1] items claimed past the grid (attention_kernel); 0 at rest
  FastDivmod page_div;         // by kv.page_size
  FastDivmod group_div;        // by call.group
  FastDivmod kv_heads_div;     // by kv.num_kv_heads (work item order, work_item.cuh)
  float scale_log2;            // sm_scale * log2(e)
  // Standalone run() with max_batch <= kThreads: no planner launch; every CTA plans the batch
  // itself from `call` (the plan buffers are neither read nor written).
  bool self_plan;
  // PriorWrites::kQueryAndNewKv in causal mode: the work item, the page table and K/V rows of keys
  // < kv_len - q_len are read before griddepcontrol.wait; q and newer rows after it.
  bool early_kv;
};

// Window of a call: < 0 means full attention (also for cross mode and a null pointer).
__device__ __forceinline__ int read_window(const AttentionBatch& b, bool causal) {
  return (causal && b.window_left != nullptr) ? *b.window_left : -1;
}

__device__ __forceinline__ int read_num_requests(const AttentionBatch& b, int max_batch) {
  const int n = *b.num_requests;
  return n < 0 ? 0 : (n > max_batch ? max_batch : n);
}

}  // namespace graphdecode::attn
