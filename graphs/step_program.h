// The step-program contract: what a program does to be captured in CUDA graphs and replayed for
// any batch. Stated once, here; StepGraphs (step_graphs.h) is the one runner.
//
// A step program is the body of one step: the prep kernels, the model(s), sampling, whatever
// else the step does on the device. It is captured once per graph key and replayed many times.
//
//   Prepare for capture (once, before StepGraphs::capture): the program allocates every buffer it
//     will ever touch and binds every device pointer that graphs bake in (page tables to the prep,
//     token feedback, chosen logits rows, workspaces). Nothing is allocated or rebound after.
//   Capture (enqueue(shape) under stream capture, largest bucket of each (mode, N, logits) first):
//     enqueue launches kernels only; every per-step size is read on the device from the prep
//     metadata; the shape fixes grid sizes and nothing else. No host sync, no allocation, no
//     device-to-host read, no host-side branch on step data.
//   Prepare for replay (every step, by StepGraphs::step, the same for every program): the host
//     writes the step image (StepInput::write: requests, token ids, table commands, program aux
//     words), one async copy to the device image, then one graph launch. A program keeps no
//     per-step host state: what a step needs reaches it through the image.
//   Eager fallback: a key that was not captured runs the same enqueue with the capacity shape;
//     every kernel's result per row is independent of the grid, so it equals a replay bitwise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "graphs/step_mode.h"

namespace graphdecode {

// What a graph is captured for: a mode, its tokens per request (decode 1, verify and
// draft-extend-v2 N, extend 0), which rows get logits, and the batch bucket it covers.
struct GraphKey {
  StepMode mode = StepMode::kDecode;
  std::int32_t tokens_per_request = 1;
  LogitRows logits = LogitRows::kLastPerRequest;
  std::int32_t bucket = 0;
};

// The grid sizes one enqueue may bake in. A graph of bucket B covers B requests, token_capacity
// new tokens and logit_capacity logits rows; the eager path uses the shape of the bucket a replay
// would use, except an extend step no graph replays, which runs its own tokens rounded up
// (graphs/step_graphs.h extend_rows). Results must not depend on them beyond the row count a GEMM
// library sees (cuBLAS picks its algorithm, so its summation order, by the row count).
struct StepShape {
  StepMode mode = StepMode::kDecode;  // the key's mode
  std::int32_t bucket = 0;
  std::int32_t token_capacity = 0;
  std::int32_t logit_capacity = 0;
  std::int32_t tokens_per_request = 0;  // the key's N (speculative: k draft tokens)
};

// The attention planners' hint of a step's query tokens (AttentionBatch::query_tokens_hint): an
// extend step's tokens (its prompt chunks), else 0 (decode-sized calls keep 64-row tiles).
inline std::int32_t prompt_tokens_hint(const StepShape& shape) noexcept {
  return shape.mode == StepMode::kExtend ? shape.token_capacity : 0;
}
// The hint of a phase's requests (AttentionBatch::requests_hint) depends on the attention's query
// group too: ModelRuntime::requests_hint(shape).

class StepProgram {
 public:
  virtual ~StepProgram() = default;
  // The step body, capture-safe as above.
  virtual void enqueue(const StepShape& shape, cudaStream_t stream) = 0;
};

}  // namespace graphdecode
