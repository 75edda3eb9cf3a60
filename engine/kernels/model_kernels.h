// Elementwise and per-row kernels of the Llama-family model: RMSNorm (optionally fused with the
// residual add), RoPE, SwiGLU, embedding gather and bias add.
//
// Every kernel is graph-safe: the number of live rows is read from device memory (`num_rows`,
// [1]) at run time, the grid is sized from the capacity `max_rows`, blocks of rows >= *num_rows
// exit at once, nothing is allocated and nothing syncs with the host. Rows >= *num_rows are never
// read nor written. Activations and weights are bf16 (bit patterns in std::uint16_t, as everywhere
// in graphdecode's host-facing API); math is fp32.
//
// Each launch function validates its Args (graphdecode::Error naming the bad field), launches on
// `stream` and checks the launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace graphdecode {

using bf16_bits = std::uint16_t;  // one bf16 element (device memory)

// ---- RMSNorm ------------------------------------------------------------------------------------
// Without residual: y = w * bf16(x / sqrt(mean(x^2) + eps)).
// With residual (the Llama "add & norm"): residual = bf16(residual + x); y = norm(residual).
// The two bf16 roundings of the normalized value and of the product with w are the ones of
// Hugging Face's LlamaRMSNorm (normalize in fp32, cast to bf16, multiply by the bf16 weight).
// y may alias x (each block reads its whole row before it writes); residual must not alias x or y.
// hidden: multiple of 8, at most 8192; all pointers 16-byte aligned. One block per row.
// weight is read before the wait for the kernel ahead (a programmatic dependent launch, as a
// GEMM's W): the kernel launched just before must not write it.
struct RmsNormArgs {
  const bf16_bits* x = nullptr;            // [max_rows][hidden]
  bf16_bits* residual = nullptr;           // [max_rows][hidden], optional (nullptr = plain norm)
  const bf16_bits* weight = nullptr;       // [hidden]
  bf16_bits* y = nullptr;                  // [max_rows][hidden]
  const std::int32_t* num_rows = nullptr;  // [1] live rows
  std::int32_t max_rows = 0;
  std::int32_t hidden = 0;
  float eps = 1e-5f;
};
void rmsnorm(const RmsNormArgs& args, cudaStream_t stream);

// ---- RoPE (in place) ----------------------------------------------------------------------------
// Hugging Face rotate_half convention: for i < h = head_dim / 2, with a = inv_freq[i] * pos (fp32)
//   x'[i]     = x[i] * cos(a) - x[i + h] * sin(a)
//   x'[i + h] = x[i + h] * cos(a) + x[i] * sin(a)
// for every q head and k head of the row; pos = positions[row]. inv_freq comes from RopeTable
// (engine/kernels/rope_freqs.h), which applies theta and the Llama-3 / linear scaling.
// head_dim 64, 128 or 256. Row strides let q and k live inside a fused qkv buffer.
struct RopeArgs {
  bf16_bits* q = nullptr;                   // [max_rows][q_row_stride], heads at [h * head_dim]
  bf16_bits* k = nullptr;                   // [max_rows][k_row_stride]
  const std::int32_t* positions = nullptr;  // [max_rows] absolute position of each row's token
  const float* inv_freq = nullptr;          // [head_dim / 2]
  const std::int32_t* num_rows = nullptr;   // [1]
  std::int32_t max_rows = 0;
  std::int32_t num_q_heads = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t q_row_stride = 0;  // elements; 0 = num_q_heads * head_dim
  std::int32_t k_row_stride = 0;  // elements; 0 = num_kv_heads * head_dim
};
void rope(const RopeArgs& args, cudaStream_t stream);

// ---- SwiGLU -------------------------------------------------------------------------------------
// out[r][j] = bf16(bf16(silu(gate[r][j])) * up[r][j]) with gate = gate_up[r][0, inter) and
// up = gate_up[r][inter, 2 * inter) (Hugging Face: act_fn(gate_proj(x)) * up_proj(x), both bf16).
// inter: multiple of 8; pointers 16-byte aligned.
struct SwiGluArgs {
  const bf16_bits* gate_up = nullptr;      // [max_rows][2 * inter], gate first
  bf16_bits* out = nullptr;                // [max_rows][inter]
  const std::int32_t* num_rows = nullptr;  // [1]
  std::int32_t max_rows = 0;
  std::int32_t inter = 0;
};
void swiglu(const SwiGluArgs& args, cudaStream_t stream);

// ---- embedding gather ---------------------------------------------------------------------------
// out[r] = table[token_ids[r]]. A token id outside [0, vocab) reads nothing: its row is written
// with zeros and *error_flag gets bit 0 set (atomicOr). The flag is sticky: the host clears it
// (e.g. cudaMemsetAsync) and reads it whenever it syncs anyway; the engine refuses unknown ids on
// the host before they reach the device, so a set flag means a bug upstream, not bad user input.
// hidden: multiple of 8; pointers 16-byte aligned.
struct EmbeddingArgs {
  const bf16_bits* table = nullptr;         // [vocab][hidden]
  const std::int32_t* token_ids = nullptr;  // [max_rows]
  bf16_bits* out = nullptr;                 // [max_rows][hidden]
  std::int32_t* error_flag = nullptr;       // [1]
  const std::int32_t* num_rows = nullptr;   // [1]
  std::int32_t max_rows = 0;
  std::int32_t vocab = 0;
  std::int32_t hidden = 0;
};
constexpr std::int32_t kEmbeddingBadTokenBit = 1;
// What a set bit of a model's error flag means (the host's error message when it reads one).
// Bit 2 is engine/kernels/stream_mlp.h's kStreamMlpStallBit.
constexpr const char* kModelErrorFlagBits =
    "bit 1: a token id outside the vocabulary reached the embedding; bit 2: an MLP block's grid "
    "barrier timed out (both internal errors)";
void embedding(const EmbeddingArgs& args, cudaStream_t stream);

// ---- bias add -----------------------------------------------------------------------------------
// y[r][j] = bf16(y[r][j] + bias[j]) for j < cols (Qwen2 q/k/v bias after the projection GEMM).
// cols and row_stride: multiples of 8; pointers 16-byte aligned.
struct AddBiasArgs {
  bf16_bits* y = nullptr;                  // [max_rows][row_stride]
  const bf16_bits* bias = nullptr;         // [cols]
  const std::int32_t* num_rows = nullptr;  // [1]
  std::int32_t max_rows = 0;
  std::int32_t cols = 0;
  std::int32_t row_stride = 0;  // elements; 0 = cols
};
void add_bias(const AddBiasArgs& args, cudaStream_t stream);

}  // namespace graphdecode
