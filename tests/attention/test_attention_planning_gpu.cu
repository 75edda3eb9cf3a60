// GPU: the two ways a launch gets its work plan give the same plan. For max_batch <= 128, run()
// launches the attention kernel alone and every CTA plans the batch itself; plan() +
// run_planned() (what a model does once per step) use the one-block planner kernel. On the same
// batch both must give bitwise identical out and lse (same chunking, same merge order), and
// match the float64 reference: decode, extend, sliding window, cross, adaptive and deterministic
// split-KV, batches of 1 to 128 requests (the self-planning limit, at exactly that capacity).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "attention_check.h"
#include "common/stream.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;

class AttentionPlanning : public GpuTest, public ::testing::WithParamInterface<bool> {};

struct PlanCase {
  Shape shape;
  std::vector<Req> reqs;
  std::int32_t window = -1;
  std::int32_t max_batch = 0;  // 0: capacity_for's choice
};

// The two ways to plan one call on `dev`: run() (self-planned: every CTA plans the batch, as
// max_batch <= 128 here) and plan() + run_planned(), each on poisoned outputs.
struct BothPlans {
  Outputs self_planned;
  Outputs planned;
};

BothPlans run_both_planners(const PagedAttention& attn, DevicePagedBatch& dev, std::int32_t total_q,
                            cudaStream_t stream) {
  BothPlans r;
  r.self_planned = run_eager(attn, dev, total_q, stream);
  dev.poison_outputs(stream);
  attn.plan(dev.batch(), stream);
  attn.run_planned(dev.batch(), dev.view(), dev.q(), dev.out(), dev.lse(), stream);
  r.planned.out = dev.download_out(total_q, stream);
  r.planned.lse = dev.download_lse(total_q, stream);
  return r;
}

void check_same_plan(const PlanCase& c, bool deterministic, Rng& rng) {
  std::vector<Req> reqs = shrink_for_sanitizer(c.reqs, c.shape.mode, 128);
  Capacity cap = capacity_for(c.shape, reqs, rng);
  if (c.max_batch > 0) cap.max_batch = c.max_batch;
  ASSERT_LE(cap.max_batch, 128) << "test bug: run() would not self-plan";
  HostPagedBatch host(c.shape, cap);
  host.fill(reqs, FillOptions{c.window, c.window >= 0}, rng);
  Stream stream;
  DevicePagedBatch dev(c.shape, cap);
  dev.upload(host, stream);
  const PagedAttention attn(host.config(deterministic, deterministic ? 128 : 0));
  const auto [self_planned, planned] = run_both_planners(attn, dev, host.total_q(), stream);

  CaseOptions o;
  o.fill.window_left = c.window;
  o.deterministic = deterministic;
  const std::string what =
      describe(c.shape, reqs, o) + ", max_batch " + std::to_string(cap.max_batch);
  EXPECT_TRUE(bitwise_equal(self_planned, 0, planned, 0, host.total_q(),
                            c.shape.num_q_heads * c.shape.head_dim, c.shape.num_q_heads))
      << "self-planned run() != plan() + run_planned(), " << what;
  EXPECT_TRUE(
      matches_reference(host.reference(), self_planned.out, &self_planned.lse, c.shape.dtype))
      << "self-planned run() vs reference, " << what;
}

constexpr Shape kLlama{32, 8, 128, 16, DType::kBF16, AttentionMode::kCausal};

TEST_P(AttentionPlanning, DecodeBatchSizes) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  check_same_plan({kLlama, {{1, 2048}}}, GetParam(), rng);  // one request: fine chunks
  check_same_plan({kLlama, {{1, 1}}}, GetParam(), rng);     // one key
  check_same_plan({kLlama, decode_reqs(rng, 7, 1, 9000)}, GetParam(), rng);
  check_same_plan({kLlama, decode_reqs(rng, 128, 1, 3000), -1, 128}, GetParam(), rng);
  check_same_plan({{28, 4, 64, 1, DType::kFP16, AttentionMode::kCausal},  // group 7, page 1
                   decode_reqs(rng, 33, 1, 2000)},
                  GetParam(), rng);
}

TEST_P(AttentionPlanning, ExtendAndSlidingWindow) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  check_same_plan({kLlama, extend_reqs(rng, 9, 1, 300, 0, 4000)}, GetParam(), rng);
  // One request of several query tiles (planned by its thread alone at head dim >= 128).
  check_same_plan({kLlama, extend_reqs(rng, 1, 40, 200, 0, 6000), 300}, GetParam(), rng);
  check_same_plan({kLlama, extend_reqs(rng, 16, 1, 8, 0, 6000), 100}, GetParam(), rng);
  auto mixed = extend_reqs(rng, 60, 1, 6, 0, 3000);
  for (const Req& r : decode_reqs(rng, 68, 1, 3000)) mixed.push_back(r);
  check_same_plan({kLlama, mixed, 700, 128}, GetParam(), rng);  // verify + decode, window
  check_same_plan({{16, 2, 256, 64, DType::kBF16, AttentionMode::kCausal},
                   extend_reqs(rng, 3, 20, 90, 0, 5000),
                   63},
                  GetParam(), rng);
}

TEST_P(AttentionPlanning, CrossEncoderLengths) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  const Shape cross{32, 8, 128, 16, DType::kFP16, AttentionMode::kCross};
  std::uniform_int_distribution<std::int32_t> enc(1, 5000), q(1, 4);
  std::vector<Req> reqs;
  for (int i = 0; i < 40; ++i) reqs.push_back(Req{q(rng), enc(rng)});
  check_same_plan({cross, reqs}, GetParam(), rng);
  check_same_plan({cross, {{1, 20000}}}, GetParam(), rng);
}

// Adaptive mode past one wave of resident CTAs (requests x KV heads >= target_ctas): the wave
// split cuts requests into chunks of >= min_keys keys where that fills the last wave better. Both
// planners agree bitwise, the outputs match the reference, and the plan did split (or, with the
// split off, did not).
class AttentionWaveSplit : public GpuTest {};

void check_wave_split(const Shape& shape, std::int32_t min_ctx, std::int32_t max_ctx,
                      std::int32_t window, std::int32_t chunks, std::int32_t min_keys, Rng& rng) {
  AttentionConfig probe;
  probe.num_q_heads = shape.num_q_heads;
  probe.num_kv_heads = shape.num_kv_heads;
  probe.head_dim = shape.head_dim;
  probe.dtype = shape.dtype;
  probe.max_batch = 1;
  probe.max_q_tokens = 1;
  probe.max_kv_len = 64;
  const std::int32_t target = PagedAttention(probe).target_ctas();
  // 1.25 waves of unsplit items: a last round of a quarter wave, which the rule cuts away.
  const std::int32_t batch = (target * 5 / 4) / shape.num_kv_heads + 1;
  ASSERT_LE(batch, 128) << "test bug: run() would not self-plan (target_ctas " << target << ")";
  std::vector<Req> reqs =
      shrink_for_sanitizer(decode_reqs(rng, batch, min_ctx, max_ctx), shape.mode, 128);
  Capacity cap = capacity_for(shape, reqs, rng);
  cap.max_batch = 128;
  HostPagedBatch host(shape, cap);
  host.fill(reqs, FillOptions{window, window >= 0}, rng);
  Stream stream;
  DevicePagedBatch dev(shape, cap);
  dev.upload(host, stream);
  AttentionConfig config = host.config();
  config.wave_split_chunks = chunks;
  config.wave_split_min_keys = min_keys;
  const PagedAttention attn(config);
  const auto [self_planned, planned] = run_both_planners(attn, dev, host.total_q(), stream);
  const std::vector<std::int32_t> got =
      attn.planned_chunks(static_cast<std::int32_t>(reqs.size()), stream);

  CaseOptions o;
  o.fill.window_left = window;
  const std::string what = describe(shape, reqs, o) + ", wave split " + std::to_string(chunks) +
                           " x >= " + std::to_string(min_keys) + " keys, target_ctas " +
                           std::to_string(target);
  std::int32_t split = 0, most = 0;
  for (const std::int32_t c : got) {
    split += c > 1;
    most = std::max(most, c);
  }
  if (chunks == 1) {
    EXPECT_EQ(most, 1) << "the split is off, yet a request was cut, " << what;
  } else {
    EXPECT_GT(split, 0) << "no request was cut, " << what;
    EXPECT_LE(most, chunks + 1) << what;  // anchored chunking adds one at most
  }
  EXPECT_TRUE(bitwise_equal(self_planned, 0, planned, 0, host.total_q(),
                            shape.num_q_heads * shape.head_dim, shape.num_q_heads))
      << "self-planned run() != plan() + run_planned(), " << what;
  EXPECT_TRUE(matches_reference(host.reference(), planned.out, &planned.lse, shape.dtype))
      << "plan() + run_planned() vs reference, " << what;
}

constexpr Shape kLlama1B{32, 8, 64, 16, DType::kBF16, AttentionMode::kCausal};

TEST_F(AttentionWaveSplit, DecodePastOneWave) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  check_wave_split(kLlama1B, 2048, 4096, -1, 3, 1024, rng);    // the default rule
  check_wave_split(kLlama1B, 2048, 4096, -1, 1, 1024, rng);    // off
  check_wave_split(kLlama1B, 300, 1500, -1, 2, 64, rng);       // short chunks (16-row layout)
  check_wave_split(kLlama1B, 2600, 4096, 2500, 3, 1024, rng);  // window: anchored extra chunk
  // d128, 2 CTAs per SM; fp16, group 7, page 1.
  check_wave_split({32, 8, 128, 16, DType::kBF16, AttentionMode::kCausal}, 1024, 3000, -1, 4, 256,
                   rng);
  check_wave_split({28, 4, 64, 1, DType::kFP16, AttentionMode::kCausal}, 1000, 2500, 700, 2, 128,
                   rng);
}

INSTANTIATE_TEST_SUITE_P(Split, AttentionPlanning, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Deterministic" : "Default";
                         });

}  // namespace
}  // namespace graphdecode
