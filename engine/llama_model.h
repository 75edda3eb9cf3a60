// The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) as a StepProgram: the step body that
// StepGraphs captures, with the same contract as graphs/attention_stack.h (which it replaces for
// real models).
//
// One step (enqueue), every size read from the prep metadata on the device:
//   prep (table commands + metadata) -> plan once per attention kind -> embedding(token ids)
//   per layer:  h = rmsnorm(x [+ residual])          (layer 0: plain norm of the embedding)
//               qkv = h * Wqkv^T [+ bias]            (one fused GEMM)
//               qkv_epilogue: [bias], Qwen3 per-head rmsnorm of q and k, rope(q, k, positions),
//               q out, k and v into the layer's pool; o = paged attention (full or window)
//               x = o * Wo^T [+ bias]; h = rmsnorm(x + residual)
//               x = down(swiglu(h * Wgate_up^T))
//   last token of each request (row q_start[r+1] - 1) gathered; final rmsnorm(x + residual);
//   logits [max_batch][vocab] (float) = lm_head (the embedding when tied).
// bf16 activations, fp32 accumulation. Rows past the live tokens (up to the graph's token
// capacity) compute values nobody reads.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "attention/paged_attention.h"
#include "common/buffers.h"
#include "engine/device_weights.h"
#include "engine/gemm.h"
#include "engine/kernels/rope_freqs.h"
#include "engine/model_config.h"
#include "engine/weights.h"
#include "graphs/attention_stack.h"
#include "graphs/stack_pools.h"
#include "graphs/step_input.h"
#include "graphs/step_prep.h"

namespace graphdecode {

struct LlamaModelOptions {
  std::int32_t max_batch = 8;       // requests per step
  std::int32_t max_tokens = 256;    // new tokens per step (sum of extend_len)
  std::int32_t max_kv_len = 2048;   // longest prefix + extend of a request
  std::int32_t max_new_tokens = 0;  // most tokens one request adds in a step; 0 = max_tokens
  std::int32_t page_size = 16;
  std::int32_t max_slots = 0;   // 0: 2 * max_batch + 1
  std::int32_t full_pages = 0;  // pages of the full-attention pool; 0: every slot at max_kv_len
  bool deterministic = false;   // batch-invariant attention split-KV
};

// The attention-stack view of (config, options): layer kinds, heads, window, pool sizes. Throws
// Error when the model cannot run: sliding layers with different windows, a head dim other than
// 64/128/256, more layers or heads than the stack supports.
AttentionStackConfig llama_stack_config(const ModelConfig& config, const LlamaModelOptions& opt);
// What the step input must hold for this model (build the StepInput from it).
StepCapacity llama_step_capacity(const ModelConfig& config, const LlamaModelOptions& opt);
// RoPE table parameters of the config (theta, llama3 / linear scaling).
RopeConfig llama_rope_config(const ModelConfig& config);

class LlamaModel : public StepProgram {
 public:
  // `input` must have been built from llama_step_capacity(weights.config, options) and outlive
  // the model. Uploads the weights and allocates everything (pools, workspaces, activations).
  LlamaModel(const HostWeights& weights, const LlamaModelOptions& options, const StepInput& input,
             cudaStream_t stream);

  // Capture-safe: no allocation, no host sync.
  void enqueue(const StepShape& shape, cudaStream_t stream) override;

  // [max_batch][vocab] float: row r = logits of request r's last new token of the last step.
  const float* logits() const noexcept { return logits_.data(); }
  std::int32_t vocab() const noexcept { return config_.vocab_size; }
  // [1] sticky device flag: bit kEmbeddingBadTokenBit set when a token id was out of range.
  std::int32_t* bad_token_flag() const noexcept { return bad_token_.data(); }

  const ModelConfig& config() const noexcept { return config_; }
  const LlamaModelOptions& options() const noexcept { return options_; }
  const AttentionStackConfig& stack_config() const noexcept { return stack_; }
  const StepPrep& prep() const noexcept { return prep_; }
  bool has_pool(AttentionKind k) const noexcept { return pools_[static_cast<int>(k)] != nullptr; }
  const KvPool& pool(AttentionKind k) const;
  // [max_slots] device tokens that step_rules::kTokenFromDevice ids read; set before capture.
  void set_token_feedback(const std::int32_t* per_slot) noexcept {
    prep_.set_token_feedback(per_slot);
  }
  // Eager table update of one pool (outside a step), e.g. releases of finished requests.
  void apply_table(AttentionKind kind, const TableCommandBatch& batch, cudaStream_t stream);

 private:
  void attention_block(std::int32_t layer, std::int32_t rows, const AttentionBatch& batch,
                       cudaStream_t stream);
  void mlp_block(std::int32_t layer, std::int32_t rows, cudaStream_t stream);
  void norm(const std::uint16_t* x, std::uint16_t* residual, const std::uint16_t* w,
            std::uint16_t* y, const std::int32_t* num_rows, std::int32_t max_rows,
            std::int32_t hidden, cudaStream_t stream) const;

  ModelConfig config_;
  LlamaModelOptions options_;
  AttentionStackConfig stack_;
  DeviceWeights weights_;
  StackPools pools_;
  std::vector<std::int32_t> layer_index_;  // layer -> index inside its pool
  std::vector<AttentionKind> layer_kind_;  // [num_layers]
  StepPrep prep_;
  std::array<std::unique_ptr<PagedAttention>, kNumPoolKinds> attention_;
  RopeTable rope_;
  Gemm gemm_;
  DeviceBuffer<std::int32_t> window_left_;  // [1] sliding layers' window
  DeviceBuffer<std::int32_t> bad_token_;    // [1]
  // Activations, [max_tokens] rows unless noted (bf16).
  DeviceBuffer<std::uint16_t> residual_;  // [hidden]
  DeviceBuffer<std::uint16_t> normed_;    // [hidden]
  DeviceBuffer<std::uint16_t> qkv_;       // [q + 2 kv]
  DeviceBuffer<std::uint16_t> q_;         // [q_heads][head_dim]: attention's q (rope applied)
  DeviceBuffer<std::uint16_t> attn_;      // [q]
  DeviceBuffer<std::uint16_t> proj_;      // [hidden] o_proj / down_proj output
  DeviceBuffer<std::uint16_t> gate_up_;   // [2 inter]
  DeviceBuffer<std::uint16_t> act_;       // [inter]
  DeviceBuffer<std::uint16_t> last_x_, last_res_, last_normed_;  // [max_batch][hidden]
  DeviceBuffer<float> logits_;                                   // [max_batch][vocab]
};

}  // namespace graphdecode
