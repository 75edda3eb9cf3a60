// The replay fuzzer's driver (internal to fuzz.cpp and fuzz_checks.cpp): two engines (graph
// replay and eager) over identical step programs, driven by one host book (fuzz_book.h) whose
// ledger is engine A's (its commands go to both), and the checks of every step.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/buffers.h"
#include "common/stream.h"
#include "engine/runtime/step_context.h"
#include "fuzz.h"
#include "fuzz_book.h"
#include "fuzz_config.h"
#include "graphs/step_graphs.h"
#include "spec_stack.h"
#include "stack_reference.h"

namespace graphdecode::fuzz {

struct Engine {
  StepContext step;
  SpecStack program;
  StepGraphs graphs;
  Engine(const SpecStackConfig& c, const StepCapacity& cap, const StepGraphsConfig& g,
         cudaStream_t s)
      : step(cap, ledger_pools(cap, c.target.options)),
        program(c, step, s),
        graphs(step.input(), program, g) {}
};

// What one engine's step left on the device, downloaded.
struct Outputs {
  std::vector<float> target;         // plain: the step's rows; speculative: the verify's
  std::vector<float> draft;          // plain: the step's rows; speculative: the draft-extend's
  std::vector<float> decodes;        // speculative: draft decodes 1 .. k - 1, [j - 1][batch][row]
  std::vector<std::int32_t> drafts;  // speculative: [max(1, k)][max_batch] (SpecStack::drafts)
};

// A KV pool of the step (both models', in step order).
struct StepPool {
  std::int32_t model = 0;
  AttentionKind kind = AttentionKind::kFull;
  std::int32_t page_size = 0;
};

class Fuzzer {
 public:
  explicit Fuzzer(const FuzzOptions& options);
  FuzzResult run();

 private:
  // fuzz.cpp: the steps.
  KvLedger& ledger() { return a_->step.ledger(); }
  static AttentionStack& stack(Engine& e, std::int32_t model) {
    return model == 0 ? e.program.target() : e.program.draft();
  }
  void one_step();
  void churn();
  void run_engines();

  // fuzz_checks.cpp: downloads and checks.
  void fail(const std::string& what);
  void download(const Engine& e, Outputs& out);
  void compare_engines(const std::string& what);
  void check_drafts(const Outputs& out, const std::string& what);
  void checksums(const Engine& e, std::vector<std::vector<std::uint64_t>>& out);
  void check_untouched(const std::vector<std::vector<std::uint64_t>>& before,
                       const std::vector<std::vector<std::uint64_t>>& after,
                       const std::string& what);
  void check_reference(const std::string& what);
  // One reference row of `model` at position tokens.size() - 1; got: the engine A row.
  void reference_row(std::int32_t model, std::span<const std::int32_t> tokens, const Request& r,
                     const float* got, const std::string& what, std::int64_t* phase_rows);

  FuzzOptions opt_;
  std::mt19937_64 rng_;
  SpecStackConfig config_;
  StepGraphsConfig graphs_on_;
  Stream stream_;
  StepCapacity cap_;
  std::unique_ptr<Engine> a_, b_;
  std::vector<StepPool> pools_;
  std::vector<DeviceBuffer<std::uint64_t>> checksum_dev_;  // [pool][num_pages]
  std::vector<std::vector<std::uint64_t>> before_a_, after_a_, before_b_, after_b_;
  StackReference reference_;

  std::unique_ptr<FuzzBook> book_;
  // The step being checked.
  StepPath path_ = StepPath::kEager;
  std::int32_t bucket_ = 0;  // graph steps: the replayed bucket
  Outputs out_a_, out_b_;

  std::int64_t step_ = 0;
  std::int32_t failures_this_step_ = 0;
  FuzzResult result_;
};

}  // namespace graphdecode::fuzz
