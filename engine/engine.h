// The decode engine: what a program embeds.
//
//   graphdecode::Engine engine(weights, {.max_batch = 32, .max_context = 4096});
//   engine.submit({.prompt = ids, .max_new_tokens = 64},
//                 [](const graphdecode::TokenEvent& e) { /* stream e.token */ });
//   engine.run_until_idle();            // or call step() from your own loop
//   std::printf("%.1f tok/s\n", engine.stats().tokens_per_s());
//
// One step: Scheduler (admission by reservation in the page ledger, chunked prefill, decode) ->
// the ledger extends the planned requests (page-table commands across the model's pools) ->
// StepGraphs::step (host writes the step image: requests, token ids, table commands, sampling
// parameters; ONE copy; ONE graph launch or the eager fallback) -> in the graph: prep, model,
// device sampling, tokens published to a per-slot feedback buffer (decode rows of the next step
// read their input token there) and to a small output array -> ONE D2H copy of that array ->
// Scheduler::on_step_done (stop tokens, max_new_tokens; finished requests' slots and pages
// released in the ledger) -> callbacks.
//
// Bad input (empty prompt, unknown token id, prompt + max_new_tokens beyond max_context, a request
// that could never fit the KV pool, bad sampling parameters) is refused by submit() with an Error
// naming the field; nothing already submitted is affected. When the KV pool is full, requests
// wait in FIFO order; none is dropped.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/buffers.h"
#include "common/stream.h"
#include "engine/llama_model.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/step_context.h"
#include "engine/sampling_step.h"
#include "engine/scheduler.h"
#include "engine/weights.h"
#include "graphs/step_graphs.h"
#include "graphs/step_input.h"

namespace graphdecode {

struct EngineConfig {
  std::int32_t max_batch = 32;         // requests running at once (one step holds them all)
  std::int32_t max_step_tokens = 512;  // new tokens per prefill step (chunked prefill budget)
  std::int32_t max_context = 4096;     // prompt + generated tokens of one request
  std::int32_t kv_pages = 0;           // full-attention pool pages; 0: max_batch * max_context
  std::int32_t sliding_pages = 0;      // sliding-window pool pages; 0: max_batch at the window
  std::int32_t page_size = 16;
  bool use_graphs = true;      // decode steps by graph replay (false: eager, same kernels)
  bool deterministic = false;  // batch-invariant attention split-KV
};

using TokenCallback = std::function<void(const TokenEvent&)>;

struct EngineStats {
  std::int64_t steps = 0, prefill_steps = 0, decode_steps = 0;
  std::int64_t graph_steps = 0, eager_steps = 0;
  std::int64_t prompt_tokens = 0;     // prefilled
  std::int64_t generated_tokens = 0;  // sampled and delivered
  std::int64_t finished = 0;
  double busy_s = 0;  // wall time inside step(), host + device
  // Wall time of decode steps (host write + copy + launch + device + token read), microseconds,
  // over the last kLatencyWindow decode steps.
  double decode_p50_us = 0, decode_p90_us = 0, decode_p99_us = 0;
  double tokens_per_s() const { return busy_s > 0 ? generated_tokens / busy_s : 0.0; }
};

class Engine {
 public:
  static constexpr std::size_t kLatencyWindow = 4096;

  // Uploads the weights, allocates every buffer, captures the decode graphs. Throws Error for an
  // unsupported model config or engine config (naming the field), or on a CUDA failure.
  Engine(const HostWeights& weights, const EngineConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request; `on_token` is called from step() for each generated token (the last one
  // with finished = true). Throws Error (changing nothing) on bad input.
  RequestId submit(RequestSpec spec, TokenCallback on_token = {});
  // Runs one step. Returns false when there was nothing to do.
  bool step();
  void run_until_idle();

  bool idle() const noexcept { return scheduler_->idle(); }
  std::int32_t waiting() const noexcept { return scheduler_->waiting(); }
  std::int32_t running() const noexcept { return scheduler_->running(); }
  EngineStats stats() const;
  const EngineConfig& config() const noexcept { return config_; }
  const LlamaModel& model() const noexcept { return *model_; }
  const StepGraphs& graphs() const noexcept { return *graphs_; }
  const KvLedger& ledger() const noexcept { return step_->ledger(); }
  cudaStream_t stream() const noexcept { return stream_; }

 private:
  void build_step();
  void finish_step(double step_us);

  EngineConfig config_;
  Stream stream_;
  std::unique_ptr<StepContext> step_;
  std::unique_ptr<ModelRuntime> runtime_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<SamplingStep> program_;
  std::unique_ptr<StepGraphs> graphs_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unordered_map<RequestId, TokenCallback> callbacks_;

  // Per-step host staging, sized at start-up.
  StepPlan plan_;
  std::vector<StepRequest> requests_;
  std::vector<std::int32_t> token_ids_;
  std::vector<std::int32_t> aux_;
  std::vector<std::int32_t> sampled_;
  std::vector<TokenEvent> events_;
  PinnedBuffer<std::int32_t> published_;  // [max_logit_rows + 1]
  Event copied_{cudaEventDisableTiming};

  EngineStats stats_;
  std::vector<double> decode_us_;  // ring of kLatencyWindow
  std::size_t decode_next_ = 0;
};

}  // namespace graphdecode
