// Mllama's gated cross-attention layers on the device (small_cross_test_config: 6 layers, cross at
// 1 and 4; synthetic gates of |g| >= 0.5 so the cross layers matter):
//   - a batch whose requests have encoder lengths 0, 1, 17, 64 (a page multiple), 1100 and 0:
//     per-step logits against the float64 reference (its own encoder states per request), graphs
//     on and off;
//   - the control that gives every request request K's encoder length FAILS that check (the bug
//     class the check exists for), while request K itself still passes;
//   - a text-only request's logits are bitwise those of the same model without its cross layers
//     (encoder_len 0 is an exact identity, in the same captured graph as image requests);
//   - graph replay == eager bitwise for a mixed batch;
//   - the two cross row kernels against their definitions (masked rows untouched, bitwise).
// The Engine serving cross-attention requests: test_cross_engine_gpu.cu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention/reference.h"
#include "attention_check.h"  // base_seed / test_rng / seed_note / sanitize_mode
#include "common/buffers.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "common/stream.h"
#include "engine/generate.h"
#include "engine/kernels/cross_kernels.h"
#include "engine/kernels/model_kernels.h"
#include "engine/llama_model.h"
#include "engine/model_step.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/step_context.h"
#include "engine/weights.h"
#include "engine_checks.h"
#include "graphs/step_graphs.h"
#include "llama_reference.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using testing::random_prompt;

class CrossGpu : public testing::GpuTest {};

using States = std::vector<std::uint16_t>;
using testing::random_encoder_states;

// One step's logits row against the float64 reference: relative L2 < 3% and max error < 5% of the
// reference's largest logit (test_llama_model_gpu's bounds).
struct RowCheck {
  double rel = 0, max_err = 0, max_ref = 0;
  bool finite = true;
  bool ok() const { return finite && rel < 0.03 && max_err < 0.05 * max_ref + 1e-4; }
};

RowCheck check_row(const std::vector<double>& ref, const float* got) {
  RowCheck c;
  double err2 = 0, ref2 = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    c.finite &= std::isfinite(got[i]);
    c.max_ref = std::max(c.max_ref, std::abs(ref[i]));
    c.max_err = std::max(c.max_err, std::abs(got[i] - ref[i]));
    err2 += (got[i] - ref[i]) * (got[i] - ref[i]);
    ref2 += ref[i] * ref[i];
  }
  c.rel = std::sqrt(err2 / std::max(ref2, 1e-30));
  return c;
}

// The batch of the reference tests: encoder lengths 17 (request 0), 0, 1, 64 (4 pages of 16),
// 1100 (> 1000) and 0; request 2's prompt starts with the image token (id vocab_size).
struct MixedBatch {
  std::vector<std::int32_t> lengths = {17, 0, 1, 64, 1100, 0};
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<States> states;
  std::vector<EncoderStatesView> views;

  MixedBatch(testing::Rng& rng, const ModelConfig& c) {
    if (testing::sanitize_mode()) lengths[4] = 300;  // compute-sanitizer: a shorter long one
    const std::vector<std::int32_t> prompt_lens = {5, 12, 40, 9, 23, 30};
    for (std::size_t r = 0; r < lengths.size(); ++r) {
      prompts.push_back(random_prompt(rng, prompt_lens[r], c.vocab_size));
      states.push_back(random_encoder_states(rng, lengths[r], c.hidden_size));
    }
    prompts[2][0] = c.vocab_size;  // <|image|>: an input id past the output vocabulary
    for (std::size_t r = 0; r < lengths.size(); ++r)
      views.push_back({states[r].empty() ? nullptr : states[r].data(), lengths[r], false});
  }
  testing::ReferenceEncoder encoder(std::size_t r) const { return {states[r], lengths[r]}; }
};

struct Generated {
  GenerateResult result;
  std::vector<std::vector<float>> logits;  // [step][batch * vocab]
};

Generated generate(const HostWeights& w, const MixedBatch& b, GenerateOptions o) {
  o.encoders = b.views;
  Stream stream;
  Generated g;
  g.result = generate_greedy(w, b.prompts, o, stream.get(),
                             [&](std::int32_t, std::span<const float> l, auto) {
                               g.logits.emplace_back(l.begin(), l.end());
                             });
  return g;
}

// Per request: does every step's logits row pass the reference check (on the request's own
// encoder states and its own greedy tokens)? Failures are described in `why`.
std::vector<bool> reference_passes(const HostWeights& w, const MixedBatch& b, const Generated& g,
                                   std::vector<std::string>& why) {
  const auto V = static_cast<std::size_t>(w.config.vocab_size);
  std::vector<bool> pass(b.prompts.size(), true);
  why.assign(b.prompts.size(), "");
  for (std::size_t p = 0; p < b.prompts.size(); ++p) {
    std::vector<std::int32_t> seq = b.prompts[p];
    const auto& toks = g.result.tokens[p];
    seq.insert(seq.end(), toks.begin(), toks.end() - 1);
    const auto ref = testing::reference_logits(w, seq, b.prompts[p].size() - 1, b.encoder(p));
    for (std::size_t s = 0; s < g.logits.size(); ++s) {
      const RowCheck c = check_row(ref[s], &g.logits[s][p * V]);
      if (!c.ok() && pass[p]) {
        pass[p] = false;
        why[p] = "step " + std::to_string(s) + ": rel " + std::to_string(c.rel) + ", max_err " +
                 std::to_string(c.max_err) + " of max " + std::to_string(c.max_ref);
      }
    }
  }
  return pass;
}

class CrossReference : public CrossGpu, public ::testing::WithParamInterface<bool> {};

TEST_P(CrossReference, MixedEncoderLengthsMatchFloat64Reference) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig c = small_cross_test_config();
  const HostWeights w = synthetic_weights(c, rng());
  const MixedBatch b(rng, c);
  GenerateOptions o;
  o.new_tokens = testing::sanitize_mode() ? 2 : 4;
  o.use_graphs = GetParam();
  const Generated g = generate(w, b, o);
  ASSERT_EQ(g.logits.size(), static_cast<std::size_t>(o.new_tokens));
  if (o.use_graphs) EXPECT_EQ(g.result.graph_steps, o.new_tokens - 1);  // every decode step
  std::vector<std::string> why;
  const std::vector<bool> pass = reference_passes(w, b, g, why);
  for (std::size_t p = 0; p < pass.size(); ++p)
    EXPECT_TRUE(pass[p]) << "request " << p << " (encoder_len " << b.lengths[p] << "): " << why[p];
}

INSTANTIATE_TEST_SUITE_P(GraphsOnOff, CrossReference, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "graphs" : "eager"; });

// The control: every step says every request has request K's encoder length (an engine that
// takes request 0's length for the whole batch). The reference check must catch it; request K
// itself, whose length is right, still passes.
TEST_F(CrossGpu, ControlWithOneRequestsEncoderLengthFailsTheReferenceCheck) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig c = small_cross_test_config();
  const HostWeights w = synthetic_weights(c, rng());
  const MixedBatch b(rng, c);
  for (const std::int32_t k : {0, 1}) {  // request 0 (17 keys), request 1 (text only)
    GenerateOptions o;
    o.new_tokens = 2;
    o.control_encoder_len_of = k;
    const Generated g = generate(w, b, o);
    std::vector<std::string> why;
    const std::vector<bool> pass = reference_passes(w, b, g, why);
    std::int32_t caught = 0;
    for (std::size_t p = 0; p < pass.size(); ++p) {
      if (b.lengths[p] == b.lengths[static_cast<std::size_t>(k)]) {
        EXPECT_TRUE(pass[p]) << "control " << k << ": request " << p
                             << " has the right length and must pass: " << why[p];
      } else {
        caught += pass[p] ? 0 : 1;
        std::printf(
            "control: every request at request %d's length %d; request %zu (length %d) %s\n", k,
            b.lengths[static_cast<std::size_t>(k)], p, b.lengths[p],
            pass[p] ? "passes" : ("FAILS: " + why[p]).c_str());
      }
    }
    EXPECT_GE(caught, 1) << "the reference check did not catch the control (request " << k
                         << "'s encoder length for every request)";
  }
}

// The model without its cross layers: the same weights, the cross layers dropped and the rest
// renumbered.
HostWeights without_cross_layers(const HostWeights& w) {
  HostWeights out;
  out.config = w.config;
  out.config.layers.clear();
  std::map<std::int32_t, std::int32_t> renumber;
  for (std::int32_t l = 0; l < w.config.num_hidden_layers; ++l) {
    if (w.config.layers[static_cast<std::size_t>(l)].kind == AttentionKind::kCross) continue;
    renumber[l] = static_cast<std::int32_t>(out.config.layers.size());
    out.config.layers.push_back(w.config.layers[static_cast<std::size_t>(l)]);
  }
  out.config.num_hidden_layers = static_cast<std::int32_t>(out.config.layers.size());
  for (const auto& [name, t] : w.tensors) {
    if (!name.starts_with("model.layers.")) {
      out.tensors[name] = t;
      continue;
    }
    const std::size_t dot = name.find('.', 13);
    const std::int32_t l = std::stoi(name.substr(13, dot - 13));
    if (!renumber.count(l)) continue;
    out.tensors["model.layers." + std::to_string(renumber[l]) + name.substr(dot)] = t;
  }
  out.config.validate();
  return out;
}

// encoder_len 0 is an exact identity of the cross blocks: in a batch mixing image and text-only
// requests (one captured graph per decode step), the text-only rows' logits are bitwise those of
// the model without cross layers run on the same batch shapes.
TEST_F(CrossGpu, TextOnlyRowsAreBitwiseTheModelWithoutCrossLayers) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig c = small_cross_test_config();
  const HostWeights w = synthetic_weights(c, rng());
  const HostWeights plain = without_cross_layers(w);
  ASSERT_EQ(plain.config.num_hidden_layers, 4);
  const MixedBatch b(rng, c);
  GenerateOptions o;
  o.new_tokens = 3;
  const Generated cross = generate(w, b, o);
  MixedBatch text_only = b;  // same prompts, no encoder states at all
  for (auto& v : text_only.views) v = {};
  const Generated ref = generate(plain, text_only, o);
  ASSERT_EQ(cross.result.graph_steps, 2);
  ASSERT_EQ(ref.result.graph_steps, 2);
  const auto V = static_cast<std::size_t>(c.vocab_size);
  for (std::size_t p = 0; p < b.lengths.size(); ++p) {
    if (b.lengths[p] != 0) continue;
    EXPECT_EQ(cross.result.tokens[p], ref.result.tokens[p]) << "request " << p;
    for (std::size_t s = 0; s < cross.logits.size(); ++s)
      EXPECT_EQ(std::memcmp(&cross.logits[s][p * V], &ref.logits[s][p * V], V * sizeof(float)), 0)
          << "text-only request " << p << " step " << s
          << ": the cross layers are not an exact identity";
  }
}

// A model on its runtime with decode graphs, its requests' encoder states projected at arrival.
struct CrossHarness {
  RuntimeOptions options;
  AttentionLayout layout;
  StepCapacity cap;
  Stream stream;
  std::unique_ptr<StepContext> step;
  std::unique_ptr<ModelRuntime> runtime;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<ModelStep> program;
  std::unique_ptr<StepGraphs> graphs;

  CrossHarness(const HostWeights& w, const RuntimeOptions& o)
      : options(o), layout(llama_attention_layout(w.config)) {
    cap = step_capacity(options, std::span<const AttentionLayout>(&layout, 1));
    step = std::make_unique<StepContext>(cap, ledger_pools(cap, options));
    runtime = std::make_unique<ModelRuntime>(layout, options, *step, 0, stream.get());
    model = std::make_unique<LlamaModel>(w, options, stream.get());
    program = std::make_unique<ModelStep>(*runtime, *model);
    graphs = std::make_unique<StepGraphs>(step->input(), *program, StepGraphsConfig{});
    graphs->capture(stream.get());
  }

  // A new request: a slot, its encoder pages, the cross table, its K/V projected.
  StepRequest arrive(const EncoderStatesView& enc) {
    StepRequest r;
    r.slot = step->ledger().acquire();
    r.encoder_len = enc.length;
    if (enc.length > 0) step->ledger().set_encoder(r.slot, enc.length);
    LlamaModel::apply_cross_table(*runtime, stream.get());
    model->encode(*runtime, r.slot, enc, stream.get());
    return r;
  }

  StepPath run(StepMode mode, std::vector<StepRequest>& req, const std::vector<std::int32_t>& ids,
               std::vector<float>& out) {
    for (StepRequest& r : req) step->ledger().extend(r.slot, r.extend_len);
    StepDesc d;
    d.mode = mode;
    d.tokens_per_request = mode == StepMode::kDecode ? 1 : 0;
    d.requests = req;
    d.token_ids = ids;
    step->attach_commands(d);
    const StepPath path = graphs->step(d, stream.get());
    step->ledger().clear_commands();
    out.resize(req.size() * static_cast<std::size_t>(model->vocab()));
    GD_CUDA(cudaMemcpyAsync(out.data(), model->logits(), out.size() * sizeof(float),
                            cudaMemcpyDeviceToHost, stream.get()));
    GD_CUDA(cudaStreamSynchronize(stream.get()));
    for (StepRequest& r : req) r.prefix_len += r.extend_len;
    return path;
  }
};

// A decode step of a mixed batch replayed from a graph, then run eagerly with the same shape
// (tables already applied; the K/V it rewrites are the same values): logits bitwise equal.
TEST_F(CrossGpu, GraphReplayEqualsEagerBitwiseForAMixedBatch) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig c = small_cross_test_config();
  const HostWeights w = synthetic_weights(c, rng());
  const MixedBatch b(rng, c);
  RuntimeOptions o;
  o.max_batch = 8;
  o.max_tokens = 128;
  o.max_kv_len = 64;
  o.max_encoder_len = 1100;
  CrossHarness h(w, o);
  std::vector<StepRequest> req;
  std::vector<std::int32_t> ids;
  for (std::size_t p = 0; p < b.prompts.size(); ++p) {
    req.push_back(h.arrive(b.views[p]));
    req.back().extend_len = static_cast<std::int32_t>(b.prompts[p].size());
    ids.insert(ids.end(), b.prompts[p].begin(), b.prompts[p].end());
  }
  std::vector<float> prefill, replay, eager;
  h.run(StepMode::kExtend, req, ids, prefill);
  ids.clear();
  for (std::size_t p = 0; p < req.size(); ++p) {
    req[p].extend_len = 1;
    ids.push_back(static_cast<std::int32_t>((p * 37 + 1) % c.vocab_size));
  }
  ASSERT_EQ(h.run(StepMode::kDecode, req, ids, replay), StepPath::kGraph);
  const GraphKey* key = h.graphs->find(StepMode::kDecode, 1, static_cast<std::int32_t>(req.size()));
  ASSERT_NE(key, nullptr);
  for (StepRequest& r : req) r.prefix_len -= 1;
  StepDesc d;
  d.mode = StepMode::kDecode;
  d.tokens_per_request = 1;
  d.requests = req;
  d.token_ids = ids;
  h.step->input().write(d);
  h.step->input().upload(h.stream.get());
  h.program->enqueue(key_shape(*key, h.cap), h.stream.get());
  eager.resize(replay.size());
  GD_CUDA(cudaMemcpyAsync(eager.data(), h.model->logits(), eager.size() * sizeof(float),
                          cudaMemcpyDeviceToHost, h.stream.get()));
  GD_CUDA(cudaStreamSynchronize(h.stream.get()));
  EXPECT_EQ(std::memcmp(replay.data(), eager.data(), replay.size() * sizeof(float)), 0);
  // And the replayed step against the float64 reference.
  const auto V = static_cast<std::size_t>(c.vocab_size);
  for (std::size_t p = 0; p < req.size(); ++p) {
    std::vector<std::int32_t> seq = b.prompts[p];
    seq.push_back(ids[p]);
    const RowCheck rc =
        check_row(testing::reference_last_logits(w, seq, b.encoder(p)), &replay[p * V]);
    EXPECT_TRUE(rc.ok()) << "request " << p << " (encoder_len " << b.lengths[p] << "): rel "
                         << rc.rel << " max_err " << rc.max_err << " of " << rc.max_ref;
  }
}

// The row kernels against their definitions: head_rmsnorm in place (heads inside a wider row),
// gated_residual_rmsnorm on rows with and without encoder keys (a masked row's residual bitwise
// untouched and its y bitwise rmsnorm()'s), and the residual-only form.
TEST_F(CrossGpu, CrossRowKernelsMatchTheirDefinitions) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  std::normal_distribution<float> n(0.f, 1.f);
  const auto bf = [](float x) { return reference::bf16_to_float(reference::float_to_bf16(x)); };
  const auto randv = [&](std::size_t count, float scale) {
    std::vector<std::uint16_t> v(count);
    for (auto& x : v) x = reference::float_to_bf16(scale * n(rng));
    return v;
  };
  Stream stream;
  // head_rmsnorm: 5 rows of [3 heads of 128 | 64 other], 4 live.
  {
    const std::int32_t rows = 5, heads = 3, d = 128, stride = heads * d + 64;
    const auto x = randv(static_cast<std::size_t>(rows) * stride, 2.f);
    const auto wt = randv(d, 1.f);
    DeviceBuffer<std::uint16_t> dx(x.size()), dw(wt.size());
    DeviceBuffer<std::int32_t> live(1);
    const std::int32_t four = 4;
    dx.upload(x.data(), x.size(), stream.get());
    dw.upload(wt.data(), wt.size(), stream.get());
    live.upload(&four, 1, stream.get());
    head_rmsnorm({dx.data(), dw.data(), live.data(), rows, heads, d, stride, 1e-5f}, stream.get());
    std::vector<std::uint16_t> got(x.size());
    dx.download(got.data(), got.size(), stream.get());
    GD_CUDA(cudaStreamSynchronize(stream.get()));
    for (std::int32_t r = 0; r < rows; ++r)
      for (std::int32_t h = 0; h <= heads; ++h) {
        const std::size_t base = static_cast<std::size_t>(r) * stride + h * d;
        const std::int32_t len = h < heads ? d : 64;
        double ss = 0;
        for (std::int32_t i = 0; h < heads && i < d; ++i) {
          const double v = reference::bf16_to_float(x[base + i]);
          ss += v * v;
        }
        const double inv = 1.0 / std::sqrt(ss / d + 1e-5);
        for (std::int32_t i = 0; i < len; ++i) {
          const float g = reference::bf16_to_float(got[base + i]);
          if (r >= 4 || h == heads) {  // dead rows and the other columns: untouched
            ASSERT_EQ(got[base + i], x[base + i]) << "row " << r << " head " << h;
            continue;
          }
          const double want = reference::bf16_to_float(wt[i]) *
                              bf(static_cast<float>(reference::bf16_to_float(x[base + i]) * inv));
          ASSERT_NEAR(g, want, 1e-2 * std::abs(want) + 1e-3) << "row " << r << " head " << h;
        }
      }
  }
  // gated_residual_rmsnorm: 6 rows, requests {0, 1, 1, 2, -1 (padding), 0}, encoder_len
  // {5, 0, 3}: rows 1, 2 (request 1) and 4 (padding) are masked; with the positional rule (a
  // cross MLP's output) also row 0, at position 2 of a slot whose first image position is 4.
  for (const bool positional : {false, true}) {
    const std::int32_t rows = 6, hidden = 1024;
    const std::vector<std::int32_t> token_request = {0, 1, 1, 2, -1, 0}, enc = {5, 0, 3};
    const std::vector<std::int32_t> token_slot = {3, 1, 1, 5, 0, 3};
    const std::vector<std::int32_t> token_position = {2, 0, 1, 0, 0, 7};
    const std::vector<std::int32_t> first = {0, 0, 0, 4, 0, 0};  // per slot
    const auto x = randv(static_cast<std::size_t>(rows) * hidden, 1.f);
    const auto res = randv(x.size(), 1.f);
    const auto wt = randv(hidden, 1.f);
    const std::uint16_t gate = reference::float_to_bf16(-0.7f);
    DeviceBuffer<std::uint16_t> dx(x.size()), dres(res.size()), dres2(res.size()), dw(wt.size()),
        dy(x.size()), dy_plain(x.size()), dg(8);
    DeviceBuffer<std::int32_t> dtr(token_request.size()), denc(enc.size()), live(1),
        dslot(token_slot.size()), dpos(token_position.size()), dfirst(first.size());
    dslot.upload(token_slot.data(), token_slot.size(), stream.get());
    dpos.upload(token_position.data(), token_position.size(), stream.get());
    dfirst.upload(first.data(), first.size(), stream.get());
    dx.upload(x.data(), x.size(), stream.get());
    dres.upload(res.data(), res.size(), stream.get());
    dres2.upload(res.data(), res.size(), stream.get());
    dw.upload(wt.data(), wt.size(), stream.get());
    dg.upload(&gate, 1, stream.get());
    dtr.upload(token_request.data(), token_request.size(), stream.get());
    denc.upload(enc.data(), enc.size(), stream.get());
    live.upload(&rows, 1, stream.get());
    GatedResidualNormArgs a;
    a.x = dx.data();
    a.residual = dres.data();
    a.gate = dg.data();
    a.token_request = dtr.data();
    a.encoder_len = denc.data();
    if (positional) {
      a.token_slot = dslot.data();
      a.token_position = dpos.data();
      a.first_position = dfirst.data();
    }
    a.weight = dw.data();
    a.y = dy.data();
    a.num_rows = live.data();
    a.max_rows = rows;
    a.hidden = hidden;
    gated_residual_rmsnorm(a, stream.get());
    a.residual = dres2.data();  // the residual-only form
    a.y = nullptr;
    gated_residual_rmsnorm(a, stream.get());
    // rmsnorm() of the untouched residual, for the masked rows' y.
    RmsNormArgs plain;
    plain.x = dres2.data();  // masked rows of dres2 are the original residual
    plain.weight = dw.data();
    plain.y = dy_plain.data();
    plain.num_rows = live.data();
    plain.max_rows = rows;
    plain.hidden = hidden;
    rmsnorm(plain, stream.get());
    std::vector<std::uint16_t> y(x.size()), r1(x.size()), r2(x.size()), yp(x.size());
    dy.download(y.data(), y.size(), stream.get());
    dres.download(r1.data(), r1.size(), stream.get());
    dres2.download(r2.data(), r2.size(), stream.get());
    dy_plain.download(yp.data(), yp.size(), stream.get());
    GD_CUDA(cudaStreamSynchronize(stream.get()));
    EXPECT_EQ(r1, r2) << "the residual-only form updates the residual the same way";
    const float tg = bf(std::tanh(reference::bf16_to_float(gate)));
    for (std::int32_t r = 0; r < rows; ++r) {
      const bool masked =
          token_request[r] < 0 || enc[token_request[r]] == 0 ||
          (positional && token_position[r] < first[static_cast<std::size_t>(token_slot[r])]);
      const std::size_t base = static_cast<std::size_t>(r) * hidden;
      if (masked) {
        EXPECT_EQ(std::memcmp(&r1[base], &res[base], hidden * 2), 0)
            << "masked row " << r << (positional ? " (positional)" : "");
        EXPECT_EQ(std::memcmp(&y[base], &yp[base], hidden * 2), 0)
            << "masked row " << r << ": y is not rmsnorm()'s";
        continue;
      }
      double ss = 0;
      std::vector<float> want_res(hidden);
      for (std::int32_t i = 0; i < hidden; ++i) {
        want_res[i] = bf(reference::bf16_to_float(res[base + i]) +
                         bf(tg * reference::bf16_to_float(x[base + i])));
        ASSERT_EQ(reference::bf16_to_float(r1[base + i]), want_res[i]) << "row " << r << " " << i;
        ss += static_cast<double>(want_res[i]) * want_res[i];
      }
      const double inv = 1.0 / std::sqrt(ss / hidden + 1e-5);
      for (std::int32_t i = 0; i < hidden; ++i) {
        const double want =
            reference::bf16_to_float(wt[i]) * bf(static_cast<float>(want_res[i] * inv));
        ASSERT_NEAR(reference::bf16_to_float(y[base + i]), want, 1e-2 * std::abs(want) + 1e-3)
            << "row " << r << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace graphdecode
