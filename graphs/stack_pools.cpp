#include "graphs/stack_pools.h"

#include <algorithm>
#include <cstdint>

#include "common/error.h"

namespace graphdecode {
namespace {

std::int32_t ceil_div(std::int32_t a, std::int32_t b) {
  return (a + b - 1) / b;
}

}  // namespace

KvPoolConfig stack_pool_config(const AttentionStackConfig& c, AttentionKind kind) {
  KvPoolConfig pc;
  PoolGeometry& g = pc.geometry;
  g.kind = kind;
  g.page_size = c.page_size;
  g.max_slots = c.resolved_max_slots();
  const std::int32_t requests = g.max_slots - 1;
  switch (kind) {
    case AttentionKind::kFull:
      g.max_pages_per_slot = ceil_div(c.max_kv_len, c.page_size);
      g.num_pages = c.full_pages > 0 ? c.full_pages : requests * g.max_pages_per_slot + 1;
      break;
    case AttentionKind::kSliding:
      g.max_pages_per_slot = ceil_div(c.max_kv_len, c.page_size);
      g.window_left = c.window_left;
      g.num_pages = swa_pool_pages(requests, c.window_left, c.max_new_tokens, c.page_size);
      break;
    case AttentionKind::kCross:
      g.max_pages_per_slot = ceil_div(std::max(c.max_encoder_len, 1), c.page_size);
      g.num_pages = requests * g.max_pages_per_slot + 1;
      break;
  }
  pc.shape.num_layers =
      static_cast<std::int32_t>(std::count(c.layers.begin(), c.layers.end(), kind));
  pc.shape.num_kv_heads = c.num_kv_heads;
  pc.shape.head_dim = c.head_dim;
  pc.shape.dtype = c.dtype;
  // Eager table updates (encode, apply_table) keep the pool's default capacities.
  return pc;
}

// Per step: releases, truncates and extends of every slot (<= 2 commands each); page ids for the
// step's new tokens (each request may start a page mid-way) or, for a cross pool, for a batch
// of arrivals. Smaller than the pool's eager capacities so the one copy per step stays small.
StepPoolCapacity stack_step_pool_capacity(const AttentionStackConfig& c, AttentionKind kind) {
  const KvPoolConfig pc = stack_pool_config(c, kind);
  const PoolGeometry& g = pc.geometry;
  StepPoolCapacity p;
  p.present = true;
  p.geometry = g;
  p.max_commands = 4 * g.max_slots;
  const std::int64_t ids = kind == AttentionKind::kCross
                               ? static_cast<std::int64_t>(c.max_batch) * g.max_pages_per_slot
                               : c.max_tokens / c.page_size + 2 * c.max_batch + 2 * g.max_slots;
  p.max_page_ids = static_cast<std::int32_t>(std::min<std::int64_t>(g.num_pages, ids));
  return p;
}

StackPools make_stack_pools(const AttentionStackConfig& c, cudaStream_t stream) {
  c.validate();
  StackPools pools;
  for (AttentionKind k : {AttentionKind::kFull, AttentionKind::kSliding, AttentionKind::kCross}) {
    if (c.has(k))
      pools[static_cast<int>(k)] = std::make_unique<KvPool>(stack_pool_config(c, k), stream);
  }
  return pools;
}

StepPrepTables stack_prep_tables(const StackPools& pools) {
  StepPrepTables t;
  for (int k = 0; k < kNumPoolKinds; ++k)
    t.table[k] = pools[k] ? pools[k]->table().data() : nullptr;
  return t;
}

}  // namespace graphdecode
