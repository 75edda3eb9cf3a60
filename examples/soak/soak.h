// The serving loop's soak: an Engine fed a seeded random stream of requests (prompt and output
// lengths from 1 to the limits, greedy and sampled rows, stop tokens, bad requests interleaved,
// cancellations from outside and from callbacks at random points, a KV pool small enough that
// requests wait), checked after every step against an exact host model:
//   - every submitted request ends exactly once: finished (max_new_tokens or a stop token),
//     cancelled, or refused by submit() with an Error naming the expected field;
//   - no token after a stop token, a finish or a cancel; the finish flag is set exactly when the
//     request's length or a stop token says so; cancelling an ended request is Error("request");
//   - the page ledger equals the host model: per running request the target's KV extent is
//     prompt + delivered - 1 (+ 1 while a pipelined step holding the request's next row is in
//     flight: Engine::pending_plan(), whose rows must start exactly there and never be past the
//     request's length) and its full-pool pages are exactly the pages of that extent; every
//     pool's free + held pages equal its usable pages; the reservations equal the sum of the
//     running requests' needs; at the end every page is free and nothing is reserved.
// The GPU tests run a short soak (tests/engine/test_soak_gpu.cpp); examples/soak runs the long one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace graphdecode::soak {

struct SoakConfig {
  std::uint64_t seed = 1;
  std::int64_t requests = 10000;  // submitted, bad ones included
  std::int32_t max_batch = 16;
  std::int32_t max_context = 160;
  std::int32_t max_step_tokens = 128;
  // Full-pool pages; 0: a third of max_batch requests at max_context, so requests wait.
  std::int32_t kv_pages = 0;
  std::int32_t max_draft_tokens = 0;  // > 0: speculative decoding, the target as its own draft
  bool ngram = false;                 // with max_draft_tokens: prompt lookup instead
  bool eagle = false;                 // with max_draft_tokens: a synthetic EAGLE head instead
  bool eagle3 = false;                // with eagle: an EAGLE-3 head (three target layers) instead
  bool use_graphs = true;
  bool pipeline = false;       // EngineConfig::pipeline: decode step t + 1 launched before t's wait
  double bad_fraction = 0.05;  // of submissions: a bad request (each kind in turn)
  double cancel_fraction = 0.08;  // of requests: cancelled at a random point
  // Longest prompt / output drawn (0: up to max_context - 1); most requests draw short ones.
  std::int32_t max_prompt = 0, max_new = 0;
};

struct SoakReport {
  std::int64_t submitted = 0;  // every submit() call
  std::int64_t refused = 0, finished_by_length = 0, finished_by_stop = 0, cancelled = 0;
  std::int64_t cancelled_from_callbacks = 0, cancel_refusals = 0;  // cancel of an ended id
  std::int64_t steps = 0, tokens = 0, waiting_steps = 0;           // steps with requests waiting
  std::int64_t page_checks = 0;        // per-request and per-pool ledger comparisons
  std::int64_t prefix_hit_tokens = 0;  // prompt tokens served from the prefix cache
  // Pipelining (EngineStats): steps launched ahead, rows computed for requests that had ended.
  std::int64_t pipelined_steps = 0, discarded_rows = 0, pending_rows_checked = 0;
  std::int64_t errors = 0;
  std::vector<std::string> first_errors;  // the first few, verbatim
  double seconds = 0;
  std::string summary() const;
};

SoakReport run_soak(const SoakConfig& config);

}  // namespace graphdecode::soak
