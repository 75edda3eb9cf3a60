// GPU: cross-attention vs the float64 reference — a different encoder length per request (1, not
// multiples of the page size, long), non-causal, every query sees all of its encoder keys; the
// window (if passed) is ignored; split-KV at small batch.
#include <gtest/gtest.h>

#include <vector>

#include "attention_check.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;

class AttentionCross : public GpuTest {};

constexpr auto kBF16 = DType::kBF16;
constexpr auto kFP16 = DType::kFP16;
constexpr auto kCross = AttentionMode::kCross;

// Encoder lengths 1..5000 mixing odd sizes, page multiples and near-multiples; q_len 1..max_q.
std::vector<Req> cross_reqs(Rng& rng, std::int32_t batch, std::int32_t max_q) {
  const std::int32_t fixed[] = {1, 2, 15, 16, 17, 64, 100, 577, 1000, 1024, 4097, 5000};
  std::uniform_int_distribution<std::int32_t> enc(1, 5000), ql(1, max_q);
  std::vector<Req> reqs;
  for (std::int32_t r = 0; r < batch; ++r) {
    const std::int32_t len = r < 12 ? fixed[r] : enc(rng);
    reqs.push_back(Req{ql(rng), len});
  }
  std::shuffle(reqs.begin(), reqs.end(), rng);
  return reqs;
}

TEST_F(AttentionCross, DecodeDifferentEncoderLengths) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  EXPECT_TRUE(run_case({32, 8, 128, 16, kBF16, kCross}, cross_reqs(rng, 20, 1), {}, rng));
  EXPECT_TRUE(run_case({8, 8, 64, 1, kFP16, kCross}, cross_reqs(rng, 14, 1), {}, rng));
  EXPECT_TRUE(run_case({16, 2, 256, 64, kBF16, kCross}, cross_reqs(rng, 12, 1), {}, rng));
  EXPECT_TRUE(run_case({28, 4, 128, 16, kFP16, kCross}, cross_reqs(rng, 40, 1), {}, rng));
}

TEST_F(AttentionCross, SeveralQueriesPerRequest) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  EXPECT_TRUE(run_case({32, 8, 128, 16, kBF16, kCross}, cross_reqs(rng, 12, 8), {}, rng));
  EXPECT_TRUE(run_case({8, 1, 64, 64, kFP16, kCross}, cross_reqs(rng, 12, 200), {}, rng));
  // More queries than encoder keys, and a prefill-sized query block.
  EXPECT_TRUE(run_case({8, 2, 128, 16, kBF16, kCross}, {{300, 1}, {1000, 577}, {17, 16}}, {}, rng));
}

TEST_F(AttentionCross, IgnoresTheWindow) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  for (std::int32_t window : {0, 3, 16}) {
    CaseOptions o;
    o.fill.window_left = window;  // passed through AttentionBatch::window_left; must be ignored
    EXPECT_TRUE(run_case({32, 8, 128, 16, kBF16, kCross}, cross_reqs(rng, 12, 4), o, rng));
  }
}

TEST_F(AttentionCross, SplitKvSmallBatchLongEncoder) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  EXPECT_TRUE(run_case({32, 8, 128, 16, kBF16, kCross}, {{1, 32768}}, {}, rng));
  EXPECT_TRUE(run_case({32, 8, 128, 16, kFP16, kCross}, {{4, 20000}, {1, 3}}, {}, rng));
}

// An encoder length of 0: every row of that request sees no key (out = 0, lse = -inf).
TEST_F(AttentionCross, EmptyEncoder) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  EXPECT_TRUE(
      run_case({32, 8, 128, 16, kBF16, kCross}, {{1, 100}, {2, 0}, {1, 17}, {3, 0}}, {}, rng));
}

}  // namespace
}  // namespace graphdecode
