#include "eagle_steps.h"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>

#include "common/cuda_check.h"
#include "common/error.h"
#include "common/stream.h"
#include "engine/llama_model.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/step_context.h"
#include "engine/spec/eagle_proposer.h"
#include "engine/spec/spec_book.h"
#include "engine/spec/spec_step.h"
#include "graphs/step_graphs.h"

namespace graphdecode {
namespace {

void write_rows(std::ostream& js, const std::vector<std::vector<std::int32_t>>& rows) {
  js << "[";
  for (std::size_t p = 0; p < rows.size(); ++p) {
    js << (p ? ", " : "") << "[";
    for (std::size_t t = 0; t < rows[p].size(); ++t) js << (t ? ", " : "") << rows[p][t];
    js << "]";
  }
  js << "]";
}

}  // namespace

int run_eagle_steps(const HostWeights& target, const EagleWeights& head,
                    const std::vector<std::vector<std::int32_t>>& prompts, std::int32_t new_tokens,
                    std::int32_t k, bool graphs, const std::string& out) {
  GD_REQUIRE(k >= 1 && k <= kMaxSpecDrafts, "k", k, "in [1, kMaxSpecDrafts]");
  const auto batch = static_cast<std::int32_t>(prompts.size());
  std::int32_t longest = 0, total = 0;
  for (const auto& p : prompts) {
    longest = std::max(longest, static_cast<std::int32_t>(p.size()));
    total += static_cast<std::int32_t>(p.size());
  }
  RuntimeOptions options;
  options.max_batch = batch;
  options.max_tokens = std::max(total, batch * (k + 1));
  options.max_kv_len = longest + new_tokens + 2 * k + 1;
  options.max_logit_rows = batch * (k + 1);
  const std::vector<AttentionLayout> models = {llama_attention_layout(target.config),
                                               llama_attention_layout(head.config.layer)};
  StepCapacity cap = step_capacity(options, models);
  cap.aux_words = SamplingWords::kCount;
  cap.max_draft_tokens = k;
  Stream stream;
  StepContext step(cap, ledger_pools(cap, options));
  ModelRuntime target_rt(models[0], options, step, 0, stream.get());
  ModelRuntime head_rt(models[1], options, step, 1, stream.get());
  LlamaModel model(target, options, stream.get());
  enable_eagle_states(model, head.config, stream.get());
  SpecStep program(target_rt, model, stream.get());
  EagleProposer proposer(head_rt, head, model, options, stream.get());
  program.set_proposer(proposer);
  StepGraphsConfig gc;
  gc.use_graphs = graphs;
  gc.modes.push_back({StepMode::kSpeculative, k});
  StepGraphs graph(step.input(), program, gc);
  graph.capture(stream.get());

  std::vector<std::int32_t> published(static_cast<std::size_t>(batch) * program.stride() + 1);
  std::vector<std::int32_t> aux, ids, vblock(step.prep().layout().total_words);
  std::int64_t graph_steps = 0, eager_steps = 0, drafted = 0, accepted = 0;
  const auto run = [&](StepDesc& d) {
    aux.assign(d.requests.size() * SamplingWords::kCount, 0);
    for (std::size_t r = 0; r < d.requests.size(); ++r)
      SamplingWords::write(
          SamplingParams{}, -1,
          std::span<std::int32_t>(aux).subspan(r * SamplingWords::kCount, SamplingWords::kCount));
    d.aux = aux;
    step.attach_commands(d);
    (graph.step(d, stream.get()) == StepPath::kGraph ? graph_steps : eager_steps) += 1;
    step.ledger().clear_commands();
    GD_CUDA(cudaMemcpyAsync(published.data(), program.published(),
                            published.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost,
                            stream.get()));
    GD_CUDA(cudaStreamSynchronize(stream.get()));
    GD_REQUIRE(published.back() == 0, "bad_token_flag", published.back(),
               "a model saw a token id outside the vocabulary");
  };
  const auto committed = [&](std::size_t r) {
    const std::int32_t* row = published.data() + r * static_cast<std::size_t>(program.stride());
    return std::vector<std::int32_t>(row + 1, row + 1 + row[0]);
  };

  KvLedger& ledger = step.ledger();
  std::vector<StepRequest> req(prompts.size());
  std::vector<SpecRequestState> state(prompts.size());
  std::vector<std::vector<std::int32_t>> tokens(prompts.size());
  for (std::size_t r = 0; r < prompts.size(); ++r) {
    req[r].slot = ledger.acquire();
    req[r].extend_len = static_cast<std::int32_t>(prompts[r].size());
    ledger.extend(req[r].slot, req[r].extend_len);
    ids.insert(ids.end(), prompts[r].begin(), prompts[r].end());
  }
  StepDesc d;
  d.mode = StepMode::kExtend;
  d.requests = req;
  d.token_ids = ids;
  run(d);
  for (std::size_t r = 0; r < prompts.size(); ++r) {
    const auto c = committed(r);
    const auto len = static_cast<std::int32_t>(prompts[r].size());
    state[r] = SpecRequestState{len, len, c};
    tokens[r] = c;
  }
  std::vector<std::vector<std::vector<std::int32_t>>> step_drafts, step_committed;
  while (std::any_of(tokens.begin(), tokens.end(), [&](const auto& t) {
    return static_cast<std::int32_t>(t.size()) < new_tokens;
  })) {
    // Only requests still short of new_tokens take part (a finished one would grow past the
    // runtime's max_kv_len); the JSON keeps every request's row per step (empty when done).
    ids.clear();
    std::vector<std::size_t> active;
    std::vector<StepRequest> sreq;
    for (std::size_t r = 0; r < prompts.size(); ++r) {
      if (static_cast<std::int32_t>(tokens[r].size()) >= new_tokens) continue;
      reserve_spec_step(ledger, req[r].slot, state[r], k);
      req[r].prefix_len = state[r].draft_cached;
      req[r].extend_len = static_cast<std::int32_t>(state[r].pending.size());
      ids.insert(ids.end(), state[r].pending.begin(), state[r].pending.end());
      active.push_back(r);
      sreq.push_back(req[r]);
    }
    StepDesc sd;
    sd.mode = StepMode::kSpeculative;
    sd.tokens_per_request = k;
    sd.requests = sreq;
    sd.token_ids = ids;
    run(sd);
    program.spec_prep().download(0, vblock, stream.get());
    const StepMetaView v = StepMetaView::over(vblock.data(), step.prep().layout());
    std::vector<std::vector<std::int32_t>> drafts(prompts.size()), comm(prompts.size());
    for (std::size_t i = 0; i < active.size(); ++i) {
      const std::size_t r = active[i];
      const std::int32_t* row = v.token_id + i * static_cast<std::size_t>(k + 1);
      drafts[r].assign(row + 1, row + 1 + k);
      comm[r] = committed(i);
      drafted += k;
      accepted += static_cast<std::int64_t>(comm[r].size()) - 1;
      commit_spec_step(ledger, req[r].slot, state[r], comm[r]);
      tokens[r].insert(tokens[r].end(), comm[r].begin(), comm[r].end());
    }
    step_drafts.push_back(std::move(drafts));
    step_committed.push_back(std::move(comm));
  }
  for (auto& t : tokens) t.resize(static_cast<std::size_t>(new_tokens));
  std::ofstream js(out + ".json");
  if (!js) throw Error("cannot write", "model_parity", "out", out + ".json");
  js << "{\"batch\": " << batch << ", \"k\": " << k << ", \"graph_steps\": " << graph_steps
     << ", \"eager_steps\": " << eager_steps << ", \"drafted\": " << drafted
     << ", \"accepted\": " << accepted << ", \"tokens\": ";
  write_rows(js, tokens);
  js << ", \"steps\": [";
  for (std::size_t s = 0; s < step_drafts.size(); ++s) {
    js << (s ? ", " : "") << "{\"drafts\": ";
    write_rows(js, step_drafts[s]);
    js << ", \"committed\": ";
    write_rows(js, step_committed[s]);
    js << "}";
  }
  js << "]}\n";
  std::cout << "model_parity: EAGLE, " << batch << " prompts, " << step_drafts.size()
            << " speculative steps, " << accepted << " of " << drafted << " drafts accepted -> "
            << out << ".json\n";
  return 0;
}

}  // namespace graphdecode
