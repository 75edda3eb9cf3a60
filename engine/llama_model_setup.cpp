// Host-side setup of LlamaModel: the attention layout of a model config and its RoPE table
// parameters (no CUDA call; tested on the CPU).
#include <algorithm>
#include <string>

#include "common/error.h"
#include "engine/llama_model.h"

namespace graphdecode {

AttentionLayout llama_attention_layout(const ModelConfig& c) {
  c.validate();
  GD_REQUIRE(c.hidden_size % 8 == 0 && c.hidden_size <= 8192, "hidden_size", c.hidden_size,
             "the row kernels need a multiple of 8, at most 8192");
  GD_REQUIRE(c.intermediate_size % 8 == 0, "intermediate_size", c.intermediate_size,
             "the SwiGLU kernel needs a multiple of 8");
  AttentionLayout a;
  a.num_q_heads = c.num_attention_heads;
  a.num_kv_heads = c.num_key_value_heads;
  a.head_dim = c.head_dim;
  a.dtype = DType::kBF16;
  for (std::size_t l = 0; l < c.layers.size(); ++l) {
    const LayerAttention& la = c.layers[l];
    if (la.kind == AttentionKind::kSliding && la.window_left >= 0) {
      GD_REQUIRE(a.window_left < 0 || a.window_left == la.window_left,
                 "layers[" + std::to_string(l) + "].window_left", la.window_left,
                 "sliding layers with different windows are not supported (one sliding pool)");
      a.window_left = la.window_left;
      a.layers.push_back(AttentionKind::kSliding);
    } else {
      // Cross layers attend over the request's encoder keys in the model's cross pool.
      a.layers.push_back(la.kind == AttentionKind::kCross ? AttentionKind::kCross
                                                          : AttentionKind::kFull);
    }
  }
  a.validate();
  return a;
}

RopeConfig llama_rope_config(const ModelConfig& c) {
  RopeConfig r;
  r.head_dim = c.head_dim;
  r.theta = c.rope_theta;
  r.scaling = c.rope_scaling;
  return r;
}

}  // namespace graphdecode
