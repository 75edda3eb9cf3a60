// One model's per-step device state: its KV pools (one per attention kind its layers use) and one
// attention planner per kind, over the StepContext (step input, prep, ledger) that every model
// of the step shares. A model's forward asks it for each layer's attention context; it never
// touches pools, tables or plans itself.
//
// In a step: StepContext's prep (table commands of every pool + metadata) -> plan() of every
// runtime (one plan per attention kind) -> each model's layers call attend(). A step of several
// phases (a speculative step: draft-extend, draft decodes, verify) plans and attends over each
// phase's own metadata block (same layout as the prep's), one phase after the other.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>

#include "attention/paged_attention.h"
#include "common/buffers.h"
#include "engine/runtime/runtime_config.h"
#include "engine/runtime/step_context.h"
#include "graphs/step_program.h"
#include "memory/kv_pool.h"

namespace graphdecode {

// What one layer needs from the runtime: where its K/V live and how to attend over them.
struct AttentionContext {
  AttentionKind kind = AttentionKind::kFull;
  PagedKvView kv;              // this layer's K/V in its pool (page table included)
  std::int32_t max_slots = 0;  // rows of the pool's page table (the K/V write bounds check)
  AttentionBatch batch;        // the phase's batch for this kind (window applied for sliding)
  const PagedAttention* attention = nullptr;
};

class ModelRuntime {
 public:
  // The pools of model `model` of `step`'s capacity (their geometry must be this layout's under
  // `options`): allocates them and their planners on `stream` and binds their page tables to the
  // step's prep. `step` must outlive the runtime.
  ModelRuntime(const AttentionLayout& layout, const RuntimeOptions& options, StepContext& step,
               std::int32_t model, cudaStream_t stream);
  ModelRuntime(const ModelRuntime&) = delete;
  ModelRuntime& operator=(const ModelRuntime&) = delete;

  // Capture-safe: one plan per attention kind present over `meta` (default: the step's prep
  // block); after that block is written, before any layer of the phase. query_tokens_hint: the
  // phase's query tokens where the host knows them (prompt_tokens_hint(shape)), 0 otherwise: it
  // picks the attention's tile size (AttentionBatch), which the phase's layers then follow.
  // requests_hint: requests_hint(shape) below: it picks the dense decode kernel at large batch
  // (AttentionBatch::requests_hint).
  void plan(cudaStream_t stream, std::int32_t query_tokens_hint = 0,
            std::int32_t requests_hint = 0) const {
    plan(meta(), stream, query_tokens_hint, requests_hint);
  }
  void plan(const StepMetaView& meta, cudaStream_t stream, std::int32_t query_tokens_hint = 0,
            std::int32_t requests_hint = 0) const;
  // The requests hint of a phase of shape `shape`: the bucket of a decode phase, and of a
  // target-verify phase whose tokens_per_request rows per request fit every attention's decode
  // layout (PagedAttention::decode_layout_for; at the 1B's group of 4, k <= 3 drafts); else 0.
  std::int32_t requests_hint(const StepShape& shape) const noexcept;
  AttentionContext layer(std::int32_t layer) const { return this->layer(layer, meta()); }
  AttentionContext layer(std::int32_t layer, const StepMetaView& meta) const;
  // out = attention of layer `layer` over q ([tokens][num_q_heads][head_dim], the layout's dtype)
  // for the phase whose metadata is `meta`. `prior`: what the kernel just before may still write
  // (paged_attention.h).
  void attend(std::int32_t layer, const void* q, void* out, cudaStream_t stream,
              PriorWrites prior = PriorWrites::kAnything) const {
    attend(layer, meta(), q, out, stream, prior);
  }
  void attend(std::int32_t layer, const StepMetaView& meta, const void* q, void* out,
              cudaStream_t stream, PriorWrites prior = PriorWrites::kAnything) const;

  const AttentionLayout& layout() const noexcept { return layout_; }
  std::int32_t model() const noexcept { return model_; }
  StepContext& step() const noexcept { return step_; }
  const StepMetaView& meta() const noexcept { return step_.prep().device(); }
  bool has_pool(AttentionKind k) const noexcept { return pools_[kind_index(k)] != nullptr; }
  const KvPool& pool(AttentionKind k) const;
  KvPool& pool(AttentionKind k);
  // Index of this model's pool of kind `k` in the step capacity (and the ledger).
  std::int32_t pool_index(AttentionKind k) const;

 private:
  AttentionLayout layout_;
  StepContext& step_;
  std::int32_t model_ = 0;
  std::array<std::unique_ptr<KvPool>, kNumAttentionKinds> pools_;
  std::array<std::int32_t, kNumAttentionKinds> pool_index_{-1, -1, -1};
  std::array<std::unique_ptr<PagedAttention>, kNumAttentionKinds> attention_;
  std::vector<std::int32_t> layer_in_pool_;  // [num_layers] index of the layer inside its pool
  DeviceBuffer<std::int32_t> window_left_;   // [1] the sliding layers' window

  AttentionBatch batch(AttentionKind k, const StepMetaView& meta) const noexcept;
};

}  // namespace graphdecode
