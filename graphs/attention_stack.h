// The captured step body until the model exists: the real prep kernels, K/V writes and paged
// attention layers of mixed kinds, over synthetic Q/K/V (graphs/synthetic.h), so graph replay,
// eager execution and a float64 reference can be compared end to end.
//
// One step (enqueue):
//   prep (table commands of every pool + metadata)  ->  plan once per attention kind  ->
//   per layer l:  residual += out(l-1) (l > 0; residual = 0 at l = 0)
//                 q = round(hash(Q, token id, position, l, head, dim) + gain * residual)
//                 self layers: k, v = round(hash(K/V, token id, position, l, kv head, dim)),
//                              write_new_kv into the layer's pool (through the page table)
//                 out(l) = PagedAttention::run_planned(q, pool view of l)
//   residual += out(L-1)
// so layers chain, and the output of a step is residual [num_tokens][num_q_heads * head_dim]
// (float). Cross layers read encoder K/V that encode() wrote when the request arrived, from
// hash(encoder K/V, request id, encoder position, l, kv head, dim).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "attention/paged_attention.h"
#include "common/buffers.h"
#include "graphs/step_input.h"
#include "graphs/step_prep.h"
#include "memory/kv_pool.h"

namespace graphdecode {

struct AttentionStackConfig {
  std::vector<AttentionKind> layers;  // at least one
  std::int32_t num_q_heads = 4;
  std::int32_t num_kv_heads = 2;
  std::int32_t head_dim = 64;  // 64, 128 or 256 (attention kernel)
  DType dtype = DType::kBF16;
  std::int32_t window_left = 63;  // sliding layers (>= 0)
  std::int32_t page_size = 16;
  std::int32_t max_batch = 32;
  std::int32_t max_tokens = 256;
  std::int32_t max_slots = 0;  // 0: max_batch * 2 + 1 (requests may wait outside a step)
  std::int32_t max_kv_len = 2048;
  std::int32_t max_encoder_len = 256;
  std::int32_t max_new_tokens = 64;  // most tokens one request adds in a step (SWA pool sizing)
  std::int32_t full_pages = 0;       // 0: every slot can hold max_kv_len
  std::uint32_t seed = 1;
  float residual_gain = 0.25f;
  bool deterministic = false;

  void validate() const;  // Error names the bad field
  std::int32_t resolved_max_slots() const { return max_slots > 0 ? max_slots : max_batch * 2 + 1; }
  bool has(AttentionKind k) const;
};

// What the step input must hold for this stack (pools present per layer kinds, their geometry).
StepCapacity stack_step_capacity(const AttentionStackConfig& config);

// Grid sizes of one enqueue: a graph of bucket B (and N tokens per request) covers at most
// token_capacity new tokens; the eager path uses max_tokens. Results never depend on it.
struct StepShape {
  std::int32_t bucket = 0;
  std::int32_t token_capacity = 0;
};

// Anything the graph runner can capture: enqueue must be capture-safe (device-side metadata
// only, no sync, no allocation).
class StepProgram {
 public:
  virtual ~StepProgram() = default;
  virtual void enqueue(const StepShape& shape, cudaStream_t stream) = 0;
};

class AttentionStack : public StepProgram {
 public:
  // `input` must have been built from stack_step_capacity(config) and outlive the stack.
  // Allocates every buffer (pools, attention workspaces, activations) on `stream`.
  AttentionStack(const AttentionStackConfig& config, const StepInput& input, cudaStream_t stream);

  void enqueue(const StepShape& shape, cudaStream_t stream) override;

  // Eager, at request arrival: applies `cross_commands` (may be null: e.g. releases and the new
  // request's pages) to the cross pool's table, then writes the request's encoder K/V for every
  // cross layer at positions [0, encoder_len) of `slot`. Waits (host) for its previous staging
  // copy; not for the step path.
  void encode(std::int32_t slot, std::uint32_t request_id, std::int32_t encoder_len,
              const TableCommandBatch* cross_commands, cudaStream_t stream);
  // Eager table update of one pool (outside a step).
  void apply_table(AttentionKind kind, const TableCommandBatch& batch, cudaStream_t stream);

  // residual [max_tokens][num_q_heads * head_dim] float: the step's output.
  const float* residual() const noexcept { return residual_.data(); }
  std::int32_t row_elems() const noexcept { return config_.num_q_heads * config_.head_dim; }
  const AttentionStackConfig& config() const noexcept { return config_; }
  const StepPrep& prep() const noexcept { return prep_; }
  bool has_pool(AttentionKind k) const noexcept { return pools_[static_cast<int>(k)] != nullptr; }
  const KvPool& pool(AttentionKind k) const;
  std::int32_t layer_in_pool(std::int32_t layer) const { return layer_index_[layer]; }

 private:
  static std::array<std::unique_ptr<KvPool>, kNumPoolKinds> make_pools(
      const AttentionStackConfig& c, cudaStream_t stream);
  void layer_input(std::int32_t layer, std::int32_t mode_flags, const StepShape& shape,
                   cudaStream_t stream) const;

  AttentionStackConfig config_;
  std::array<std::unique_ptr<KvPool>, kNumPoolKinds> pools_;
  std::vector<std::int32_t> layer_index_;  // layer -> index inside its pool
  StepPrep prep_;
  std::array<std::unique_ptr<PagedAttention>, kNumPoolKinds> attention_;
  DeviceBuffer<std::int32_t> window_left_;       // [1] sliding layers' window
  DeviceBuffer<std::uint16_t> q_, k_, v_, out_;  // [max_tokens][heads][head_dim]
  DeviceBuffer<float> residual_;                 // [max_tokens][num_q_heads * head_dim]
  // encode(): [max_encoder_len][num_kv_heads][head_dim] K/V, and (count, slot, position) staging.
  DeviceBuffer<std::uint16_t> enc_k_, enc_v_;
  DeviceBuffer<std::int32_t> enc_meta_;  // [1 + 2 * max_encoder_len]: count, slots, positions
  PinnedBuffer<std::int32_t> enc_meta_host_;
};

}  // namespace graphdecode
