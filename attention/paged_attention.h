// Paged attention: one kernel family for decode, extend (prefill with prefix), target-verify,
// draft-extend-v2 and cross-attention, with the sliding-window rule and split-KV + LSE merge.
//
// Plan/run split (FlashInfer style), graph-safe by construction:
//   * Construction validates the configuration (head dim, dtype, group size, capacities) and
//     allocates every buffer it will ever use (work list, partial outputs) sized for capacity.
//   * run() reads lengths, extents, windows and page tables from DEVICE memory only. A tiny
//     device-side planner turns them into a work list (for max_batch <= 128 every CTA of the
//     attention kernel plans the batch itself instead: one launch per call); the attention
//     kernel's grid is at most one wave of resident CTAs, which claim the work items past it
//     (d256: one CTA per work item of the capacity; CTAs past the work list exit at once); the
//     last CTA of a split request merges its partials in a fixed order. No host sync, no
//     allocation: run() can be captured in a graph and replayed with any batch that fits the
//     capacity.
//
// Semantics (DESIGN.md, common/request_rules.h):
//   causal: request r has q_len = q_start[r+1] - q_start[r] new tokens and kv_len[r] = prefix +
//           extend keys (the new tokens' K/V already written to the cache). Its i-th query sits at
//           position kv_len - q_len + i and sees keys key_visible(pos, k, window_left), k < kv_len.
//   cross:  request r's queries see all kv_len[r] (= its encoder length) keys; no mask, no window.
// Deterministic mode: KV is split at absolute key positions into chunks of `split_tokens` and
// partials merge in chunk order, so a request's output is bitwise independent of the batch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/buffers.h"
#include "common/dtype.h"
#include "memory/kv_layout.h"

namespace graphdecode {

namespace attn {
struct PlanView;
struct PlanParams;
// The attention kernel a call runs: the base one, 128-row extend tiles (wide), or the dense
// decode kernel (AttentionBatch's hints pick it; paged_attention.cu).
enum class KernelChoice : std::uint8_t { kBase, kWide, kDense };
}  // namespace attn

enum class AttentionMode : std::uint8_t { kCausal = 0, kCross = 1 };

// What the kernel launched just before a run_planned() call on the same stream may still be
// writing when the attention kernel starts. (The attention kernel is a programmatic dependent,
// PDL: its CTAs may become resident while that kernel runs, and wait for it before reading.)
enum class PriorWrites : std::uint8_t {
  // Anything this call reads: the kernel waits for it before its first global read (default).
  kAnything = 0,
  // Of what this call reads, only q and the K/V rows of this step's new tokens (keys >=
  // kv_len - q_len): e.g. a rope + KV-append kernel, or the previous layer's attention. The
  // kernel then reads its work item, the page table and the K/V tiles of older keys before it
  // waits, overlapping that kernel's tail. Also required: of the kernels before that one, each
  // that writes what this call reads early (plan, page table, older K/V) has completed when this
  // kernel starts. graphdecode's kernels trigger their dependents only after their own
  // griddepcontrol.wait, so everything two launches back has; the QKV epilogue triggers at its
  // start, so the qkv GEMM before it may still run (it writes only its qkv buffer).
  // Ignored in cross mode (encoder K/V may be written in the same step).
  kQueryAndNewKv = 1,
};

// Per-step batch description. Every pointer is DEVICE memory, so a captured graph reads whatever
// the prep kernels wrote there at replay.
struct AttentionBatch {
  const std::int32_t* num_requests = nullptr;  // [1] live requests; rows past it are ignored
  const std::int32_t* slot = nullptr;          // [max_batch] page-table row of each request
  const std::int32_t* q_start = nullptr;       // [max_batch + 1] cu_seqlens of the query tokens
  const std::int32_t* kv_len = nullptr;  // [max_batch] causal: prefix + extend; cross: encoder len
  const std::int32_t* window_left = nullptr;  // [1] this layer's window_left (< 0 = full);
                                              // nullptr = full. Ignored in cross mode.
  // Host-side, never read on the device: about how many query tokens the call has (a prompt
  // chunk's length; 0 = unknown or few). A call of many rows (tokens x group, see
  // kWideMinRows in attention/attention_policy.h) runs 128-row query tiles at head dim 64: the
  // same outputs, faster on long prompts. A plan and the runs over it use the plan's choice.
  std::int32_t query_tokens_hint = 0;
  // Host-side as well: about how many requests the call has (a decode graph's bucket; 0 = unknown
  // or few). At head dim 64, a call of more requests x KV heads than the base kernel's wave of
  // resident CTAs (attention/attention_policy.h kDenseMinItems) runs the dense decode kernel (4
  // CTAs per SM): faster at large batch, slower at small. Decode items come out bitwise the same
  // (same code, same chunks in deterministic mode; in adaptive mode the chunks follow the kernel's
  // wave, as they follow the batch). query_tokens_hint's wide tiles take precedence. The
  // environment's GRAPHDECODE_ATTN_DENSE_MIN_ITEMS (an integer >= 0 of requests x KV heads; 0 =
  // never) replaces that rule when a PagedAttention is made (A/B runs, tests).
  std::int32_t requests_hint = 0;
};

struct AttentionConfig {
  std::int32_t num_q_heads = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;  // 64, 128 or 256
  DType dtype = DType::kBF16;
  AttentionMode mode = AttentionMode::kCausal;
  std::int32_t max_batch = 0;     // capacity: requests per call
  std::int32_t max_q_tokens = 0;  // capacity: query tokens per call (sum over requests)
  std::int32_t max_kv_len = 0;    // capacity: longest KV extent (or encoder length)
  bool deterministic = false;     // batch-invariant split-KV
  std::int32_t split_tokens = 0;  // deterministic chunk size in keys; 0 = library default.
                                  // Must be a multiple of the kernel's KV tile (64).
  float sm_scale = 0.f;           // 0 = 1/sqrt(head_dim)
  // Adaptive mode, a batch of more than one wave of CTAs: at most this many chunks per request
  // (1 = never split such a batch) of at least wave_split_min_keys keys (a multiple of 64).
  // 0 = the library default (attention_policy.h kWaveSplitChunks, kWaveSplitMinKeys), which the
  // environment's GRAPHDECODE_ATTN_WAVE_SPLIT="chunks,min_keys" overrides (benchmark sweeps).
  std::int32_t wave_split_chunks = 0;
  std::int32_t wave_split_min_keys = 0;
};

class PagedAttention {
 public:
  // Throws graphdecode::Error naming the field for an unsupported head dim, dtype, group size
  // (num_q_heads % num_kv_heads != 0 or group > 16), or non-positive capacities.
  explicit PagedAttention(const AttentionConfig& config);

  // q:   [total_q][num_q_heads][head_dim] (dtype), rows q_start[0] .. q_start[num_requests]-1
  // out: [total_q][num_q_heads][head_dim] (dtype); every live row is written
  // lse: [total_q][num_q_heads] float (natural log of the softmax denominator, scaled scores), or
  //      nullptr. A query row that sees no key gets out = 0 and lse = -inf.
  // kv:  the layer's paged K/V; kv.page_table rows are indexed by batch.slot.
  void run(const AttentionBatch& batch, const PagedKvView& kv, const void* q, void* out, float* lse,
           cudaStream_t stream) const;

  // run() in two halves, for a model: plan() derives the work plan of a step once (one small
  // kernel), then every layer of this attention kind calls run_planned() with the same `batch`
  // (same lengths and window; the K/V view, q and out change per layer). Both capture in a graph.
  // `prior`: see PriorWrites (a call right behind plan() must keep kAnything).
  // run_planned() runs the tiles of the last plan() (batch.query_tokens_hint is read there).
  void plan(const AttentionBatch& batch, cudaStream_t stream) const;
  void run_planned(const AttentionBatch& batch, const PagedKvView& kv, const void* q, void* out,
                   float* lse, cudaStream_t stream,
                   PriorWrites prior = PriorWrites::kAnything) const;

  const AttentionConfig& config() const noexcept { return config_; }
  // Whether the last plan() or run() chose 128-row extend tiles / the dense decode kernel (tests,
  // benchmarks).
  bool wide_tiles_chosen() const noexcept { return planned_ == attn::KernelChoice::kWide; }
  bool dense_decode_chosen() const noexcept { return planned_ == attn::KernelChoice::kDense; }
  // Whether a call of requests_hint `requests` (and no wide tiles) runs the dense decode kernel.
  bool dense_decode_for(std::int32_t requests) const noexcept;
  // Whether `tokens_per_request` query tokens of a request (times the query group) fit one tile of
  // the decode layout (16 rows): what a caller checks before it hints the requests of a phase of
  // several tokens per request (a speculative verify), whose items would otherwise take the dense
  // kernel's extend layout, its slow path.
  bool decode_layout_for(std::int32_t tokens_per_request) const noexcept;
  std::size_t workspace_bytes() const noexcept;
  std::int32_t split_tokens() const noexcept { return split_tokens_; }
  // Adaptive split-KV's aim: one wave of resident CTAs (decode and 64-row extend tiles).
  std::int32_t target_ctas() const noexcept { return target_ctas_; }
  // ... of the dense decode kernel (0: none at this head dim).
  std::int32_t target_ctas_dense() const noexcept { return target_ctas_dense_; }
  // Tests and diagnostics only (synchronizes `stream`): the KV chunks per request of the last
  // plan() or planned run(), [num_requests] (run() of a self-planned batch writes no plan).
  std::vector<std::int32_t> planned_chunks(std::int32_t num_requests, cudaStream_t stream) const;

 private:
  attn::PlanView plan_view() const;
  // kernel: the attention kernel the plan is for (choose(batch)); its wave is the split's aim.
  attn::PlanParams plan_params(const AttentionBatch& batch, attn::KernelChoice kernel) const;
  // The kernel of a call from its hints: wide tiles, else the dense decode kernel, else the base.
  attn::KernelChoice choose(const AttentionBatch& batch) const noexcept;
  // A call of `tokens` query tokens runs 128-row tiles (kWideMinRows rows at a head dim that has
  // the wide kernel).
  bool wide_for_tokens(std::int32_t tokens) const noexcept;
  // The adaptive split's aim (one wave of resident CTAs) for a kernel.
  std::int32_t target_of(attn::KernelChoice kernel) const noexcept;
  // self_plan: no plan kernel, every CTA plans the batch itself; else the plan is in place.
  void launch_attention(const AttentionBatch& batch, const PagedKvView& kv, const void* q,
                        void* out, float* lse, bool self_plan, attn::KernelChoice kernel,
                        PriorWrites prior, cudaStream_t stream) const;
  AttentionConfig config_;
  std::int32_t split_tokens_ = 0;       // effective deterministic chunk size
  std::int32_t target_ctas_ = 0;        // adaptive split-KV aims at about this many CTAs
  std::int32_t target_ctas_wide_ = 0;   // ... in a wide-tile call (0: no wide kernel)
  std::int32_t target_ctas_dense_ = 0;  // ... in a dense decode call (0: no dense kernel)
  // requests_hint x KV heads from which a call takes the dense kernel (0: never): one more than
  // the base kernel's wave (target_ctas_), kDenseMinItems when set, or
  // GRAPHDECODE_ATTN_DENSE_MIN_ITEMS.
  std::int32_t dense_min_items_ = 0;
  std::int32_t wave_chunks_ = 1;    // past one wave: chunks per request at most (1 = off)
  std::int32_t wave_min_keys_ = 0;  // ... of at least this many keys
  // The last plan()'s (or run()'s) kernel; run_planned follows the plan's choice.
  mutable attn::KernelChoice planned_ = attn::KernelChoice::kBase;
  std::int64_t max_chunks_ = 0;      // chunks per request at most
  std::int64_t max_work_ = 0;        // work-list capacity = attention grid size
  std::int64_t max_partials_ = 0;    // partial (token, head, chunk) capacity
  DeviceBuffer<std::int32_t> plan_;  // [7 * max_batch + 2 + max_work] the plan (attn::PlanView)
  DeviceBuffer<float> partial_o_;    // [max_partials][head_dim]
  DeviceBuffer<float> partial_lse_;  // [max_partials]
  // [max_work + 1] split-KV arrival counters, then the counter of work items claimed past the
  // grid; all 0 at rest.
  DeviceBuffer<std::int32_t> counters_;
};

// Merges two partial attention states over disjoint key sets (e.g. a shared prefix and a suffix):
//   out = (exp(lse_a) * o_a + exp(lse_b) * o_b) / (exp(lse_a) + exp(lse_b)),  lse = log-sum-exp.
// o_a, o_b, out: [rows][num_heads][head_dim] (dtype); lse_a, lse_b, lse_out: [rows][num_heads].
// A state with lse = -inf contributes nothing. lse_out may be nullptr. rows is read from device
// memory (`num_rows` [1]) so the merge captures in a graph; max_rows sizes the grid.
struct MergeStatesArgs {
  const void* o_a = nullptr;
  const float* lse_a = nullptr;
  const void* o_b = nullptr;
  const float* lse_b = nullptr;
  void* out = nullptr;
  float* lse_out = nullptr;
  const std::int32_t* num_rows = nullptr;  // [1] device
  std::int32_t max_rows = 0;
  std::int32_t num_heads = 0;
  std::int32_t head_dim = 0;
  DType dtype = DType::kBF16;
};
void merge_attention_states(const MergeStatesArgs& args, cudaStream_t stream);

#if GD_ATTN_TRACE
namespace attn {  // diagnosis builds only: per-CTA timestamps of the last attention launch
void clear_trace();
std::vector<unsigned long long> read_trace();  // [kTraceCtas][kTraceFields], attention_trace.cuh
}  // namespace attn
#endif

}  // namespace graphdecode
