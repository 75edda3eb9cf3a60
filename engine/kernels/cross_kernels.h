// Row kernels of the gated cross-attention layers (Mllama's MllamaCrossAttentionDecoderLayer):
// the per-head RMSNorm of q (and of the encoder keys at admission), and the tanh-gated residual
// add fused with the next RMSNorm, masked per token by its request's encoder length.
//
// Same contract as model_kernels.h: graph-safe (the live-row count is read on the device, grids
// sized from capacities, rows past the count exit at once), bf16 in and out, fp32 math, each
// launch function validates its Args (graphdecode::Error names the field) and checks the launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/kernels/model_kernels.h"

namespace graphdecode {

// ---- per-head RMSNorm, in place --------------------------------------------------------------
// For every live row r and head h < num_heads: x[r][h] = bf16(w * bf16(x[r][h] * inv_rms)), the
// rounding of Hugging Face's MllamaTextRMSNorm over head_dim (as the QKV epilogue's Qwen3 norm).
// head_dim 64, 128 or 256; row_stride (elements) lets the heads sit inside a wider row.
struct HeadNormArgs {
  bf16_bits* x = nullptr;                  // [max_rows][row_stride], head h at [h * head_dim]
  const bf16_bits* weight = nullptr;       // [head_dim]
  const std::int32_t* num_rows = nullptr;  // [1] live rows
  std::int32_t max_rows = 0;
  std::int32_t num_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t row_stride = 0;  // 0 = num_heads * head_dim
  float eps = 1e-5f;
};
void head_rmsnorm(const HeadNormArgs& args, cudaStream_t stream);

// ---- gated residual add + RMSNorm --------------------------------------------------------------
// Per live row r, whose request is q = token_request[r]:
//   encoder_len[q] > 0:  residual[r] = bf16(residual[r] + bf16(bf16(tanh(gate)) * x[r]))
//   otherwise:           residual[r] unchanged (the cross block is an exact identity for a
//                        request without encoder states: HF skips the layer for it)
//   then, when y is given, y[r] = rmsnorm(residual[r]) with `weight` (as rmsnorm()).
// The roundings are HF's bf16 ones: tanh of the bf16 gate parameter rounded to bf16, the product
// rounded, the sum rounded. hidden: multiple of 8, at most 8192; pointers 16-byte aligned;
// residual must not alias x or y.
struct GatedResidualNormArgs {
  const bf16_bits* x = nullptr;     // [max_rows][hidden] the gated block's output
  bf16_bits* residual = nullptr;    // [max_rows][hidden]
  const bf16_bits* gate = nullptr;  // [1] the raw gate parameter (tanh applied here)
  const std::int32_t* token_request =
      nullptr;                                // [max_rows] prep: request of each token (< 0: none)
  const std::int32_t* encoder_len = nullptr;  // [max_batch] prep: encoder keys of each request
  // Optional (all three or none): rows whose position is below first_position[their slot] are
  // not gated in either (a cross MLP's rows before the request's first image token).
  const std::int32_t* token_slot = nullptr;      // [max_rows] prep: slot of each token
  const std::int32_t* token_position = nullptr;  // [max_rows] prep: position of each token
  const std::int32_t* first_position = nullptr;  // [max_slots]
  const bf16_bits* weight = nullptr;             // [hidden] the norm's weight (with y)
  bf16_bits* y = nullptr;                        // [max_rows][hidden] or nullptr: residual only
  const std::int32_t* num_rows = nullptr;        // [1] live rows
  std::int32_t max_rows = 0;
  std::int32_t hidden = 0;
  float eps = 1e-5f;
};
void gated_residual_rmsnorm(const GatedResidualNormArgs& args, cudaStream_t stream);

}  // namespace graphdecode
