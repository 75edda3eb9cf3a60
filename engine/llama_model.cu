#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/kernels/model_kernels.h"
#include "engine/kernels/qkv_epilogue.h"
#include "engine/llama_model.h"

namespace graphdecode {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(std::int64_t items) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, (items + kThreads - 1) / kThreads));
}

// Copies each live request's last new token (row q_start[r+1] - 1) of x and residual into rows r
// of last_x and last_res.
struct GatherParams {
  const uint4* x;
  const uint4* res;
  uint4* last_x;
  uint4* last_res;
  const std::int32_t* num_requests;
  const std::int32_t* q_start;  // [max_batch + 1]
  std::int32_t max_batch, row_vecs;
};

__global__ void __launch_bounds__(kThreads)
    gather_last_kernel(const __grid_constant__ GatherParams p) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const std::int32_t n = min(*p.num_requests, p.max_batch);
  if (i >= static_cast<std::int64_t>(n) * p.row_vecs) return;
  const auto r = static_cast<std::int32_t>(i / p.row_vecs);
  const auto e = static_cast<std::int32_t>(i - static_cast<std::int64_t>(r) * p.row_vecs);
  const std::int64_t src = static_cast<std::int64_t>(p.q_start[r + 1] - 1) * p.row_vecs + e;
  p.last_x[i] = p.x[src];
  p.last_res[i] = p.res[src];
}

}  // namespace

LlamaModel::LlamaModel(const HostWeights& weights, const LlamaModelOptions& options,
                       const StepInput& input, cudaStream_t stream)
    : config_(weights.config),
      options_(options),
      stack_(llama_stack_config(weights.config, options)),
      weights_(weights, stream),
      pools_(make_stack_pools(stack_, stream)),
      prep_(input, stack_prep_tables(pools_)),
      rope_(llama_rope_config(weights.config), stream) {
  const StepCapacity want = stack_step_capacity(stack_);
  const StepCapacity& got = input.capacity();
  GD_REQUIRE(got.max_batch == want.max_batch && got.max_tokens == want.max_tokens &&
                 got.max_slots == want.max_slots && got.max_kv_len == want.max_kv_len &&
                 got.max_encoder_len == want.max_encoder_len,
             "input", "capacity", "step input not built from llama_step_capacity(config, options)");
  std::array<std::int32_t, kNumPoolKinds> counts{};
  for (AttentionKind k : stack_.layers) {
    layer_kind_.push_back(k);
    layer_index_.push_back(counts[static_cast<int>(k)]++);
  }
  for (AttentionKind k : {AttentionKind::kFull, AttentionKind::kSliding}) {
    if (!stack_.has(k)) continue;
    AttentionConfig ac;
    ac.num_q_heads = stack_.num_q_heads;
    ac.num_kv_heads = stack_.num_kv_heads;
    ac.head_dim = stack_.head_dim;
    ac.dtype = DType::kBF16;
    ac.mode = AttentionMode::kCausal;
    ac.max_batch = stack_.max_batch;
    ac.max_q_tokens = stack_.max_tokens;
    ac.max_kv_len = stack_.max_kv_len;
    ac.deterministic = stack_.deterministic;
    attention_[static_cast<int>(k)] = std::make_unique<PagedAttention>(ac);
  }
  window_left_ = DeviceBuffer<std::int32_t>(1);
  window_left_.upload(&stack_.window_left, 1, stream);
  bad_token_ = DeviceBuffer<std::int32_t>(1);
  bad_token_.fill_bytes(0, stream);

  const auto t = static_cast<std::size_t>(stack_.max_tokens);
  const auto b = static_cast<std::size_t>(stack_.max_batch);
  const auto h = static_cast<std::size_t>(config_.hidden_size);
  const auto q = static_cast<std::size_t>(config_.q_size());
  const auto kv = static_cast<std::size_t>(config_.kv_size());
  const auto inter = static_cast<std::size_t>(config_.intermediate_size);
  residual_ = DeviceBuffer<std::uint16_t>(t * h);
  normed_ = DeviceBuffer<std::uint16_t>(t * h);
  qkv_ = DeviceBuffer<std::uint16_t>(t * (q + 2 * kv));
  q_ = DeviceBuffer<std::uint16_t>(t * q);
  attn_ = DeviceBuffer<std::uint16_t>(t * q);
  proj_ = DeviceBuffer<std::uint16_t>(t * h);
  gate_up_ = DeviceBuffer<std::uint16_t>(t * 2 * inter);
  act_ = DeviceBuffer<std::uint16_t>(t * inter);
  last_x_ = DeviceBuffer<std::uint16_t>(b * h);
  last_res_ = DeviceBuffer<std::uint16_t>(b * h);
  last_normed_ = DeviceBuffer<std::uint16_t>(b * h);
  logits_ = DeviceBuffer<float>(b * static_cast<std::size_t>(config_.vocab_size));
  // Rows past the live ones are computed from whatever these hold: start from zeros.
  for (DeviceBuffer<std::uint16_t>* buf : {&residual_, &normed_, &qkv_, &q_, &attn_, &proj_,
                                           &gate_up_, &act_, &last_x_, &last_res_, &last_normed_})
    buf->fill_bytes(0, stream);
  logits_.fill_bytes(0, stream);
  GD_CUDA(cudaStreamSynchronize(stream));
}

const KvPool& LlamaModel::pool(AttentionKind k) const {
  GD_REQUIRE(has_pool(k), "kind", static_cast<int>(k), "this model has no such pool");
  return *pools_[static_cast<int>(k)];
}

void LlamaModel::apply_table(AttentionKind kind, const TableCommandBatch& batch,
                             cudaStream_t stream) {
  GD_REQUIRE(has_pool(kind), "kind", static_cast<int>(kind), "this model has no such pool");
  pools_[static_cast<int>(kind)]->table().apply(batch, stream);
}

void LlamaModel::norm(const std::uint16_t* x, std::uint16_t* residual, const std::uint16_t* w,
                      std::uint16_t* y, const std::int32_t* num_rows, std::int32_t max_rows,
                      std::int32_t hidden, cudaStream_t stream) const {
  RmsNormArgs a;
  a.x = x;
  a.residual = residual;
  a.weight = w;
  a.y = y;
  a.num_rows = num_rows;
  a.max_rows = max_rows;
  a.hidden = hidden;
  a.eps = static_cast<float>(config_.rms_norm_eps);
  rmsnorm(a, stream);
}

void LlamaModel::attention_block(std::int32_t l, std::int32_t rows, const AttentionBatch& batch,
                                 cudaStream_t stream) {
  const DeviceLayerWeights& w = weights_.layer(l);
  const StepMetaView& m = prep_.device();
  const std::int32_t* num_tokens = m.scalars + StepMetaLayout::kNumTokens;
  const std::int32_t hq = config_.num_attention_heads, hkv = config_.num_key_value_heads;
  const std::int32_t d = config_.head_dim, h = config_.hidden_size;
  const std::int32_t qkv_cols = config_.q_size() + 2 * config_.kv_size();

  gemm_.run({normed_.data(), w.qkv, qkv_.data(), rows, h, qkv_cols, GemmOut::kBF16}, stream);
  // qkv [+ bias] -> Qwen3 q/k norm -> rope -> q_, and K/V straight into the layer's pages.
  const AttentionKind kind = layer_kind_[l];
  const KvPool& pool = *pools_[static_cast<int>(kind)];
  const PagedKvView view = pool.view(layer_index_[l]);
  QkvEpilogueArgs e;
  e.qkv = qkv_.data();
  e.bias = w.qkv_bias;
  e.q_norm = w.q_norm;
  e.k_norm = w.k_norm;
  e.eps = static_cast<float>(config_.rms_norm_eps);
  e.positions = m.token_position;
  e.inv_freq = rope_.data();
  e.num_rows = num_tokens;
  e.max_rows = rows;
  e.num_q_heads = hq;
  e.num_kv_heads = hkv;
  e.head_dim = d;
  e.q_out = q_.data();
  e.cache = view;
  e.max_slots = pool.config().geometry.max_slots;
  e.slot = m.token_slot;
  qkv_epilogue(e, stream);
  // qkv_epilogue writes q and this step's K/V rows only: the attention kernel may read its plan
  // and the older K/V while it runs.
  attention_[static_cast<int>(kind)]->run_planned(batch, view, q_.data(), attn_.data(), nullptr,
                                                  stream, PriorWrites::kQueryAndNewKv);
  gemm_.run({attn_.data(), w.o, proj_.data(), rows, config_.q_size(), h, GemmOut::kBF16}, stream);
  if (w.o_bias != nullptr) {
    AddBiasArgs b;
    b.y = proj_.data();
    b.bias = w.o_bias;
    b.num_rows = num_tokens;
    b.max_rows = rows;
    b.cols = h;
    add_bias(b, stream);
  }
}

void LlamaModel::mlp_block(std::int32_t l, std::int32_t rows, cudaStream_t stream) {
  const DeviceLayerWeights& w = weights_.layer(l);
  const std::int32_t* num_tokens = prep_.device().scalars + StepMetaLayout::kNumTokens;
  const std::int32_t h = config_.hidden_size, inter = config_.intermediate_size;
  // residual += o; normed = norm(residual)
  norm(proj_.data(), residual_.data(), w.post_norm, normed_.data(), num_tokens, rows, h, stream);
  gemm_.run({normed_.data(), w.gate_up, gate_up_.data(), rows, h, 2 * inter, GemmOut::kBF16},
            stream);
  SwiGluArgs s;
  s.gate_up = gate_up_.data();
  s.out = act_.data();
  s.num_rows = num_tokens;
  s.max_rows = rows;
  s.inter = inter;
  swiglu(s, stream);
  gemm_.run({act_.data(), w.down, proj_.data(), rows, inter, h, GemmOut::kBF16}, stream);
}

void LlamaModel::enqueue(const StepShape& shape, cudaStream_t stream) {
  GD_REQUIRE(shape.token_capacity >= 1, "token_capacity", shape.token_capacity, "must be positive");
  const std::int32_t rows = std::min(shape.token_capacity, stack_.max_tokens);
  const std::int32_t batch_rows = std::clamp(shape.bucket, 1, stack_.max_batch);
  prep_.enqueue(stream);
  const AttentionBatch full = prep_.self_batch(nullptr);
  const AttentionBatch window = prep_.self_batch(window_left_.data());
  if (attention_[static_cast<int>(AttentionKind::kFull)])
    attention_[static_cast<int>(AttentionKind::kFull)]->plan(full, stream);
  if (attention_[static_cast<int>(AttentionKind::kSliding)])
    attention_[static_cast<int>(AttentionKind::kSliding)]->plan(window, stream);

  const StepMetaView& m = prep_.device();
  const std::int32_t* num_tokens = m.scalars + StepMetaLayout::kNumTokens;
  const std::int32_t h = config_.hidden_size;
  EmbeddingArgs e;
  e.table = weights_.embed();
  e.token_ids = m.token_id;
  e.out = residual_.data();
  e.error_flag = bad_token_.data();
  e.num_rows = num_tokens;
  e.max_rows = rows;
  e.vocab = config_.vocab_size;
  e.hidden = h;
  embedding(e, stream);

  const auto layers = static_cast<std::int32_t>(layer_kind_.size());
  for (std::int32_t l = 0; l < layers; ++l) {
    const DeviceLayerWeights& w = weights_.layer(l);
    if (l == 0) {
      norm(residual_.data(), nullptr, w.input_norm, normed_.data(), num_tokens, rows, h, stream);
    } else {  // residual += previous MLP output; normed = norm(residual)
      norm(proj_.data(), residual_.data(), w.input_norm, normed_.data(), num_tokens, rows, h,
           stream);
    }
    attention_block(l, rows, layer_kind_[l] == AttentionKind::kSliding ? window : full, stream);
    mlp_block(l, rows, stream);
  }

  GatherParams g;
  g.x = reinterpret_cast<const uint4*>(proj_.data());
  g.res = reinterpret_cast<const uint4*>(residual_.data());
  g.last_x = reinterpret_cast<uint4*>(last_x_.data());
  g.last_res = reinterpret_cast<uint4*>(last_res_.data());
  g.num_requests = m.scalars + StepMetaLayout::kNumRequests;
  g.q_start = m.q_start;
  g.max_batch = batch_rows;
  g.row_vecs = h / 8;
  gather_last_kernel<<<blocks_for(static_cast<std::int64_t>(batch_rows) * g.row_vecs), kThreads, 0,
                       stream>>>(g);
  GD_CHECK_LAUNCH();
  norm(last_x_.data(), last_res_.data(), weights_.final_norm(), last_normed_.data(),
       m.scalars + StepMetaLayout::kNumRequests, batch_rows, h, stream);
  gemm_.run({last_normed_.data(), weights_.lm_head(), logits_.data(), batch_rows, h,
             config_.vocab_size, GemmOut::kF32},
            stream);
}

}  // namespace graphdecode
