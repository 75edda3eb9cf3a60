// The Engine on the device: continuous batching (requests join and leave, chunked prefill, a KV
// pool too small for all requests at once) produces, for every request, greedy tokens that the
// float64 CPU reference confirms position by position; sampling is reproducible and top-k 1 is
// greedy; stop tokens end a request; bad requests are refused by name while the others are served.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attention/reference.h"
#include "attention_check.h"  // base_seed / test_rng / seed_note / sanitize_mode
#include "common/error.h"
#include "engine/engine.h"
#include "engine/model_config.h"
#include "engine/weights.h"
#include "engine_checks.h"
#include "llama_reference.h"
#include "support/field_of.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

class EngineGpu : public testing::GpuTest {};

using testing::collect;
using testing::Collected;
using testing::expect_greedy_confirmed;
using testing::field_of;
using testing::random_prompt;

class EngineContinuousBatching : public EngineGpu, public ::testing::WithParamInterface<bool> {};

TEST_P(EngineContinuousBatching, GreedyTokensConfirmedByFloat64Reference) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_test_config();  // full + sliding (window 32) layers
  const HostWeights w = synthetic_weights(config, rng());
  EngineConfig ec;
  ec.max_batch = 4;
  ec.max_step_tokens = 48;  // prompts up to 90 tokens: chunked prefill
  ec.max_context = 128;
  ec.kv_pages = 20;  // 320 tokens: two or three requests at a time, the others wait
  ec.use_graphs = GetParam();
  Engine engine(w, ec);

  const int n = testing::sanitize_mode() ? 4 : 14;
  Collected got;
  std::map<RequestId, std::vector<std::int32_t>> prompts;
  std::map<RequestId, std::int32_t> wanted;
  for (int r = 0; r < n; ++r) {
    RequestSpec s;
    s.prompt =
        random_prompt(rng, std::uniform_int_distribution<int>(1, 90)(rng), config.vocab_size);
    s.max_new_tokens = std::uniform_int_distribution<int>(1, 24)(rng);
    const std::vector<std::int32_t> prompt = s.prompt;
    const std::int32_t max_new = s.max_new_tokens;
    const RequestId id = engine.submit(std::move(s), collect(got));
    prompts[id] = prompt;
    wanted[id] = max_new;
  }
  std::int32_t most_running = 0;
  while (engine.step()) {
    most_running = std::max(most_running, engine.running());
    ASSERT_LE(engine.running(), ec.max_batch);
  }
  EXPECT_TRUE(engine.idle());
  EXPECT_GE(most_running, 2) << "requests should share steps";

  const EngineStats st = engine.stats();
  EXPECT_EQ(st.finished, n);
  EXPECT_GT(st.decode_steps, 0);
  EXPECT_GT(st.prefill_steps, 0);
  if (ec.use_graphs) {
    EXPECT_EQ(st.graph_steps, st.decode_steps);  // every decode step replays a graph
  } else {
    EXPECT_EQ(st.graph_steps, 0);
  }
  std::int64_t generated = 0;
  for (const auto& [id, prompt] : prompts) {
    const auto& toks = got.tokens[id];
    generated += static_cast<std::int64_t>(toks.size());
    EXPECT_EQ(static_cast<std::int32_t>(toks.size()), wanted[id]) << "request " << id;
    EXPECT_EQ(got.finished[id], 1) << "request " << id;
    expect_greedy_confirmed(w, prompt, toks, "request " + std::to_string(id));
  }
  EXPECT_EQ(st.generated_tokens, generated);
}

INSTANTIATE_TEST_SUITE_P(GraphsOnOff, EngineContinuousBatching, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "graphs" : "eager"; });

// A model whose layers all use a sliding window has one KV pool, the window pool, and the engine
// admits by what it really holds: with a window of 32 keys and 48-token prefill chunks a request
// holds at most 6 pages however long it grows, so 13 pages run two requests at a time (never
// three) although every request's whole extent would need up to 8 pages. Every request ends with
// its tokens confirmed by the float64 reference and every page back in the pool.
TEST_F(EngineGpu, SlidingWindowOnlyModelIsAdmittedByWindowPages) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  ModelConfig config = small_test_config();
  for (LayerAttention& l : config.layers)
    l = {AttentionKind::kSliding, window_left_from_hf_sliding_window(32)};
  const HostWeights w = synthetic_weights(config, rng());
  EngineConfig ec;
  ec.max_batch = 4;
  ec.max_step_tokens = 48;
  ec.max_context = 128;
  ec.sliding_pages = 13;
  Engine engine(w, ec);
  ASSERT_EQ(engine.ledger().num_pools(), 1);
  ASSERT_EQ(engine.ledger().config(0).geometry.kind, AttentionKind::kSliding);

  const int n = testing::sanitize_mode() ? 3 : 8;
  Collected got;
  std::map<RequestId, std::vector<std::int32_t>> prompts;
  for (int r = 0; r < n; ++r) {
    RequestSpec s;
    s.prompt =
        random_prompt(rng, std::uniform_int_distribution<int>(70, 90)(rng), config.vocab_size);
    s.max_new_tokens = std::uniform_int_distribution<int>(20, 30)(rng);  // extent >= 90: 6 pages
    const std::vector<std::int32_t> prompt = s.prompt;
    prompts[engine.submit(std::move(s), collect(got))] = prompt;
  }
  std::int32_t most_running = 0;
  while (engine.step()) {
    most_running = std::max(most_running, engine.running());
    ASSERT_LE(engine.running(), 2) << "13 window pages hold two requests";
    ASSERT_LE(engine.ledger().reserved_pages(0), 12);
  }
  EXPECT_EQ(most_running, 2);
  EXPECT_EQ(engine.stats().finished, n);
  EXPECT_EQ(engine.ledger().free_pages(0), engine.ledger().usable_pages(0));
  EXPECT_EQ(engine.ledger().reserved_pages(0), 0);
  for (const auto& [id, prompt] : prompts) {
    EXPECT_EQ(got.finished[id], 1) << "request " << id;
    expect_greedy_confirmed(w, prompt, got.tokens[id], "request " + std::to_string(id));
  }
}

// Sampled requests: the same submissions give the same tokens run to run; top-k 1 equals greedy on
// the same prompt; temperature sampling departs from greedy; a stop token ends a request.
TEST_F(EngineGpu, SamplingIsReproducibleTopK1IsGreedyAndStopTokensStop) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, rng());
  EngineConfig ec;
  ec.max_batch = 8;
  ec.max_context = 128;
  ec.deterministic = true;
  const std::vector<std::int32_t> prompt = random_prompt(rng, 37, config.vocab_size);
  const std::uint64_t seed = rng();

  // The four requests; the greedy one stops at `greedy_stop` when it is set. Collected per request.
  const auto run = [&](std::vector<std::vector<std::int32_t>>& out, std::vector<int>& finished,
                       std::optional<std::int32_t> greedy_stop) {
    Engine engine(w, ec);
    Collected got;
    std::vector<RequestId> ids;
    const auto submit = [&](SamplingParams sp, std::vector<std::int32_t> stop) {
      RequestSpec s;
      s.prompt = prompt;
      s.max_new_tokens = 32;
      s.sampling = sp;
      s.stop_tokens = std::move(stop);
      ids.push_back(engine.submit(std::move(s), collect(got)));
    };
    std::vector<std::int32_t> stop;
    if (greedy_stop) stop.push_back(*greedy_stop);
    submit({}, stop);                             // greedy
    submit({1.0f, 1, 1.0f, seed}, {});            // top-k 1
    submit({0.9f, 0, 0.9f, seed}, {});            // temperature + top-p
    submit({1.5f, 20, 1.0f, seed ^ 0x5555}, {});  // temperature + top-k
    engine.run_until_idle();
    out.clear();
    finished.clear();
    for (RequestId id : ids) {
      out.push_back(got.tokens[id]);
      finished.push_back(got.finished[id]);
    }
  };
  std::vector<std::vector<std::int32_t>> a, b, stopped;
  std::vector<int> finished;
  run(a, finished, std::nullopt);
  run(b, finished, std::nullopt);
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(a, b) << "same submissions, same seeds: same tokens";
  EXPECT_EQ(a[1], a[0]) << "top-k 1 must pick the greedy token";
  EXPECT_NE(a[2], a[0]) << "temperature 0.9 never departed from greedy in 32 tokens";
  EXPECT_NE(a[3], a[2]);

  // Stop token: the same four requests again, the greedy one stopping at the first occurrence of
  // its 6th token. Its steps up to the stop are the batches of the run above, so its tokens are
  // that run's up to the stop. (Run alone, they need not be: the GEMMs are not batch-invariant,
  // and with GRAPHDECODE_SEED=2594227729539340104 the greedy request alone took 316 where the
  // batch of four took 183 at its 3rd token, float64 logits 1.009197 and 1.008574.)
  ASSERT_GE(a[0].size(), 6u);
  run(stopped, finished, a[0][5]);
  const auto stop_at = std::find(a[0].begin(), a[0].end(), a[0][5]) - a[0].begin();
  const std::vector<std::int32_t> expect(a[0].begin(), a[0].begin() + stop_at + 1);
  EXPECT_EQ(stopped[0], expect);
  EXPECT_EQ(finished[0], 1);
}

// Bad requests: an Error naming the field, nothing queued; requests before and after are served.
TEST_F(EngineGpu, BadRequestsAreRefusedByNameAndOthersKeepServing) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, rng());
  EngineConfig ec;
  ec.max_batch = 4;
  ec.max_context = 64;
  ec.kv_pages = 6;
  Engine engine(w, ec);
  Collected got;
  const auto spec = [&](std::int32_t len, std::int32_t max_new) {
    RequestSpec s;
    s.prompt = random_prompt(rng, len, config.vocab_size);
    s.max_new_tokens = max_new;
    return s;
  };
  const RequestId before = engine.submit(spec(20, 8), collect(got));
  ASSERT_TRUE(engine.step());  // `before` is running when the bad requests arrive

  const auto expect_refused = [&](RequestSpec s, const std::string& field) {
    try {
      engine.submit(std::move(s), collect(got));
      ADD_FAILURE() << "accepted a request with a bad " << field;
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), field) << e.what();
    }
  };
  RequestSpec bad = spec(10, 4);
  bad.prompt[3] = config.vocab_size;  // unknown token id
  expect_refused(bad, "prompt[3]");
  bad = spec(10, 4);
  bad.prompt[0] = -1;
  expect_refused(bad, "prompt[0]");
  expect_refused(spec(0, 4), "prompt");                         // empty
  expect_refused(spec(70, 4), "prompt_len + max_new_tokens");   // prompt beyond max context
  expect_refused(spec(10, 60), "prompt_len + max_new_tokens");  // max new beyond capacity
  expect_refused(spec(10, 0), "max_new_tokens");
  bad = spec(10, 4);
  bad.sampling.top_p = 0.f;
  expect_refused(bad, "sampling.top_p");
  bad = spec(10, 4);
  bad.sampling.temperature = -1.f;
  expect_refused(bad, "sampling.temperature");
  bad = spec(10, 4);
  bad.stop_tokens = {config.vocab_size + 5};
  expect_refused(bad, "stop_tokens");
  EXPECT_EQ(engine.waiting(), 0);

  const RequestId after = engine.submit(spec(30, 6), collect(got));
  engine.run_until_idle();
  EXPECT_EQ(got.tokens[before].size(), 8u);
  EXPECT_EQ(got.tokens[after].size(), 6u);
  EXPECT_EQ(engine.stats().finished, 2);
}

TEST_F(EngineGpu, UnsupportedConfigsAreRefusedAtConstruction) {
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, 3);
  EngineConfig ec;
  ec.max_batch = 0;
  try {
    Engine engine(w, ec);
    ADD_FAILURE() << "accepted max_batch 0";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "max_batch") << e.what();
  }
  ModelConfig odd = config;
  odd.head_dim = 96;  // no attention kernel for it: refused by the weights layer or the engine
  try {
    const HostWeights w96 = synthetic_weights(odd, 3);
    Engine engine(w96, EngineConfig{});
    ADD_FAILURE() << "accepted head_dim 96";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim"), std::string::npos) << e.what();
  }
}

// Cancellation: a waiting request (its final event at once), a request in prefill, and running
// requests cancelled from another request's callback; no token is delivered after a cancel
// event, the others finish with tokens the float64 reference confirms, every page comes back;
// unknown and finished ids are named errors. Plain and speculative engines.
class EngineCancel : public EngineGpu, public ::testing::WithParamInterface<bool> {};

TEST_P(EngineCancel, WaitingPrefillAndRunningRequestsLeaveCleanly) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, rng());
  EngineConfig ec;
  ec.max_batch = 3;
  ec.max_step_tokens = 32;  // a 100-token prompt takes four prefill steps
  ec.max_context = 160;
  if (GetParam()) ec.speculative.max_draft_tokens = 3;
  Engine engine(w, ec, GetParam() ? &w : nullptr);
  Collected got;
  std::map<RequestId, bool> cancelled;
  const auto track = [&](const TokenEvent& e) {
    EXPECT_FALSE(cancelled[e.id]) << "event after the cancellation of request " << e.id;
    if (e.cancelled) cancelled[e.id] = true;
    EXPECT_EQ(e.cancelled, e.token == kNoToken);
  };
  std::vector<RequestId> ids;
  std::map<RequestId, std::vector<std::int32_t>> prompts;
  for (int r = 0; r < 6; ++r) {
    RequestSpec s;
    s.prompt = random_prompt(rng, r == 1 ? 100 : 20 + 7 * r, config.vocab_size);
    s.max_new_tokens = 30;
    prompts[static_cast<RequestId>(r + 1)] = s.prompt;
    const TokenCallback inner = collect(got);
    // Request 0's third token cancels requests 2 and 3 (running or still waiting) from its
    // callback.
    const bool canceller = r == 0;
    ids.push_back(engine.submit(std::move(s), [&, inner, canceller](const TokenEvent& e) {
      track(e);
      inner(e);
      if (canceller && got.tokens[e.id].size() == 3) {
        engine.cancel(ids[2]);
        engine.cancel(ids[3]);
      }
    }));
  }
  engine.cancel(ids[5]);  // waiting: its final event arrives at once
  EXPECT_TRUE(cancelled[ids[5]]);
  EXPECT_EQ(got.finished[ids[5]], 1);
  ASSERT_TRUE(engine.step());  // requests 0..2 admitted; request 1 starts its long prefill
  engine.cancel(ids[1]);       // in prefill
  EXPECT_TRUE(cancelled[ids[1]]);
  while (engine.step()) {
  }
  EXPECT_TRUE(engine.idle());
  for (RequestId id : ids) EXPECT_EQ(got.finished[id], 1) << "request " << id;
  for (RequestId id : {ids[1], ids[2], ids[3], ids[5]}) EXPECT_TRUE(cancelled[id]) << id;
  for (RequestId id : {ids[0], ids[4]}) {
    EXPECT_FALSE(cancelled[id]);
    EXPECT_EQ(got.tokens[id].size(), 30u);
    expect_greedy_confirmed(w, prompts[id], got.tokens[id], "request " + std::to_string(id));
  }
  EXPECT_EQ(engine.stats().cancelled, 4);
  EXPECT_EQ(engine.stats().finished, 6);
  for (std::int32_t p = 0; p < engine.ledger().num_pools(); ++p) {
    EXPECT_EQ(engine.ledger().free_pages(p), engine.ledger().usable_pages(p)) << "pool " << p;
    EXPECT_EQ(engine.ledger().reserved_pages(p), 0) << "pool " << p;
  }
  EXPECT_EQ(field_of([&] { engine.cancel(ids[0]); }), "request");  // finished
  EXPECT_EQ(field_of([&] { engine.cancel(12345); }), "request");   // unknown
}

INSTANTIATE_TEST_SUITE_P(PlainOrSpeculative, EngineCancel, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "speculative" : "plain"; });

// Speculative decoding in the engine: continuous batching (requests join and leave, chunked
// prefill, a pool too small for all at once, stop tokens), the target as its own draft, a draft
// with a noisy LM head and prompt lookup, graphs on and off. Every greedy request's tokens are
// confirmed by the float64 reference like a plain engine's, and equal the plain engine's tokens (a
// divergence is allowed only at a near-tie, which expect_greedy_confirmed bounds); requests that do
// not speculate and sampled requests commit one token per step.
class EngineSpeculative : public EngineGpu, public ::testing::WithParamInterface<bool> {};

TEST_P(EngineSpeculative, GreedyTokensEqualPlainDecodingUnderContinuousBatching) {
  const testing::ScopedGemvOff same_gemms;  // spec vs plain: the same GEMM kernels
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_test_config();
  const std::uint64_t seed = rng();
  const HostWeights w = synthetic_weights(config, seed);
  HostWeights noisy = w;
  testing::Rng noise(seed + 3);
  std::normal_distribution<float> n01(0.f, 0.01f);
  for (std::uint16_t& x : noisy.tensors.at("lm_head.weight").data)
    x = reference::float_to_bf16(reference::bf16_to_float(x) + n01(noise));

  EngineConfig ec;
  ec.max_batch = 4;
  ec.max_step_tokens = 48;
  ec.max_context = 128;
  ec.kv_pages = 24;
  ec.use_graphs = GetParam();
  const int n = testing::sanitize_mode() ? 4 : 10;
  std::vector<RequestSpec> specs;
  for (int r = 0; r < n; ++r) {
    RequestSpec s;
    s.prompt =
        random_prompt(rng, std::uniform_int_distribution<int>(1, 80)(rng), config.vocab_size);
    s.max_new_tokens = std::uniform_int_distribution<int>(1, 40)(rng);
    if (r % 4 == 1) s.stop_tokens = {static_cast<std::int32_t>(rng() % config.vocab_size)};
    if (r == 2) s.speculate = false;
    specs.push_back(s);
  }
  const auto serve = [&](Engine& engine) -> std::vector<std::vector<std::int32_t>> {
    Collected got;
    std::vector<RequestId> ids;
    for (const RequestSpec& s : specs) ids.push_back(engine.submit(s, collect(got)));
    while (engine.step()) EXPECT_LE(engine.running(), ec.max_batch);
    std::vector<std::vector<std::int32_t>> out;
    for (RequestId id : ids) {
      EXPECT_EQ(got.finished[id], 1) << "request " << id;
      out.push_back(got.tokens[id]);
    }
    return out;
  };
  Engine plain(w, ec);
  const auto want = serve(plain);

  for (const int variant : {0, 1, 2}) {
    const bool own = variant == 0;
    const std::string what = own ? "own draft" : variant == 1 ? "noisy draft" : "prompt lookup";
    EngineConfig sc = ec;
    sc.speculative.max_draft_tokens = 4;
    if (variant == 2) sc.speculative.proposer = SpecProposer::kNgram;
    Engine engine(w, sc, own ? &w : variant == 1 ? &noisy : nullptr);
    const auto got = serve(engine);
    int differ = 0;
    for (int r = 0; r < n; ++r) {
      const auto& g = got[static_cast<std::size_t>(r)];
      const auto& p = want[static_cast<std::size_t>(r)];
      const RequestSpec& s = specs[static_cast<std::size_t>(r)];
      // A stop token ends both at the same place unless an earlier token differs.
      if (g != p) ++differ;
      ASSERT_FALSE(g.empty()) << what << " request " << r;
      EXPECT_LE(static_cast<std::int32_t>(g.size()), s.max_new_tokens);
      expect_greedy_confirmed(w, s.prompt, g, what + " request " + std::to_string(r));
    }
    const EngineStats st = engine.stats();
    std::printf(
        "[ %s ] %lld decode steps, %lld rows: %lld of %lld drafts accepted, %.2f tokens per "
        "row; %d of %d requests differ from plain decoding\n",
        what.c_str(), static_cast<long long>(st.decode_steps), static_cast<long long>(st.spec_rows),
        static_cast<long long>(st.accepted_tokens), static_cast<long long>(st.drafted_tokens),
        st.tokens_per_spec_row(), differ, n);
    EXPECT_LE(differ, 1) << what << ": divergences beyond a rare near-tie";
    EXPECT_GT(st.drafted_tokens, 0);
    if (own) EXPECT_GT(st.tokens_per_spec_row(), 2.0);
    if (ec.use_graphs) EXPECT_EQ(st.graph_steps, st.decode_steps);
    EXPECT_EQ(engine.ledger().free_pages(0), engine.ledger().usable_pages(0));
  }
}

// Sampled requests speculate too (rejection sampling keeps the target's distribution; the
// chi-square tests are in test_accept_sampled_gpu). With the target as its own draft, p and q
// agree up to bf16 rounding of two GEMM shapes: nearly every draft is accepted, and since the
// draft's sample and the target's use the same seed and position, the tokens are nearly always
// the plain engine's own samples. Runs are reproducible.
TEST_F(EngineGpu, SampledRequestsSpeculateWithTheTargetsDistribution) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, rng());
  EngineConfig ec;
  ec.max_batch = 8;
  ec.max_step_tokens = 256;
  ec.max_context = 160;
  const int n = testing::sanitize_mode() ? 3 : 8;
  std::vector<RequestSpec> specs;
  for (int r = 0; r < n; ++r) {
    RequestSpec s;
    s.prompt = random_prompt(rng, 10 + 9 * r, config.vocab_size);
    s.max_new_tokens = 32;
    s.sampling = {0.8f, r % 2 ? 40 : 0, r % 3 ? 0.95f : 1.f, 1000 + static_cast<std::uint64_t>(r)};
    specs.push_back(s);
  }
  const auto serve = [&](Engine& engine) -> std::vector<std::vector<std::int32_t>> {
    Collected got;
    std::vector<RequestId> ids;
    for (const RequestSpec& s : specs) ids.push_back(engine.submit(s, collect(got)));
    engine.run_until_idle();
    std::vector<std::vector<std::int32_t>> out;
    for (RequestId id : ids) out.push_back(got.tokens[id]);
    return out;
  };
  Engine plain(w, ec);
  const auto want = serve(plain);
  EngineConfig sc = ec;
  sc.speculative.max_draft_tokens = 4;
  Engine a(w, sc, &w), b(w, sc, &w);
  const auto got = serve(a);
  EXPECT_EQ(got, serve(b)) << "speculative sampling is reproducible";
  const EngineStats st = a.stats();
  const double rate = static_cast<double>(st.accepted_tokens) / st.drafted_tokens;
  int same = 0;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(got[static_cast<std::size_t>(r)].size(), 32u);
    same += got[static_cast<std::size_t>(r)] == want[static_cast<std::size_t>(r)];
  }
  std::printf(
      "[ sampled, own draft ] acceptance %.3f, %d of %d requests token-identical to plain "
      "sampling\n",
      rate, same, n);
  EXPECT_GT(rate, 0.85);
  EXPECT_GE(same, n / 2);
}

INSTANTIATE_TEST_SUITE_P(GraphsOnOff, EngineSpeculative, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "graphs" : "eager"; });

TEST_F(EngineGpu, SpeculativeConfigurationErrorsNameTheField) {
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, 5);
  EngineConfig ec;
  ec.max_batch = 2;
  ec.max_context = 64;
  ec.speculative.max_draft_tokens = 2;
  EXPECT_EQ(field_of([&] { Engine e(w, ec); }), "draft");
  EngineConfig lookup = ec;
  lookup.speculative.proposer = SpecProposer::kNgram;
  EXPECT_EQ(field_of([&] { Engine e(w, lookup, &w); }), "draft");
  lookup.speculative.ngram.min_ngram = 0;
  EXPECT_EQ(field_of([&] { Engine e(w, lookup); }), "ngram.min_ngram");
  ModelConfig other = config;
  other.vocab_size = 256;
  const HostWeights small_vocab = synthetic_weights(other, 5);
  EXPECT_EQ(field_of([&] { Engine e(w, ec, &small_vocab); }), "draft.vocab_size");
  EngineConfig bad = ec;
  bad.speculative.k_by_batch = {{4, 3}};
  EXPECT_EQ(field_of([&] { Engine e(w, bad, &w); }), "speculative.k_by_batch[0].k");
  bad = ec;
  bad.speculative.max_draft_tokens = 0;
  EXPECT_EQ(field_of([&] { Engine e(w, bad, &w); }), "speculative.max_draft_tokens");
  bad.speculative.max_draft_tokens = 99;
  EXPECT_EQ(field_of([&] { Engine e(w, bad, &w); }), "speculative.max_draft_tokens");
}

// The default pool has room for the k draft rows past max_context that a speculative step writes:
// a request of exactly max_context tokens is served as it is without speculation (bench_spec at
// batch 1 was refused: 12 pages, 13 needed).
TEST_F(EngineGpu, DefaultPoolFitsARequestOfMaxContextWithDrafts) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, rng());
  EngineConfig ec;
  ec.max_batch = 1;
  ec.max_context = 48;  // 3 pages of 16; the drafts need a 4th
  ec.speculative.max_draft_tokens = 4;
  for (const bool lookup : {false, true}) {
    EngineConfig sc = ec;
    if (lookup) sc.speculative.proposer = SpecProposer::kNgram;
    Engine engine(w, sc, lookup ? nullptr : &w);
    RequestSpec s;
    s.prompt = random_prompt(rng, 16, config.vocab_size);
    s.max_new_tokens = 32;
    Collected got;
    const RequestId id = engine.submit(s, collect(got));
    engine.run_until_idle();
    EXPECT_EQ(got.tokens[id].size(), 32u) << (lookup ? "prompt lookup" : "draft model");
    EXPECT_EQ(got.finished[id], 1);
  }
}

}  // namespace
}  // namespace graphdecode
