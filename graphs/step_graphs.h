// CUDA graphs of whole steps, keyed by (mode, tokens per request, logits rows, batch bucket):
// the runner of the step-program contract (graphs/step_program.h).
//
//   * capture(): once, after the program allocated and bound everything. For every captured
//     (mode, N, logits) and every bucket, LARGEST bucket first, the program's enqueue(shape) is
//     captured into one CudaGraph (which ends the capture on every error path).
//   * step(desc): StepInput::write(desc) (host validation + fill of the pinned image), ONE async
//     copy of the image, then ONE cudaGraphLaunch of the smallest captured bucket >= batch size of
//     the step's key. Rows past the batch are padding; the prep kernels make them inert.
//   * Eager fallback: a batch larger than the largest bucket, a key that was not captured, or
//     graphs switched off (use_graphs = false, e.g. for debugging) runs the SAME enqueue eagerly
//     with the shape of the bucket a replay would use (GEMM libraries choose algorithms by row
//     count), bitwise equal to a replay.
// Nothing on the step path allocates or synchronises the host (StepInput::write may wait for the
// copy issued two steps earlier, see step_input.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "graphs/cuda_graph.h"
#include "graphs/step_input.h"
#include "graphs/step_program.h"

namespace graphdecode {

// 1, 2, 4, 8, 16, 24, 32, 48, 64, then steps of 32 up to 256 and 64 beyond, always ending with
// max_batch itself.
std::vector<std::int32_t> default_buckets(std::int32_t max_batch);

// The shape a graph of `key` bakes in: new tokens decode bucket, verify / draft-extend-v2
// bucket * N, extend max_tokens (never more than max_tokens); logits rows bucket, or one per
// token for kEveryRow (never more than max_logit_rows).
StepShape key_shape(const GraphKey& key, const StepCapacity& capacity);

// The rows an eager extend step of `tokens` new tokens runs through the layers when no extend
// graph is captured: `tokens` rounded up to a multiple of kExtendRowGranule (so the GEMM library
// sees few distinct row counts), never more than `max_tokens`.
inline constexpr std::int32_t kExtendRowGranule = 64;
std::int32_t extend_rows(std::int32_t tokens, std::int32_t max_tokens) noexcept;

// One family of graphs: a mode, N and logits rows, captured for every bucket.
struct GraphMode {
  StepMode mode = StepMode::kDecode;
  std::int32_t tokens_per_request = 1;  // decode 1 (forced), extend 0 (forced), else N >= 1
  LogitRows logits = LogitRows::kLastPerRequest;
};

struct StepGraphsConfig {
  std::vector<std::int32_t> buckets;  // ascending; empty = default_buckets(max_batch)
  std::vector<GraphMode> modes;       // empty = decode only
  bool use_graphs = true;             // false: every step runs eagerly (debugging)
};

enum class StepPath : std::uint8_t { kGraph = 0, kEager = 1 };

class StepGraphs {
 public:
  // `input` and `program` must outlive this object. Validates the config (Error names the field).
  StepGraphs(StepInput& input, StepProgram& program, StepGraphsConfig config);
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Captures every key on `stream` (largest bucket first). Measures the device memory the
  // graphs take (cudaMemGetInfo before and after). Does nothing when use_graphs is false.
  void capture(cudaStream_t stream);

  // write + one copy + one graph launch (or the eager fallback). Returns the path taken.
  StepPath step(const StepDesc& desc, cudaStream_t stream);
  // The graph that step() would replay for (mode, N, logits, batch), or nullptr (eager).
  const GraphKey* find(StepMode mode, std::int32_t tokens_per_request, std::int32_t batch,
                       LogitRows logits = LogitRows::kLastPerRequest) const;

  std::size_t num_graphs() const noexcept { return entries_.size(); }
  std::size_t num_nodes() const;  // over all graphs
  // Device memory taken by capture() (bytes, from cudaMemGetInfo; 0 before capture).
  std::size_t graph_memory_bytes() const noexcept { return graph_memory_; }
  const std::vector<std::int32_t>& buckets() const noexcept { return buckets_; }
  bool use_graphs() const noexcept { return config_.use_graphs; }
  void set_use_graphs(bool on) noexcept { config_.use_graphs = on; }

 private:
  struct Entry {
    GraphKey key;
    CudaGraph graph;
  };
  const Entry* find_entry(StepMode mode, std::int32_t n, LogitRows logits,
                          std::int32_t batch) const;
  bool captures_extend() const noexcept;  // an extend mode among config_.modes

  StepInput& input_;
  StepProgram& program_;
  StepGraphsConfig config_;
  std::vector<std::int32_t> buckets_;
  std::vector<Entry> entries_;  // grouped by (mode, N, logits), buckets ascending in a group
  std::size_t graph_memory_ = 0;
};

}  // namespace graphdecode
