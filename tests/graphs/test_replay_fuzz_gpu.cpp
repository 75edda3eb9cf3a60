// GPU: a short replay fuzz (examples/replay_fuzz's core) as a test: graph replay == eager
// bitwise, float64 reference within tolerance, untouched KV unchanged, for a few seeds. Also
// reports the device memory the captured graphs take.
#include <gtest/gtest.h>

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
    }
    ::testing::Test::RecordProperty("graph_memory_bytes_seed" + std::to_string(seed),
                                    std::to_string(r.graph_memory_bytes));
    std::printf("seed %llu: %zu graphs take %.2f MiB of device memory; max ref error %.3g\n",
                static_cast<unsigned long long>(seed), r.num_graphs,
                r.graph_memory_bytes / 1048576.0, r.max_ref_error);
  }
}

}  // namespace
}  // namespace graphdecode
