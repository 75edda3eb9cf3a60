#include <algorithm>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/kernels/sampling.h"
#include "engine/row_sampler.h"

namespace graphdecode {
namespace {

constexpr int kThreads = 128;

struct UnpackParams {
  const std::int32_t* aux;  // [max_batch][SamplingWords::kCount] step image
  StepMetaView meta;        // the phase: logits rows, their token rows, token request/position
  float* temperature;
  std::int32_t* top_k;
  float* top_p;
  std::uint64_t* seed;
  std::uint64_t* rng_step;
  std::int32_t max_rows;
};

// Row i < live: the words of the row's request, the counter = position of the sampled token;
// padding rows: greedy with fixed values (never read back).
__global__ void unpack_sampling_kernel(const __grid_constant__ UnpackParams p) {
  const std::int32_t i = static_cast<std::int32_t>(blockIdx.x * kThreads + threadIdx.x);
  if (i >= p.max_rows) return;
  if (i < p.meta.scalars[StepMetaLayout::kNumLogitRows]) {
    const std::int32_t t = p.meta.logit_row[i];
    const std::int32_t r = p.meta.token_request[t];
    const std::int32_t* w = p.aux + static_cast<std::int64_t>(r) * SamplingWords::kCount;
    p.temperature[i] = __int_as_float(w[SamplingWords::kTemperature]);
    p.top_k[i] = w[SamplingWords::kTopK];
    p.top_p[i] = __int_as_float(w[SamplingWords::kTopP]);
    p.seed[i] =
        (static_cast<std::uint64_t>(static_cast<std::uint32_t>(w[SamplingWords::kSeedHi])) << 32) |
        static_cast<std::uint32_t>(w[SamplingWords::kSeedLo]);
    p.rng_step[i] = static_cast<std::uint32_t>(p.meta.token_position[t] + 1);
  } else {
    p.temperature[i] = 0.f;
    p.top_k[i] = 0;
    p.top_p[i] = 1.f;
    p.seed[i] = 0;
    p.rng_step[i] = 0;
  }
}

}  // namespace

RowSampler::RowSampler(std::int32_t max_rows, std::int32_t vocab, cudaStream_t stream)
    : max_rows_(max_rows), vocab_(vocab) {
  GD_REQUIRE(max_rows >= 1, "max_rows", max_rows, "must be positive");
  GD_REQUIRE(vocab >= 1, "vocab", vocab, "must be positive");
  const auto b = static_cast<std::size_t>(max_rows);
  temperature_ = DeviceBuffer<float>(b);
  top_p_ = DeviceBuffer<float>(b);
  top_k_ = DeviceBuffer<std::int32_t>(b);
  seed_ = DeviceBuffer<std::uint64_t>(b);
  rng_step_ = DeviceBuffer<std::uint64_t>(b);
  top_k_.fill_bytes(0, stream);
  workspace_ = DeviceBuffer<std::uint8_t>(sampling_workspace_bytes(max_rows, vocab));
  workspace_.fill_bytes(0, stream);  // every call leaves it zeroed again
}

void RowSampler::enqueue(const StepMetaView& meta, const std::int32_t* aux, const float* logits,
                         std::int32_t grid_rows, std::int32_t* tokens, cudaStream_t stream,
                         SamplingRowStats* stats) const {
  const std::int32_t rows = std::clamp(grid_rows, 1, max_rows_);
  UnpackParams u;
  u.aux = aux;
  u.meta = meta;
  u.temperature = temperature_.data();
  u.top_k = top_k_.data();
  u.top_p = top_p_.data();
  u.seed = seed_.data();
  u.rng_step = rng_step_.data();
  u.max_rows = rows;
  unpack_sampling_kernel<<<static_cast<unsigned>((rows + kThreads - 1) / kThreads), kThreads, 0,
                           stream>>>(u);
  GD_CHECK_LAUNCH();

  SamplingArgs a;
  a.logits = logits;
  a.logits_type = LogitsType::kFloat32;
  a.temperature = temperature_.data();
  a.top_k = top_k_.data();
  a.top_p = top_p_.data();
  a.seed = seed_.data();
  a.step = rng_step_.data();
  a.tokens = tokens;
  a.num_rows = meta.scalars + StepMetaLayout::kNumLogitRows;
  a.max_rows = rows;
  a.vocab = vocab_;
  a.workspace = workspace_.data();
  a.workspace_bytes = workspace_.bytes();
  a.row_stats = stats;
  sample(a, stream);
}

}  // namespace graphdecode
