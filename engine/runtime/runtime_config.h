// What the runtime needs to know about a model and a step, and the sizes that follow from it:
// the model's attention layout, the step limits, each KV pool's geometry, the step input's
// capacity and the ledger's pools. Plain host code (no CUDA call), tested on the CPU.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/attention_kind.h"
#include "common/dtype.h"
#include "graphs/step_input.h"
#include "memory/kv_ledger.h"
#include "memory/kv_pool.h"

namespace graphdecode {

// The attention a model's layers do: what the runtime sizes pools and planners from.
struct AttentionLayout {
  std::vector<AttentionKind> layers;  // [num_layers] at least one
  std::int32_t num_q_heads = 0;
  std::int32_t num_kv_heads = 0;  // divides num_q_heads
  std::int32_t head_dim = 0;      // 64, 128 or 256 (attention kernel)
  DType dtype = DType::kBF16;
  std::int32_t window_left = -1;  // sliding layers' window (>= 0); one per model (one pool)

  void validate() const;  // Error names the bad field
  bool has(AttentionKind k) const;
  std::int32_t count(AttentionKind k) const;
};

// How large a step can be, and how much KV memory the pools hold.
struct RuntimeOptions {
  std::int32_t max_batch = 8;        // requests per step
  std::int32_t max_tokens = 256;     // new tokens per step (sum of extend_len), >= max_batch
  std::int32_t max_kv_len = 2048;    // longest prefix + extend of a request
  std::int32_t max_new_tokens = 0;   // most tokens one request adds in a step; 0 = max_tokens
  std::int32_t max_encoder_len = 0;  // cross layers: longest encoder input of a request
  std::int32_t max_logit_rows = 0;   // logits rows per step (LogitRows); 0 = max_batch
  std::int32_t page_size = 16;
  std::int32_t max_slots = 0;   // 0: 2 * max_batch + 1 (requests may wait outside a step)
  std::int32_t full_pages = 0;  // full pools, reserved page included; 0: every slot at max_kv_len
  std::int32_t sliding_pages = 0;  // sliding pools; 0: every slot at its window's peak
  std::int32_t cross_pages = 0;    // cross pools; 0: every slot at max_encoder_len
  bool deterministic = false;      // batch-invariant attention split-KV
  bool prefix_cache = false;       // self-attention pools share cached prefix pages (the ledger's)

  void validate() const;  // Error names the bad field
  std::int32_t resolved_max_slots() const { return max_slots > 0 ? max_slots : 2 * max_batch + 1; }
  std::int32_t resolved_max_new_tokens() const {
    return max_new_tokens > 0 ? max_new_tokens : max_tokens;
  }
};

// The pool of `kind` for `layout`: its page geometry and the shape of the K/V it stores.
KvPoolConfig pool_config(const AttentionLayout& layout, const RuntimeOptions& options,
                         AttentionKind kind);

// The step input's capacity for these models run side by side in one step (a target, then its
// draft): one pool per attention kind of each model, in model order, kinds in AttentionKind
// order. aux_words and token_feedback are left for the caller.
StepCapacity step_capacity(const RuntimeOptions& options, std::span<const AttentionLayout> models);

// The ledger's view of the capacity's pools (groups = models).
std::vector<LedgerPool> ledger_pools(const StepCapacity& capacity, const RuntimeOptions& options);

}  // namespace graphdecode
