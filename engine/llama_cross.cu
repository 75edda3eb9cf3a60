// LlamaModel's gated cross-attention layers (Mllama's text decoder): the layer's forward inside
// a step, the gated residual add, and encode(), the one-off projection of a request's encoder
// states into the cross pool when it is admitted. See llama_model.h for the layer's math.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/kernels/cross_kernels.h"
#include "engine/llama_model.h"
#include "memory/kv_write.h"

namespace graphdecode {
namespace {

constexpr int kThreads = 256;

// encode()'s write_new_kv destinations: meta[0] = rows, meta[1 + i] = slot for i < rows (the
// positions, meta[1 + max_rows + i] = i, are written once at start-up).
__global__ void __launch_bounds__(kThreads)
    encoder_rows_kernel(std::int32_t* meta, std::int32_t slot, std::int32_t rows) {
  const std::int32_t i = static_cast<std::int32_t>(blockIdx.x * kThreads + threadIdx.x);
  if (i == 0) meta[0] = rows;
  if (i < rows) meta[1 + i] = slot;
}

__global__ void set_slot_value_kernel(std::int32_t* values, std::int32_t slot, std::int32_t value) {
  values[slot] = value;
}

}  // namespace

void LlamaModel::allocate_encoder_staging(std::int32_t max_slots, cudaStream_t stream) {
  if (!layout_.has(AttentionKind::kCross)) return;
  GD_REQUIRE(max_encoder_len_ >= 1, "max_encoder_len", max_encoder_len_,
             "the model has cross-attention layers: set the longest encoder input (>= 1)");
  const auto e = static_cast<std::size_t>(max_encoder_len_);
  const auto h = static_cast<std::size_t>(config_.hidden_size);
  const auto kv = static_cast<std::size_t>(config_.kv_size());
  enc_states_ = DeviceBuffer<std::uint16_t>(e * h);
  enc_k_ = DeviceBuffer<std::uint16_t>(e * kv);
  enc_v_ = DeviceBuffer<std::uint16_t>(e * kv);
  enc_meta_ = DeviceBuffer<std::int32_t>(1 + 2 * e);
  mlp_from_ = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(max_slots));
  mlp_from_.fill_bytes(0, stream);
  std::vector<std::int32_t> meta(1 + 2 * e, 0);
  for (std::size_t i = 0; i < e; ++i) meta[1 + e + i] = static_cast<std::int32_t>(i);
  enc_meta_.upload(meta.data(), meta.size(), stream);
  for (DeviceBuffer<std::uint16_t>* buf : {&enc_states_, &enc_k_, &enc_v_})
    buf->fill_bytes(0, stream);
  GD_CUDA(cudaStreamSynchronize(stream));  // `meta` is a host local (start-up only)
}

void LlamaModel::add_norm(const StepMetaView& m, const std::uint16_t* gate, const std::uint16_t* w,
                          std::int32_t rows, bool mlp, cudaStream_t stream) {
  const std::int32_t* num_tokens = m.scalars + StepMetaLayout::kNumTokens;
  const std::int32_t h = config_.hidden_size;
  if (gate == nullptr) {  // a self-attention layer's output: the plain fused add + norm
    norm(proj_.data(), residual_.data(), w, normed_.data(), num_tokens, rows, h, stream);
    return;
  }
  GatedResidualNormArgs a;
  a.x = proj_.data();
  a.residual = residual_.data();
  a.gate = gate;
  a.token_request = m.token_request;
  a.encoder_len = m.encoder_len;
  if (mlp) {  // transformers' full_text_row_masked_out_mask: the MLP part only
    a.token_slot = m.token_slot;
    a.token_position = m.token_position;
    a.first_position = mlp_from_.data();
  }
  a.weight = w;
  a.y = w != nullptr ? normed_.data() : nullptr;
  a.num_rows = num_tokens;
  a.max_rows = rows;
  a.hidden = h;
  a.eps = static_cast<float>(config_.rms_norm_eps);
  gated_residual_rmsnorm(a, stream);
}

void LlamaModel::cross_attention_block(const ModelRuntime& rt, const StepMetaView& m,
                                       std::int32_t l, std::int32_t rows, cudaStream_t stream) {
  const DeviceLayerWeights& w = weights_.layer(l);
  const std::int32_t h = config_.hidden_size, q = config_.q_size();
  // q = q_norm(h * Wq^T) per head; no RoPE (the encoder keys have no positions).
  gemm_.run({normed_.data(), w.qkv, q_.data(), rows, h, q, GemmOut::kBF16}, stream);
  HeadNormArgs n;
  n.x = q_.data();
  n.weight = w.q_norm;
  n.num_rows = m.scalars + StepMetaLayout::kNumTokens;
  n.max_rows = rows;
  n.num_heads = config_.num_attention_heads;
  n.head_dim = config_.head_dim;
  n.eps = static_cast<float>(config_.rms_norm_eps);
  head_rmsnorm(n, stream);
  // Non-causal over the request's encoder_len keys (the prep's per-request lengths); a request
  // with none gets 0 rows (masked out by the gated adds anyway).
  rt.attend(l, m, q_.data(), attn_.data(), stream);
  gemm_.run({attn_.data(), w.o, proj_.data(), rows, q, h, GemmOut::kBF16}, stream);
}

void LlamaModel::apply_cross_table(ModelRuntime& rt, cudaStream_t stream) {
  const std::int32_t pool = rt.pool_index(AttentionKind::kCross);
  KvLedger& ledger = rt.step().ledger();
  if (ledger.commands(pool).empty()) return;
  rt.pool(AttentionKind::kCross).table().apply(ledger.commands(pool), stream);
  ledger.clear_commands(pool);
}

void LlamaModel::encode(const ModelRuntime& rt, std::int32_t slot, const EncoderStatesView& s,
                        cudaStream_t stream) {
  GD_REQUIRE(layout_.has(AttentionKind::kCross), "encoder", "given",
             "the model has no cross-attention layers to read encoder states");
  GD_REQUIRE(rt.layout().layers == layout_.layers, "runtime", rt.model(),
             "the runtime's attention layout is not this model's");
  GD_REQUIRE(s.length >= 0 && s.length <= max_encoder_len_, "encoder.length", s.length,
             "outside [0, max_encoder_len = " + std::to_string(max_encoder_len_) + "]");
  if (s.length == 0) return;
  GD_REQUIRE(s.data != nullptr, "encoder.data", "nullptr", "encoder states of length > 0");
  GD_REQUIRE(s.first_position >= 0, "encoder.first_position", s.first_position,
             "cannot be negative");
  const AttentionContext first = rt.layer(static_cast<std::int32_t>(
      std::find(layout_.layers.begin(), layout_.layers.end(), AttentionKind::kCross) -
      layout_.layers.begin()));
  GD_REQUIRE(slot > kPaddingSlot && slot < first.max_slots, "slot", slot,
             "not a request slot of the cross pool");
  const std::int32_t h = config_.hidden_size, kv = config_.kv_size(), n = s.length;
  const auto e = static_cast<std::size_t>(max_encoder_len_);
  const std::uint16_t* states = s.data;
  if (!s.on_device) {
    GD_CUDA(cudaMemcpyAsync(enc_states_.data(), s.data,
                            static_cast<std::size_t>(n) * h * sizeof(std::uint16_t),
                            cudaMemcpyHostToDevice, stream));
    states = enc_states_.data();
  }
  encoder_rows_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0,
                        stream>>>(enc_meta_.data(), slot, n);
  GD_CHECK_LAUNCH();
  // The slot's rows before first_position skip the cross MLP from now on (a text-only request
  // later in this slot is masked whole by its encoder_len 0, whatever this holds).
  GD_REQUIRE(static_cast<std::size_t>(slot) < mlp_from_.size(), "slot", slot,
             "beyond the model's slots");
  set_slot_value_kernel<<<1, 1, 0, stream>>>(mlp_from_.data(), slot, s.first_position);
  GD_CHECK_LAUNCH();
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(layout_.layers.size()); ++l) {
    if (!is_cross(l)) continue;
    const DeviceLayerWeights& w = weights_.layer(l);
    // K = k_norm(states * Wk^T) per head, V = states * Wv^T (cross_kv: k rows, then v rows).
    gemm_.run({states, w.cross_kv, enc_k_.data(), n, h, kv, GemmOut::kBF16}, stream);
    gemm_.run({states, w.cross_kv + static_cast<std::size_t>(kv) * h, enc_v_.data(), n, h, kv,
               GemmOut::kBF16},
              stream);
    HeadNormArgs kn;
    kn.x = enc_k_.data();
    kn.weight = w.k_norm;
    kn.num_rows = enc_meta_.data();
    kn.max_rows = n;
    kn.num_heads = config_.num_key_value_heads;
    kn.head_dim = config_.head_dim;
    kn.eps = static_cast<float>(config_.rms_norm_eps);
    head_rmsnorm(kn, stream);
    const AttentionContext a = rt.layer(l);
    KvWriteArgs wr;
    wr.cache = a.kv;
    wr.max_slots = a.max_slots;
    wr.dtype = layout_.dtype;
    wr.k_new = enc_k_.data();
    wr.v_new = enc_v_.data();
    wr.num_tokens = enc_meta_.data();
    wr.max_tokens = n;
    wr.slot = enc_meta_.data() + 1;
    wr.position = enc_meta_.data() + 1 + e;
    write_new_kv(wr, stream);
  }
}

}  // namespace graphdecode
