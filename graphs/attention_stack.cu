#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "graphs/attention_stack.h"
#include "graphs/stack_pools.h"
#include "graphs/synthetic.h"
#include "memory/kv_write.h"

namespace graphdecode {
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

bool AttentionStackConfig::has(AttentionKind k) const {
  return std::find(layers.begin(), layers.end(), k) != layers.end();
}

void AttentionStackConfig::validate() const {
  GD_REQUIRE(!layers.empty(), "layers", 0, "the stack needs at least one layer");
  GD_REQUIRE(layers.size() <= 64, "layers", layers.size(), "at most 64 layers (hash packing)");
  GD_REQUIRE(num_q_heads >= 1 && num_q_heads < 64, "num_q_heads", num_q_heads, "in [1, 64)");
  GD_REQUIRE(num_kv_heads >= 1 && num_q_heads % num_kv_heads == 0, "num_kv_heads", num_kv_heads,
             "must divide num_q_heads");
  GD_REQUIRE(head_dim == 64 || head_dim == 128 || head_dim == 256, "head_dim", head_dim,
             "64, 128 or 256");
  GD_REQUIRE(!has(AttentionKind::kSliding) || window_left >= 0, "window_left", window_left,
             "sliding layers need window_left >= 0");
  GD_REQUIRE(!has(AttentionKind::kCross) || max_encoder_len >= 1, "max_encoder_len",
             max_encoder_len, "cross layers need encoder keys");
  GD_REQUIRE(max_new_tokens >= 1 && max_new_tokens <= max_tokens, "max_new_tokens", max_new_tokens,
             "in [1, max_tokens]");
  GD_REQUIRE(page_size >= 1, "page_size", page_size, "must be positive");
}

StepCapacity stack_step_capacity(const AttentionStackConfig& c) {
  c.validate();
  StepCapacity cap;
  cap.max_batch = c.max_batch;
  cap.max_tokens = c.max_tokens;
  cap.max_slots = c.resolved_max_slots();
  cap.max_kv_len = c.max_kv_len;
  cap.max_encoder_len = c.has(AttentionKind::kCross) ? c.max_encoder_len : 0;
  for (AttentionKind k : {AttentionKind::kFull, AttentionKind::kSliding, AttentionKind::kCross}) {
    if (!c.has(k)) continue;
    cap.pools[pool_index(k)] = stack_step_pool_capacity(c, k);
  }
  cap.validate();
  return cap;
}

std::array<std::unique_ptr<KvPool>, kNumPoolKinds> AttentionStack::make_pools(
    const AttentionStackConfig& c, cudaStream_t stream) {
  return make_stack_pools(c, stream);
}

AttentionStack::AttentionStack(const AttentionStackConfig& config, const StepInput& input,
                               cudaStream_t stream)
    : config_(config), pools_(make_pools(config, stream)), prep_(input, stack_prep_tables(pools_)) {
  const StepCapacity want = stack_step_capacity(config_);
  const StepCapacity& got = input.capacity();
  GD_REQUIRE(got.max_batch == want.max_batch && got.max_tokens == want.max_tokens &&
                 got.max_slots == want.max_slots && got.max_kv_len == want.max_kv_len &&
                 got.max_encoder_len == want.max_encoder_len,
             "input", "capacity", "step input not built from stack_step_capacity(config)");
  std::array<std::int32_t, kNumPoolKinds> counts{};
  for (AttentionKind k : config_.layers) layer_index_.push_back(counts[static_cast<int>(k)]++);

  for (AttentionKind k : {AttentionKind::kFull, AttentionKind::kSliding, AttentionKind::kCross}) {
    if (!config_.has(k)) continue;
    AttentionConfig ac;
    ac.num_q_heads = config_.num_q_heads;
    ac.num_kv_heads = config_.num_kv_heads;
    ac.head_dim = config_.head_dim;
    ac.dtype = config_.dtype;
    ac.mode = k == AttentionKind::kCross ? AttentionMode::kCross : AttentionMode::kCausal;
    ac.max_batch = config_.max_batch;
    ac.max_q_tokens = config_.max_tokens;
    ac.max_kv_len = k == AttentionKind::kCross ? config_.max_encoder_len : config_.max_kv_len;
    ac.deterministic = config_.deterministic;
    attention_[static_cast<int>(k)] = std::make_unique<PagedAttention>(ac);
  }
  window_left_ = DeviceBuffer<std::int32_t>(1);
  window_left_.upload(&config_.window_left, 1, stream);
  const auto t = static_cast<std::size_t>(config_.max_tokens);
  const auto hq = static_cast<std::size_t>(config_.num_q_heads);
  const auto hkv = static_cast<std::size_t>(config_.num_kv_heads);
  const auto d = static_cast<std::size_t>(config_.head_dim);
  q_ = DeviceBuffer<std::uint16_t>(t * hq * d);
  out_ = DeviceBuffer<std::uint16_t>(t * hq * d);
  k_ = DeviceBuffer<std::uint16_t>(t * hkv * d);
  v_ = DeviceBuffer<std::uint16_t>(t * hkv * d);
  residual_ = DeviceBuffer<float>(t * hq * d);
  residual_.fill_bytes(0, stream);
  out_.fill_bytes(0, stream);
  if (config_.has(AttentionKind::kCross)) {
    const auto e = static_cast<std::size_t>(config_.max_encoder_len);
    enc_k_ = DeviceBuffer<std::uint16_t>(e * hkv * d);
    enc_v_ = DeviceBuffer<std::uint16_t>(e * hkv * d);
    enc_meta_ = DeviceBuffer<std::int32_t>(1 + 2 * e);
    enc_meta_host_ = PinnedBuffer<std::int32_t>(1 + 2 * e);
  }
  GD_CUDA(cudaStreamSynchronize(stream));
}

const KvPool& AttentionStack::pool(AttentionKind k) const {
  GD_REQUIRE(has_pool(k), "kind", static_cast<int>(k), "this stack has no such pool");
  return *pools_[static_cast<int>(k)];
}

void AttentionStack::layer_input(std::int32_t layer, std::int32_t flags, const StepShape& shape,
                                 cudaStream_t stream) const {
  const StepMetaView& m = prep_.device();
  LayerInputParams p;
  p.num_tokens = m.scalars + StepMetaLayout::kNumTokens;
  p.token_id = m.token_id;
  p.token_position = m.token_position;
  p.out = out_.data();
  p.residual = residual_.data();
  p.q = q_.data();
  p.k = k_.data();
  p.v = v_.data();
  p.token_capacity = std::min(shape.token_capacity, config_.max_tokens);
  p.num_q_heads = config_.num_q_heads;
  p.num_kv_heads = config_.num_kv_heads;
  p.head_dim = config_.head_dim;
  p.layer = layer;
  p.flags = flags;
  p.seed = config_.seed;
  p.gain = config_.residual_gain;
  p.bf16 = config_.dtype == DType::kBF16;
  const std::int64_t items =
      static_cast<std::int64_t>(p.token_capacity) * config_.num_q_heads * config_.head_dim;
  layer_input_kernel<<<blocks_for(items), kThreads, 0, stream>>>(p);
  GD_CHECK_LAUNCH();
}

void AttentionStack::enqueue(const StepShape& shape, cudaStream_t stream) {
  GD_REQUIRE(shape.token_capacity >= 1, "token_capacity", shape.token_capacity, "must be positive");
  prep_.enqueue(stream);
  const AttentionBatch self_full = prep_.self_batch(nullptr);
  const AttentionBatch self_window = prep_.self_batch(window_left_.data());
  const AttentionBatch cross = prep_.cross_batch();
  const auto batch_of = [&](AttentionKind k) -> const AttentionBatch& {
    return k == AttentionKind::kFull      ? self_full
           : k == AttentionKind::kSliding ? self_window
                                          : cross;
  };
  for (AttentionKind k : {AttentionKind::kFull, AttentionKind::kSliding, AttentionKind::kCross}) {
    if (attention_[static_cast<int>(k)]) attention_[static_cast<int>(k)]->plan(batch_of(k), stream);
  }
  const StepMetaView& m = prep_.device();
  const auto layers = static_cast<std::int32_t>(config_.layers.size());
  for (std::int32_t l = 0; l < layers; ++l) {
    const AttentionKind kind = config_.layers[l];
    const bool self = kind != AttentionKind::kCross;
    const std::int32_t flags =
        (l == 0 ? kInitResidual : kAccumulate) | kWriteQ | (self ? kWriteKV : 0);
    layer_input(l, flags, shape, stream);
    const KvPool& pool = *pools_[static_cast<int>(kind)];
    const PagedKvView view = pool.view(layer_index_[l]);
    if (self) {
      KvWriteArgs w;
      w.cache = view;
      w.max_slots = pool.config().geometry.max_slots;
      w.dtype = config_.dtype;
      w.k_new = k_.data();
      w.v_new = v_.data();
      w.num_tokens = m.scalars + StepMetaLayout::kNumTokens;
      w.max_tokens = std::min(shape.token_capacity, config_.max_tokens);
      w.slot = m.token_slot;
      w.position = m.token_position;
      write_new_kv(w, stream);
    }
    // Self layers: write_new_kv (this step's K/V rows) is the kernel right before. Cross layers:
    // layer_input (q); kQueryAndNewKv is ignored in cross mode anyway.
    attention_[static_cast<int>(kind)]->run_planned(
        batch_of(kind), view, q_.data(), out_.data(), nullptr, stream,
        self ? PriorWrites::kQueryAndNewKv : PriorWrites::kAnything);
  }
  layer_input(layers, kAccumulate, shape, stream);
}

void AttentionStack::apply_table(AttentionKind kind, const TableCommandBatch& batch,
                                 cudaStream_t stream) {
  GD_REQUIRE(has_pool(kind), "kind", static_cast<int>(kind), "this stack has no such pool");
  pools_[static_cast<int>(kind)]->table().apply(batch, stream);
}

void AttentionStack::encode(std::int32_t slot, std::uint32_t request_id, std::int32_t encoder_len,
                            const TableCommandBatch* cross_commands, cudaStream_t stream) {
  GD_REQUIRE(config_.has(AttentionKind::kCross), "layers", "no cross layer", "nothing to encode");
  GD_REQUIRE(slot > kPaddingSlot && slot < config_.resolved_max_slots(), "slot", slot,
             "not a request slot");
  GD_REQUIRE(encoder_len >= 0 && encoder_len <= config_.max_encoder_len, "encoder_len", encoder_len,
             "outside [0, max_encoder_len]");
  KvPool& pool = *pools_[pool_index(AttentionKind::kCross)];
  if (cross_commands != nullptr) pool.table().apply(*cross_commands, stream);
  if (encoder_len == 0) return;
  GD_CUDA(cudaStreamSynchronize(stream));  // the staging may still feed the previous encode
  const auto e = static_cast<std::size_t>(config_.max_encoder_len);
  std::int32_t* h = enc_meta_host_.data();
  h[0] = encoder_len;
  for (std::int32_t i = 0; i < encoder_len; ++i) {
    h[1 + i] = slot;
    h[1 + e + i] = i;
  }
  GD_CUDA(cudaMemcpyAsync(enc_meta_.data(), h, (1 + 2 * e) * sizeof(std::int32_t),
                          cudaMemcpyHostToDevice, stream));
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(config_.layers.size()); ++l) {
    if (config_.layers[l] != AttentionKind::kCross) continue;
    EncoderParams p;
    p.count = enc_meta_.data();
    p.k = enc_k_.data();
    p.v = enc_v_.data();
    p.max_len = config_.max_encoder_len;
    p.num_kv_heads = config_.num_kv_heads;
    p.head_dim = config_.head_dim;
    p.layer = l;
    p.seed = config_.seed;
    p.request_id = request_id;
    p.bf16 = config_.dtype == DType::kBF16;
    encoder_kv_kernel<<<blocks_for(static_cast<std::int64_t>(encoder_len) * config_.num_kv_heads *
                                   config_.head_dim),
                        kThreads, 0, stream>>>(p);
    GD_CHECK_LAUNCH();
    KvWriteArgs w;
    w.cache = pool.view(layer_index_[l]);
    w.max_slots = pool.config().geometry.max_slots;
    w.dtype = config_.dtype;
    w.k_new = enc_k_.data();
    w.v_new = enc_v_.data();
    w.num_tokens = enc_meta_.data();
    w.max_tokens = encoder_len;
    w.slot = enc_meta_.data() + 1;
    w.position = enc_meta_.data() + 1 + e;
    write_new_kv(w, stream);
  }
}

}  // namespace graphdecode
