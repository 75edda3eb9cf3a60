#include "engine/generate.h"

#include <algorithm>
#include <memory>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/kernels/model_kernels.h"
#include "engine/model_step.h"
#include "engine/runtime/step_context.h"
#include "graphs/step_graphs.h"

namespace graphdecode {

std::int32_t argmax(std::span<const float> row) {
  std::int32_t best = 0;
  for (std::size_t i = 1; i < row.size(); ++i) {
    if (row[i] > row[static_cast<std::size_t>(best)]) best = static_cast<std::int32_t>(i);
  }
  return best;
}

RuntimeOptions generation_runtime_options(std::span<const std::vector<std::int32_t>> prompts,
                                          const GenerateOptions& o) {
  GD_REQUIRE(!prompts.empty(), "prompts", 0, "need at least one prompt");
  GD_REQUIRE(o.new_tokens >= 1, "new_tokens", o.new_tokens, "must be positive");
  std::int32_t total = 0, longest = 0;
  for (const auto& p : prompts) {
    total += static_cast<std::int32_t>(p.size());
    longest = std::max(longest, static_cast<std::int32_t>(p.size()));
  }
  std::int32_t longest_encoder = 1;
  for (const EncoderStatesView& e : o.encoders)
    longest_encoder = std::max(longest_encoder, e.length);
  RuntimeOptions m;
  m.max_encoder_len = longest_encoder;
  m.max_batch = static_cast<std::int32_t>(prompts.size());
  m.max_tokens = std::max(total, m.max_batch);
  m.max_kv_len = longest + o.new_tokens;
  m.max_new_tokens = longest;
  m.page_size = o.page_size;
  m.deterministic = o.deterministic;
  return m;
}

GenerateResult generate_greedy(const HostWeights& weights,
                               std::span<const std::vector<std::int32_t>> prompts,
                               const GenerateOptions& o, cudaStream_t stream,
                               const StepCallback& on_step) {
  const std::int32_t vocab = weights.config.vocab_size;
  const std::int32_t input_vocab = weights.config.input_vocab_size();
  for (std::size_t r = 0; r < prompts.size(); ++r) {
    GD_REQUIRE(!prompts[r].empty(), "prompts[" + std::to_string(r) + "]", 0, "empty prompt");
    for (std::int32_t id : prompts[r])
      GD_REQUIRE(id >= 0 && id < input_vocab, "prompts[" + std::to_string(r) + "]", id,
                 "token id outside [0, input vocab)");
  }
  GD_REQUIRE(o.encoders.empty() || o.encoders.size() == prompts.size(), "encoders",
             o.encoders.size(), "one entry per prompt, or none");
  std::vector<std::int32_t> enc_len(prompts.size(), 0);
  for (std::size_t r = 0; r < o.encoders.size(); ++r) {
    enc_len[r] = o.encoders[r].length;
    GD_REQUIRE(enc_len[r] >= 0, "encoders[" + std::to_string(r) + "].length", enc_len[r],
               "cannot be negative");
    GD_REQUIRE(enc_len[r] == 0 || weights.config.any_cross(), "encoders[" + std::to_string(r) + "]",
               enc_len[r], "the model has no cross-attention layers");
  }
  GD_REQUIRE(o.control_encoder_len_of < static_cast<std::int32_t>(prompts.size()),
             "control_encoder_len_of", o.control_encoder_len_of, "not a prompt index");
  const RuntimeOptions ro = generation_runtime_options(prompts, o);
  const AttentionLayout layout = llama_attention_layout(weights.config);
  const StepCapacity cap = step_capacity(ro, std::span<const AttentionLayout>(&layout, 1));
  StepContext context(cap, ledger_pools(cap, ro));
  ModelRuntime runtime(layout, ro, context, 0, stream);
  LlamaModel model(weights, ro, stream);
  ModelStep program(runtime, model);
  StepGraphsConfig gc;
  gc.use_graphs = o.use_graphs;
  StepGraphs graphs(context.input(), program, gc);
  graphs.capture(stream);

  KvLedger& ledger = context.ledger();
  const auto batch = static_cast<std::int32_t>(prompts.size());
  std::vector<StepRequest> requests(prompts.size());
  for (auto& r : requests) r.slot = ledger.acquire();
  if (weights.config.any_cross()) {
    // Cross pages per request (the control reserves the longest for all), the table applied,
    // then every request's own states projected.
    const std::int32_t longest = *std::max_element(enc_len.begin(), enc_len.end());
    const bool control = o.control_encoder_len_of >= 0;
    for (std::size_t r = 0; r < requests.size(); ++r) {
      requests[r].encoder_len =
          control ? enc_len[static_cast<std::size_t>(o.control_encoder_len_of)] : enc_len[r];
      const std::int32_t pages_for = control ? longest : enc_len[r];
      if (pages_for > 0) ledger.set_encoder(requests[r].slot, pages_for);
    }
    LlamaModel::apply_cross_table(runtime, stream);
    for (std::size_t r = 0; r < o.encoders.size(); ++r)
      model.encode(runtime, requests[r].slot, o.encoders[r], stream);
  }
  std::vector<std::int32_t> ids;
  std::vector<std::int32_t> kv(prompts.size(), 0);  // tokens cached per request
  std::vector<float> logits(static_cast<std::size_t>(batch) * vocab);
  std::vector<std::int32_t> picks(prompts.size());
  GenerateResult result;
  result.tokens.assign(prompts.size(), {});

  for (std::int32_t step = 0; step < o.new_tokens; ++step) {
    ids.clear();
    for (std::size_t r = 0; r < prompts.size(); ++r) {
      const std::int32_t ext = step == 0 ? static_cast<std::int32_t>(prompts[r].size()) : 1;
      requests[r].prefix_len = kv[r];
      requests[r].extend_len = ext;
      if (step == 0) {
        ids.insert(ids.end(), prompts[r].begin(), prompts[r].end());
      } else {
        ids.push_back(picks[r]);
      }
      ledger.extend(requests[r].slot, ext);
      kv[r] += ext;
    }
    StepDesc d;
    d.mode = step == 0 ? StepMode::kExtend : StepMode::kDecode;
    d.tokens_per_request = step == 0 ? 0 : 1;
    d.requests = requests;
    d.token_ids = ids;
    context.attach_commands(d);
    const StepPath path = graphs.step(d, stream);
    (path == StepPath::kGraph ? result.graph_steps : result.eager_steps) += 1;
    ledger.clear_commands();
    GD_CUDA(cudaMemcpyAsync(logits.data(), model.logits(), logits.size() * sizeof(float),
                            cudaMemcpyDeviceToHost, stream));
    GD_CUDA(cudaStreamSynchronize(stream));
    for (std::int32_t r = 0; r < batch; ++r) {
      picks[static_cast<std::size_t>(r)] = argmax(std::span<const float>(
          logits.data() + static_cast<std::size_t>(r) * vocab, static_cast<std::size_t>(vocab)));
      result.tokens[static_cast<std::size_t>(r)].push_back(picks[static_cast<std::size_t>(r)]);
    }
    if (on_step) on_step(step, logits, picks);
  }
  std::int32_t bad = 0;
  GD_CUDA(cudaMemcpy(&bad, model.bad_token_flag(), sizeof(bad), cudaMemcpyDeviceToHost));
  GD_REQUIRE(bad == 0, "bad_token_flag", bad, kModelErrorFlagBits);
  return result;
}

}  // namespace graphdecode
