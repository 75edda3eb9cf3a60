#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/runtime/model_runtime.h"

namespace graphdecode {

ModelRuntime::ModelRuntime(const AttentionLayout& layout, const RuntimeOptions& options,
                           StepContext& step, std::int32_t model, cudaStream_t stream)
    : layout_(layout), step_(step), model_(model) {
  layout_.validate();
  const StepCapacity& cap = step_.capacity();
  std::array<std::int32_t, kNumAttentionKinds> counts{};
  for (AttentionKind k : layout_.layers) layer_in_pool_.push_back(counts[kind_index(k)]++);

  for (std::int32_t i = 0; i < cap.num_pools(); ++i) {
    const StepPoolCapacity& p = cap.pools[i];
    if (p.model != model_) continue;
    const AttentionKind k = p.geometry.kind;
    GD_REQUIRE(layout_.has(k), "pools[" + std::to_string(i) + "].kind", attention_kind_name(k),
               "the model has no layer of this kind");
    GD_REQUIRE(pool_index_[kind_index(k)] < 0, "pools[" + std::to_string(i) + "].kind",
               attention_kind_name(k), "one pool per attention kind and model");
    const KvPoolConfig pc = pool_config(layout_, options, k);
    GD_REQUIRE(pc.geometry.num_pages == p.geometry.num_pages &&
                   pc.geometry.max_pages_per_slot == p.geometry.max_pages_per_slot &&
                   pc.geometry.page_size == p.geometry.page_size &&
                   pc.geometry.max_slots == p.geometry.max_slots,
               "pools[" + std::to_string(i) + "].geometry", "differs",
               "the step capacity was not built from this layout and these options");
    pool_index_[kind_index(k)] = i;
    pools_[kind_index(k)] = std::make_unique<KvPool>(pc, stream);
    step_.prep().bind_table(i, pools_[kind_index(k)]->table().data());

    AttentionConfig ac;
    ac.num_q_heads = layout_.num_q_heads;
    ac.num_kv_heads = layout_.num_kv_heads;
    ac.head_dim = layout_.head_dim;
    ac.dtype = layout_.dtype;
    ac.mode = k == AttentionKind::kCross ? AttentionMode::kCross : AttentionMode::kCausal;
    ac.max_batch = cap.max_batch;
    ac.max_q_tokens = cap.max_tokens;
    ac.max_kv_len = k == AttentionKind::kCross ? cap.max_encoder_len : cap.max_kv_len;
    ac.deterministic = options.deterministic;
    attention_[kind_index(k)] = std::make_unique<PagedAttention>(ac);
  }
  for (AttentionKind k : {AttentionKind::kFull, AttentionKind::kSliding, AttentionKind::kCross}) {
    GD_REQUIRE(
        !layout_.has(k) || pools_[kind_index(k)] != nullptr, "model", model_,
        "the step capacity has no " + std::string(attention_kind_name(k)) + " pool for this model");
  }
  window_left_ = DeviceBuffer<std::int32_t>(1);
  window_left_.upload(&layout_.window_left, 1, stream);
  // The window value is a host local: in place before the constructor returns.
  GD_CUDA(cudaStreamSynchronize(stream));
}

const KvPool& ModelRuntime::pool(AttentionKind k) const {
  GD_REQUIRE(has_pool(k), "kind", attention_kind_name(k), "this model has no such pool");
  return *pools_[kind_index(k)];
}

KvPool& ModelRuntime::pool(AttentionKind k) {
  GD_REQUIRE(has_pool(k), "kind", attention_kind_name(k), "this model has no such pool");
  return *pools_[kind_index(k)];
}

std::int32_t ModelRuntime::pool_index(AttentionKind k) const {
  GD_REQUIRE(has_pool(k), "kind", attention_kind_name(k), "this model has no such pool");
  return pool_index_[kind_index(k)];
}

AttentionBatch ModelRuntime::batch(AttentionKind k, const StepMetaView& meta) const noexcept {
  switch (k) {
    case AttentionKind::kSliding:
      return self_batch(meta, window_left_.data());
    case AttentionKind::kCross:
      return cross_batch(meta);
    case AttentionKind::kFull:
      break;
  }
  return self_batch(meta, nullptr);
}

void ModelRuntime::plan(const StepMetaView& meta, cudaStream_t stream,
                        std::int32_t query_tokens_hint, std::int32_t requests_hint) const {
  for (int k = 0; k < kNumAttentionKinds; ++k) {
    if (!attention_[k]) continue;
    AttentionBatch b = batch(static_cast<AttentionKind>(k), meta);
    b.query_tokens_hint = query_tokens_hint;
    b.requests_hint = requests_hint;
    attention_[k]->plan(b, stream);
  }
}

std::int32_t ModelRuntime::requests_hint(const StepShape& shape) const noexcept {
  if (shape.mode == StepMode::kDecode) return shape.bucket;
  if (shape.mode != StepMode::kTargetVerify) return 0;
  for (const auto& a : attention_)
    if (a && !a->decode_layout_for(shape.tokens_per_request)) return 0;
  return shape.bucket;
}

AttentionContext ModelRuntime::layer(std::int32_t l, const StepMetaView& meta) const {
  GD_REQUIRE(l >= 0 && l < static_cast<std::int32_t>(layout_.layers.size()), "layer", l,
             "outside the model's layers");
  const AttentionKind k = layout_.layers[static_cast<std::size_t>(l)];
  const KvPool& p = *pools_[kind_index(k)];
  AttentionContext a;
  a.kind = k;
  a.kv = p.view(layer_in_pool_[static_cast<std::size_t>(l)]);
  a.max_slots = p.config().geometry.max_slots;
  a.batch = batch(k, meta);
  a.attention = attention_[kind_index(k)].get();
  return a;
}

void ModelRuntime::attend(std::int32_t l, const StepMetaView& meta, const void* q, void* out,
                          cudaStream_t stream, PriorWrites prior) const {
  const AttentionContext a = layer(l, meta);
  a.attention->run_planned(a.batch, a.kv, q, out, nullptr, stream, prior);
}

}  // namespace graphdecode
