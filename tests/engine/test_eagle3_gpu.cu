// EAGLE-3 heads on the device: the target's captured states against a float64 residual stream
// (and not the stream one layer off, SGLang's and vLLM's conventions apart); the proposer's draft
// logits (extend over a whole prompt from the three captured states, then decodes feeding the
// head's own output back) against the float64 EAGLE-3 reference, with every non-draft id at -inf
// and the drafts mapped through d2t; the states carried between steps; graph replay bitwise equal
// to eager; speculative greedy decoding equal to plain greedy decoding (a target with
// sliding-window layers and prompts longer than the window, graphs on and off) with a random head
// (drafts rejected) and a head whose first draft is always the target's token; the Engine serving
// an EAGLE-3 head under continuous batching, refusing bad requests by name while it serves, and
// refusing heads that do not fit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attention/reference.h"
#include "attention_check.h"  // test_rng / seed_note / sanitize_mode
#include "common/stream.h"
#include "eagle3_reference.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/spec/eagle_proposer.h"
#include "engine/spec/eagle_weights.h"
#include "engine_checks.h"
#include "llama_reference.h"
#include "spec_run.h"
#include "support/field_of.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using testing::Eagle3Input;
using testing::SpecRun;

class Eagle3Gpu : public testing::GpuTest {};

double bf16(std::uint16_t b) {
  return reference::bf16_to_float(b);
}

// Norm weights 1 + N(0, 0.25), so a norm applied in the wrong place shows in the drafts.
void vary_norms(EagleWeights& h, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 0.5f);
  for (auto& [name, t] : h.tensors)
    if (name.ends_with("norm.weight"))
      for (std::uint16_t& x : t.data) x = reference::float_to_bf16(1.f + n(rng));
}

// ---- the captured states ------------------------------------------------------------------------

TEST_F(Eagle3Gpu, CapturedStatesAreTheResidualStreamEnteringTheLayers) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_test_config();  // 4 layers: the head's points are 1, 2, 3
  const HostWeights target = synthetic_weights(config, rng());
  const EagleWeights head = synthetic_eagle3_weights(config, rng());
  const std::array<std::int32_t, 3> points = eagle3_capture_layers(head.config, config);
  const auto prompts = testing::spec_prompts(config, rng);
  SpecRun run(target, head, 4, 2, true);
  std::vector<StepRequest> req;
  std::vector<SpecRequestState> state;
  run.prefill(prompts, req, state);
  const auto H = static_cast<std::size_t>(config.hidden_size), S = 3 * H;
  std::size_t rows = 0;
  for (const auto& p : prompts) rows += p.size();
  const auto aux = run.download(run.target->aux_hidden_states(), rows * S);
  const auto carry =
      run.download(run.eagle().carry(), static_cast<std::size_t>(run.cap.max_slots) * 3 * S);
  const std::array<std::int32_t, 3> before = {points[0] - 1, points[1] - 1, points[2] - 1};
  double worst = 0;
  for (std::size_t r = 0, off = 0; r < prompts.size(); off += prompts[r].size(), ++r) {
    const auto want = testing::reference_residual_streams(target, prompts[r], points);
    const auto off_by_one = testing::reference_residual_streams(target, prompts[r], before);
    for (std::size_t b = 0; b < 3; ++b) {
      double scale = 0, err = 0, err_wrong = 0;
      for (std::size_t j = 0; j < prompts[r].size(); ++j)
        for (std::size_t i = 0; i < H; ++i) {
          const double got = bf16(aux[(off + j) * S + b * H + i]);
          scale = std::max(scale, std::abs(want[b][j][i]));
          err = std::max(err, std::abs(got - want[b][j][i]));
          err_wrong = std::max(err_wrong, std::abs(got - off_by_one[b][j][i]));
        }
      const double tol = 0.02 * scale + 1e-3;
      worst = std::max(worst, err / scale);
      EXPECT_LE(err, tol) << "request " << r << " block " << b << " (layer " << points[b] << ")";
      // The check can fail: the stream one layer earlier (the other engine's reading of config
      // layer ids) is far outside the tolerance.
      EXPECT_GT(err_wrong, 2 * tol) << "request " << r << " block " << b;
    }
    const std::size_t last = off + prompts[r].size() - 1;
    const auto slot = static_cast<std::size_t>(req[r].slot);
    EXPECT_TRUE(std::equal(aux.begin() + static_cast<std::ptrdiff_t>(last * S),
                           aux.begin() + static_cast<std::ptrdiff_t>((last + 1) * S),
                           carry.begin() + static_cast<std::ptrdiff_t>(slot * 3 * S)))
        << "request " << r << ": the prefill's last states are not carried";
  }
  std::printf("[ eagle3 states ] worst captured-state error %.4f of the largest entry\n", worst);
}

// ---- the drafts against the float64 reference ---------------------------------------------------

class Eagle3Reference : public Eagle3Gpu, public ::testing::WithParamInterface<bool> {};

// A head with its own embedding and an fc bias (both optional in EAGLE-3 checkpoints).
EagleWeights with_embedding_and_bias(EagleWeights h, std::uint64_t seed) {
  const auto H = static_cast<std::size_t>(h.config.layer.hidden_size);
  const auto V = static_cast<std::size_t>(h.config.layer.vocab_size);
  HostTensor embed;
  embed.shape = {static_cast<std::int64_t>(V), static_cast<std::int64_t>(H)};
  embed.data = synthetic::normal_values("test.embed", V * H, seed);
  HostTensor bias;
  bias.shape = {static_cast<std::int64_t>(H)};
  bias.data = synthetic::normal_values("test.fc_bias", H, seed);
  h.tensors["embed_tokens.weight"] = embed;
  h.tensors["fc.bias"] = bias;
  h.config.own_embedding = h.config.fc_bias = true;
  return h;
}

TEST_P(Eagle3Reference, DraftsMatchTheFloat64Reference) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_test_config();
  const HostWeights target = synthetic_weights(config, rng());
  EagleWeights head = synthetic_eagle3_weights(config, rng(), 200);
  vary_norms(head, rng());
  if (GetParam()) head = with_embedding_and_bias(head, rng());
  const auto prompts = testing::spec_prompts(config, rng);
  const std::int32_t k = 3;
  SpecRun run(target, head, 4, k, true);
  const auto H = static_cast<std::size_t>(config.hidden_size), S = 3 * H;
  const auto V = static_cast<std::size_t>(config.vocab_size);
  const std::size_t stride = static_cast<std::size_t>(k) + 1;
  std::vector<StepRequest> req;
  std::vector<SpecRequestState> state;
  run.prefill(prompts, req, state);
  std::size_t rows = 0;
  for (const auto& p : prompts) rows += p.size();
  const auto aux = run.download(run.target->aux_hidden_states(), rows * S);
  std::vector<std::vector<Eagle3Input>> states(prompts.size());
  for (std::size_t r = 0, off = 0; r < prompts.size(); off += prompts[r].size(), ++r)
    for (std::size_t j = 0; j < prompts[r].size(); ++j) {
      Eagle3Input in;
      in.state.resize(S);
      for (std::size_t i = 0; i < S; ++i) in.state[i] = bf16(aux[(off + j) * S + i]);
      states[r].push_back(in);
    }
  run.speculate(req, state, k);
  const StepMetaLayout& layout = run.step->prep().layout();
  std::vector<std::int32_t> vblock(layout.total_words);
  run.program->spec_prep().download(0, vblock, run.stream.get());
  const StepMetaView v = StepMetaView::over(vblock.data(), layout);
  const auto draft_logits =
      run.download(run.proposer->draft_logits(), static_cast<std::size_t>(k) * 4 * V);
  const auto verify_aux = run.download(run.target->aux_hidden_states(), 4 * stride * S);
  const auto carry =
      run.download(run.eagle().carry(), static_cast<std::size_t>(run.cap.max_slots) * stride * S);
  double worst = 0;
  int mapped = 0, near_ties = 0;
  std::set<std::int32_t> distinct;
  for (std::size_t r = 0; r < prompts.size(); ++r) {
    const auto L = prompts[r].size();
    // Pairs (token_{j+1}, a_j) at j = 0 .. L - 1 (token_L: the prefill's token), then the decodes
    // (d_j, the head's own output of the row before).
    std::vector<std::int32_t> toks(prompts[r].begin() + 1, prompts[r].end());
    toks.push_back(v.token_id[r * stride]);
    std::vector<Eagle3Input> in = states[r];
    auto ref = testing::reference_eagle3(head, target, toks, in, L - 1);
    for (std::int32_t j = 1; j < k; ++j) {
      toks.push_back(v.token_id[r * stride + static_cast<std::size_t>(j)]);  // d_j
      in.push_back({ref.back().y, true});
      ref.push_back(testing::reference_eagle3(head, target, toks, in, toks.size() - 1).back());
    }
    for (std::int32_t j = 0; j < k; ++j) {
      const testing::Eagle3ReferenceRow& want = ref[static_cast<std::size_t>(j)];
      const float* got = draft_logits.data() + (static_cast<std::size_t>(j) * 4 + r) * V;
      const std::vector<double> full =
          testing::scatter_draft_logits(head, want.draft_logits, config.vocab_size);
      double scale = 0, err = 0;
      std::size_t arg = 0, off_draft_finite = 0;
      for (std::size_t t = 0; t < V; ++t) {
        if (std::isinf(full[t])) {
          off_draft_finite += !(std::isinf(got[t]) && got[t] < 0);
          continue;
        }
        scale = std::max(scale, std::abs(full[t]));
        err = std::max(err, std::abs(got[t] - full[t]));
        if (got[t] > got[arg]) arg = t;
      }
      worst = std::max(worst, err / scale);
      EXPECT_EQ(off_draft_finite, 0u)
          << "request " << r << " draft " << j + 1 << ": ids off the draft vocabulary must be -inf";
      EXPECT_LE(err, 0.02 * scale + 1e-3) << "request " << r << " draft " << j + 1
                                          << ": worst logit error " << err << " of " << scale;
      const std::int32_t drafted = v.token_id[r * stride + 1 + static_cast<std::size_t>(j)];
      EXPECT_EQ(static_cast<std::int32_t>(arg), drafted)
          << "request " << r << ": greedy draft " << j + 1 << " is not its logits' argmax";
      if (want.token != drafted) {  // only at a near-tie of the reference
        std::vector<double> sorted = want.draft_logits;
        std::sort(sorted.rbegin(), sorted.rend());
        EXPECT_LT(sorted[0] - sorted[1], 0.02 * scale)
            << "request " << r << " draft " << j + 1 << ": " << drafted << " vs the reference's "
            << want.token;
        ++near_ties;
      }
      mapped += want.draft_id != want.token;
      distinct.insert(drafted);
    }
    // After the verify every verify row's states are carried.
    const auto slot = static_cast<std::size_t>(req[r].slot);
    for (std::size_t i = 0; i < stride; ++i)
      EXPECT_TRUE(
          std::equal(verify_aux.begin() + static_cast<std::ptrdiff_t>((r * stride + i) * S),
                     verify_aux.begin() + static_cast<std::ptrdiff_t>((r * stride + i + 1) * S),
                     carry.begin() + static_cast<std::ptrdiff_t>((slot * stride + i) * S)))
          << "request " << r << " verify row " << i;
  }
  // The check can fail: the drafts went through d2t (a draft id is not its target id) and are
  // not one constant token.
  EXPECT_GT(mapped, 0);
  EXPECT_GT(distinct.size(), 1u);
  EXPECT_LE(near_ties, 1);
  std::printf("[ eagle3 reference ] worst draft logit error %.4f of the largest logit\n", worst);
}

INSTANTIATE_TEST_SUITE_P(Heads, Eagle3Reference, ::testing::Bool(), [](const auto& info) {
  return info.param ? "own_embedding_fc_bias" : "eagle3";
});

// ---- graph replay vs eager, bitwise -------------------------------------------------------------

TEST_F(Eagle3Gpu, GraphReplayEqualsEagerBitwise) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_test_config();
  const HostWeights target = synthetic_weights(config, rng());
  const EagleWeights head = synthetic_eagle3_weights(config, rng());
  const auto prompts = testing::spec_prompts(config, rng);
  const std::int32_t kmax = 4;
  testing::expect_eagle_replay_equals_eager(target, head, prompts, kmax,
                                            testing::sanitize_mode() ? 4 : 12);
}

// ---- speculative greedy decoding with an EAGLE-3 head equals plain greedy -----------------------

// A target whose greedy next token is the current one + 1 (mod vocab): attention and MLP outputs
// zeroed, so every residual-stream state of row t is embed(token_t), and lm_head row v = embed
// row v - 1. And an EAGLE-3 head that drafts token_t + 2 from row t's states: fc = [I | 0 | 0],
// attention and MLP outputs zeroed (y = embed(token_t)), draft lm_head row i = embed row
// d2t(i) - 2, d2t a permutation of the whole vocabulary (i -> 7i + 3). Its first draft of a step is
// the target's token; the later ones repeat it (the head's own y does not move): exactly one
// accepted draft per request and step, so every step commits two tokens and carries two rows.
void make_shift(HostWeights& target, EagleWeights& head) {
  const auto H = static_cast<std::size_t>(target.config.hidden_size);
  const auto V = static_cast<std::size_t>(target.config.vocab_size);
  testing::zero_block_outputs(target);
  const std::vector<std::uint16_t>& embed = target.at("model.embed_tokens.weight").data;
  const auto copy_row = [&](std::vector<std::uint16_t>& dst, std::size_t row, std::size_t src) {
    std::copy(embed.begin() + static_cast<std::ptrdiff_t>(src * H),
              embed.begin() + static_cast<std::ptrdiff_t>((src + 1) * H),
              dst.begin() + static_cast<std::ptrdiff_t>(row * H));
  };
  std::vector<std::uint16_t>& lm = target.tensors.at("lm_head.weight").data;
  for (std::size_t v = 0; v < V; ++v) copy_row(lm, v, (v + V - 1) % V);
  for (std::size_t i = 0; i < V; ++i)
    head.draft_to_target[i] = static_cast<std::int32_t>((7 * i + 3) % V);
  std::vector<std::uint16_t>& fc = head.tensors.at("fc.weight").data;
  std::fill(fc.begin(), fc.end(), std::uint16_t{0});
  for (std::size_t i = 0; i < H; ++i) fc[i * 3 * H + i] = reference::float_to_bf16(1.f);
  for (const char* zero : {"midlayer.self_attn.o_proj.weight", "midlayer.mlp.down_proj.weight"}) {
    std::vector<std::uint16_t>& d = head.tensors.at(zero).data;
    std::fill(d.begin(), d.end(), std::uint16_t{0});
  }
  std::vector<std::uint16_t>& dl = head.tensors.at("lm_head.weight").data;
  for (std::size_t i = 0; i < V; ++i)
    copy_row(dl, i, (static_cast<std::size_t>(head.draft_to_target[i]) + V - 2) % V);
}

class Eagle3Greedy : public Eagle3Gpu, public ::testing::WithParamInterface<bool> {};

TEST_P(Eagle3Greedy, TokensEqualPlainGreedyDecoding) {
  const testing::ScopedGemvOff same_gemms;  // spec vs plain: the same GEMM kernels
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_test_config();  // full + sliding (window 32) layers
  const std::uint64_t seed = rng();
  const auto prompts = testing::spec_prompts(config, rng);
  const std::int32_t new_tokens = testing::sanitize_mode() ? 12 : 128;
  const bool graphs = GetParam();
  Stream stream;
  GenerateOptions go;
  go.new_tokens = new_tokens;
  go.use_graphs = graphs;
  int near_ties = 0;
  {  // a random head: its drafts are (nearly) all rejected; k cycling 0 .. 4
    const HostWeights target = synthetic_weights(config, seed);
    const GenerateResult plain = generate_greedy(target, prompts, go, stream.get());
    SpecRun run(target, synthetic_eagle3_weights(config, seed + 1), 4, 4, graphs);
    const auto spec =
        run.generate(prompts, new_tokens, [](std::int64_t s) { return static_cast<int>(s % 5); });
    near_ties += testing::compare_with_plain(target, prompts, spec, plain.tokens, "random head");
    std::printf("[ random eagle3 head ] %lld steps, %lld of %lld drafts accepted\n",
                static_cast<long long>(run.steps), static_cast<long long>(run.accepted),
                static_cast<long long>(run.drafted));
    if (graphs) EXPECT_EQ(run.graph_steps, run.steps - 1);  // all but the prefill replayed
  }
  {  // the +1 target and the head whose first draft is its token; k cycling 1 .. 4
    HostWeights target = synthetic_weights(config, seed + 2);
    EagleWeights head = synthetic_eagle3_weights(config, seed + 3, config.vocab_size);
    make_shift(target, head);
    const GenerateResult plain = generate_greedy(target, prompts, go, stream.get());
    SpecRun run(target, head, 4, 4, graphs);
    std::int64_t first_drafts = 0;
    const auto spec = run.generate(prompts, new_tokens, [&](std::int64_t s) {
      first_drafts += static_cast<std::int64_t>(prompts.size());
      return static_cast<int>(s % 4) + 1;
    });
    near_ties += testing::compare_with_plain(target, prompts, spec, plain.tokens, "shift head");
    std::printf("[ shift eagle3 head ] %lld steps, %lld of %lld drafts accepted\n",
                static_cast<long long>(run.steps), static_cast<long long>(run.accepted),
                static_cast<long long>(run.drafted));
    // Every step accepts each request's first draft (and the later ones repeat it: rejected).
    EXPECT_EQ(run.accepted, first_drafts);
  }
  EXPECT_LE(near_ties, 1) << "near-tie divergences of 8 request runs";
}

INSTANTIATE_TEST_SUITE_P(GraphsOnOff, Eagle3Greedy, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "graphs" : "eager"; });

// ---- the Engine with an EAGLE-3 head ------------------------------------------------------------

class Eagle3Engine : public Eagle3Gpu, public ::testing::WithParamInterface<bool> {};

TEST_P(Eagle3Engine, GreedyTokensEqualPlainDecodingAndBadRequestsAreRefused) {
  const testing::ScopedGemvOff same_gemms;  // spec vs plain: the same GEMM kernels
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_test_config();
  const std::uint64_t seed = rng();
  HostWeights target = synthetic_weights(config, seed);
  EagleWeights head = synthetic_eagle3_weights(config, seed + 1, config.vocab_size);
  make_shift(target, head);  // drafts worth accepting, so steps commit several tokens
  EngineConfig ec;
  ec.max_batch = 4;
  ec.max_step_tokens = 48;  // prompts up to 80 tokens: chunked prefill
  ec.max_context = 160;
  ec.kv_pages = 40;
  ec.use_graphs = GetParam();
  const int n = testing::sanitize_mode() ? 4 : 10;
  std::vector<RequestSpec> specs;
  for (int r = 0; r < n; ++r) {
    RequestSpec s;
    const int len = std::uniform_int_distribution<int>(1, 80)(rng);
    for (int i = 0; i < len; ++i) s.prompt.push_back(static_cast<std::int32_t>(rng() % 512));
    s.max_new_tokens = std::uniform_int_distribution<int>(1, 60)(rng);
    if (r == 0) s.max_new_tokens = 40;  // at least one long greedy speculating request
    if (r == 2) s.speculate = false;
    if (r % 4 == 3) s.sampling = {.temperature = 0.8f, .top_p = 0.9f, .seed = 7u + r};
    specs.push_back(s);
  }
  using testing::field_of;
  const auto serve = [&](Engine& engine, bool with_bad) {
    std::map<RequestId, std::vector<std::int32_t>> got;
    std::vector<RequestId> ids;
    for (std::size_t r = 0; r < specs.size(); ++r) {
      ids.push_back(engine.submit(specs[r], [&got](const TokenEvent& e) {
        if (e.token != kNoToken) got[e.id].push_back(e.token);
      }));
      if (with_bad && r == 3) {  // while requests run: refused by name, nothing else affected
        for (int s = 0; s < 3; ++s) engine.step();
        RequestSpec bad = specs[0];
        bad.prompt.push_back(config.vocab_size + 5);
        EXPECT_EQ(field_of([&] { engine.submit(bad); }).substr(0, 7), "prompt[");
        RequestSpec empty = specs[0];
        empty.max_new_tokens = 0;
        EXPECT_EQ(field_of([&] { engine.submit(empty); }), "max_new_tokens");
      }
    }
    while (engine.step()) EXPECT_LE(engine.running(), ec.max_batch);
    std::vector<std::vector<std::int32_t>> out;
    for (RequestId id : ids) out.push_back(got[id]);
    return out;
  };
  Engine plain(target, ec);
  const auto want = serve(plain, false);
  EngineConfig sc = ec;
  sc.speculative.max_draft_tokens = 4;
  sc.speculative.proposer = SpecProposer::kEagle;
  Engine engine(target, sc, nullptr, &head);
  const auto got = serve(engine, true);
  std::vector<std::vector<std::int32_t>> prompts, greedy_got, greedy_want;
  for (std::size_t r = 0; r < specs.size(); ++r) {
    const RequestSpec& s = specs[r];
    if (s.sampling.temperature > 0) {  // q from the scattered draft logits: valid target tokens
      EXPECT_EQ(static_cast<std::int32_t>(got[r].size()), s.max_new_tokens) << "request " << r;
      for (std::int32_t t : got[r]) EXPECT_TRUE(t >= 0 && t < config.vocab_size) << t;
      continue;
    }
    prompts.push_back(s.prompt);
    greedy_got.push_back(got[r]);
    greedy_want.push_back(want[r]);
  }
  EXPECT_LE(testing::compare_with_plain(target, prompts, greedy_got, greedy_want, "engine"), 1);
  const EngineStats st = engine.stats();
  std::printf(
      "[ engine eagle3 ] %lld decode steps, %lld of %lld drafts accepted, %.2f tokens/row\n",
      static_cast<long long>(st.decode_steps), static_cast<long long>(st.accepted_tokens),
      static_cast<long long>(st.drafted_tokens), st.tokens_per_spec_row());
  // The shift head's first draft is the target's next token: a greedy speculating row commits two
  // tokens per step (one accepted draft), so its m tokens after the prefill's first took about
  // (m - 1) / 2 accepted drafts. Half of that over those rows is the floor (near-ties, length
  // caps); a head fed the wrong hidden states accepts ~1 in 40 (the random head above). Drafts of
  // sampled rows are not counted: their acceptance depends on the seed.
  std::int64_t floor_accepted = 0;
  for (const RequestSpec& s : specs)
    if (s.speculate && s.sampling.temperature == 0) floor_accepted += (s.max_new_tokens - 1) / 4;
  EXPECT_GE(st.accepted_tokens, floor_accepted);
  for (std::int32_t p = 0; p < engine.ledger().num_pools(); ++p)
    EXPECT_EQ(engine.ledger().free_pages(p), engine.ledger().usable_pages(p)) << "pool " << p;
}

INSTANTIATE_TEST_SUITE_P(GraphsOnOff, Eagle3Engine, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "graphs" : "eager"; });

TEST_F(Eagle3Gpu, EngineRefusesHeadsThatDoNotFit) {
  const ModelConfig config = small_test_config();
  const HostWeights target = synthetic_weights(config, 1);
  const EagleWeights head = synthetic_eagle3_weights(config, 2);
  using testing::field_of;
  EngineConfig ec;
  ec.max_batch = 2;
  ec.max_context = 64;
  ec.speculative.max_draft_tokens = 2;
  ec.speculative.proposer = SpecProposer::kEagle;
  {  // the default capture layers [2, L/2, L-3] of a 4-layer target are not three layers
    EagleWeights h = head;
    h.config.aux_layer_ids.clear();
    EXPECT_EQ(field_of([&] { Engine e(target, ec, nullptr, &h); }), "eagle.aux_layer_ids");
  }
  {  // fc over states of another width
    EagleWeights h = head;
    h.config.target_hidden_size = 512;
    EXPECT_EQ(field_of([&] { Engine e(target, ec, nullptr, &h); }), "eagle.target_hidden_size");
  }
  {  // a draft vocabulary larger than the target's
    EagleWeights h = head;
    h.config.draft_vocab_size = config.vocab_size + 1;
    EXPECT_EQ(field_of([&] { Engine e(target, ec, nullptr, &h); }), "eagle.draft_vocab_size");
  }
  {  // d2t out of range, and not one-to-one
    EagleWeights h = head;
    h.draft_to_target[5] = config.vocab_size;
    EXPECT_EQ(field_of([&] { Engine e(target, ec, nullptr, &h); }), "d2t[5]");
    h = head;
    h.draft_to_target[6] = h.draft_to_target[2];
    EXPECT_EQ(field_of([&] { Engine e(target, ec, nullptr, &h); }), "d2t[6]");
  }
  {  // a target of another vocabulary
    ModelConfig other = config;
    other.vocab_size = 1024;
    const HostWeights t2 = synthetic_weights(other, 3);
    EXPECT_EQ(field_of([&] { Engine e(t2, ec, nullptr, &head); }), "eagle.vocab_size");
  }
  // A good head still serves after all of that.
  Engine e(target, ec, nullptr, &head);
  RequestSpec s;
  s.prompt = {1, 2, 3, 4, 5};
  s.max_new_tokens = 8;
  std::vector<std::int32_t> got;
  e.submit(s, [&got](const TokenEvent& ev) {
    if (ev.token != kNoToken) got.push_back(ev.token);
  });
  while (e.step()) {
  }
  EXPECT_EQ(got.size(), 8u);
}

}  // namespace
}  // namespace graphdecode
