// How the engine runs a planned step on the device. A runner owns the step's device state (step
// context, runtimes, models, program, graphs) and turns a scheduler plan into one image, one
// graph launch (or the eager fallback) and one read-back of the tokens each request committed.
// Two runners: plain decoding (engine/decode_runner.h) and speculative decoding with a draft
// model (engine/spec/spec_runner.h).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "common/error.h"
#include "engine/llama_model.h"
#include "engine/runtime/model_runtime.h"
#include "engine/scheduler.h"
#include "graphs/step_graphs.h"
#include "memory/kv_ledger.h"

namespace graphdecode {

// What one step produced: per planned request, the tokens it committed (0 for a prefill chunk
// that does not end its prompt; 1 for a decode row; up to k + 1 for a speculative row).
struct StepResult {
  std::vector<std::int32_t> counts;  // [planned requests]
  std::vector<std::int32_t> tokens;  // counts[0] tokens of request 0, then request 1's, ...
  StepPath path = StepPath::kGraph;
  std::int32_t drafts = 0;  // draft tokens per request of a speculative step (its k)
  // Device microseconds of a speculative step's phases (engine/spec/spec_step.h SpecPhase);
  // all 0 for other steps.
  std::array<float, 4> phase_us{};
  // Device microseconds of the step, from before its image copy to its tokens' read-back
  // (timing events; runners that time it: DecodeRunner), else 0. Pipelined, a step's copy
  // starts when the step before ends, so this is the device's time per step.
  float device_us = 0;
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // Extends the planned requests in the ledger, writes and runs the step, reads back the
  // committed tokens into `out`. Throws Error on a device-side error flag.
  virtual void run(const StepPlan& plan, const Scheduler& scheduler, StepResult& out) = 0;
  // Pipelined steps (docs/serving_loop.md), for runners whose pipelines() is true: launch()
  // extends the ledger, writes the image and enqueues its copy, the step and the read-back of its
  // tokens, without waiting; collect() waits for the oldest launched step and reads its tokens
  // into `out`. At most two steps are launched and not collected (double-buffered staging);
  // run() == launch() then collect(). collect() throws Error on a device-side error flag.
  virtual bool pipelines() const { return false; }
  virtual void launch(const StepPlan& plan, const Scheduler& scheduler);
  virtual void collect(const StepPlan& plan, StepResult& out);
  // After the scheduler took the result (finished requests are released from the ledger):
  // forget per-request state of the requests that finished.
  virtual void retire(std::span<const TokenEvent> events) { static_cast<void>(events); }
  // Positions a request may hold past prompt + max_new_tokens (the scheduler reserves them).
  virtual std::int32_t reserve_slack() const { return 0; }

  virtual KvLedger& ledger() = 0;
  virtual const StepGraphs& graphs() const = 0;
  virtual const LlamaModel& model() const = 0;  // the target
  // The runtime of model `model` of the step (0 = the target, 1 = a draft or EAGLE head): its
  // KV pools, for tests that read pages.
  virtual const ModelRuntime& runtime(std::int32_t model) const = 0;
};

inline void StepRunner::launch(const StepPlan& plan, const Scheduler& scheduler) {
  static_cast<void>(plan);
  static_cast<void>(scheduler);
  GD_REQUIRE(false, "pipeline", "on", "this step runner does not pipeline steps");
}
inline void StepRunner::collect(const StepPlan& plan, StepResult& out) {
  static_cast<void>(plan);
  static_cast<void>(out);
  GD_REQUIRE(false, "pipeline", "on", "this step runner does not pipeline steps");
}

}  // namespace graphdecode
