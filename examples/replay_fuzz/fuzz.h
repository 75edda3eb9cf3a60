// The replay fuzzer: random step sequences run by graph replay on engine A and eagerly on engine B
// (two identical step programs with identical state: a target and a draft synthetic attention
// stack on one StepContext, spec_stack.h), compared bitwise, against a float64 reference on
// sampled rows, and checked for KV that must not change (live requests outside the step, each
// model's cached prefix, the reserved padding page). Plain steps (decode, target-verify,
// draft-extend-v2, extend) run both stacks over the same rows; speculative steps run the whole
// chain (draft-extend, draft decodes, verify) with acceptance drawn by the fuzzer and rollback
// through the speculative book (engine/spec/spec_book.h). Used by examples/replay_fuzz and the
// tests.
#pragma once

#include <array>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "graphs/step_mode.h"

namespace graphdecode::fuzz {

struct FuzzOptions {
  std::uint64_t seed = 1;
  std::int64_t steps = 1000;
  std::int32_t max_batch = 32;
  std::int32_t ref_rows = 2;       // rows per step checked against the float64 reference
  std::int32_t spec_percent = 40;  // share of speculative steps (0: none, no request speculates)
  bool verbose = false;
  std::ostream* log = nullptr;  // failures (and, verbose, every step) are written here
};

// Counts of the steps of one StepMode.
struct ModeCounts {
  std::int64_t steps = 0;
  std::int64_t mismatches = 0;    // steps with any failed check
  std::int64_t graph_steps = 0;   // engine A steps replayed from a graph
  std::int64_t eager_steps = 0;   // engine A steps that fell back to eager
  std::int64_t padded_steps = 0;  // graph steps whose bucket had padding rows
  std::int64_t ref_rows = 0;      // rows checked against the float64 reference (every phase)
  double max_ref_error = 0.0;
};

// What the speculative steps did, per phase.
struct SpecCounts {
  std::int64_t k0_steps = 0;           // steps of k = 0 (a verify of the last committed token)
  std::int64_t requests = 0;           // request rows over all speculative steps
  std::int64_t draft_decodes = 0;      // draft decode phases run (k - 1 per step)
  std::int64_t drafted = 0;            // drafts proposed (k per request row)
  std::int64_t accepted = 0;           // drafts the fuzzer accepted
  std::int64_t drafts_checked = 0;     // device draft tokens compared with the host's
  std::int64_t draft_extend_rows = 0;  // reference rows per phase
  std::int64_t draft_decode_rows = 0;
  std::int64_t verify_rows = 0;
};

struct FuzzResult {
  std::int64_t steps = 0;
  std::int64_t mismatches = 0;    // steps with any failed check
  std::int64_t graph_steps = 0;   // engine A steps replayed from a graph
  std::int64_t eager_steps = 0;   // engine A steps that fell back to eager
  std::int64_t padded_steps = 0;  // graph steps whose bucket had padding rows
  std::int64_t ref_rows = 0;
  double max_ref_error = 0.0;
  std::array<ModeCounts, kNumStepModes> modes{};  // index: StepMode
  SpecCounts spec;
  std::size_t graph_memory_bytes = 0;
  std::size_t num_graphs = 0;
  std::string config;  // one line describing the drawn configuration
};

// Runs the fuzz; throws graphdecode::Error on a setup or CUDA failure (not on a mismatch).
FuzzResult run_replay_fuzz(const FuzzOptions& options);

}  // namespace graphdecode::fuzz
