#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "attention_stack.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "memory/kv_write.h"
#include "synthetic.h"

namespace graphdecode::fuzz {
namespace {

constexpr int kThreads = 256;

// What one layer_input launch does (bit flags).
enum : std::int32_t {
  kInitResidual = 1,  // residual = 0 (first layer)
  kAccumulate = 2,    // residual += out (previous layer's output)
  kWriteQ = 4,        // q = round(hash + gain * residual)
  kWriteKV = 8,       // k, v = round(hash) (self layers)
};

struct LayerInputParams {
  const std::int32_t* num_tokens;      // [1] prep output
  const std::int32_t* token_id;        // [max_tokens] prep output
  const std::int32_t* token_position;  // [max_tokens] prep output
  const std::uint16_t* out;            // [max_tokens][hq][d] previous layer's output
  float* residual;                     // [max_tokens][hq * d]
  std::uint16_t* q;                    // [max_tokens][hq][d]
  std::uint16_t* k;                    // [max_tokens][hkv][d]
  std::uint16_t* v;                    // [max_tokens][hkv][d]
  std::int32_t token_capacity;         // grid covers this many tokens
  std::int32_t num_q_heads, num_kv_heads, head_dim, layer, flags;
  std::uint32_t seed;
  float gain;
  bool bf16;
};

__device__ __forceinline__ std::uint16_t round_to(float x, bool bf16) {
  return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
}
__device__ __forceinline__ float widen(std::uint16_t x, bool bf16) {
  return bf16 ? __bfloat162float(__ushort_as_bfloat16(x)) : __half2float(__ushort_as_half(x));
}

// One thread per (token, q head, dim); threads of kv heads < num_kv_heads also make K and V.
__global__ void __launch_bounds__(kThreads)
    layer_input_kernel(const __grid_constant__ LayerInputParams p) {
  const std::int32_t row = p.num_q_heads * p.head_dim;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const std::int32_t n = min(*p.num_tokens, p.token_capacity);
  if (i >= static_cast<std::int64_t>(n) * row) return;
  const auto t = static_cast<std::int32_t>(i / row);
  const auto e = static_cast<std::int32_t>(i - static_cast<std::int64_t>(t) * row);
  const std::int32_t h = e / p.head_dim;
  const std::int32_t d = e - h * p.head_dim;
  float r = 0.f;
  if (!(p.flags & kInitResidual)) r = p.residual[i];
  if (p.flags & kAccumulate) r += widen(p.out[i], p.bf16);
  if (p.flags & (kInitResidual | kAccumulate)) p.residual[i] = r;
  const auto id = static_cast<std::uint32_t>(p.token_id[t]);
  const auto pos = static_cast<std::uint32_t>(p.token_position[t]);
  if (p.flags & kWriteQ) {
    const float x =
        synthetic::value(p.seed, synthetic::kQuery, id, pos, synthetic::element_id(p.layer, h, d));
    p.q[i] = round_to(x + p.gain * r, p.bf16);
  }
  if ((p.flags & kWriteKV) && h < p.num_kv_heads) {
    const std::int64_t kv = (static_cast<std::int64_t>(t) * p.num_kv_heads + h) * p.head_dim + d;
    const std::uint32_t el = synthetic::element_id(p.layer, h, d);
    p.k[kv] = round_to(synthetic::value(p.seed, synthetic::kKey, id, pos, el), p.bf16);
    p.v[kv] = round_to(synthetic::value(p.seed, synthetic::kValue, id, pos, el), p.bf16);
  }
}

struct EncoderParams {
  const std::int32_t* count;  // [1]
  std::uint16_t* k;           // [max_encoder_len][hkv][d]
  std::uint16_t* v;
  std::int32_t max_len, num_kv_heads, head_dim, layer;
  std::uint32_t seed, request_id;
  bool bf16;
};

__global__ void __launch_bounds__(kThreads)
    encoder_kv_kernel(const __grid_constant__ EncoderParams p) {
  const std::int32_t row = p.num_kv_heads * p.head_dim;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= static_cast<std::int64_t>(min(*p.count, p.max_len)) * row) return;
  const auto t = static_cast<std::int32_t>(i / row);
  const auto e = static_cast<std::int32_t>(i - static_cast<std::int64_t>(t) * row);
  const std::int32_t h = e / p.head_dim;
  const std::uint32_t el = synthetic::element_id(p.layer, h, e - h * p.head_dim);
  p.k[i] = round_to(synthetic::value(p.seed, synthetic::kEncoderKey, p.request_id,
                                     static_cast<std::uint32_t>(t), el),
                    p.bf16);
  p.v[i] = round_to(synthetic::value(p.seed, synthetic::kEncoderValue, p.request_id,
                                     static_cast<std::uint32_t>(t), el),
                    p.bf16);
}

unsigned blocks_for(std::int64_t items) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, (items + kThreads - 1) / kThreads));
}

}  // namespace

void AttentionStackConfig::validate() const {
  layout.validate();
  options.validate();
  GD_REQUIRE(layout.layers.size() <= 64, "layers", layout.layers.size(),
             "at most 64 layers (hash packing)");
  GD_REQUIRE(layout.num_q_heads < 64, "num_q_heads", layout.num_q_heads, "below 64 (hash packing)");
}

StepCapacity stack_step_capacity(const AttentionStackConfig& c) {
  c.validate();
  return step_capacity(c.options, std::span<const AttentionLayout>(&c.layout, 1));
}

AttentionStack::AttentionStack(const AttentionStackConfig& config, StepContext& step,
                               cudaStream_t stream, std::int32_t model)
    : config_(config), runtime_(config.layout, config.options, step, model, stream) {
  config_.validate();
  const auto t = static_cast<std::size_t>(config_.options.max_tokens);
  const auto hq = static_cast<std::size_t>(config_.layout.num_q_heads);
  const auto hkv = static_cast<std::size_t>(config_.layout.num_kv_heads);
  const auto d = static_cast<std::size_t>(config_.layout.head_dim);
  q_ = DeviceBuffer<std::uint16_t>(t * hq * d);
  out_ = DeviceBuffer<std::uint16_t>(t * hq * d);
  k_ = DeviceBuffer<std::uint16_t>(t * hkv * d);
  v_ = DeviceBuffer<std::uint16_t>(t * hkv * d);
  residual_ = DeviceBuffer<float>(t * hq * d);
  residual_.fill_bytes(0, stream);
  out_.fill_bytes(0, stream);
  if (config_.layout.has(AttentionKind::kCross)) {
    const auto e = static_cast<std::size_t>(config_.options.max_encoder_len);
    enc_k_ = DeviceBuffer<std::uint16_t>(e * hkv * d);
    enc_v_ = DeviceBuffer<std::uint16_t>(e * hkv * d);
    enc_meta_ = DeviceBuffer<std::int32_t>(1 + 2 * e);
    enc_meta_host_ = PinnedBuffer<std::int32_t>(1 + 2 * e);
  }
  GD_CUDA(cudaStreamSynchronize(stream));
}

void AttentionStack::layer_input(std::int32_t layer, std::int32_t flags, const StepMetaView& m,
                                 std::int32_t token_capacity, float* residual,
                                 cudaStream_t stream) const {
  LayerInputParams p;
  p.num_tokens = m.scalars + StepMetaLayout::kNumTokens;
  p.token_id = m.token_id;
  p.token_position = m.token_position;
  p.out = out_.data();
  p.residual = residual;
  p.q = q_.data();
  p.k = k_.data();
  p.v = v_.data();
  p.token_capacity = std::min(token_capacity, config_.options.max_tokens);
  p.num_q_heads = config_.layout.num_q_heads;
  p.num_kv_heads = config_.layout.num_kv_heads;
  p.head_dim = config_.layout.head_dim;
  p.layer = layer;
  p.flags = flags;
  p.seed = config_.seed;
  p.gain = config_.residual_gain;
  p.bf16 = config_.layout.dtype == DType::kBF16;
  const std::int64_t items =
      static_cast<std::int64_t>(p.token_capacity) * p.num_q_heads * p.head_dim;
  layer_input_kernel<<<blocks_for(items), kThreads, 0, stream>>>(p);
  GD_CHECK_LAUNCH();
}

void AttentionStack::enqueue(const StepShape& shape, cudaStream_t stream) {
  GD_REQUIRE(shape.token_capacity >= 1, "token_capacity", shape.token_capacity, "must be positive");
  runtime_.step().prep().enqueue(stream);
  runtime_.plan(stream);
  forward(runtime_.meta(), shape.token_capacity, residual_.data(), stream);
}

void AttentionStack::forward(const StepMetaView& m, std::int32_t token_capacity, float* residual,
                             cudaStream_t stream) const {
  GD_REQUIRE(token_capacity >= 1, "token_capacity", token_capacity, "must be positive");
  GD_REQUIRE(residual != nullptr, "residual", "nullptr", "forward needs an output buffer");
  const AttentionLayout& layout = config_.layout;
  const auto layers = static_cast<std::int32_t>(layout.layers.size());
  for (std::int32_t l = 0; l < layers; ++l) {
    const bool self = layout.layers[l] != AttentionKind::kCross;
    const std::int32_t flags =
        (l == 0 ? kInitResidual : kAccumulate) | kWriteQ | (self ? kWriteKV : 0);
    layer_input(l, flags, m, token_capacity, residual, stream);
    if (self) {
      const AttentionContext a = runtime_.layer(l, m);
      KvWriteArgs w;
      w.cache = a.kv;
      w.max_slots = a.max_slots;
      w.dtype = layout.dtype;
      w.k_new = k_.data();
      w.v_new = v_.data();
      w.num_tokens = m.scalars + StepMetaLayout::kNumTokens;
      w.max_tokens = std::min(token_capacity, config_.options.max_tokens);
      w.slot = m.token_slot;
      w.position = m.token_position;
      write_new_kv(w, stream);
    }
    // Self layers: write_new_kv (this step's K/V rows) is the kernel right before. Cross layers:
    // layer_input (q); kQueryAndNewKv is ignored in cross mode anyway.
    runtime_.attend(l, m, q_.data(), out_.data(), stream,
                    self ? PriorWrites::kQueryAndNewKv : PriorWrites::kAnything);
  }
  layer_input(layers, kAccumulate, m, token_capacity, residual, stream);
}

void AttentionStack::apply_table(AttentionKind kind, const TableCommandBatch& batch,
                                 cudaStream_t stream) {
  runtime_.pool(kind).table().apply(batch, stream);
}

void AttentionStack::encode(std::int32_t slot, std::uint32_t request_id, std::int32_t encoder_len,
                            cudaStream_t stream) {
  const AttentionLayout& layout = config_.layout;
  GD_REQUIRE(layout.has(AttentionKind::kCross), "layers", "no cross layer", "nothing to encode");
  GD_REQUIRE(slot > kPaddingSlot && slot < config_.options.resolved_max_slots(), "slot", slot,
             "not a request slot");
  GD_REQUIRE(encoder_len >= 0 && encoder_len <= config_.options.max_encoder_len, "encoder_len",
             encoder_len, "outside [0, max_encoder_len]");
  if (encoder_len == 0) return;
  GD_CUDA(cudaStreamSynchronize(stream));  // the staging may still feed the previous encode
  const auto e = static_cast<std::size_t>(config_.options.max_encoder_len);
  std::int32_t* h = enc_meta_host_.data();
  h[0] = encoder_len;
  for (std::int32_t i = 0; i < encoder_len; ++i) {
    h[1 + i] = slot;
    h[1 + e + i] = i;
  }
  GD_CUDA(cudaMemcpyAsync(enc_meta_.data(), h, (1 + 2 * e) * sizeof(std::int32_t),
                          cudaMemcpyHostToDevice, stream));
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(layout.layers.size()); ++l) {
    if (layout.layers[l] != AttentionKind::kCross) continue;
    EncoderParams p;
    p.count = enc_meta_.data();
    p.k = enc_k_.data();
    p.v = enc_v_.data();
    p.max_len = config_.options.max_encoder_len;
    p.num_kv_heads = layout.num_kv_heads;
    p.head_dim = layout.head_dim;
    p.layer = l;
    p.seed = config_.seed;
    p.request_id = request_id;
    p.bf16 = layout.dtype == DType::kBF16;
    encoder_kv_kernel<<<blocks_for(static_cast<std::int64_t>(encoder_len) * layout.num_kv_heads *
                                   layout.head_dim),
                        kThreads, 0, stream>>>(p);
    GD_CHECK_LAUNCH();
    const AttentionContext a = runtime_.layer(l);
    KvWriteArgs w;
    w.cache = a.kv;
    w.max_slots = a.max_slots;
    w.dtype = layout.dtype;
    w.k_new = enc_k_.data();
    w.v_new = enc_v_.data();
    w.num_tokens = enc_meta_.data();
    w.max_tokens = encoder_len;
    w.slot = enc_meta_.data() + 1;
    w.position = enc_meta_.data() + 1 + e;
    write_new_kv(w, stream);
  }
}

}  // namespace graphdecode::fuzz
