// Test support: a target and a proposer (a draft model, prompt lookup or an EAGLE head) in one
// speculative step program (SpecStep on one step context), driven like the engine drives it: the
// host book of each request (engine/spec/spec_book.h), one image and one read-back per step.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "attention_check.h"  // Rng
#include "common/cuda_check.h"
#include "common/stream.h"
#include "engine/llama_model.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/step_context.h"
#include "engine/spec/eagle_proposer.h"
#include "engine/spec/proposer.h"
#include "engine/spec/spec_book.h"
#include "engine/spec/spec_step.h"
#include "graphs/step_graphs.h"

namespace graphdecode::testing {

// The speculative tests' prompts: four of lengths 5, 40, 77 and 33 (small_test_config's window is
// 32: three of them are longer), ids uniform in [0, vocab).
inline std::vector<std::vector<std::int32_t>> spec_prompts(const ModelConfig& c, Rng& rng) {
  std::vector<std::vector<std::int32_t>> p;
  for (std::int32_t len : {5, 40, 77, 33}) {
    std::vector<std::int32_t> prompt(static_cast<std::size_t>(len));
    for (auto& t : prompt) t = static_cast<std::int32_t>(rng() % c.vocab_size);
    p.push_back(prompt);
  }
  return p;
}

struct SpecRun {
  RuntimeOptions options;
  StepCapacity cap;
  Stream stream;
  std::unique_ptr<StepContext> step;
  std::unique_ptr<ModelRuntime> target_rt, draft_rt;  // draft_rt: the draft model's or the head's
  std::unique_ptr<LlamaModel> target, draft;          // draft: a draft model only
  std::unique_ptr<SpecStep> program;
  std::unique_ptr<DraftProposer> proposer;
  std::unique_ptr<StepGraphs> graphs;
  std::vector<std::int32_t> published;
  std::int64_t drafted = 0, accepted = 0, steps = 0, graph_steps = 0;

  // `d`: the draft model, or nullptr for prompt lookup.
  SpecRun(const HostWeights& t, const HostWeights* d, std::int32_t max_batch, std::int32_t k_max,
          bool use_graphs) {
    std::vector<AttentionLayout> models = {llama_attention_layout(t.config)};
    if (d) models.push_back(llama_attention_layout(d->config));
    begin(models, max_batch, k_max);
    target = std::make_unique<LlamaModel>(t, options, stream.get());
    program = std::make_unique<SpecStep>(*target_rt, *target, stream.get());
    if (d) {
      draft_rt = std::make_unique<ModelRuntime>(models[1], options, *step, 1, stream.get());
      draft = std::make_unique<LlamaModel>(*d, options, stream.get());
      proposer = std::make_unique<DraftModelProposer>(*draft_rt, *draft, stream.get());
    } else {
      proposer = std::make_unique<NgramProposer>(step->prep(), NgramConfig{}, stream.get());
    }
    finish(max_batch, k_max, use_graphs);
  }

  // An EAGLE head proposes (the target keeps its hidden states for it).
  SpecRun(const HostWeights& t, const EagleWeights& h, std::int32_t max_batch, std::int32_t k_max,
          bool use_graphs) {
    const std::vector<AttentionLayout> models = {llama_attention_layout(t.config),
                                                 llama_attention_layout(h.config.layer)};
    begin(models, max_batch, k_max);
    draft_rt = std::make_unique<ModelRuntime>(models[1], options, *step, 1, stream.get());
    target = std::make_unique<LlamaModel>(t, options, stream.get());
    enable_eagle_states(*target, h.config, stream.get());
    program = std::make_unique<SpecStep>(*target_rt, *target, stream.get());
    proposer = std::make_unique<EagleProposer>(*draft_rt, h, *target, options, stream.get());
    finish(max_batch, k_max, use_graphs);
  }

  // The EAGLE head's proposer (the second constructor only).
  EagleProposer& eagle() { return static_cast<EagleProposer&>(*proposer); }

  void run(StepDesc& d, std::vector<std::int32_t>& aux) {
    aux.assign(d.requests.size() * SamplingWords::kCount, 0);
    for (std::size_t r = 0; r < d.requests.size(); ++r)
      SamplingWords::write(
          SamplingParams{}, -1,
          std::span<std::int32_t>(aux).subspan(r * SamplingWords::kCount, SamplingWords::kCount));
    d.aux = aux;
    step->attach_commands(d);
    graph_steps += graphs->step(d, stream.get()) == StepPath::kGraph;
    ++steps;
    step->ledger().clear_commands();
    GD_CUDA(cudaMemcpyAsync(published.data(), program->published(),
                            published.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost,
                            stream.get()));
    GD_CUDA(cudaStreamSynchronize(stream.get()));
    ASSERT_EQ(published.back(), 0) << "a model saw a token id outside the vocabulary";
  }

  std::span<const std::int32_t> committed(std::size_t r) const {
    const std::int32_t* row = published.data() + r * program->stride();
    return {row + 1, static_cast<std::size_t>(row[0])};
  }

  template <typename T>
  std::vector<T> download(const T* p, std::size_t n) {
    std::vector<T> h(n);
    GD_CUDA(cudaMemcpyAsync(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost, stream.get()));
    GD_CUDA(cudaStreamSynchronize(stream.get()));
    return h;
  }

  // The prefill of `prompts` (one step): slots and book states out.
  void prefill(const std::vector<std::vector<std::int32_t>>& prompts, std::vector<StepRequest>& req,
               std::vector<SpecRequestState>& state) {
    KvLedger& ledger = step->ledger();
    std::vector<std::int32_t> ids, aux;
    req.assign(prompts.size(), StepRequest{});
    state.assign(prompts.size(), SpecRequestState{});
    for (std::size_t r = 0; r < prompts.size(); ++r) {
      req[r].slot = ledger.acquire();
      req[r].extend_len = static_cast<std::int32_t>(prompts[r].size());
      ledger.extend(req[r].slot, req[r].extend_len);  // both models
      ids.insert(ids.end(), prompts[r].begin(), prompts[r].end());
    }
    StepDesc d;
    d.mode = StepMode::kExtend;
    d.requests = req;
    d.token_ids = ids;
    run(d, aux);
    for (std::size_t r = 0; r < prompts.size(); ++r) {
      const auto c = committed(r);
      const auto len = static_cast<std::int32_t>(prompts[r].size());
      state[r] = SpecRequestState{len, len, {c.begin(), c.end()}};
    }
  }

  // One speculative step of k drafts; the committed tokens per request out.
  std::vector<std::vector<std::int32_t>> speculate(std::vector<StepRequest>& req,
                                                   std::vector<SpecRequestState>& state,
                                                   std::int32_t k) {
    KvLedger& ledger = step->ledger();
    std::vector<std::int32_t> ids, aux;
    for (std::size_t r = 0; r < req.size(); ++r) {
      reserve_spec_step(ledger, req[r].slot, state[r], k);
      req[r].prefix_len = state[r].draft_cached;
      req[r].extend_len = static_cast<std::int32_t>(state[r].pending.size());
      ids.insert(ids.end(), state[r].pending.begin(), state[r].pending.end());
    }
    StepDesc sd;
    sd.mode = StepMode::kSpeculative;
    sd.tokens_per_request = k;
    sd.requests = req;
    sd.token_ids = ids;
    run(sd, aux);
    std::vector<std::vector<std::int32_t>> out;
    for (std::size_t r = 0; r < req.size(); ++r) {
      const auto c = committed(r);
      EXPECT_GE(c.size(), 1u);
      EXPECT_LE(c.size(), static_cast<std::size_t>(k + 1));
      drafted += k;
      accepted += static_cast<std::int64_t>(c.size()) - 1;
      commit_spec_step(ledger, req[r].slot, state[r], c);
      out.emplace_back(c.begin(), c.end());
    }
    return out;
  }

  // Greedy generation of `new_tokens` per prompt: a prefill, then speculative steps of k drafts
  // (k_of(step) per step). Every request runs to at least new_tokens; the tokens past are cut.
  std::vector<std::vector<std::int32_t>> generate(
      const std::vector<std::vector<std::int32_t>>& prompts, std::int32_t new_tokens,
      const std::function<std::int32_t(std::int64_t)>& k_of) {
    std::vector<StepRequest> req;
    std::vector<SpecRequestState> state;
    prefill(prompts, req, state);
    std::vector<std::vector<std::int32_t>> out(prompts.size());
    for (std::size_t r = 0; r < prompts.size(); ++r) out[r] = state[r].pending;
    for (std::int64_t s = 0;; ++s) {
      bool done = true;
      for (const auto& o : out) done &= static_cast<std::int32_t>(o.size()) >= new_tokens;
      if (done) break;
      const auto c = speculate(req, state, k_of(s));
      for (std::size_t r = 0; r < req.size(); ++r)
        out[r].insert(out[r].end(), c[r].begin(), c[r].end());
    }
    for (auto& o : out) o.resize(static_cast<std::size_t>(new_tokens));
    return out;
  }

 private:
  void begin(const std::vector<AttentionLayout>& models, std::int32_t max_batch,
             std::int32_t k_max) {
    options.max_batch = max_batch;
    options.max_tokens = 256;
    options.max_kv_len = 256;
    options.max_logit_rows = max_batch * (k_max + 1);
    cap = step_capacity(options, models);
    cap.aux_words = SamplingWords::kCount;
    cap.max_draft_tokens = k_max;
    step = std::make_unique<StepContext>(cap, ledger_pools(cap, options));
    target_rt = std::make_unique<ModelRuntime>(models[0], options, *step, 0, stream.get());
  }
  void finish(std::int32_t max_batch, std::int32_t k_max, bool use_graphs) {
    program->set_proposer(*proposer);
    StepGraphsConfig gc;
    gc.use_graphs = use_graphs;
    for (std::int32_t k = 0; k <= k_max; ++k) gc.modes.push_back({StepMode::kSpeculative, k});
    graphs = std::make_unique<StepGraphs>(step->input(), *program, gc);
    graphs->capture(stream.get());
    published.resize(static_cast<std::size_t>(max_batch) * program->stride() + 1);
  }
};

// The same EAGLE speculative steps by graph replay and eagerly (the eager path runs the bucket's
// shapes), k = step % (k_max + 1): every step's committed tokens, draft logits and carried states
// must be bitwise equal, and every step but the prefill must have been replayed.
inline void expect_eagle_replay_equals_eager(const HostWeights& target, const EagleWeights& head,
                                             const std::vector<std::vector<std::int32_t>>& prompts,
                                             std::int32_t k_max, int steps) {
  SpecRun replay(target, head, 4, k_max, true), eager(target, head, 4, k_max, false);
  std::vector<StepRequest> rq, eq;
  std::vector<SpecRequestState> rs, es;
  replay.prefill(prompts, rq, rs);
  eager.prefill(prompts, eq, es);
  const auto V = static_cast<std::size_t>(target.config.vocab_size);
  const std::size_t carry_words = static_cast<std::size_t>(replay.cap.max_slots) *
                                  static_cast<std::size_t>(k_max + 1) *
                                  static_cast<std::size_t>(head.config.state_width());
  const std::size_t logit_words = static_cast<std::size_t>(k_max) * 4 * V;
  for (int s = 0; s < steps; ++s) {
    const std::int32_t k = s % (k_max + 1);
    EXPECT_EQ(replay.speculate(rq, rs, k), eager.speculate(eq, es, k)) << "step " << s;
    const auto la = replay.download(replay.proposer->draft_logits(), logit_words);
    const auto lb = eager.download(eager.proposer->draft_logits(), logit_words);
    EXPECT_TRUE(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)) == 0)
        << "step " << s << ": draft logits differ";
    EXPECT_EQ(replay.download(replay.eagle().carry(), carry_words),
              eager.download(eager.eagle().carry(), carry_words))
        << "step " << s << ": carried states differ";
  }
  EXPECT_EQ(replay.graph_steps, replay.steps - 1);  // all but the prefill replayed
  EXPECT_EQ(eager.graph_steps, 0);
}

}  // namespace graphdecode::testing
