// The replay fuzzer: random step sequences run by graph replay on engine A and eagerly on engine B
// (two identical attention stacks with identical state), compared bitwise, against a float64
// reference on sampled rows, and checked for KV that must not change (live requests outside the
// step, cached prefixes, the reserved padding page). Used by examples/replay_fuzz and the tests.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace graphdecode::fuzz {

struct FuzzOptions {
  std::uint64_t seed = 1;
  std::int64_t steps = 1000;
  std::int32_t max_batch = 32;
  std::int32_t ref_rows = 2;  // rows per step checked against the float64 reference
  bool verbose = false;
  std::ostream* log = nullptr;  // failures (and, verbose, every step) are written here
};

struct FuzzResult {
  std::int64_t steps = 0;
  std::int64_t mismatches = 0;    // steps with any failed check
  std::int64_t graph_steps = 0;   // engine A steps replayed from a graph
  std::int64_t eager_steps = 0;   // engine A steps that fell back to eager
  std::int64_t padded_steps = 0;  // graph steps whose bucket had padding rows
  std::int64_t ref_rows = 0;
  double max_ref_error = 0.0;
  std::size_t graph_memory_bytes = 0;
  std::size_t num_graphs = 0;
  std::string config;  // one line describing the drawn configuration
};

// Runs the fuzz; throws graphdecode::Error on a setup or CUDA failure (not on a mismatch).
FuzzResult run_replay_fuzz(const FuzzOptions& options);

}  // namespace graphdecode::fuzz
