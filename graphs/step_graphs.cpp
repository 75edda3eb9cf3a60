#include "graphs/step_graphs.h"

#include <algorithm>
#include <string>
#include <tuple>

#include "common/cuda_check.h"
#include "common/error.h"

namespace graphdecode {

std::vector<std::int32_t> default_buckets(std::int32_t max_batch) {
  GD_REQUIRE(max_batch >= 1, "max_batch", max_batch, "must be positive");
  std::vector<std::int32_t> b;
  for (std::int32_t x : {1, 2, 4, 8, 16, 24, 32, 48, 64}) {
    if (x < max_batch) b.push_back(x);
  }
  for (std::int32_t x = 96; x < max_batch; x += x < 256 ? 32 : 64) b.push_back(x);
  b.push_back(max_batch);
  return b;
}

StepShape key_shape(const GraphKey& key, const StepCapacity& cap) {
  const std::int32_t max_tokens = cap.max_tokens;
  std::int64_t t = max_tokens;
  switch (key.mode) {
    case StepMode::kDecode:
      t = key.bucket;
      break;
    case StepMode::kTargetVerify:
    case StepMode::kDraftExtendV2:
      t = static_cast<std::int64_t>(key.bucket) * key.tokens_per_request;
      break;
    case StepMode::kSpeculative:  // the draft-extend's rows: up to k + 1 committed per request
      t = static_cast<std::int64_t>(key.bucket) * (cap.max_draft_tokens + 1);
      break;
    case StepMode::kExtend:
      break;
  }
  StepShape shape;
  shape.mode = key.mode;
  shape.bucket = key.bucket;
  shape.token_capacity = static_cast<std::int32_t>(std::min<std::int64_t>(t, max_tokens));
  shape.logit_capacity =
      std::min(key.logits == LogitRows::kEveryRow ? shape.token_capacity : key.bucket,
               cap.resolved_max_logit_rows());
  shape.tokens_per_request = key.tokens_per_request;
  return shape;
}

std::int32_t extend_rows(std::int32_t tokens, std::int32_t max_tokens) noexcept {
  const std::int64_t rounded = (std::max<std::int64_t>(tokens, 1) + kExtendRowGranule - 1) /
                               kExtendRowGranule * kExtendRowGranule;
  return static_cast<std::int32_t>(std::min<std::int64_t>(rounded, max_tokens));
}

StepGraphs::StepGraphs(StepInput& input, StepProgram& program, StepGraphsConfig config)
    : input_(input), program_(program), config_(std::move(config)) {
  const StepCapacity& cap = input_.capacity();
  buckets_ = config_.buckets.empty() ? default_buckets(cap.max_batch) : config_.buckets;
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    GD_REQUIRE(buckets_[i] >= 1 && buckets_[i] <= cap.max_batch,
               "buckets[" + std::to_string(i) + "]", buckets_[i], "outside [1, max_batch]");
    GD_REQUIRE(i == 0 || buckets_[i] > buckets_[i - 1], "buckets[" + std::to_string(i) + "]",
               buckets_[i], "buckets must be strictly ascending");
  }
  if (config_.modes.empty()) config_.modes.push_back(GraphMode{});
  for (std::size_t i = 0; i < config_.modes.size(); ++i) {
    auto& [mode, n, logits] = config_.modes[i];
    const auto m = static_cast<std::int32_t>(mode);
    GD_REQUIRE(m >= 0 && m < kNumStepModes, "modes[" + std::to_string(i) + "].mode", m,
               "unknown step mode");
    if (mode == StepMode::kDecode) n = 1;
    if (mode == StepMode::kExtend) n = 0;
    GD_REQUIRE(n >= 0 && n <= cap.max_tokens, "modes[" + std::to_string(i) + "].tokens", n,
               "tokens per request outside [1, max_tokens]");
    GD_REQUIRE(mode == StepMode::kExtend || mode == StepMode::kDecode ||
                   mode == StepMode::kSpeculative || n >= 1,
               "modes[" + std::to_string(i) + "].tokens", n,
               "verify / draft-extend-v2 need N >= 1");
    GD_REQUIRE(mode != StepMode::kSpeculative ||
                   (n <= cap.max_draft_tokens && logits == LogitRows::kLastPerRequest),
               "modes[" + std::to_string(i) + "].tokens", n,
               "speculative graphs draft k <= max_draft_tokens, last row per request");
    const auto l = static_cast<std::int32_t>(logits);
    GD_REQUIRE(l >= 0 && l < kNumLogitRows, "modes[" + std::to_string(i) + "].logits", l,
               "unknown LogitRows");
  }
}

void StepGraphs::capture(cudaStream_t stream) {
  if (!config_.use_graphs) return;
  GD_REQUIRE(entries_.empty(), "capture", "twice", "graphs are captured once");
  GD_CUDA(cudaStreamSynchronize(stream));
  std::size_t free_before = 0, free_after = 0, total = 0;
  GD_CUDA(cudaMemGetInfo(&free_before, &total));
  for (const GraphMode& m : config_.modes) {
    for (auto b = buckets_.rbegin(); b != buckets_.rend(); ++b) {  // largest first
      const GraphKey key{m.mode, m.tokens_per_request, m.logits, *b};
      const StepShape shape = key_shape(key, input_.capacity());
      CudaGraph g = CudaGraph::capture(stream, [&] { program_.enqueue(shape, stream); });
      entries_.push_back(Entry{key, std::move(g)});
    }
  }
  std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
    const auto ka = std::tuple(static_cast<int>(a.key.mode), a.key.tokens_per_request,
                               static_cast<int>(a.key.logits), a.key.bucket);
    const auto kb = std::tuple(static_cast<int>(b.key.mode), b.key.tokens_per_request,
                               static_cast<int>(b.key.logits), b.key.bucket);
    return ka < kb;
  });
  // Upload every executable graph once so the first replay of each pays no setup.
  for (const Entry& e : entries_) e.graph.upload(stream);
  GD_CUDA(cudaStreamSynchronize(stream));
  GD_CUDA(cudaMemGetInfo(&free_after, &total));
  graph_memory_ = free_before > free_after ? free_before - free_after : 0;
}

const GraphKey* StepGraphs::find(StepMode mode, std::int32_t n, std::int32_t batch,
                                 LogitRows logits) const {
  const Entry* e = find_entry(mode, n, logits, batch);
  return e ? &e->key : nullptr;
}

const StepGraphs::Entry* StepGraphs::find_entry(StepMode mode, std::int32_t n, LogitRows logits,
                                                std::int32_t batch) const {
  if (!config_.use_graphs) return nullptr;
  if (mode == StepMode::kDecode) n = 1;
  if (mode == StepMode::kExtend) n = 0;
  for (const Entry& e : entries_) {  // ascending buckets inside a (mode, N) group
    if (e.key.mode == mode && e.key.tokens_per_request == n && e.key.logits == logits &&
        e.key.bucket >= batch)
      return &e;
  }
  return nullptr;
}

StepPath StepGraphs::step(const StepDesc& desc, cudaStream_t stream) {
  input_.write(desc);
  input_.upload(stream);
  const auto batch = static_cast<std::int32_t>(desc.requests.size());
  if (const Entry* e =
          find_entry(input_.mode(), input_.tokens_per_request(), input_.logit_rows(), batch)) {
    e->graph.launch(stream);
    return StepPath::kGraph;
  }
  // The shape a replay would have (the smallest bucket >= batch, else the capacity): GEMM
  // libraries pick algorithms by row count, so the capacity shape is not bitwise a replay.
  const auto b = std::lower_bound(buckets_.begin(), buckets_.end(), batch);
  const std::int32_t bucket = b != buckets_.end() ? *b : input_.capacity().max_batch;
  std::int32_t n = input_.tokens_per_request();
  if (input_.mode() == StepMode::kDecode) n = 1;
  if (input_.mode() == StepMode::kExtend) n = 0;
  const GraphKey key{input_.mode(), n, input_.logit_rows(), bucket};
  StepShape shape = key_shape(key, input_.capacity());
  // An extend step that no graph could replay (no extend mode captured) runs its own rows, not
  // the capacity's: a prefill chunk of P tokens must not pay for max_tokens rows in every GEMM.
  if (input_.mode() == StepMode::kExtend && !captures_extend()) {
    shape.token_capacity = extend_rows(input_.num_tokens(), shape.token_capacity);
    if (key.logits == LogitRows::kEveryRow)
      shape.logit_capacity = std::min(shape.logit_capacity, shape.token_capacity);
  }
  program_.enqueue(shape, stream);
  return StepPath::kEager;
}

bool StepGraphs::captures_extend() const noexcept {
  return std::any_of(config_.modes.begin(), config_.modes.end(),
                     [](const GraphMode& m) { return m.mode == StepMode::kExtend; });
}

std::size_t StepGraphs::num_nodes() const {
  std::size_t n = 0;
  for (const Entry& e : entries_) n += e.graph.num_nodes();
  return n;
}

}  // namespace graphdecode
