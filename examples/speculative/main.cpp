// speculative: speculative decoding with a draft model, against plain decoding in the same run.
// Serves the same greedy requests twice, once by plain decode steps and once by speculative steps
// (k drafts from the draft model, verified by the target in one pass), and prints the acceptance
// per draft position, the tokens a request commits per step, throughput of both and the speedup,
// and whether every request got the same tokens. Each engine first serves a warm-up batch of other
// prompts, so one-off costs (graph captures, library loading) do not favour either side.
//
//   speculative [--target DIR | --model 1b|small] [--draft self|noisy|layers:N|DIR]
//               [--eagle synthetic|synthetic3|DIR] [--k K] [--requests N] [--max-batch B]
//               [--prompt-len L] [--new-tokens T] [--seed S] [--graphs on|off]
//
// Drafts: `self` is the target itself (every draft accepted: the machinery at full acceptance,
// no speedup since the draft costs what the target costs); `noisy` the target with noise on its
// LM head (part accepted); `layers:N` the target's first N layers with the same weights (a cheap
// draft); DIR a Hugging Face checkpoint of the target's vocabulary. Synthetic weights by default.
// --eagle drafts with an EAGLE head instead (engine/spec/eagle_weights.h): `synthetic` a seeded
// random EAGLE-1/2 head for the target, `synthetic3` a seeded random EAGLE-3 head (three captured
// target layers, a draft vocabulary of half the target's; both show the machinery, their drafts
// are rarely accepted), DIR a head directory (config.json + model.safetensors, EAGLE's tensor
// names) trained for the target: EAGLE-1/2 or EAGLE-3 (LlamaForCausalLMEagle3), as its config
// says.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "attention/reference.h"
#include "common/device.h"
#include "common/error.h"
#include "engine/engine.h"
#include "engine/model_config.h"
#include "engine/spec/eagle_weights.h"
#include "engine/weights.h"

namespace {

using namespace graphdecode;

struct Options {
  std::string target, draft = "self", model = "small", eagle;
  std::int32_t k = 4, requests = 8, max_batch = 8, prompt_len = 64, new_tokens = 128;
  std::uint64_t seed = 1;
  bool graphs = true;
};

int usage() {
  std::fprintf(stderr,
               "usage: speculative [--target DIR | --model 1b|small] "
               "[--draft self|noisy|layers:N|DIR]\n"
               "                   [--eagle synthetic|synthetic3|DIR] [--k K] [--requests N] "
               "[--max-batch B] "
               "[--prompt-len L]\n"
               "                   [--new-tokens T] [--seed S] [--graphs on|off]\n");
  return 2;
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--target")
      o.target = v;
    else if (a == "--model")
      o.model = v;
    else if (a == "--draft")
      o.draft = v;
    else if (a == "--eagle")
      o.eagle = v;
    else if (a == "--k")
      o.k = std::stoi(v);
    else if (a == "--requests")
      o.requests = std::stoi(v);
    else if (a == "--max-batch")
      o.max_batch = std::stoi(v);
    else if (a == "--prompt-len")
      o.prompt_len = std::stoi(v);
    else if (a == "--new-tokens")
      o.new_tokens = std::stoi(v);
    else if (a == "--seed")
      o.seed = std::stoull(v);
    else if (a == "--graphs")
      o.graphs = v != "off";
    else
      return false;
  }
  return argc % 2 == 1 && (o.model == "1b" || o.model == "small");
}

HostWeights make_draft(const Options& o, const HostWeights& target) {
  if (o.draft == "self") return target;
  if (o.draft == "noisy") {
    HostWeights d = target;
    std::mt19937_64 rng(o.seed + 7);
    std::normal_distribution<float> noise(0.f, 0.01f);
    const std::string head =
        target.config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    for (std::uint16_t& x : d.tensors.at(head).data)
      x = reference::float_to_bf16(reference::bf16_to_float(x) + noise(rng));
    return d;
  }
  if (o.draft.starts_with("layers:")) {
    GD_REQUIRE(o.target.empty(), "draft", o.draft, "layers:N drafts need synthetic weights");
    ModelConfig c = target.config;
    c.num_hidden_layers = std::stoi(o.draft.substr(7));
    GD_REQUIRE(c.num_hidden_layers >= 1 && c.num_hidden_layers <= target.config.num_hidden_layers,
               "draft", o.draft, "layers:N with N in [1, the target's layers]");
    c.layers.resize(static_cast<std::size_t>(c.num_hidden_layers));
    return synthetic_weights(c, o.seed);  // the target's tensors of those layers, same seed
  }
  return load_checkpoint(o.draft);
}

struct Served {
  std::vector<std::vector<std::int32_t>> tokens;
  EngineStats stats;
};

// The counters of `now` accumulated since `before` (the latency percentiles are over the last
// steps already, so they are kept as they are).
EngineStats since(const EngineStats& now, const EngineStats& before) {
  EngineStats d = now;
  d.steps -= before.steps;
  d.prefill_steps -= before.prefill_steps;
  d.decode_steps -= before.decode_steps;
  d.generated_tokens -= before.generated_tokens;
  d.busy_s -= before.busy_s;
  d.spec_rows -= before.spec_rows;
  d.drafted_tokens -= before.drafted_tokens;
  d.accepted_tokens -= before.accepted_tokens;
  for (std::size_t j = 0; j < before.drafted_at.size() && j < d.drafted_at.size(); ++j) {
    d.drafted_at[j] -= before.drafted_at[j];
    d.accepted_at[j] -= before.accepted_at[j];
  }
  return d;
}

// Serves `warmup` (same shapes, other prompts, so the prefix cache cannot serve the measured ones)
// and then `specs`, and reports `specs`: the warm-up pays the one-off costs (graph captures, cuBLAS
// and module loading) that would otherwise favour whichever engine runs second.
Served serve(Engine& engine, const std::vector<RequestSpec>& warmup,
             const std::vector<RequestSpec>& specs) {
  Served out;
  for (const std::vector<RequestSpec>* batch : {&warmup, &specs}) {
    const EngineStats before = engine.stats();
    out.tokens.assign(batch->size(), {});
    for (std::size_t r = 0; r < batch->size(); ++r)
      engine.submit((*batch)[r],
                    [&out, r](const TokenEvent& e) { out.tokens[r].push_back(e.token); });
    engine.run_until_idle();
    out.stats = since(engine.stats(), before);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      usage();
      return 0;
    }
  }
  try {
    if (!parse(argc, argv, o)) return usage();
  } catch (const std::exception&) {
    return usage();
  }
  if (!cuda_device_available()) {
    std::fprintf(stderr, "speculative: no CUDA device found; the engine needs an NVIDIA GPU.\n");
    return 1;
  }
  try {
    const HostWeights target =
        !o.target.empty()
            ? load_checkpoint(o.target)
            : synthetic_weights(o.model == "1b" ? llama_1b_config() : small_test_config(), o.seed);
    const bool eagle = !o.eagle.empty();
    const HostWeights draft = eagle ? HostWeights{} : make_draft(o, target);
    const EagleWeights head =
        !eagle                    ? EagleWeights{}
        : o.eagle == "synthetic"  ? synthetic_eagle_weights(target.config, o.seed + 11)
        : o.eagle == "synthetic3" ? synthetic_eagle3_weights(target.config, o.seed + 11)
                                  : load_eagle_head(o.eagle);
    std::printf("target: %d layers, hidden %d, vocab %d (%s); ", target.config.num_hidden_layers,
                target.config.hidden_size, target.config.vocab_size,
                o.target.empty() ? "synthetic" : o.target.c_str());
    if (eagle)
      std::printf("EAGLE-%s head (%s), k <= %d\n", head.config.eagle3() ? "3" : "1/2",
                  o.eagle.c_str(), o.k);
    else
      std::printf("draft: %d layers (%s), k <= %d\n", draft.config.num_hidden_layers,
                  o.draft.c_str(), o.k);

    std::mt19937_64 rng(o.seed);
    const auto random_specs = [&] {
      std::vector<RequestSpec> specs(static_cast<std::size_t>(o.requests));
      for (RequestSpec& s : specs) {
        s.prompt.resize(static_cast<std::size_t>(o.prompt_len));
        for (auto& t : s.prompt)
          t = std::uniform_int_distribution<std::int32_t>(0, target.config.vocab_size - 1)(rng);
        s.max_new_tokens = o.new_tokens;
      }
      return specs;
    };
    const std::vector<RequestSpec> warmup = random_specs();
    const std::vector<RequestSpec> specs = random_specs();
    EngineConfig ec;
    ec.max_batch = o.max_batch;
    ec.max_context = o.prompt_len + o.new_tokens;
    ec.use_graphs = o.graphs;
    Engine plain_engine(target, ec);
    const Served plain = serve(plain_engine, warmup, specs);
    ec.speculative.max_draft_tokens = o.k;
    ec.speculative.k_by_batch = {{o.max_batch, o.k}};
    if (eagle) ec.speculative.proposer = SpecProposer::kEagle;
    Engine spec_engine(target, ec, eagle ? nullptr : &draft, eagle ? &head : nullptr);
    const Served spec = serve(spec_engine, warmup, specs);

    const EngineStats& s = spec.stats;
    std::printf("acceptance by draft position:");
    for (std::size_t j = 0; j < s.drafted_at.size(); ++j)
      std::printf(" %zu:%.3f", j + 1,
                  s.drafted_at[j] ? static_cast<double>(s.accepted_at[j]) / s.drafted_at[j] : 0.0);
    std::printf("\n%lld of %lld drafts accepted, %.2f tokens per request per step\n",
                static_cast<long long>(s.accepted_tokens), static_cast<long long>(s.drafted_tokens),
                s.tokens_per_spec_row());
    std::printf("plain:       %6.0f tokens/s, %lld decode steps, p50 step %.0f us\n",
                plain.stats.tokens_per_s(), static_cast<long long>(plain.stats.decode_steps),
                plain.stats.decode_p50_us);
    std::printf("speculative: %6.0f tokens/s, %lld decode steps, p50 step %.0f us\n",
                s.tokens_per_s(), static_cast<long long>(s.decode_steps), s.decode_p50_us);
    std::printf("speedup %.2fx\n", s.tokens_per_s() / plain.stats.tokens_per_s());
    int differ = 0;
    for (std::size_t r = 0; r < specs.size(); ++r) differ += spec.tokens[r] != plain.tokens[r];
    std::printf("%d of %d requests got tokens different from plain greedy decoding%s\n", differ,
                o.requests, differ ? " (a near-tie of bf16 logits can flip a greedy pick)" : "");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "speculative: %s\n", e.what());
    return 1;
  }
  return 0;
}
