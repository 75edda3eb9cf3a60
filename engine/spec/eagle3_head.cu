// The EAGLE-3 forward of EagleHead (engine/spec/eagle_head.h; the weights' definition and its
// sources in engine/spec/eagle_weights.h). Shares the attention, MLP and output-row steps with
// EAGLE-1/2 (eagle_head.cu); differs in what enters the layer and what leaves it.
#include <cuda_bf16.h>

#include <algorithm>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/kernels/model_kernels.h"
#include "engine/spec/eagle_head.h"
#include "engine/spec/eagle_head_kernels.cuh"

namespace graphdecode {

void EagleHead::forward3(const ModelRuntime& rt, const StepMetaView& m,
                         const std::int32_t* token_ids, const HiddenInput& in, std::int32_t rows,
                         std::int32_t logit_rows, float* logits, cudaStream_t stream) {
  const ModelConfig& c = config_.layer;
  const std::int32_t* num_tokens = m.scalars + StepMetaLayout::kNumTokens;
  const std::int32_t h = c.hidden_size, s = config_.state_width();
  const float eps = static_cast<float>(c.rms_norm_eps);

  embed(token_ids, num_tokens, rows, stream);
  // x (residual_): the head's own previous output as it is (draft decodes), or fc over the
  // target's three captured states (the extend over committed tokens, a prefill chunk).
  if (in.rows != nullptr) {
    GatherParams g{in, reinterpret_cast<uint4*>(residual_.data()), num_tokens, rows, h / 8};
    gather_states_kernel<<<blocks_for(static_cast<std::int64_t>(rows) * (h / 8)), kThreads, 0,
                           stream>>>(g);
    GD_CHECK_LAUNCH();
  } else {
    GatherParams g{in, reinterpret_cast<uint4*>(states_.data()), num_tokens, rows, s / 8};
    gather_states_kernel<<<blocks_for(static_cast<std::int64_t>(rows) * (s / 8)), kThreads, 0,
                           stream>>>(g);
    GD_CHECK_LAUNCH();
    gemm_.run({states_.data(), fc_, residual_.data(), rows, s, h, GemmOut::kBF16}, stream);
    if (fc_bias_ != nullptr) add_bias({residual_.data(), fc_bias_, num_tokens, rows, h, 0}, stream);
  }
  // cat = [input_layernorm(embedding) | hidden_norm(x)]; x itself stays the residual.
  RmsNormArgs n;
  n.num_rows = num_tokens;
  n.max_rows = rows;
  n.hidden = h;
  n.eps = eps;
  n.x = emb_.data();
  n.weight = input_norm_;
  n.y = normed_.data();
  rmsnorm(n, stream);
  n.x = residual_.data();
  n.weight = hidden_norm_;
  n.y = hid_normed_.data();
  rmsnorm(n, stream);
  const HiddenInput normed_x{hid_normed_.data(), nullptr, nullptr, nullptr};
  ConcatParams cp{reinterpret_cast<const uint4*>(normed_.data()),
                  normed_x,
                  reinterpret_cast<uint4*>(cat_.data()),
                  num_tokens,
                  rows,
                  h / 8};
  concat_kernel<<<blocks_for(static_cast<std::int64_t>(rows) * (h / 8)), kThreads, 0, stream>>>(cp);
  GD_CHECK_LAUNCH();
  attention(rt, m, cat_.data(), 2 * h, rows, stream);
  mlp(m, rows, stream);
  if (logit_rows == 0) return;
  output_rows(m, logit_rows, stream);  // out_: y before the final norm, the next input
  const std::int32_t* num_logit_rows = m.scalars + StepMetaLayout::kNumLogitRows;
  n.x = out_.data();
  n.weight = final_norm_;
  n.y = out_normed_.data();
  n.num_rows = num_logit_rows;
  n.max_rows = logit_rows;
  rmsnorm(n, stream);
  const std::int32_t dv = config_.draft_vocab_size;
  gemm_.run(
      {out_normed_.data(), draft_head_, draft_logits_.data(), logit_rows, h, dv, GemmOut::kF32},
      stream);
  ScatterParams sp{draft_logits_.data(),
                   target_to_draft_.data(),
                   logits,
                   num_logit_rows,
                   logit_rows,
                   c.vocab_size,
                   dv};
  const dim3 grid(blocks_for(c.vocab_size), static_cast<unsigned>(logit_rows));
  scatter_draft_kernel<<<grid, kThreads, 0, stream>>>(sp);
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
