// An EAGLE head on the device (engine/spec/eagle_weights.h): its weights in one arena (q/k/v
// and gate/up fused as in DeviceWeights) and the forward of one phase over its runtime (model 1 of
// the target's step, its own full-attention pool). EAGLE-1/2 (eagle_head.cu):
//   cat = [embed(token) | hidden]            hidden: the target's states, the slot's carried
//                                            states, or the head's own output (HiddenInput)
//   x = cat * fc^T [+ fc.bias]; h = input_norm ? rmsnorm(x) : x
//   attention (RoPE, K/V into the head's pool); x = x + o; y = x + mlp(rmsnorm(x))
//   out[r] = y at the phase's logits rows (last row of each request); logits = out * lm_head^T
// The embedding (unless the head has its own) and lm_head are the target's.
// EAGLE-3 (eagle3_head.cu): x = fc(the target's three captured states) or the head's own output
// (no fc); cat = [input_norm(embed(token)) | hidden_norm(x)]; attention over cat (2 hidden in);
// x = x + o; y = x + mlp(rmsnorm(x)); out = y; draft logits = lm_head(norm(out)) over the draft
// vocabulary, scattered to the target's ids (d2t) with -inf elsewhere.
// bf16 activations, fp32 accumulation; capture-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/buffers.h"
#include "engine/gemm.h"
#include "engine/kernels/rope_freqs.h"
#include "engine/llama_model.h"
#include "engine/runtime/model_runtime.h"
#include "engine/spec/eagle_weights.h"

namespace graphdecode {

// Where each row's hidden-state input comes from: `rows` ([rows][hidden], row t for row t: the
// head's own outputs), or per row a source code (eagle_rules: >= 0 a row of `target`, < 0 a row
// of `carry`; rows of the head's state_width(): the target's final-normed states for EAGLE-1/2,
// its three captured states for EAGLE-3).
struct HiddenInput {
  const std::uint16_t* rows = nullptr;
  const std::int32_t* source = nullptr;  // [max_tokens]
  const std::uint16_t* target = nullptr;
  const std::uint16_t* carry = nullptr;
};

class EagleHead {
 public:
  // Uploads the head; `target` (the verifying model, its embedding and lm_head) must outlive it.
  // Activations for options.max_tokens rows, outputs for options.max_batch requests. Error when
  // the head does not fit the target (check_eagle_fits).
  EagleHead(const EagleWeights& head, const LlamaModel& target, const RuntimeOptions& options,
            cudaStream_t stream);
  EagleHead(const EagleHead&) = delete;
  EagleHead& operator=(const EagleHead&) = delete;

  // One phase over `meta` (a block of the step's layout whose positions are the head's):
  // `token_ids` [rows] (may be another block's, the draft tokens), token_capacity rows through
  // the layer; logit_rows > 0: out() and `logits` ([logit_rows][vocab] float, the target's
  // vocabulary) of the meta's logits rows; 0: the cache only.
  void forward(const ModelRuntime& runtime, const StepMetaView& meta, const std::int32_t* token_ids,
               const HiddenInput& hidden, std::int32_t token_capacity, std::int32_t logit_rows,
               float* logits, cudaStream_t stream);

  // [max_batch][hidden] bf16: the head's output at the last phase's logits rows (what the next
  // draft position reads as its hidden state).
  const std::uint16_t* out() const noexcept { return out_.data(); }
  std::int32_t* bad_token_flag() const noexcept { return bad_token_.data(); }
  const EagleConfig& config() const noexcept { return config_; }
  std::int32_t hidden() const noexcept { return config_.layer.hidden_size; }
  // Width of the target/carry rows a source-coded HiddenInput reads (EagleConfig::state_width).
  std::int32_t state_width() const noexcept { return config_.state_width(); }

 private:
  // Places the head's tensors in one arena (EAGLE-3 also its index map); sets the pointers.
  void upload(const EagleWeights& head, cudaStream_t stream);
  void forward3(const ModelRuntime& runtime, const StepMetaView& meta,
                const std::int32_t* token_ids, const HiddenInput& hidden, std::int32_t rows,
                std::int32_t logit_rows, float* logits, cudaStream_t stream);
  // emb_ = the embedding rows of token_ids (bad ids raise the bad-token flag).
  void embed(const std::int32_t* token_ids, const std::int32_t* num_tokens, std::int32_t rows,
             cudaStream_t stream);
  // qkv = in * Wqkv^T (in: [rows][in_dim]), RoPE, K/V into the pool, attention, o projection
  // into proj_ (+ o bias).
  void attention(const ModelRuntime& runtime, const StepMetaView& meta, const std::uint16_t* in,
                 std::int32_t in_dim, std::int32_t rows, cudaStream_t stream);
  // residual_ += proj_; proj_ = down(swiglu(gate_up(post_norm(residual_)))).
  void mlp(const StepMetaView& meta, std::int32_t rows, cudaStream_t stream);
  // out_[i] = residual_ + proj_ at the meta's logits rows i < logit_rows.
  void output_rows(const StepMetaView& meta, std::int32_t logit_rows, cudaStream_t stream);

  EagleConfig config_;
  const LlamaModel& target_;
  std::int32_t max_tokens_ = 0, max_batch_ = 0;
  RopeTable rope_;
  Gemm gemm_;
  DeviceBuffer<std::uint16_t> arena_;
  const std::uint16_t *embed_ = nullptr, *fc_ = nullptr, *fc_bias_ = nullptr,
                      *input_norm_ = nullptr, *qkv_ = nullptr, *qkv_bias_ = nullptr,
                      *q_norm_ = nullptr, *k_norm_ = nullptr, *o_ = nullptr, *o_bias_ = nullptr,
                      *post_norm_ = nullptr, *gate_up_ = nullptr, *down_ = nullptr,
                      *hidden_norm_ = nullptr, *final_norm_ = nullptr, *draft_head_ = nullptr;
  DeviceBuffer<std::int32_t> bad_token_;        // [1]
  DeviceBuffer<std::int32_t> target_to_draft_;  // EAGLE-3: [vocab] draft id, -1 off the draft vocab
  // Activations, [max_tokens] rows (bf16).
  DeviceBuffer<std::uint16_t> emb_;          // [hidden]
  DeviceBuffer<std::uint16_t> cat_;          // [2 hidden]
  DeviceBuffer<std::uint16_t> residual_;     // [hidden]
  DeviceBuffer<std::uint16_t> normed_;       // [hidden]
  DeviceBuffer<std::uint16_t> qkv_act_;      // [q + 2 kv]
  DeviceBuffer<std::uint16_t> q_;            // [q]
  DeviceBuffer<std::uint16_t> attn_;         // [q]
  DeviceBuffer<std::uint16_t> proj_;         // [hidden]
  DeviceBuffer<std::uint16_t> gate_up_act_;  // [2 inter]
  DeviceBuffer<std::uint16_t> act_;          // [inter]
  DeviceBuffer<std::uint16_t> out_;          // [max_batch][hidden]
  // EAGLE-3 only.
  DeviceBuffer<std::uint16_t> states_;      // [max_tokens][state_width] gathered target states
  DeviceBuffer<std::uint16_t> hid_normed_;  // [max_tokens][hidden] hidden_norm(x)
  DeviceBuffer<std::uint16_t> out_normed_;  // [max_batch][hidden] norm(out)
  DeviceBuffer<float> draft_logits_;        // [max_batch][draft_vocab]
};

}  // namespace graphdecode
