// RoPE frequency scaling as a Hugging Face config states it (rope_scaling / rope_parameters): the
// one definition the config parser fills and the RoPE table (engine/kernels/rope_freqs.h) reads.
#pragma once

#include <cstdint>

namespace graphdecode {

// kNone (no rope_scaling) and kDefault (rope_type "default") both mean plain RoPE with theta.
enum class RopeScalingType : std::uint8_t { kNone, kDefault, kLinear, kLlama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;                                // linear, llama3
  double low_freq_factor = 1.0;                       // llama3
  double high_freq_factor = 4.0;                      // llama3
  std::int64_t original_max_position_embeddings = 0;  // llama3
};

}  // namespace graphdecode
