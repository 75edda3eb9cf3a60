// RoPE inverse frequencies on the host. See rope_freqs.h.
#include "engine/kernels/rope_freqs.h"

#include <cmath>
#include <numbers>

#include "common/error.h"

namespace graphdecode {

std::vector<double> rope_inv_freq(const RopeConfig& c) {
  GD_REQUIRE(c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256, "head_dim", c.head_dim,
             "RoPE supports head dims 64, 128 and 256");
  GD_REQUIRE(std::isfinite(c.theta) && c.theta > 1.0, "theta", c.theta,
             "rope theta must be finite and > 1");
  const RopeScaling& s = c.scaling;
  GD_REQUIRE(s.type == RopeScalingType::kNone || s.type == RopeScalingType::kDefault ||
                 s.type == RopeScalingType::kLinear || s.type == RopeScalingType::kLlama3,
             "scaling.type", static_cast<int>(s.type), "unknown rope scaling type");
  if (s.type == RopeScalingType::kLinear || s.type == RopeScalingType::kLlama3)
    GD_REQUIRE(std::isfinite(s.factor) && s.factor > 0.0, "scaling.factor", s.factor,
               "rope scaling factor must be finite and > 0");
  if (s.type == RopeScalingType::kLlama3) {
    GD_REQUIRE(std::isfinite(s.low_freq_factor) && s.low_freq_factor > 0.0,
               "scaling.low_freq_factor", s.low_freq_factor, "must be finite and > 0");
    GD_REQUIRE(std::isfinite(s.high_freq_factor) && s.high_freq_factor > s.low_freq_factor,
               "scaling.high_freq_factor", s.high_freq_factor,
               "must be finite and greater than low_freq_factor");
    GD_REQUIRE(s.original_max_position_embeddings > 0, "scaling.original_max_position_embeddings",
               s.original_max_position_embeddings, "must be finite and > 0");
  }

  const std::int32_t half = c.head_dim / 2;
  std::vector<double> inv(half);
  for (std::int32_t i = 0; i < half; ++i)
    inv[i] = 1.0 / std::pow(c.theta, static_cast<double>(2 * i) / c.head_dim);

  if (s.type == RopeScalingType::kLinear) {
    for (double& f : inv) f /= s.factor;
  } else if (s.type == RopeScalingType::kLlama3) {
    const auto old_ctx = static_cast<double>(s.original_max_position_embeddings);
    const double low_freq_wavelen = old_ctx / s.low_freq_factor;
    const double high_freq_wavelen = old_ctx / s.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen < high_freq_wavelen) continue;  // high frequency: unchanged
      if (wavelen > low_freq_wavelen) {           // low frequency: divided by factor
        f /= s.factor;
        continue;
      }
      const double smooth =
          (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1.0 - smooth) * f / s.factor + smooth * f;
    }
  }
  return inv;
}

RopeTable::RopeTable(const RopeConfig& config, cudaStream_t stream) {
  const std::vector<double> inv = rope_inv_freq(config);
  std::vector<float> f(inv.begin(), inv.end());
  table_ = DeviceBuffer<float>(f.size());
  table_.upload(f.data(), f.size(), stream);
  // The host vector dies at return: wait for the copy (set-up time, not the step path).
  GD_CUDA(cudaStreamSynchronize(stream));
  head_dim_ = config.head_dim;
}

}  // namespace graphdecode
