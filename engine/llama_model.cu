#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/kernels/model_kernels.h"
#include "engine/kernels/qkv_epilogue.h"
#include "engine/llama_model.h"

namespace graphdecode {
namespace {

constexpr int kThreads = 256;
// Where the warpgroup GEMM (Gemm::uses_wgmma) and its SwiGLU epilogue run, from the decode step on
// an H200 (bench/NOTES.md 103, 104, 132). The 1B shape: at every row count it takes (9-64).
// Models wider than kWgmmaNarrowHidden (the 8B shape, t101: B = 16 5281.6 -> 5554.1 us, B = 64
// 7325.5 -> 7208.7): from kWgmmaWideMinRows rows, and their gate_up (with the SwiGLU epilogue) and
// lm_head, the outputs of 2 x intermediate or more, from kWgmmaWideOutMinRows (8B step, graph us,
// B = 32 L = 1024 / 4096: -0.9% / -0.7% on one host, -0.2% / -0.4% on another; B = 16 +4.6%;
// rows 17-31 not measured). The SwiGLU epilogue from kFuseSwigluMinRows rows (1B, t101, two
// rounds: B = 16 L = 1024 +0.7%, B = 32 -0.0 / -1.0%, B = 64 -1.4 / -0.7% at L = 1024 / 4096).
constexpr std::int32_t kWgmmaNarrowHidden = 2048;
constexpr std::int32_t kWgmmaWideMinRows = 33;
constexpr std::int32_t kWgmmaWideOutMinRows = 32;
constexpr std::int32_t kFuseSwigluMinRows = 17;

unsigned blocks_for(std::int64_t items) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, (items + kThreads - 1) / kThreads));
}

// Copies the step's logits rows (token row logit_row[i] of x and residual) into rows i of
// out_x and out_res (x nullptr: residual only).
struct GatherParams {
  const uint4* x;
  const uint4* res;
  uint4* out_x;
  uint4* out_res;
  const std::int32_t* num_rows;   // [1] prep: logits rows of the step
  const std::int32_t* logit_row;  // [max_logit_rows] prep: token row of each
  std::int32_t max_rows, row_vecs;
};

__global__ void __launch_bounds__(kThreads)
    gather_rows_kernel(const __grid_constant__ GatherParams p) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const std::int32_t n = min(*p.num_rows, p.max_rows);
  if (i >= static_cast<std::int64_t>(n) * p.row_vecs) return;
  const auto r = static_cast<std::int32_t>(i / p.row_vecs);
  const auto e = static_cast<std::int32_t>(i - static_cast<std::int64_t>(r) * p.row_vecs);
  const std::int64_t src = static_cast<std::int64_t>(p.logit_row[r]) * p.row_vecs + e;
  if (p.x != nullptr) p.out_x[i] = p.x[src];
  p.out_res[i] = p.res[src];
}

// dst[t][offset + e] = src[t][e] for the live rows (16-byte vectors): one capture point's block
// of the aux states.
struct CaptureParams {
  const uint4* src;              // [max_rows][row_vecs]
  uint4* dst;                    // [max_rows][dst_vecs]
  const std::int32_t* num_rows;  // [1]
  std::int32_t max_rows, row_vecs, dst_vecs, offset;
};

__global__ void __launch_bounds__(kThreads)
    capture_rows_kernel(const __grid_constant__ CaptureParams p) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const std::int32_t n = min(*p.num_rows, p.max_rows);
  if (i >= static_cast<std::int64_t>(n) * p.row_vecs) return;
  const auto t = static_cast<std::int32_t>(i / p.row_vecs);
  const auto e = static_cast<std::int32_t>(i - static_cast<std::int64_t>(t) * p.row_vecs);
  p.dst[static_cast<std::int64_t>(t) * p.dst_vecs + p.offset + e] = p.src[i];
}

}  // namespace

LlamaModel::LlamaModel(const HostWeights& weights, const RuntimeOptions& options,
                       cudaStream_t stream)
    : config_(weights.config),
      layout_(llama_attention_layout(weights.config)),
      max_tokens_(options.max_tokens),
      max_logit_rows_(options.max_logit_rows > 0 ? options.max_logit_rows : options.max_batch),
      max_encoder_len_(options.max_encoder_len),
      weights_(weights, stream),
      rope_(llama_rope_config(weights.config), stream) {
  options.validate();
  bad_token_ = DeviceBuffer<std::int32_t>(1);
  bad_token_.fill_bytes(0, stream);

  const auto t = static_cast<std::size_t>(max_tokens_);
  const auto b = static_cast<std::size_t>(max_logit_rows_);
  const auto h = static_cast<std::size_t>(config_.hidden_size);
  const auto q = static_cast<std::size_t>(config_.q_size());
  const auto kv = static_cast<std::size_t>(config_.kv_size());
  const auto inter = static_cast<std::size_t>(config_.intermediate_size);
  residual_ = DeviceBuffer<std::uint16_t>(t * h);
  normed_ = DeviceBuffer<std::uint16_t>(t * h);
  qkv_ = DeviceBuffer<std::uint16_t>(t * (q + 2 * kv));
  q_ = DeviceBuffer<std::uint16_t>(t * q);
  attn_ = DeviceBuffer<std::uint16_t>(t * q);
  proj_ = DeviceBuffer<std::uint16_t>(t * h);
  gate_up_ = DeviceBuffer<std::uint16_t>(t * 2 * inter);
  act_ = DeviceBuffer<std::uint16_t>(t * inter);
  sum_sq_ = DeviceBuffer<float>(std::max(
      static_cast<std::size_t>(gemm_.stream_gemv_parts(config_.hidden_size)) * kSkinnyMaxRows,
      h / kWgmmaNormPart * std::min<std::size_t>(t, kWgmmaNormMaxRows)));
  if (const char* fuse = std::getenv("GRAPHDECODE_FUSE_NORM"))
    fuse_norm_ = std::strcmp(fuse, "0") != 0;
  if (const char* fold = std::getenv("GRAPHDECODE_WGMMA_NORM"))
    wgmma_norm_ = std::strcmp(fold, "0") != 0;
  if (const char* fuse = std::getenv("GRAPHDECODE_FUSE_SWIGLU"))
    fuse_swiglu_ = std::strcmp(fuse, "0") != 0;
  if (const char* mlp = std::getenv("GRAPHDECODE_STREAM_MLP")) {
    stream_mlp_ = std::strcmp(mlp, "0") != 0;
    if (std::strcmp(mlp, "all") == 0) stream_mlp_max_rows_ = kSkinnyMaxRows;
  }
  if (const char* coop = std::getenv("GRAPHDECODE_STREAM_MLP_COOP"))
    stream_mlp_cooperative_ = std::strcmp(coop, "0") != 0;
  if (const char* fma = std::getenv("GRAPHDECODE_STREAM_MLP_FMA"))
    stream_mlp_fma_ = std::strcmp(fma, "1") == 0;
  mlp_sync_ = DeviceBuffer<std::uint32_t>(static_cast<std::size_t>(config_.num_hidden_layers) *
                                          kStreamMlpSyncWords);
  mlp_sync_.fill_bytes(0, stream);
  // The warpgroup GEMM on wide models from kWgmmaWideMinRows rows, their widest outputs from
  // kWgmmaWideOutMinRows (above); GRAPHDECODE_WGMMA_GEMM=on or GRAPHDECODE_WGMMA_AUTO keep Gemm's
  // bounds.
  if (config_.hidden_size > kWgmmaNarrowHidden && !gemm_.wgmma_routing_from_env())
    gemm_.set_wgmma_min_rows(kWgmmaWideMinRows, kWgmmaWideOutMinRows,
                             2 * config_.intermediate_size);
  logit_x_ = DeviceBuffer<std::uint16_t>(b * h);
  logit_res_ = DeviceBuffer<std::uint16_t>(b * h);
  logit_normed_ = DeviceBuffer<std::uint16_t>(b * h);
  logits_ = DeviceBuffer<float>(b * static_cast<std::size_t>(config_.vocab_size));
  // Rows past the live ones are computed from whatever these hold: start from zeros.
  for (DeviceBuffer<std::uint16_t>* buf :
       {&residual_, &normed_, &qkv_, &q_, &attn_, &proj_, &gate_up_, &act_, &logit_x_, &logit_res_,
        &logit_normed_})
    buf->fill_bytes(0, stream);
  logits_.fill_bytes(0, stream);
  sum_sq_.fill_bytes(0, stream);
  GD_CUDA(cudaStreamSynchronize(stream));
  allocate_encoder_staging(options.resolved_max_slots(), stream);
}

void LlamaModel::enable_hidden_states(cudaStream_t stream) {
  GD_REQUIRE(!is_cross(static_cast<std::int32_t>(layout_.layers.size()) - 1), "layers",
             "cross last", "hidden states are captured after a self-attention layer");
  if (hidden_.size() > 0) return;
  hidden_ = DeviceBuffer<std::uint16_t>(static_cast<std::size_t>(max_tokens_) *
                                        static_cast<std::size_t>(config_.hidden_size));
  hidden_.fill_bytes(0, stream);
  GD_CUDA(cudaStreamSynchronize(stream));
}

void LlamaModel::enable_aux_hidden_states(std::span<const std::int32_t> points,
                                          cudaStream_t stream) {
  const std::vector<std::int32_t> want(points.begin(), points.end());
  GD_REQUIRE(!want.empty(), "aux_points", "none", "at least one capture layer");
  for (std::size_t i = 0; i < want.size(); ++i)
    GD_REQUIRE(
        want[i] >= 0 && want[i] < config_.num_hidden_layers && (i == 0 || want[i] > want[i - 1]),
        "aux_points[" + std::to_string(i) + "]", want[i],
        "capture layers are strictly increasing layers of the model (" +
            std::to_string(config_.num_hidden_layers) + ")");
  if (aux_.size() > 0) {
    GD_REQUIRE(want == aux_points_, "aux_points", "other layers",
               "the model already captures other layers");
    return;
  }
  aux_points_ = want;
  aux_ = DeviceBuffer<std::uint16_t>(static_cast<std::size_t>(max_tokens_) *
                                     static_cast<std::size_t>(aux_width()));
  aux_.fill_bytes(0, stream);
  GD_CUDA(cudaStreamSynchronize(stream));
}

void LlamaModel::capture_aux(const StepMetaView& m, std::int32_t layer, std::int32_t rows,
                             cudaStream_t stream) {
  const std::int32_t vecs = config_.hidden_size / 8;
  for (std::size_t i = 0; i < aux_points_.size(); ++i) {
    if (aux_points_[i] != layer) continue;
    CaptureParams p{reinterpret_cast<const uint4*>(residual_.data()),
                    reinterpret_cast<uint4*>(aux_.data()),
                    m.scalars + StepMetaLayout::kNumTokens,
                    rows,
                    vecs,
                    static_cast<std::int32_t>(aux_points_.size()) * vecs,
                    static_cast<std::int32_t>(i) * vecs};
    capture_rows_kernel<<<blocks_for(static_cast<std::int64_t>(rows) * vecs), kThreads, 0,
                          stream>>>(p);
    GD_CHECK_LAUNCH();
  }
}

void LlamaModel::norm(const std::uint16_t* x, std::uint16_t* residual, const std::uint16_t* w,
                      std::uint16_t* y, const std::int32_t* num_rows, std::int32_t max_rows,
                      std::int32_t hidden, cudaStream_t stream) const {
  RmsNormArgs a;
  a.x = x;
  a.residual = residual;
  a.weight = w;
  a.y = y;
  a.num_rows = num_rows;
  a.max_rows = max_rows;
  a.hidden = hidden;
  a.eps = static_cast<float>(config_.rms_norm_eps);
  rmsnorm(a, stream);
}

bool LlamaModel::fuses_input_norm(std::int32_t rows) const {
  if (!fuse_norm_ || config_.any_cross()) return false;
  const std::int32_t h = config_.hidden_size;
  const std::int32_t qkv_cols = config_.q_size() + 2 * config_.kv_size();
  for (std::int32_t l = 0; l < config_.num_hidden_layers; ++l) {
    const DeviceLayerWeights& w = weights_.layer(l);
    if (!gemm_.fuses_norm(
            {residual_.data(), w.qkv, qkv_.data(), rows, h, qkv_cols, GemmOut::kBF16}) ||
        !gemm_.fuses_norm({act_.data(), w.down, proj_.data(), rows, config_.intermediate_size, h,
                           GemmOut::kBF16}))
      return false;
  }
  return true;
}

WgmmaNormFusion LlamaModel::residual_epilogue(const std::uint16_t* next_norm_weight) {
  WgmmaNormFusion f;
  f.residual = residual_.data();
  f.norm_weight = next_norm_weight;
  f.weighted = normed_.data();
  f.sum_sq_out = sum_sq_.data();
  return f;
}

WgmmaNormFusion LlamaModel::row_scale(std::int32_t k) const {
  WgmmaNormFusion f;
  f.sum_sq_in = sum_sq_.data();
  f.parts = k / kWgmmaNormPart;
  f.eps = static_cast<float>(config_.rms_norm_eps);
  return f;
}

bool LlamaModel::fuses_wgmma_norm(std::int32_t rows) const {
  return !fuses_input_norm(rows) && wgmma_norm_fits(rows);
}

bool LlamaModel::wgmma_norm_fits(std::int32_t rows) const {
  if (!wgmma_norm_ || !fuse_norm_ || config_.any_cross()) return false;
  const std::int32_t h = config_.hidden_size, inter = config_.intermediate_size;
  if (h > kWgmmaRowScaleMaxK) return false;  // qkv and gate_up scale rows over k = hidden
  const std::int32_t qkv_cols = config_.q_size() + 2 * config_.kv_size();
  for (std::int32_t l = 0; l < config_.num_hidden_layers; ++l) {
    const DeviceLayerWeights& w = weights_.layer(l);
    if (w.o_bias != nullptr ||
        !gemm_.fuses_wgmma_norm(
            {normed_.data(), w.qkv, qkv_.data(), rows, h, qkv_cols, GemmOut::kBF16}) ||
        !gemm_.fuses_wgmma_norm(
            {attn_.data(), w.o, proj_.data(), rows, config_.q_size(), h, GemmOut::kBF16}) ||
        !gemm_.fuses_wgmma_norm(
            {normed_.data(), w.gate_up, gate_up_.data(), rows, h, 2 * inter, GemmOut::kBF16}) ||
        !gemm_.fuses_wgmma_norm(
            {act_.data(), w.down, proj_.data(), rows, inter, h, GemmOut::kBF16}))
      return false;
  }
  return true;
}

bool LlamaModel::fuses_mlp_block(std::int32_t rows) const {
  return fuses_input_norm(rows) && mlp_block_fits(rows);
}

bool LlamaModel::mlp_block_fits(std::int32_t rows) const {
  if (!stream_mlp_ || rows > stream_mlp_max_rows_) return false;
  const std::int32_t h = config_.hidden_size;
  if (!gemm_.fuses_mlp(rows, h, config_.intermediate_size)) return false;
  for (std::int32_t l = 0; l < config_.num_hidden_layers; ++l) {
    const DeviceLayerWeights& w = weights_.layer(l);
    if (w.o_bias != nullptr || !gemm_.fuses_norm({attn_.data(), w.o, proj_.data(), rows,
                                                  config_.q_size(), h, GemmOut::kBF16}))
      return false;
  }
  return true;
}

void LlamaModel::attention_block(const ModelRuntime& rt, const StepMetaView& m, std::int32_t l,
                                 std::int32_t rows, bool norm_in, bool o_adds, bool wgmma_fold,
                                 cudaStream_t stream) {
  const DeviceLayerWeights& w = weights_.layer(l);
  const std::int32_t* num_tokens = m.scalars + StepMetaLayout::kNumTokens;
  const std::int32_t hq = config_.num_attention_heads, hkv = config_.num_key_value_heads;
  const std::int32_t d = config_.head_dim, h = config_.hidden_size;
  const std::int32_t qkv_cols = config_.q_size() + 2 * config_.kv_size();

  if (norm_in) {  // x = residual_, normed by the GEMV from the last down projection's squares
    StreamGemvFusion f;
    f.norm_weight = w.input_norm;
    f.sum_sq_in = sum_sq_.data();
    f.parts = gemm_.stream_gemv_parts(h);
    f.eps = static_cast<float>(config_.rms_norm_eps);
    gemm_.run_fused({residual_.data(), w.qkv, qkv_.data(), rows, h, qkv_cols, GemmOut::kBF16}, f,
                    stream);
  } else if (wgmma_fold && l > 0) {  // normed_ = residual * input norm weight; rows scaled
    gemm_.run_wgmma_fused({normed_.data(), w.qkv, qkv_.data(), rows, h, qkv_cols, GemmOut::kBF16},
                          row_scale(h), /*swiglu=*/false, stream);
  } else {
    gemm_.run({normed_.data(), w.qkv, qkv_.data(), rows, h, qkv_cols, GemmOut::kBF16}, stream);
  }
  // qkv [+ bias] -> Qwen3 q/k norm -> rope -> q_, and K/V straight into the layer's pages.
  const AttentionContext a = rt.layer(l, m);
  QkvEpilogueArgs e;
  e.qkv = qkv_.data();
  e.bias = w.qkv_bias;
  e.q_norm = w.q_norm;
  e.k_norm = w.k_norm;
  e.eps = static_cast<float>(config_.rms_norm_eps);
  e.positions = m.token_position;
  e.inv_freq = rope_.data();
  e.num_rows = num_tokens;
  e.max_rows = rows;
  e.num_q_heads = hq;
  e.num_kv_heads = hkv;
  e.head_dim = d;
  e.q_out = q_.data();
  e.cache = a.kv;
  e.max_slots = a.max_slots;
  e.slot = m.token_slot;
  qkv_epilogue(e, stream);
  // qkv_epilogue writes q and this step's K/V rows only: the attention kernel may read its plan
  // and the older K/V while it runs.
  a.attention->run_planned(a.batch, a.kv, q_.data(), attn_.data(), nullptr, stream,
                           PriorWrites::kQueryAndNewKv);
  const GemmArgs o{attn_.data(), w.o, proj_.data(), rows, config_.q_size(), h, GemmOut::kBF16};
  if (wgmma_fold) {  // residual_ += o; normed_ = residual * post norm weight; sum_sq_
    gemm_.run_wgmma_fused(o, residual_epilogue(w.post_norm), /*swiglu=*/false, stream);
    return;
  }
  if (o_adds) {  // residual_ += o, and its squares for the MLP block's norm
    StreamGemvFusion f;
    f.residual = residual_.data();
    f.sum_sq_out = sum_sq_.data();
    gemm_.run_fused(o, f, stream);
    return;
  }
  gemm_.run(o, stream);
  if (w.o_bias != nullptr) {
    AddBiasArgs b;
    b.y = proj_.data();
    b.bias = w.o_bias;
    b.num_rows = num_tokens;
    b.max_rows = rows;
    b.cols = h;
    add_bias(b, stream);
  }
}

void LlamaModel::mlp_block(const StepMetaView& m, std::int32_t l, std::int32_t rows,
                           bool add_residual, bool one_grid, bool wgmma_fold, cudaStream_t stream) {
  const DeviceLayerWeights& w = weights_.layer(l);
  const std::int32_t* num_tokens = m.scalars + StepMetaLayout::kNumTokens;
  const std::int32_t h = config_.hidden_size, inter = config_.intermediate_size;
  if (one_grid) {  // norm, gate_up, SwiGLU and down in one kernel; residual_ holds the o added
    StreamMlpArgs a;
    a.x = residual_.data();
    a.norm_weight = w.post_norm;
    a.sum_sq_in = sum_sq_.data();
    a.parts = gemm_.stream_gemv_parts(h);
    a.eps = static_cast<float>(config_.rms_norm_eps);
    a.w_gate_up = w.gate_up;
    a.w_down = w.down;
    a.act = act_.data();
    a.y = proj_.data();
    if (add_residual) {
      a.residual = residual_.data();
      a.sum_sq_out = sum_sq_.data();
    }
    a.sync = mlp_sync_.data() + static_cast<std::size_t>(l) * kStreamMlpSyncWords;
    a.error_flag = bad_token_.data();
    a.rows = rows;
    a.hidden = h;
    a.inter = inter;
    a.cooperative = stream_mlp_cooperative_;
    a.fma = stream_mlp_fma_ && rows <= kStreamMlpFmaMaxRows;
    gemm_.run_mlp(a, stream);
    return;
  }
  // residual += o (tanh(attn_gate) * o on a cross layer's rows with encoder keys);
  // normed = norm(residual). Folded: the o projection added it, normed_ is weighted, not scaled.
  if (!wgmma_fold) add_norm(m, w.attn_gate, w.post_norm, rows, /*mlp=*/false, stream);
  const GemmArgs to_act{normed_.data(), w.gate_up, act_.data(), rows, h, 2 * inter, GemmOut::kBF16};
  const GemmArgs to_gate_up{normed_.data(), w.gate_up,     gate_up_.data(), rows, h,
                            2 * inter,      GemmOut::kBF16};
  if (fuse_swiglu_ && rows >= kFuseSwigluMinRows && gemm_.fuses_swiglu(to_act)) {
    if (wgmma_fold)
      gemm_.run_wgmma_fused(to_act, row_scale(h), /*swiglu=*/true, stream);
    else
      gemm_.run_swiglu(to_act, stream);  // act = swiglu(gate_up) in the GEMM's epilogue
  } else {
    if (wgmma_fold)
      gemm_.run_wgmma_fused(to_gate_up, row_scale(h), /*swiglu=*/false, stream);
    else
      gemm_.run(to_gate_up, stream);
    SwiGluArgs s;
    s.gate_up = gate_up_.data();
    s.out = act_.data();
    s.num_rows = num_tokens;
    s.max_rows = rows;
    s.inter = inter;
    swiglu(s, stream);
  }
  const GemmArgs down{act_.data(), w.down, proj_.data(), rows, inter, h, GemmOut::kBF16};
  if (add_residual && wgmma_fold) {  // residual_ += down; normed_ for the next layer's qkv
    gemm_.run_wgmma_fused(down, residual_epilogue(weights_.layer(l + 1).input_norm),
                          /*swiglu=*/false, stream);
    return;
  }
  if (add_residual) {  // residual_ += down, and its squares for the next layer's qkv GEMV
    StreamGemvFusion f;
    f.residual = residual_.data();
    f.sum_sq_out = sum_sq_.data();
    gemm_.run_fused(down, f, stream);
  } else {
    gemm_.run(down, stream);
  }
}

void LlamaModel::forward(const ModelRuntime& rt, const StepMetaView& m, const StepShape& shape,
                         float* logits, cudaStream_t stream) {
  GD_REQUIRE(shape.token_capacity >= 1, "token_capacity", shape.token_capacity, "must be positive");
  GD_REQUIRE(rt.layout().layers == layout_.layers && rt.layout().head_dim == layout_.head_dim,
             "runtime", rt.model(), "the runtime's attention layout is not this model's");
  const std::int32_t rows = std::min(shape.token_capacity, max_tokens_);
  const std::int32_t logit_rows = std::clamp(shape.logit_capacity, 1, max_logit_rows_);
  const std::int32_t* num_tokens = m.scalars + StepMetaLayout::kNumTokens;
  const std::int32_t h = config_.hidden_size;
  EmbeddingArgs e;
  e.table = weights_.embed();
  e.token_ids = m.token_id;
  e.out = residual_.data();
  e.error_flag = bad_token_.data();
  e.num_rows = num_tokens;
  e.max_rows = rows;
  e.vocab = config_.input_vocab_size();  // Mllama: the image token and reserved ids are inputs
  e.hidden = h;
  embedding(e, stream);

  const auto layers = static_cast<std::int32_t>(layout_.layers.size());
  const bool fuse = fuses_input_norm(rows);
  const bool one_grid_mlp = fuse && mlp_block_fits(rows);
  const bool wgmma_fold = !fuse && wgmma_norm_fits(rows);
  for (std::int32_t l = 0; l < layers; ++l) {
    const DeviceLayerWeights& w = weights_.layer(l);
    if (l == 0) {
      norm(residual_.data(), nullptr, w.input_norm, normed_.data(), num_tokens, rows, h, stream);
    } else if (!fuse && !wgmma_fold) {  // residual += previous MLP output (gated if that layer
                                        // was a cross layer)
      add_norm(m, weights_.layer(l - 1).mlp_gate, w.input_norm, rows, /*mlp=*/true, stream);
    }  // fused or folded: layer l - 1's down projection added it; the qkv GEMM norms
    // residual_ now holds the stream entering layer l (layer 0: the embedding).
    if (aux_.size() > 0) capture_aux(m, l, rows, stream);
    if (is_cross(l)) {
      cross_attention_block(rt, m, l, rows, stream);
    } else {
      attention_block(rt, m, l, rows, /*norm_in=*/fuse && l > 0, /*o_adds=*/one_grid_mlp,
                      wgmma_fold, stream);
    }
    mlp_block(m, l, rows, /*add_residual=*/(fuse || wgmma_fold) && l + 1 < layers, one_grid_mlp,
              wgmma_fold, stream);
  }
  // A last cross layer's MLP output is added here, gated and masked; the final norm then takes
  // the residual alone.
  const bool last_cross = is_cross(layers - 1);
  if (last_cross)
    add_norm(m, weights_.layer(layers - 1).mlp_gate, nullptr, rows, /*mlp=*/true, stream);

  if (hidden_.size() > 0) {  // every row's normed state, then the logits rows copied from it
    norm(proj_.data(), residual_.data(), weights_.final_norm(), hidden_.data(), num_tokens, rows, h,
         stream);
    GatherParams g;
    g.x = nullptr;
    g.res = reinterpret_cast<const uint4*>(hidden_.data());
    g.out_res = reinterpret_cast<uint4*>(logit_normed_.data());
    g.num_rows = m.scalars + StepMetaLayout::kNumLogitRows;
    g.logit_row = m.logit_row;
    g.max_rows = logit_rows;
    g.row_vecs = h / 8;
    gather_rows_kernel<<<blocks_for(static_cast<std::int64_t>(logit_rows) * g.row_vecs), kThreads,
                         0, stream>>>(g);
    GD_CHECK_LAUNCH();
    gemm_.run(
        {logit_normed_.data(), weights_.lm_head(), logits != nullptr ? logits : logits_.data(),
         logit_rows, h, config_.vocab_size, GemmOut::kF32},
        stream);
    return;
  }
  GatherParams g;
  g.x = last_cross ? nullptr : reinterpret_cast<const uint4*>(proj_.data());
  g.res = reinterpret_cast<const uint4*>(residual_.data());
  g.out_x = reinterpret_cast<uint4*>(logit_x_.data());
  g.out_res = reinterpret_cast<uint4*>(logit_res_.data());
  g.num_rows = m.scalars + StepMetaLayout::kNumLogitRows;
  g.logit_row = m.logit_row;
  g.max_rows = logit_rows;
  g.row_vecs = h / 8;
  gather_rows_kernel<<<blocks_for(static_cast<std::int64_t>(logit_rows) * g.row_vecs), kThreads, 0,
                       stream>>>(g);
  GD_CHECK_LAUNCH();
  if (last_cross) {
    norm(logit_res_.data(), nullptr, weights_.final_norm(), logit_normed_.data(),
         m.scalars + StepMetaLayout::kNumLogitRows, logit_rows, h, stream);
  } else {
    norm(logit_x_.data(), logit_res_.data(), weights_.final_norm(), logit_normed_.data(),
         m.scalars + StepMetaLayout::kNumLogitRows, logit_rows, h, stream);
  }
  gemm_.run({logit_normed_.data(), weights_.lm_head(), logits != nullptr ? logits : logits_.data(),
             logit_rows, h, config_.vocab_size, GemmOut::kF32},
            stream);
}

}  // namespace graphdecode
