// The model's weights on the device: one arena (one cudaMalloc), bf16, laid out for the forward.
//
// Per layer the q, k and v projections are concatenated into one fused [q + 2 kv, hidden] matrix
// (rows q, then k, then v) and gate/up into one [2 * inter, hidden] (gate first), so each is one
// GEMM; their biases are fused the same way. A cross-attention layer's `qkv` is q_proj alone
// ([q, hidden]: its k and v project the encoder states, not the step's tokens) and its k/v
// projections are `cross_kv` ([2 kv, hidden], k rows first). Every tensor starts 256-byte
// aligned.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/buffers.h"
#include "engine/model_config.h"
#include "engine/weights.h"

namespace graphdecode {

struct DeviceLayerWeights {
  const std::uint16_t* input_norm = nullptr;  // [hidden]
  const std::uint16_t* qkv = nullptr;         // [q + 2 kv][hidden]; cross layers [q][hidden]
  const std::uint16_t* qkv_bias = nullptr;    // [q + 2 kv] or nullptr
  const std::uint16_t* q_norm = nullptr;      // [head_dim] (Qwen3, cross layers) or nullptr
  const std::uint16_t* k_norm = nullptr;      // [head_dim] (Qwen3, cross layers) or nullptr
  const std::uint16_t* cross_kv = nullptr;    // [2 kv][hidden] (cross layers) or nullptr
  const std::uint16_t* attn_gate = nullptr;   // [1] raw gate, tanh applied (cross) or nullptr
  const std::uint16_t* mlp_gate = nullptr;    // [1] raw gate, tanh applied (cross) or nullptr
  const std::uint16_t* o = nullptr;           // [hidden][q]
  const std::uint16_t* o_bias = nullptr;      // [hidden] or nullptr
  const std::uint16_t* post_norm = nullptr;   // [hidden]
  const std::uint16_t* gate_up = nullptr;     // [2 inter][hidden], gate rows first
  const std::uint16_t* down = nullptr;        // [hidden][inter]
};

// Host-side layout of the arena: element offsets of every tensor (no CUDA; tested on the CPU).
struct WeightArenaLayout {
  static constexpr std::size_t kAlignElems = 128;  // 256 bytes of bf16
  static constexpr std::size_t kNone = ~std::size_t{0};
  struct Layer {
    std::size_t input_norm = kNone, qkv = kNone, qkv_bias = kNone, q_norm = kNone, k_norm = kNone,
                o = kNone, o_bias = kNone, post_norm = kNone, gate_up = kNone, down = kNone,
                cross_kv = kNone, attn_gate = kNone, mlp_gate = kNone;
  };
  std::size_t embed = kNone, final_norm = kNone, lm_head = kNone;  // lm_head == embed when tied
  std::vector<Layer> layers;
  std::size_t total_elems = 0;

  static WeightArenaLayout compute(const ModelConfig& config);
};

// Fills the arena image on the host (bf16 bits, [layout.total_elems], padding zero). Throws Error
// naming a tensor whose shape does not match the config.
std::vector<std::uint16_t> pack_weight_arena(const HostWeights& weights,
                                             const WeightArenaLayout& layout);

class DeviceWeights {
 public:
  // Packs on the host, uploads with one copy, waits for it (start-up only).
  DeviceWeights(const HostWeights& weights, cudaStream_t stream);

  const ModelConfig& config() const noexcept { return config_; }
  const std::uint16_t* embed() const noexcept { return at(layout_.embed); }  // [vocab][hidden]
  const std::uint16_t* final_norm() const noexcept { return at(layout_.final_norm); }  // [hidden]
  const std::uint16_t* lm_head() const noexcept { return at(layout_.lm_head); }  // [vocab][hidden]
  const DeviceLayerWeights& layer(std::int32_t l) const { return layers_.at(l); }
  std::size_t bytes() const noexcept { return arena_.bytes(); }

 private:
  const std::uint16_t* at(std::size_t off) const noexcept {
    return off == WeightArenaLayout::kNone ? nullptr : arena_.data() + off;
  }
  ModelConfig config_;
  WeightArenaLayout layout_;
  DeviceBuffer<std::uint16_t> arena_;
  std::vector<DeviceLayerWeights> layers_;
};

}  // namespace graphdecode
