#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/kernels/model_kernels.h"
#include "engine/kernels/qkv_epilogue.h"
#include "engine/spec/eagle_head.h"
#include "engine/spec/eagle_head_kernels.cuh"
#include "engine/spec/eagle_rules.h"

namespace graphdecode {
namespace {

struct Cursor {
  std::size_t next = 0;
  std::size_t take(std::size_t elems) {
    const std::size_t off = next;
    next = (next + elems + 127) / 128 * 128;  // 256-byte aligned tensors
    return off;
  }
};

}  // namespace

EagleHead::EagleHead(const EagleWeights& head, const LlamaModel& target,
                     const RuntimeOptions& options, cudaStream_t stream)
    : config_(head.config),
      target_(target),
      max_tokens_(options.max_tokens),
      max_batch_(options.max_batch),
      rope_(llama_rope_config(head.config.layer), stream) {
  options.validate();
  config_.validate();
  check_eagle_fits(config_, target.config());
  if (config_.eagle3()) eagle3_detail::check_draft_to_target(head, target.vocab());
  upload(head, stream);
  const ModelConfig& c = config_.layer;
  const auto h = static_cast<std::size_t>(c.hidden_size);
  const auto q = static_cast<std::size_t>(c.q_size());
  const auto kv = static_cast<std::size_t>(c.kv_size());
  const auto inter = static_cast<std::size_t>(c.intermediate_size);
  const auto t = static_cast<std::size_t>(max_tokens_);
  const auto b = static_cast<std::size_t>(max_batch_);
  bad_token_ = DeviceBuffer<std::int32_t>(1);
  bad_token_.fill_bytes(0, stream);
  emb_ = DeviceBuffer<std::uint16_t>(t * h);
  cat_ = DeviceBuffer<std::uint16_t>(t * 2 * h);
  residual_ = DeviceBuffer<std::uint16_t>(t * h);
  normed_ = DeviceBuffer<std::uint16_t>(t * h);
  qkv_act_ = DeviceBuffer<std::uint16_t>(t * (q + 2 * kv));
  q_ = DeviceBuffer<std::uint16_t>(t * q);
  attn_ = DeviceBuffer<std::uint16_t>(t * q);
  proj_ = DeviceBuffer<std::uint16_t>(t * h);
  gate_up_act_ = DeviceBuffer<std::uint16_t>(t * 2 * inter);
  act_ = DeviceBuffer<std::uint16_t>(t * inter);
  out_ = DeviceBuffer<std::uint16_t>(b * h);
  std::vector<DeviceBuffer<std::uint16_t>*> zero = {&emb_,         &cat_, &residual_, &normed_,
                                                    &qkv_act_,     &q_,   &attn_,     &proj_,
                                                    &gate_up_act_, &act_, &out_};
  if (config_.eagle3()) {
    states_ = DeviceBuffer<std::uint16_t>(t * static_cast<std::size_t>(config_.state_width()));
    hid_normed_ = DeviceBuffer<std::uint16_t>(t * h);
    out_normed_ = DeviceBuffer<std::uint16_t>(b * h);
    draft_logits_ = DeviceBuffer<float>(b * static_cast<std::size_t>(config_.draft_vocab_size));
    draft_logits_.fill_bytes(0, stream);
    for (DeviceBuffer<std::uint16_t>* x : {&states_, &hid_normed_, &out_normed_}) zero.push_back(x);
  }
  // Rows past the live ones are computed from whatever these hold: start from zeros.
  for (DeviceBuffer<std::uint16_t>* x : zero) x->fill_bytes(0, stream);
  GD_CUDA(cudaStreamSynchronize(stream));  // the host images are freed on return
}

void EagleHead::upload(const EagleWeights& head, cudaStream_t stream) {
  const ModelConfig& c = config_.layer;
  const bool v3 = config_.eagle3();
  const auto h = static_cast<std::size_t>(c.hidden_size);
  const auto q = static_cast<std::size_t>(c.q_size());
  const auto kv = static_cast<std::size_t>(c.kv_size());
  const auto inter = static_cast<std::size_t>(c.intermediate_size);
  // EAGLE-1/2 names its layer layers.0.*, EAGLE-3 midlayer.*; the layer's tensors are otherwise
  // the same, except that EAGLE-3's q/k/v read cat(embedding, state): 2 hidden inputs.
  const std::string layer = v3 ? "midlayer." : "layers.0.";
  const std::size_t qkv_in = v3 ? 2 * h : h;
  const std::size_t fc_in = v3 ? static_cast<std::size_t>(config_.state_width()) : 2 * h;
  // Host image of the arena: (offset, tensor name, offset inside a fused tensor).
  struct Piece {
    std::size_t off;
    std::string name;
    std::size_t within;
  };
  std::vector<Piece> pieces;
  Cursor cur;
  const auto place = [&](std::size_t elems, const std::vector<std::string>& names) {
    const std::size_t off = cur.take(elems);
    std::size_t within = 0;
    for (const std::string& n : names) {
      const HostTensor& t = head.at(n);
      GD_REQUIRE(t.data.size() == static_cast<std::size_t>(t.numel()), n, t.data.size(),
                 "tensor data does not match its shape");
      pieces.push_back({off, n, within});
      within += t.data.size();
    }
    GD_REQUIRE(within == elems, names.front(), within, "tensor size does not match the config");
    return off;
  };
  const std::size_t none = ~std::size_t{0};
  std::size_t o_embed = none, o_fc_bias = none, o_in_norm = none, o_qkv_bias = none,
              o_q_norm = none, o_k_norm = none, o_o_bias = none, o_hid_norm = none, o_final = none,
              o_lm = none;
  if (config_.own_embedding)
    o_embed = place(static_cast<std::size_t>(c.vocab_size) * h, {"embed_tokens.weight"});
  const std::size_t o_fc = place(h * fc_in, {"fc.weight"});
  if (config_.fc_bias) o_fc_bias = place(h, {"fc.bias"});
  if (config_.input_norm) o_in_norm = place(h, {layer + "input_layernorm.weight"});
  if (v3) o_hid_norm = place(h, {layer + "hidden_norm.weight"});
  const std::size_t o_qkv = place(
      (q + 2 * kv) * qkv_in, {layer + "self_attn.q_proj.weight", layer + "self_attn.k_proj.weight",
                              layer + "self_attn.v_proj.weight"});
  if (c.qkv_bias)
    o_qkv_bias =
        place(q + 2 * kv, {layer + "self_attn.q_proj.bias", layer + "self_attn.k_proj.bias",
                           layer + "self_attn.v_proj.bias"});
  if (c.qk_norm) {
    o_q_norm = place(static_cast<std::size_t>(c.head_dim), {layer + "self_attn.q_norm.weight"});
    o_k_norm = place(static_cast<std::size_t>(c.head_dim), {layer + "self_attn.k_norm.weight"});
  }
  const std::size_t o_o = place(h * q, {layer + "self_attn.o_proj.weight"});
  if (c.o_bias) o_o_bias = place(h, {layer + "self_attn.o_proj.bias"});
  const std::size_t o_post = place(h, {layer + "post_attention_layernorm.weight"});
  const std::size_t o_gate_up =
      place(2 * inter * h, {layer + "mlp.gate_proj.weight", layer + "mlp.up_proj.weight"});
  const std::size_t o_down = place(h * inter, {layer + "mlp.down_proj.weight"});
  if (v3) {
    o_final = place(h, {"norm.weight"});
    o_lm = place(static_cast<std::size_t>(config_.draft_vocab_size) * h, {"lm_head.weight"});
  }
  std::vector<std::uint16_t> image(cur.next, 0);
  for (const Piece& p : pieces) {
    const HostTensor& t = head.at(p.name);
    std::memcpy(image.data() + p.off + p.within, t.data.data(),
                t.data.size() * sizeof(std::uint16_t));
  }
  arena_ = DeviceBuffer<std::uint16_t>(image.size());
  arena_.upload(image.data(), image.size(), stream);
  const auto at = [this, none](std::size_t off) -> const std::uint16_t* {
    return off == none ? nullptr : arena_.data() + off;
  };
  embed_ = config_.own_embedding ? at(o_embed) : target_.weights().embed();
  fc_ = at(o_fc);
  fc_bias_ = at(o_fc_bias);
  input_norm_ = at(o_in_norm);
  hidden_norm_ = at(o_hid_norm);
  qkv_ = at(o_qkv);
  qkv_bias_ = at(o_qkv_bias);
  q_norm_ = at(o_q_norm);
  k_norm_ = at(o_k_norm);
  o_ = at(o_o);
  o_bias_ = at(o_o_bias);
  post_norm_ = at(o_post);
  gate_up_ = at(o_gate_up);
  down_ = at(o_down);
  final_norm_ = at(o_final);
  draft_head_ = at(o_lm);
  if (v3) {  // the inverse of draft_to_target, so the scatter writes every target id once
    std::vector<std::int32_t> t2d(static_cast<std::size_t>(c.vocab_size), -1);
    for (std::size_t i = 0; i < head.draft_to_target.size(); ++i)
      t2d[static_cast<std::size_t>(head.draft_to_target[i])] = static_cast<std::int32_t>(i);
    target_to_draft_ = DeviceBuffer<std::int32_t>(t2d.size());
    target_to_draft_.upload(t2d.data(), t2d.size(), stream);
    GD_CUDA(cudaStreamSynchronize(stream));  // t2d is freed on return
  }
  GD_CUDA(cudaStreamSynchronize(stream));  // the arena's host image is freed on return
}

void EagleHead::forward(const ModelRuntime& rt, const StepMetaView& m,
                        const std::int32_t* token_ids, const HiddenInput& in,
                        std::int32_t token_capacity, std::int32_t logit_rows, float* logits,
                        cudaStream_t stream) {
  const ModelConfig& c = config_.layer;
  GD_REQUIRE(token_capacity >= 1, "token_capacity", token_capacity, "must be positive");
  GD_REQUIRE(in.rows != nullptr || (in.source && in.target && in.carry), "hidden", "incomplete",
             "rows, or source with target and carry states");
  GD_REQUIRE(logit_rows <= max_batch_, "logit_rows", logit_rows, "more than max_batch");
  GD_REQUIRE(logit_rows == 0 || logits != nullptr, "logits", "nullptr", "logit rows need logits");
  const std::int32_t rows = std::min(token_capacity, max_tokens_);
  if (config_.eagle3()) {
    forward3(rt, m, token_ids, in, rows, logit_rows, logits, stream);
    return;
  }
  const std::int32_t* num_tokens = m.scalars + StepMetaLayout::kNumTokens;
  const std::int32_t h = c.hidden_size;

  embed(token_ids, num_tokens, rows, stream);
  ConcatParams cp{reinterpret_cast<const uint4*>(emb_.data()),
                  in,
                  reinterpret_cast<uint4*>(cat_.data()),
                  num_tokens,
                  rows,
                  h / 8};
  concat_kernel<<<blocks_for(static_cast<std::int64_t>(rows) * (h / 8)), kThreads, 0, stream>>>(cp);
  GD_CHECK_LAUNCH();
  gemm_.run({cat_.data(), fc_, residual_.data(), rows, 2 * h, h, GemmOut::kBF16}, stream);
  if (fc_bias_ != nullptr) add_bias({residual_.data(), fc_bias_, num_tokens, rows, h, 0}, stream);
  const std::uint16_t* attn_in = residual_.data();
  if (input_norm_ != nullptr) {
    RmsNormArgs n;
    n.x = residual_.data();
    n.weight = input_norm_;
    n.y = normed_.data();
    n.num_rows = num_tokens;
    n.max_rows = rows;
    n.hidden = h;
    n.eps = static_cast<float>(c.rms_norm_eps);
    rmsnorm(n, stream);
    attn_in = normed_.data();
  }
  attention(rt, m, attn_in, h, rows, stream);
  mlp(m, rows, stream);
  if (logit_rows == 0) return;
  output_rows(m, logit_rows, stream);
  gemm_.run({out_.data(), target_.weights().lm_head(), logits, logit_rows, h, c.vocab_size,
             GemmOut::kF32},
            stream);
}

void EagleHead::embed(const std::int32_t* token_ids, const std::int32_t* num_tokens,
                      std::int32_t rows, cudaStream_t stream) {
  const ModelConfig& c = config_.layer;
  EmbeddingArgs e;
  e.table = embed_;
  e.token_ids = token_ids;
  e.out = emb_.data();
  e.error_flag = bad_token_.data();
  e.num_rows = num_tokens;
  e.max_rows = rows;
  e.vocab = c.vocab_size;
  e.hidden = c.hidden_size;
  embedding(e, stream);
}

void EagleHead::attention(const ModelRuntime& rt, const StepMetaView& m, const std::uint16_t* in,
                          std::int32_t in_dim, std::int32_t rows, cudaStream_t stream) {
  const ModelConfig& c = config_.layer;
  const std::int32_t* num_tokens = m.scalars + StepMetaLayout::kNumTokens;
  const std::int32_t h = c.hidden_size;
  const std::int32_t qkv_cols = c.q_size() + 2 * c.kv_size();
  gemm_.run({in, qkv_, qkv_act_.data(), rows, in_dim, qkv_cols, GemmOut::kBF16}, stream);
  const AttentionContext a = rt.layer(0, m);
  QkvEpilogueArgs q;
  q.qkv = qkv_act_.data();
  q.bias = qkv_bias_;
  q.q_norm = q_norm_;
  q.k_norm = k_norm_;
  q.eps = static_cast<float>(c.rms_norm_eps);
  q.positions = m.token_position;
  q.inv_freq = rope_.data();
  q.num_rows = num_tokens;
  q.max_rows = rows;
  q.num_q_heads = c.num_attention_heads;
  q.num_kv_heads = c.num_key_value_heads;
  q.head_dim = c.head_dim;
  q.q_out = q_.data();
  q.cache = a.kv;
  q.max_slots = a.max_slots;
  q.slot = m.token_slot;
  qkv_epilogue(q, stream);
  a.attention->run_planned(a.batch, a.kv, q_.data(), attn_.data(), nullptr, stream,
                           PriorWrites::kQueryAndNewKv);
  gemm_.run({attn_.data(), o_, proj_.data(), rows, c.q_size(), h, GemmOut::kBF16}, stream);
  if (o_bias_ != nullptr) add_bias({proj_.data(), o_bias_, num_tokens, rows, h, 0}, stream);
}

void EagleHead::mlp(const StepMetaView& m, std::int32_t rows, cudaStream_t stream) {
  const ModelConfig& c = config_.layer;
  const std::int32_t* num_tokens = m.scalars + StepMetaLayout::kNumTokens;
  const std::int32_t h = c.hidden_size, inter = c.intermediate_size;
  // residual = x + o; normed = post_attention_layernorm(residual)
  RmsNormArgs n;
  n.x = proj_.data();
  n.residual = residual_.data();
  n.weight = post_norm_;
  n.y = normed_.data();
  n.num_rows = num_tokens;
  n.max_rows = rows;
  n.hidden = h;
  n.eps = static_cast<float>(c.rms_norm_eps);
  rmsnorm(n, stream);
  gemm_.run({normed_.data(), gate_up_, gate_up_act_.data(), rows, h, 2 * inter, GemmOut::kBF16},
            stream);
  SwiGluArgs s;
  s.gate_up = gate_up_act_.data();
  s.out = act_.data();
  s.num_rows = num_tokens;
  s.max_rows = rows;
  s.inter = inter;
  swiglu(s, stream);
  gemm_.run({act_.data(), down_, proj_.data(), rows, inter, h, GemmOut::kBF16}, stream);
}

void EagleHead::output_rows(const StepMetaView& m, std::int32_t logit_rows, cudaStream_t stream) {
  const std::int32_t h = config_.layer.hidden_size;
  OutParams op{proj_.data(),
               residual_.data(),
               out_.data(),
               m.scalars + StepMetaLayout::kNumLogitRows,
               m.logit_row,
               logit_rows,
               h};
  output_rows_kernel<<<blocks_for(static_cast<std::int64_t>(logit_rows) * h), kThreads, 0,
                       stream>>>(op);
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
