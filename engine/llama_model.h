// The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3): the forward pass of one step, over
// the attention context a ModelRuntime hands each layer (engine/runtime/model_runtime.h). It
// owns the weights and activations; pools, prep and plans belong to the runtime.
//
// forward(), every size read from the prep metadata on the device:
//   embedding(token ids)
//   per layer:  h = rmsnorm(x [+ residual])          (layer 0: plain norm of the embedding)
//               qkv = h * Wqkv^T [+ bias]            (one fused GEMM)
//               qkv_epilogue: [bias], Qwen3 per-head rmsnorm of q and k, rope(q, k, positions),
//               q out, k and v into the layer's pool; o = paged attention (full or window)
//               x = o * Wo^T [+ bias]; h = rmsnorm(x + residual)
//               x = down(swiglu(h * Wgate_up^T))
//   the step's logits rows (LogitRows: the last row of each request, every row, or a chosen row)
//   gathered; final rmsnorm(x + residual); logits [max_logit_rows][vocab] (float) = lm_head (the
//   embedding when tied).
// bf16 activations, fp32 accumulation. Rows past the live tokens (up to the graph's token
// capacity) compute values nobody reads.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/buffers.h"
#include "engine/device_weights.h"
#include "engine/gemm.h"
#include "engine/kernels/rope_freqs.h"
#include "engine/model_config.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/runtime_config.h"
#include "engine/weights.h"
#include "graphs/step_program.h"

namespace graphdecode {

// The attention layout of a Llama-family config (layer kinds, heads, window). Throws Error when
// the model cannot run: sliding layers with different windows (one sliding pool), a head dim
// other than 64/128/256, hidden or intermediate sizes the row kernels do not take.
AttentionLayout llama_attention_layout(const ModelConfig& config);
// RoPE table parameters of the config (theta, llama3 / linear scaling).
RopeConfig llama_rope_config(const ModelConfig& config);

class LlamaModel {
 public:
  // Uploads the weights and allocates the activations for `options.max_tokens` rows and
  // `options.max_logit_rows` logits rows.
  LlamaModel(const HostWeights& weights, const RuntimeOptions& options, cudaStream_t stream);

  // Capture-safe (no allocation, no host sync): the step's forward over `runtime`'s attention.
  // `shape` fixes the grids: token_capacity rows through the layers, logit_capacity logits rows.
  void forward(const ModelRuntime& runtime, const StepShape& shape, cudaStream_t stream) {
    forward(runtime, runtime.meta(), shape, nullptr, stream);
  }
  // The forward of one phase of a step whose metadata is `meta` (a block of the prep's layout),
  // writing its logits rows to `logits` ([logit_capacity][vocab] float; nullptr = logits()).
  void forward(const ModelRuntime& runtime, const StepMetaView& meta, const StepShape& shape,
               float* logits, cudaStream_t stream);

  // [max_logit_rows][vocab] float: row i = logits of the step's logits row i (LogitRows).
  const float* logits() const noexcept { return logits_.data(); }
  std::int32_t vocab() const noexcept { return config_.vocab_size; }
  std::int32_t max_logit_rows() const noexcept { return max_logit_rows_; }
  // [1] sticky device flag: bit kEmbeddingBadTokenBit set when a token id was out of range.
  std::int32_t* bad_token_flag() const noexcept { return bad_token_.data(); }
  const ModelConfig& config() const noexcept { return config_; }
  const AttentionLayout& layout() const noexcept { return layout_; }

 private:
  void attention_block(const ModelRuntime& rt, const StepMetaView& meta, std::int32_t layer,
                       std::int32_t rows, cudaStream_t stream);
  void mlp_block(const StepMetaView& meta, std::int32_t layer, std::int32_t rows,
                 cudaStream_t stream);
  void norm(const std::uint16_t* x, std::uint16_t* residual, const std::uint16_t* w,
            std::uint16_t* y, const std::int32_t* num_rows, std::int32_t max_rows,
            std::int32_t hidden, cudaStream_t stream) const;

  ModelConfig config_;
  AttentionLayout layout_;
  std::int32_t max_tokens_ = 0;
  std::int32_t max_logit_rows_ = 0;
  DeviceWeights weights_;
  RopeTable rope_;
  Gemm gemm_;
  DeviceBuffer<std::int32_t> bad_token_;  // [1]
  // Activations, [max_tokens] rows unless noted (bf16).
  DeviceBuffer<std::uint16_t> residual_;  // [hidden]
  DeviceBuffer<std::uint16_t> normed_;    // [hidden]
  DeviceBuffer<std::uint16_t> qkv_;       // [q + 2 kv]
  DeviceBuffer<std::uint16_t> q_;         // [q_heads][head_dim]: attention's q (rope applied)
  DeviceBuffer<std::uint16_t> attn_;      // [q]
  DeviceBuffer<std::uint16_t> proj_;      // [hidden] o_proj / down_proj output
  DeviceBuffer<std::uint16_t> gate_up_;   // [2 inter]
  DeviceBuffer<std::uint16_t> act_;       // [inter]
  // [max_logit_rows][hidden]: the logits rows' x, residual and final norm.
  DeviceBuffer<std::uint16_t> logit_x_, logit_res_, logit_normed_;
  DeviceBuffer<float> logits_;  // [max_logit_rows][vocab]
};

}  // namespace graphdecode
