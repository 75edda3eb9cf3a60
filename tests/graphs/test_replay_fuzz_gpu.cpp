// GPU: a short replay fuzz (examples/replay_fuzz's core) as a test: graph replay == eager
// bitwise on every phase (plain steps over a target and a draft stack, whole speculative steps:
// draft-extend, draft decodes, verify), the device's draft tokens == the host's, float64
// reference within tolerance on every phase, untouched KV unchanged, for a few seeds. Also
// reports the device memory the captured graphs take.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "fuzz.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

class ReplayFuzzGpu : public testing::GpuTest {};

TEST_F(ReplayFuzzGpu, TwoHundredStepsPerSeedWithoutMismatch) {
  const bool sanitize = std::getenv("GRAPHDECODE_SANITIZE") != nullptr;
  for (std::uint64_t seed : {1ull, 2ull, 3ull}) {
    fuzz::FuzzOptions o;
    o.seed = seed;
    o.steps = sanitize ? 12 : 200;
    o.max_batch = sanitize ? 8 : 32;
    o.ref_rows = sanitize ? 1 : 2;
    std::ostringstream log;
    o.log = &log;
    const fuzz::FuzzResult r = fuzz::run_replay_fuzz(o);
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " " << r.config);
    EXPECT_EQ(r.mismatches, 0) << log.str();
    EXPECT_EQ(r.steps, o.steps);
    EXPECT_GT(r.num_graphs, 0u);
    if (!sanitize) {
      EXPECT_GT(r.graph_steps, 0);
      EXPECT_GT(r.padded_steps, 0);  // buckets larger than the batch: padding rows replayed
      EXPECT_GT(r.eager_steps, 0);   // extend / uncaptured N fall back to eager
      EXPECT_GT(r.ref_rows, 0);
      for (int m = 0; m < kNumStepModes; ++m)
        EXPECT_GT(r.modes[static_cast<std::size_t>(m)].steps, 0) << "mode " << m;
      const fuzz::ModeCounts& spec = r.modes[static_cast<std::size_t>(StepMode::kSpeculative)];
      EXPECT_GT(spec.graph_steps, 0);
      EXPECT_GT(spec.eager_steps, 0);  // uncaptured k
      EXPECT_GT(r.spec.k0_steps, 0);
      EXPECT_GT(r.spec.drafts_checked, 0);
      EXPECT_GT(r.spec.draft_extend_rows, 0);
      EXPECT_GT(r.spec.draft_decode_rows, 0);
      EXPECT_GT(r.spec.verify_rows, 0);
    }
    ::testing::Test::RecordProperty("graph_memory_bytes_seed" + std::to_string(seed),
                                    std::to_string(r.graph_memory_bytes));
    const fuzz::ModeCounts& spec = r.modes[static_cast<std::size_t>(StepMode::kSpeculative)];
    std::printf(
        "seed %llu: %zu graphs take %.2f MiB of device memory; max ref error %.3g; speculative "
        "steps %lld (graph %lld, padded %lld, eager %lld), reference rows %lld\n",
        static_cast<unsigned long long>(seed), r.num_graphs, r.graph_memory_bytes / 1048576.0,
        r.max_ref_error, static_cast<long long>(spec.steps),
        static_cast<long long>(spec.graph_steps), static_cast<long long>(spec.padded_steps),
        static_cast<long long>(spec.eager_steps), static_cast<long long>(spec.ref_rows));
  }
}

}  // namespace
}  // namespace graphdecode
