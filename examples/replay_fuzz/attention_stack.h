// The replay fuzzer's step program: the real prep kernels, runtime (pools, planners), K/V writes
// and paged attention layers of mixed kinds, over synthetic Q/K/V (synthetic.h), so graph
// replay, eager execution and a float64 reference can be compared end to end. A test fixture,
// not part of the library.
//
// One step (enqueue):
//   prep (table commands of every pool + metadata)  ->  plan once per attention kind  ->
//   forward over the prep's block:
//   per layer l:  residual += out(l-1) (l > 0; residual = 0 at l = 0)
//                 q = round(hash(Q, token id, position, l, head, dim) + gain * residual)
//                 self layers: k, v = round(hash(K/V, token id, position, l, kv head, dim)),
//                              write_new_kv into the layer's pool (through the page table)
//                 out(l) = attention of layer l (ModelRuntime::attend)
//   residual += out(L-1)
// so layers chain, and the output of a step is residual [num_tokens][num_q_heads * head_dim]
// (float). Cross layers read encoder K/V that encode() wrote when the request arrived, from
// hash(encoder K/V, request id, encoder position, l, kv head, dim).
//
// forward() runs the layers over any metadata block of the prep's layout (a phase of a
// speculative step, spec_stack.h) into any residual buffer, so two stacks (a target and a draft,
// models 0 and 1 of one StepContext) can run the phases of one step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/buffers.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/runtime_config.h"
#include "engine/runtime/step_context.h"
#include "graphs/step_program.h"

namespace graphdecode::fuzz {

struct AttentionStackConfig {
  AttentionLayout layout;  // at most 64 layers, heads < 64 (the synthetic hash packs them)
  RuntimeOptions options;
  std::uint32_t seed = 1;
  float residual_gain = 0.25f;

  void validate() const;  // Error names the bad field
};

// The step capacity of the stack (one model).
StepCapacity stack_step_capacity(const AttentionStackConfig& config);

class AttentionStack : public StepProgram {
 public:
  // `step` must have been built from a capacity that lists this config's pools as model `model`
  // (stack_step_capacity(config) for model 0 alone) and outlive the stack. Allocates every buffer
  // (pools, attention workspaces, activations) on `stream`.
  AttentionStack(const AttentionStackConfig& config, StepContext& step, cudaStream_t stream,
                 std::int32_t model = 0);

  // prep -> plan -> forward(prep block, residual()).
  void enqueue(const StepShape& shape, cudaStream_t stream) override;
  // Capture-safe: the layers over the phase whose metadata is `meta`, planned for it
  // (runtime().plan(meta)) after it was written. Grids cover `token_capacity` rows (counts are
  // read on the device). Output: `residual` [token_capacity][row_elems()] float.
  void forward(const StepMetaView& meta, std::int32_t token_capacity, float* residual,
               cudaStream_t stream) const;

  // Eager, at request arrival (after the cross pool's table holds the request's pages, see
  // apply_table): writes the request's encoder K/V for every cross layer at positions
  // [0, encoder_len) of `slot`. Waits (host) for its previous staging copy; not for the step path.
  void encode(std::int32_t slot, std::uint32_t request_id, std::int32_t encoder_len,
              cudaStream_t stream);
  // Eager table update of this stack's pool of `kind` (outside a step).
  void apply_table(AttentionKind kind, const TableCommandBatch& batch, cudaStream_t stream);

  // residual [max_tokens][num_q_heads * head_dim] float: enqueue's output.
  const float* residual() const noexcept { return residual_.data(); }
  float* residual() noexcept { return residual_.data(); }
  std::int32_t row_elems() const noexcept {
    return config_.layout.num_q_heads * config_.layout.head_dim;
  }
  const AttentionStackConfig& config() const noexcept { return config_; }
  const ModelRuntime& runtime() const noexcept { return runtime_; }

 private:
  void layer_input(std::int32_t layer, std::int32_t mode_flags, const StepMetaView& meta,
                   std::int32_t token_capacity, float* residual, cudaStream_t stream) const;

  AttentionStackConfig config_;
  ModelRuntime runtime_;
  DeviceBuffer<std::uint16_t> q_, k_, v_, out_;  // [max_tokens][heads][head_dim]
  DeviceBuffer<float> residual_;                 // [max_tokens][num_q_heads * head_dim]
  // encode(): [max_encoder_len][num_kv_heads][head_dim] K/V, and (count, slot, position) staging.
  DeviceBuffer<std::uint16_t> enc_k_, enc_v_;
  DeviceBuffer<std::int32_t> enc_meta_;  // [1 + 2 * max_encoder_len]: count, slots, positions
  PinnedBuffer<std::int32_t> enc_meta_host_;
};

}  // namespace graphdecode::fuzz
