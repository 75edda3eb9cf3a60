// Host-side setup of LlamaModel: the attention-stack view of a model config and its RoPE table
// parameters (no CUDA call; tested on the CPU).
#include <algorithm>

#include "common/error.h"
#include "engine/llama_model.h"

namespace graphdecode {

AttentionStackConfig llama_stack_config(const ModelConfig& c, const LlamaModelOptions& o) {
  c.validate();
  GD_REQUIRE(o.max_batch >= 1, "max_batch", o.max_batch, "must be positive");
  GD_REQUIRE(o.max_tokens >= o.max_batch, "max_tokens", o.max_tokens, "must be >= max_batch");
  GD_REQUIRE(o.max_kv_len >= 1, "max_kv_len", o.max_kv_len, "must be positive");
  GD_REQUIRE(c.hidden_size % 8 == 0 && c.hidden_size <= 8192, "hidden_size", c.hidden_size,
             "the row kernels need a multiple of 8, at most 8192");
  GD_REQUIRE(c.intermediate_size % 8 == 0, "intermediate_size", c.intermediate_size,
             "the SwiGLU kernel needs a multiple of 8");
  AttentionStackConfig s;
  s.num_q_heads = c.num_attention_heads;
  s.num_kv_heads = c.num_key_value_heads;
  s.head_dim = c.head_dim;
  s.dtype = DType::kBF16;
  s.page_size = o.page_size;
  s.max_batch = o.max_batch;
  s.max_tokens = o.max_tokens;
  s.max_slots = o.max_slots;
  s.full_pages = o.full_pages;
  s.max_kv_len = o.max_kv_len;
  s.max_encoder_len = 0;
  s.max_new_tokens = o.max_new_tokens > 0 ? o.max_new_tokens : o.max_tokens;
  s.deterministic = o.deterministic;
  s.window_left = -1;
  for (std::size_t l = 0; l < c.layers.size(); ++l) {
    const LayerAttention& a = c.layers[l];
    if (a.kind == AttentionKind::kSliding && a.window_left >= 0) {
      GD_REQUIRE(s.window_left < 0 || s.window_left == a.window_left,
                 "layers[" + std::to_string(l) + "].window_left", a.window_left,
                 "sliding layers with different windows are not supported (one SWA pool)");
      s.window_left = a.window_left;
      s.layers.push_back(AttentionKind::kSliding);
    } else {
      s.layers.push_back(AttentionKind::kFull);
    }
  }
  if (s.window_left < 0) s.window_left = 0;  // unused: no sliding layer
  s.validate();
  return s;
}

StepCapacity llama_step_capacity(const ModelConfig& c, const LlamaModelOptions& o) {
  return stack_step_capacity(llama_stack_config(c, o));
}

RopeConfig llama_rope_config(const ModelConfig& c) {
  RopeConfig r;
  r.head_dim = c.head_dim;
  r.theta = c.rope_theta;
  r.scaling = c.rope_scaling;
  return r;
}

}  // namespace graphdecode
