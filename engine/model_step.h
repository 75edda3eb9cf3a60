// The step program of one model's forward: the step's prep (table commands + metadata), the
// model's attention plans, then its forward up to the logits rows. What StepGraphs captures for
// generation without device sampling (engine/generate.h, tests, benchmarks); the engine's step
// adds sampling on top of it (engine/sampling_step.h).
#pragma once

#include <cuda_runtime.h>

#include "engine/llama_model.h"
#include "engine/runtime/model_runtime.h"
#include "graphs/step_program.h"

namespace graphdecode {

class ModelStep : public StepProgram {
 public:
  // Both must outlive this object.
  ModelStep(ModelRuntime& runtime, LlamaModel& model) : runtime_(runtime), model_(model) {}

  void enqueue(const StepShape& shape, cudaStream_t stream) override {
    runtime_.step().prep().enqueue(stream);
    runtime_.plan(stream, prompt_tokens_hint(shape), runtime_.requests_hint(shape));
    model_.forward(runtime_, shape, stream);
  }

  ModelRuntime& runtime() const noexcept { return runtime_; }
  LlamaModel& model() const noexcept { return model_; }

 private:
  ModelRuntime& runtime_;
  LlamaModel& model_;
};

}  // namespace graphdecode
