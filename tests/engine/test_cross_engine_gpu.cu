// The Engine serving Mllama-style cross-attention requests (small_cross_test_config) with mixed
// encoder lengths (host and device states, arrivals between steps, chunked prefill, pools that
// make requests wait): every token confirmed by the float64 reference, every page returned; bad
// encoder inputs refused by name while others run; sampling and stop tokens as for the other
// families. The model-level checks are in test_cross_gpu.cu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "attention/reference.h"
#include "attention_check.h"  // base_seed / test_rng / seed_note / sanitize_mode
#include "common/buffers.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/engine.h"
#include "engine/weights.h"
#include "engine_checks.h"
#include "llama_reference.h"
#include "support/field_of.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using testing::collect;
using testing::Collected;
using testing::expect_greedy_confirmed;
using testing::field_of;
using testing::random_encoder_states;
using testing::random_prompt;

class CrossGpu : public testing::GpuTest {};

using States = std::vector<std::uint16_t>;

class EngineCross : public CrossGpu, public ::testing::WithParamInterface<bool> {};

// Requests with encoder lengths 0 .. 1100 (host and device states) join and leave between steps
// under chunked prefill, with the self and cross pools too small for all of them at once; every
// token is confirmed by the float64 reference on the request's own states, every decode step
// replays a graph whatever the mix, and every page comes back.
TEST_P(EngineCross, MixedEncoderLengthsServedAndConfirmedByFloat64Reference) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_cross_test_config();
  const HostWeights w = synthetic_weights(config, rng());
  EngineConfig ec;
  ec.max_batch = 4;
  ec.max_step_tokens = 48;  // prompts up to 60 tokens: chunked prefill
  ec.max_context = 96;
  ec.kv_pages = 16;  // 256 tokens: two to four requests at a time
  ec.max_encoder_len = 1100;
  ec.cross_pages = 90;  // 1440 keys: the 1100-long request leaves room for little else
  ec.use_graphs = GetParam();
  Engine engine(w, ec);

  const std::vector<std::int32_t> lengths = {1100, 0, 17, 64, 1, 0, 33, 250, 16, 0, 5, 700};
  const std::size_t n = testing::sanitize_mode() ? 4 : lengths.size();
  std::vector<States> states(n);
  std::vector<std::vector<std::int32_t>> prompts(n);
  std::vector<DeviceBuffer<std::uint16_t>> device_states;
  std::map<RequestId, std::size_t> index;
  std::map<RequestId, std::int32_t> wanted;
  Collected got;
  const auto submit = [&](std::size_t i) {
    states[i] = random_encoder_states(rng, lengths[i], config.hidden_size);
    prompts[i] =
        random_prompt(rng, std::uniform_int_distribution<int>(1, 60)(rng), config.vocab_size);
    if (lengths[i] > 0 && i % 3 == 0) prompts[i][0] = config.vocab_size;  // <|image|> first
    RequestSpec s;
    s.prompt = prompts[i];
    s.max_new_tokens = std::uniform_int_distribution<int>(1, 16)(rng);
    s.encoder = {states[i].empty() ? nullptr : states[i].data(), lengths[i], config.hidden_size,
                 false};
    if (lengths[i] > 0 && i % 2 == 1) {  // device states for every other image request
      device_states.emplace_back(states[i].size());
      device_states.back().upload(states[i].data(), states[i].size(), engine.stream());
      GD_CUDA(cudaStreamSynchronize(engine.stream()));
      s.encoder.data = device_states.back().data();
      s.encoder.on_device = true;
    }
    const std::int32_t max_new = s.max_new_tokens;
    const RequestId id = engine.submit(std::move(s), collect(got));
    index[id] = i;
    wanted[id] = max_new;
  };
  device_states.reserve(n);
  for (std::size_t i = 0; i < n / 2; ++i) submit(i);
  std::size_t next = n / 2;
  std::int32_t most_running = 0;
  while (engine.step() || next < n) {
    if (next < n) submit(next++);  // arrivals between steps
    most_running = std::max(most_running, engine.running());
    ASSERT_LE(engine.running(), ec.max_batch);
  }
  EXPECT_TRUE(engine.idle());
  EXPECT_GE(most_running, 2) << "requests should share steps";
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.finished, static_cast<std::int64_t>(n));
  if (ec.use_graphs) EXPECT_EQ(st.graph_steps, st.decode_steps);  // any mix replays a graph
  for (const auto& [id, i] : index) {
    EXPECT_EQ(got.finished[id], 1) << "request " << id;
    EXPECT_EQ(static_cast<std::int32_t>(got.tokens[id].size()), wanted[id]) << "request " << id;
    expect_greedy_confirmed(
        w, prompts[i], got.tokens[id],
        "request " + std::to_string(id) + " (encoder_len " + std::to_string(lengths[i]) + ")",
        {states[i], lengths[i]});
  }
  for (std::int32_t p = 0; p < engine.ledger().num_pools(); ++p) {
    EXPECT_EQ(engine.ledger().free_pages(p), engine.ledger().usable_pages(p)) << "pool " << p;
    EXPECT_EQ(engine.ledger().reserved_pages(p), 0) << "pool " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(GraphsOnOff, EngineCross, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "graphs" : "eager"; });

// Sampling and stop tokens as for the other families: with encoder states, the same submissions
// give the same tokens run to run, top-k 1 equals greedy, and a stop token ends a request.
// Text before the first image token (transformers' vision flow, e.g. a chat template's header):
// rows before encoder.first_position skip the cross layers' MLP term and keep their attention
// term. Every token is confirmed by the float64 reference under the same rule, graphs on and off,
// and the rule matters: the reference without it moves those requests' first logits.
TEST_P(EngineCross, RowsBeforeTheImageTokenSkipTheCrossMlp) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_cross_test_config();
  const HostWeights w = synthetic_weights(config, rng());
  EngineConfig ec;
  ec.max_batch = 4;
  ec.max_context = 96;
  ec.max_encoder_len = 64;
  ec.use_graphs = GetParam();
  Engine engine(w, ec);
  const std::int32_t image = config.vocab_size;  // the first input id past the text vocabulary
  const std::vector<std::int32_t> firsts = {5, 1, 0, 11};
  const std::vector<std::int32_t> lengths = {17, 40, 9, 64};
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<States> states;
  Collected got;
  std::vector<RequestId> ids;
  for (std::size_t r = 0; r < firsts.size(); ++r) {
    std::vector<std::int32_t> p = random_prompt(rng, firsts[r], config.vocab_size);
    p.push_back(image);
    const std::vector<std::int32_t> tail = random_prompt(rng, 6, config.vocab_size);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
    states.push_back(random_encoder_states(rng, lengths[r], config.hidden_size));
    RequestSpec s;
    s.prompt = p;
    s.max_new_tokens = 12;
    s.encoder = {states.back().data(), lengths[r], config.hidden_size, false, firsts[r]};
    ids.push_back(engine.submit(std::move(s), collect(got)));
  }
  engine.run_until_idle();
  for (std::size_t r = 0; r < firsts.size(); ++r) {
    const testing::ReferenceEncoder enc{states[r], lengths[r], firsts[r]};
    expect_greedy_confirmed(w, prompts[r], got.tokens[ids[r]],
                            "request " + std::to_string(r) + " (first image position " +
                                std::to_string(firsts[r]) + ")",
                            enc);
    if (firsts[r] == 0) continue;
    // The control: at the first (masked) row the rule moves the logits by more than the 3%
    // tolerance the check allows, so a kernel that ignored it would fail the reference check
    // (the synthetic gates are +-[0.5, 1): the MLP term is large).
    const std::vector<std::int32_t> head(prompts[r].begin(), prompts[r].begin() + 1);
    const auto masked = testing::reference_last_logits(w, head, enc);
    const auto open = testing::reference_last_logits(w, head, {states[r], lengths[r], 0});
    double scale = 0, diff = 0;
    for (std::size_t i = 0; i < masked.size(); ++i) {
      scale = std::max(scale, std::abs(masked[i]));
      diff = std::max(diff, std::abs(masked[i] - open[i]));
    }
    EXPECT_GT(diff, 0.03 * scale) << "request " << r << ": the rule changes too little to test";
  }
}

TEST_F(CrossGpu, SamplingIsReproducibleAndStopTokensStopWithEncoderStates) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_cross_test_config();
  const HostWeights w = synthetic_weights(config, rng());
  EngineConfig ec;
  ec.max_batch = 4;
  ec.max_context = 96;
  ec.max_encoder_len = 200;
  ec.deterministic = true;
  const std::vector<std::int32_t> prompt = random_prompt(rng, 21, config.vocab_size);
  const States states = random_encoder_states(rng, 150, config.hidden_size);
  const std::uint64_t seed = rng();
  // The three requests; the greedy one (only) stops at `greedy_stop`, so the batches before its
  // stop are those of a run without it: the GEMMs are not batch-invariant, and a request that left
  // earlier would change the rows of the greedy one's steps (test_engine_gpu.cu's sampling test
  // flaked that way at a near tie).
  const auto run = [&](std::vector<std::vector<std::int32_t>>& out,
                       std::vector<std::int32_t> greedy_stop) {
    Engine engine(w, ec);
    Collected got;
    std::vector<RequestId> ids;
    for (const SamplingParams sp : {SamplingParams{}, SamplingParams{1.0f, 1, 1.0f, seed},
                                    SamplingParams{0.9f, 0, 0.9f, seed}}) {
      RequestSpec s;
      s.prompt = prompt;
      s.max_new_tokens = 24;
      s.sampling = sp;
      if (ids.empty()) s.stop_tokens = greedy_stop;
      s.encoder = {states.data(), 150, config.hidden_size, false};
      ids.push_back(engine.submit(std::move(s), collect(got)));
    }
    engine.run_until_idle();
    out.clear();
    for (RequestId id : ids) out.push_back(got.tokens[id]);
  };
  std::vector<std::vector<std::int32_t>> a, b, stopped;
  run(a, {});
  run(b, {});
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a, b) << "same submissions, same seeds: same tokens";
  EXPECT_EQ(a[1], a[0]) << "top-k 1 must pick the greedy token";
  expect_greedy_confirmed(w, prompt, a[0], "greedy request", {states, 150});
  run(stopped, {a[0][5]});
  const auto stop_at = std::find(a[0].begin(), a[0].end(), a[0][5]) - a[0].begin();
  EXPECT_EQ(stopped[0], std::vector<std::int32_t>(a[0].begin(), a[0].begin() + stop_at + 1));
}

// Encoder states of the wrong width, longer than the maximum, flagged as device memory while on
// the host, or given to a model without cross layers: an Error naming the field, nothing queued;
// the requests before and after are served. A cross model without max_encoder_len, or with
// speculative decoding, is refused at construction.
TEST_F(CrossGpu, BadEncoderInputsAreRefusedByNameAndOthersKeepServing) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_cross_test_config();
  const HostWeights w = synthetic_weights(config, rng());
  EngineConfig ec;
  ec.max_batch = 4;
  ec.max_context = 64;
  ec.max_encoder_len = 40;
  Engine engine(w, ec);
  Collected got;
  const States ok_states = random_encoder_states(rng, 40, config.hidden_size);
  const auto spec = [&](std::int32_t len) {
    RequestSpec s;
    s.prompt = random_prompt(rng, 10, config.vocab_size);
    s.max_new_tokens = 6;
    s.encoder = {len > 0 ? ok_states.data() : nullptr, len, config.hidden_size, false};
    return s;
  };
  const RequestId before = engine.submit(spec(30), collect(got));
  ASSERT_TRUE(engine.step());  // `before` is running when the bad requests arrive
  RequestSpec bad = spec(20);
  bad.encoder.width = config.hidden_size / 2;
  EXPECT_EQ(field_of([&] { engine.submit(bad); }), "encoder.width");
  EXPECT_EQ(field_of([&] { engine.submit(spec(41)); }), "encoder.length");
  bad = spec(20);
  bad.encoder.on_device = true;  // a host pointer
  EXPECT_EQ(field_of([&] { engine.submit(bad); }), "encoder.data");
  bad = spec(20);
  bad.encoder.data = nullptr;
  EXPECT_EQ(field_of([&] { engine.submit(bad); }), "encoder.data");
  EXPECT_EQ(engine.waiting(), 0);
  const RequestId after = engine.submit(spec(0), collect(got));
  engine.run_until_idle();
  EXPECT_EQ(got.tokens[before].size(), 6u);
  EXPECT_EQ(got.tokens[after].size(), 6u);
  EXPECT_EQ(engine.stats().finished, 2);

  // A model without cross layers refuses encoder states.
  const HostWeights plain = synthetic_weights(small_test_config(), 5);
  Engine text(plain, EngineConfig{.max_batch = 2, .max_context = 64});
  RequestSpec s;
  s.prompt = {1, 2, 3};
  s.encoder = {ok_states.data(), 4, config.hidden_size, false};
  EXPECT_EQ(field_of([&] { text.submit(s); }), "encoder");
  // Construction: max_encoder_len missing; speculative decoding of a cross model.
  EXPECT_EQ(field_of([&] { Engine e(w, EngineConfig{.max_batch = 2, .max_context = 64}); }),
            "max_encoder_len");
  EngineConfig spec_ec = ec;
  spec_ec.speculative.max_draft_tokens = 2;
  spec_ec.speculative.proposer = SpecProposer::kNgram;
  EXPECT_EQ(field_of([&] { Engine e(w, spec_ec); }), "speculative.max_draft_tokens");
}

}  // namespace
}  // namespace graphdecode
