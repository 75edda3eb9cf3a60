// RoPE inverse frequencies, computed once on the host (float64, rounded to float at the end) and
// kept in a device table that the rope kernel reads.
//
// Default (Hugging Face _compute_default_rope_parameters):
//   inv_freq[i] = 1 / theta^(2i / head_dim), i < head_dim / 2.
// Linear ("linear" rope_type): inv_freq[i] / factor.
// Llama 3 ("llama3" rope_type, _compute_llama3_parameters), with wavelen = 2 pi / inv_freq:
//   wavelen < original_max / high_freq_factor          -> inv_freq (high frequencies unchanged)
//   wavelen > original_max / low_freq_factor           -> inv_freq / factor
//   otherwise, s = (original_max / wavelen - low_freq_factor)
//                  / (high_freq_factor - low_freq_factor)
//                                                      -> (1 - s) * inv_freq / factor + s *
//                                                      inv_freq
// The attention scaling of these types is 1, so cos/sin are not scaled.
#pragma once

#include <cstdint>
#include <vector>

#include "common/buffers.h"
#include "engine/rope_scaling.h"

namespace graphdecode {

struct RopeConfig {
  std::int32_t head_dim = 128;  // 64, 128 or 256
  double theta = 10000.0;
  RopeScaling scaling;
};

// Validates config (graphdecode::Error naming the field) and returns the head_dim / 2 inverse
// frequencies in float64.
std::vector<double> rope_inv_freq(const RopeConfig& config);

// Owner of the device table [head_dim / 2] (float). Built at setup; the table's address is fixed
// for its lifetime, so graphs may read it.
class RopeTable {
 public:
  RopeTable() = default;
  explicit RopeTable(const RopeConfig& config, cudaStream_t stream = nullptr);
  const float* data() const noexcept { return table_.data(); }
  std::int32_t head_dim() const noexcept { return head_dim_; }

 private:
  DeviceBuffer<float> table_;
  std::int32_t head_dim_ = 0;
};

}  // namespace graphdecode
