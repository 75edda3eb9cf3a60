// The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, and Mllama's text decoder with gated
// cross-attention layers): the forward pass of one step, over the attention context a
// ModelRuntime hands each layer (engine/runtime/model_runtime.h). It owns the weights and
// activations; pools, prep and plans belong to the runtime.
//
// forward(), every size read from the prep metadata on the device:
//   embedding(token ids)
//   per self-attention layer:
//               h = rmsnorm(x [+ residual])          (layer 0: plain norm of the embedding)
//               qkv = h * Wqkv^T [+ bias]            (one fused GEMM)
//               qkv_epilogue: [bias], Qwen3 per-head rmsnorm of q and k, rope(q, k, positions),
//               q out, k and v into the layer's pool; o = paged attention (full or window)
//               x = o * Wo^T [+ bias]; h = rmsnorm(x + residual)
//               x = down(swiglu(h * Wgate_up^T))
//   per cross-attention layer (Mllama, engine/llama_cross.cu):
//               h = rmsnorm(x + residual)            (the residual add of the layer before)
//               q = q_norm(h * Wq^T) per head (no RoPE); o = attention over the request's
//               encoder keys in the cross pool (non-causal; written by encode() at admission)
//               residual += tanh(attn_gate) * (o * Wo^T); h = rmsnorm(residual)
//               x = down(swiglu(h * Wgate_up^T)), added as tanh(mlp_gate) * x by the next norm
//               Both gated adds skip the rows of requests with encoder_len 0: the layer is then an
//               exact identity for them (HF runs no cross layer for a text-only request), in the
//               same graph as requests with encoder states.
//   the step's logits rows (LogitRows: the last row of each request, every row, or a chosen row)
//   gathered; final rmsnorm(x + residual); logits [max_logit_rows][vocab] (float) = lm_head (the
//   embedding when tied).
// bf16 activations, fp32 accumulation. Rows past the live tokens (up to the graph's token
// capacity) compute values nobody reads.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "common/buffers.h"
#include "engine/device_weights.h"
#include "engine/gemm.h"
#include "engine/kernels/rope_freqs.h"
#include "engine/model_config.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/runtime_config.h"
#include "engine/weights.h"
#include "graphs/step_program.h"

namespace graphdecode {

// The attention layout of a Llama-family config (layer kinds incl. cross, heads, window). Throws
// Error when the model cannot run: sliding layers with different windows (one sliding pool), a
// head dim other than 64/128/256, hidden or intermediate sizes the row kernels do not take.
AttentionLayout llama_attention_layout(const ModelConfig& config);
// RoPE table parameters of the config (theta, llama3 / linear scaling).
RopeConfig llama_rope_config(const ModelConfig& config);

// A request's encoder states as encode() reads them: bf16 [length][hidden], row-major.
struct EncoderStatesView {
  const std::uint16_t* data = nullptr;  // host or device memory (on_device)
  std::int32_t length = 0;              // rows (the request's encoder_len)
  bool on_device = false;
  // Positions before it have no image to attend (transformers' cross_attention_mask rows of zeros
  // before the first <|image|> token): their cross layers' MLP output is not added (HF keeps the
  // attention output of those rows, which attend every key). 0: every position counts.
  std::int32_t first_position = 0;
};

class LlamaModel {
 public:
  // Uploads the weights and allocates the activations for `options.max_tokens` rows and
  // `options.max_logit_rows` logits rows; a model with cross layers also its encoder staging for
  // `options.max_encoder_len` rows (which must then be >= 1).
  LlamaModel(const HostWeights& weights, const RuntimeOptions& options, cudaStream_t stream);

  // Cross-attention models, eagerly, outside any step (when a request is admitted): projects the
  // request's encoder states with every cross layer's k/v projections (and k_norm on K) and
  // writes the keys and values into `runtime`'s cross pool at positions [0, length) of `slot`.
  // The cross pool's table must already hold the slot's pages (KvLedger::set_encoder, then the
  // pool's commands applied: apply_cross_table). Stream-ordered, no host sync: a host `data` is
  // copied into start-up staging (pageable memory: the copy is done when this returns), a device
  // `data` is read by the GEMMs on `stream` and must stay valid until they ran. length 0 does
  // nothing. Error (nothing enqueued) for a model without cross layers, a length outside
  // [0, max_encoder_len], a slot outside the pools, a null pointer.
  void encode(const ModelRuntime& runtime, std::int32_t slot, const EncoderStatesView& states,
              cudaStream_t stream);
  // Applies the step ledger's pending commands of `runtime`'s cross pool to its device table now
  // and clears them (they then ride in no step image): what encode() needs first.
  static void apply_cross_table(ModelRuntime& runtime, cudaStream_t stream);

  // Capture-safe (no allocation, no host sync): the step's forward over `runtime`'s attention.
  // `shape` fixes the grids: token_capacity rows through the layers, logit_capacity logits rows.
  void forward(const ModelRuntime& runtime, const StepShape& shape, cudaStream_t stream) {
    forward(runtime, runtime.meta(), shape, nullptr, stream);
  }
  // The forward of one phase of a step whose metadata is `meta` (a block of the prep's layout),
  // writing its logits rows to `logits` ([logit_capacity][vocab] float; nullptr = logits()).
  void forward(const ModelRuntime& runtime, const StepMetaView& meta, const StepShape& shape,
               float* logits, cudaStream_t stream);

  // Start-up only, before the first forward (it allocates): from then on every forward also
  // writes hidden_states(), the final-normed hidden state (what lm_head reads) of EVERY token row,
  // for draft heads that read the target's states (EAGLE). The logits rows are then gathered from
  // it: the same kernel over the same rows, so the logits are bitwise those without it. Error for
  // a model whose last layer is a cross layer.
  void enable_hidden_states(cudaStream_t stream);
  // [max_tokens][hidden] bf16, row t = token row t of the last forward's metadata; nullptr until
  // enable_hidden_states.
  const std::uint16_t* hidden_states() const noexcept { return hidden_.data(); }
  // Start-up only, before the first forward (it allocates): from then on every forward also
  // writes aux_hidden_states(): per token row, block i is the residual stream ENTERING layer
  // points[i] (the embedding for 0; after layer points[i] - 1's MLP residual add), the state
  // SGLang and vLLM capture for EAGLE-3 heads (`hidden_states + residual` before the layer).
  // Written inside the forward, so inside every captured graph; the forward's other outputs are
  // unchanged. Error unless points are strictly increasing layers in [0, num_hidden_layers - 1],
  // or when already enabled with other points.
  void enable_aux_hidden_states(std::span<const std::int32_t> points, cudaStream_t stream);
  // [max_tokens][aux_width()] bf16, row t = token row t of the last forward's metadata; nullptr
  // until enable_aux_hidden_states.
  const std::uint16_t* aux_hidden_states() const noexcept { return aux_.data(); }
  std::int32_t aux_width() const noexcept {
    return static_cast<std::int32_t>(aux_points_.size()) * config_.hidden_size;
  }
  const std::vector<std::int32_t>& aux_points() const noexcept { return aux_points_; }
  // The device weights (a draft head shares the embedding and lm_head).
  const DeviceWeights& weights() const noexcept { return weights_; }

  // [max_logit_rows][vocab] float: row i = logits of the step's logits row i (LogitRows).
  const float* logits() const noexcept { return logits_.data(); }
  std::int32_t vocab() const noexcept { return config_.vocab_size; }
  std::int32_t max_logit_rows() const noexcept { return max_logit_rows_; }
  // [1] sticky device flag: bit kEmbeddingBadTokenBit set when a token id was out of range,
  // kStreamMlpStallBit when an MLP block's grid barrier timed out (both internal errors).
  std::int32_t* bad_token_flag() const noexcept { return bad_token_.data(); }
  const ModelConfig& config() const noexcept { return config_; }
  // True when a step of `rows` rows folds each layer's input RMSNorm (layers 1..) into the GEMVs
  // around it (StreamGemvFusion, engine/kernels/stream_gemv.h): every down and qkv projection takes
  // the stream GEMV, the model has no cross layers, and GRAPHDECODE_FUSE_NORM is not 0.
  bool fuses_input_norm(std::int32_t rows) const;
  // True when a step of `rows` rows also runs each MLP block in one grid (Gemm::fuses_mlp,
  // engine/kernels/stream_mlp.h; the o projection then adds its output to the residual and leaves
  // the squares the block's norm reads): fuses_input_norm, every o projection takes the stream
  // GEMV without a bias, and GRAPHDECODE_STREAM_MLP is not 0 (default: rows <= 2, where it was
  // measured ahead; all: up to 8).
  bool fuses_mlp_block(std::int32_t rows) const;
  // True when a step of `rows` token rows folds each layer's two RMSNorms into the warpgroup GEMMs
  // around them (WgmmaNormFusion, engine/kernels/wgmma_gemm.h; rows 9-64 where every layer's qkv,
  // o, gate_up and down take that GEMM): the o and down projections add to residual_ and leave
  // normed_ = residual * the next norm's weight with sum_sq_; qkv and gate_up scale their rows by
  // the inverse RMS. Both norms or neither: the 8B's post-attention norm alone (its down runs on
  // cuBLAS at 33-64 rows) made its step 0.5-0.7% slower at B = 48-64 (bench/NOTES.md 141). Not
  // where fuses_input_norm holds, not on cross models, not with an o bias or a hidden past
  // kWgmmaRowScaleMaxK; GRAPHDECODE_WGMMA_NORM=0 when the model was made: off (A/B runs).
  bool fuses_wgmma_norm(std::int32_t rows) const;
  const AttentionLayout& layout() const noexcept { return layout_; }

 private:
  // fuses_mlp_block's own conditions, past fuses_input_norm (forward has that one already).
  bool mlp_block_fits(std::int32_t rows) const;
  // fuses_wgmma_norm's own conditions, past fuses_input_norm (forward has that one already).
  bool wgmma_norm_fits(std::int32_t rows) const;
  // norm_in: x = the residual stream, normed inside the qkv GEMV (fuses_input_norm).
  // o_adds: the o projection adds its output to residual_ and leaves sum_sq_ (fuses_mlp_block).
  // wgmma_fold (fuses_wgmma_norm): the o projection adds to residual_ and leaves normed_ and
  // sum_sq_ for the post-attention norm; past layer 0 the qkv GEMM scales its rows (normed_ is
  // then the residual times this layer's input norm weight, from the down projection before).
  void attention_block(const ModelRuntime& rt, const StepMetaView& meta, std::int32_t layer,
                       std::int32_t rows, bool norm_in, bool o_adds, bool wgmma_fold,
                       cudaStream_t stream);
  // Cross layers (engine/llama_cross.cu): q projection, per-head q norm, attention over the
  // encoder keys, o projection into proj_.
  void cross_attention_block(const ModelRuntime& rt, const StepMetaView& meta, std::int32_t layer,
                             std::int32_t rows, cudaStream_t stream);
  // residual += proj_ (tanh(gate) * proj_ on rows with encoder keys when `gate`; for a cross
  // MLP's output (`mlp`) only on rows at or past their slot's first_position); normed_ =
  // rmsnorm(residual) with `w`; `w` nullptr: the residual update alone.
  void add_norm(const StepMetaView& meta, const std::uint16_t* gate, const std::uint16_t* w,
                std::int32_t rows, bool mlp, cudaStream_t stream);
  // add_residual: the down projection adds its output to residual_ and leaves sum_sq_ for the
  // next layer's qkv GEMV (fuses_input_norm). one_grid: the block in one kernel
  // (fuses_mlp_block; the o projection added its output to residual_ already). wgmma_fold
  // (fuses_wgmma_norm): no add + norm kernel, gate_up scales its rows, and with add_residual the
  // down projection leaves normed_ and sum_sq_ for the next layer's input norm.
  void mlp_block(const StepMetaView& meta, std::int32_t layer, std::int32_t rows, bool add_residual,
                 bool one_grid, bool wgmma_fold, cudaStream_t stream);
  // WgmmaNormFusion's two forms over residual_, normed_ and sum_sq_ (fuses_wgmma_norm): the o or
  // down projection's epilogue with the next norm's weight, and the row scale of a GEMM over k.
  WgmmaNormFusion residual_epilogue(const std::uint16_t* next_norm_weight);
  WgmmaNormFusion row_scale(std::int32_t k) const;
  void norm(const std::uint16_t* x, std::uint16_t* residual, const std::uint16_t* w,
            std::uint16_t* y, const std::int32_t* num_rows, std::int32_t max_rows,
            std::int32_t hidden, cudaStream_t stream) const;
  bool is_cross(std::int32_t layer) const noexcept {
    return layout_.layers[static_cast<std::size_t>(layer)] == AttentionKind::kCross;
  }
  void allocate_encoder_staging(std::int32_t max_slots, cudaStream_t stream);
  // aux_ block of every capture point equal to `layer`: the residual stream entering it.
  void capture_aux(const StepMetaView& meta, std::int32_t layer, std::int32_t rows,
                   cudaStream_t stream);

  ModelConfig config_;
  AttentionLayout layout_;
  std::int32_t max_tokens_ = 0;
  std::int32_t max_logit_rows_ = 0;
  std::int32_t max_encoder_len_ = 0;  // cross models: longest encoder input (encode staging)
  DeviceWeights weights_;
  RopeTable rope_;
  Gemm gemm_;
  DeviceBuffer<std::int32_t> bad_token_;  // [1]
  // Activations, [max_tokens] rows unless noted (bf16).
  DeviceBuffer<std::uint16_t> residual_;  // [hidden]
  DeviceBuffer<std::uint16_t> normed_;    // [hidden]
  DeviceBuffer<std::uint16_t> qkv_;       // [q + 2 kv]
  DeviceBuffer<std::uint16_t> q_;         // [q_heads][head_dim]: attention's q (rope applied)
  DeviceBuffer<std::uint16_t> attn_;      // [q]
  DeviceBuffer<std::uint16_t> proj_;      // [hidden] o_proj / down_proj output
  DeviceBuffer<std::uint16_t> gate_up_;   // [2 inter]
  DeviceBuffer<std::uint16_t> act_;       // [inter]
  // [stream_gemv_parts(hidden)][kSkinnyMaxRows] float: the down projection's per-CTA sums of
  // squares of the residual rows, read by the next qkv GEMV (fuses_input_norm); with
  // fuses_mlp_block also the o projection's, read by the MLP block's norm. Under
  // fuses_wgmma_norm: [hidden / 128][rows] (at most 64 rows), the o and down projections' tiles'.
  DeviceBuffer<float> sum_sq_;
  // [layers][kStreamMlpSyncWords] each layer's MLP block's grid words (zeroed once)
  DeviceBuffer<std::uint32_t> mlp_sync_;
  // GRAPHDECODE_STREAM_MLP when the model was made: 0 = off, all = up to 8 rows; otherwise on up to
  // kStreamMlpMaxRows rows, where it was measured ahead (bench/NOTES.md 115).
  static constexpr std::int32_t kStreamMlpMaxRows = 2;
  bool stream_mlp_ = true;
  std::int32_t stream_mlp_max_rows_ = kStreamMlpMaxRows;
  // The block as a cooperative launch (StreamMlpArgs::cooperative): the driver places every CTA
  // at once, which its grid barrier needs even when another stream or process holds SMs. It costs
  // ~1% of the 1B step at B = 1-2 against the plain PDL launch (bench_decode, H200, t137: B = 1
  // L = 1024 987.2 against 978.7 us), paid for that guarantee. GRAPHDECODE_STREAM_MLP_COOP=0: the
  // plain launch (one engine alone on the GPU; A/B runs).
  bool stream_mlp_cooperative_ = true;
  // GRAPHDECODE_STREAM_MLP_FMA=1: its consumers on CUDA cores at rows <= 2 (StreamMlpArgs::fma):
  // -1.7% for the block at rows 1, +12% at rows 2 (probe_stream_mlp_trace, t136).
  static constexpr std::int32_t kStreamMlpFmaMaxRows = 2;
  bool stream_mlp_fma_ = false;
  bool fuse_norm_ = true;   // GRAPHDECODE_FUSE_NORM=0 when the model was made: off (A/B runs)
  bool wgmma_norm_ = true;  // GRAPHDECODE_WGMMA_NORM=0 when the model was made: off (A/B runs)
  // The SwiGLU in the gate_up GEMM's epilogue where the warpgroup GEMM runs it (Gemm::
  // fuses_swiglu); GRAPHDECODE_FUSE_SWIGLU=0 when the model was made: off (A/B runs).
  bool fuse_swiglu_ = true;
  // [max_logit_rows][hidden]: the logits rows' x, residual and final norm.
  DeviceBuffer<std::uint16_t> logit_x_, logit_res_, logit_normed_;
  DeviceBuffer<float> logits_;          // [max_logit_rows][vocab]
  DeviceBuffer<std::uint16_t> hidden_;  // [max_tokens][hidden] when enabled (hidden_states())
  // [max_tokens][points][hidden] when enabled (aux_hidden_states()), block i = aux_points_[i].
  DeviceBuffer<std::uint16_t> aux_;
  std::vector<std::int32_t> aux_points_;  // ascending capture layers
  // encode() staging (cross models only): host states copied here, each cross layer's K and V,
  // and write_new_kv's destinations (count, then the slot per row, then positions 0..n-1).
  DeviceBuffer<std::uint16_t> enc_states_;  // [max_encoder_len][hidden]
  DeviceBuffer<std::uint16_t> enc_k_;       // [max_encoder_len][kv]
  DeviceBuffer<std::uint16_t> enc_v_;       // [max_encoder_len][kv]
  DeviceBuffer<std::int32_t> enc_meta_;     // [1 + 2 * max_encoder_len]
  DeviceBuffer<std::int32_t> mlp_from_;     // [max_slots] per slot: first_position of its states
};

}  // namespace graphdecode
