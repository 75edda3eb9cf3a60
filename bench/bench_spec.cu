// bench_spec: speculative decoding against plain decoding in the same run, by the Engine.
//
//   bench_spec --target DIR --draft DIR [--batches 1,8,32,64] [--ks 1,2,3,4,5] [--new-tokens T]
//              [--prompt-len L] [--lookup] [--json PATH]
//   bench_spec --synthetic [--draft-layers N] ...   (the 1B-class shape; the draft its first N
//                                                    layers with the same synthetic weights)
//   bench_spec ... --eagle DIR|synthetic|synthetic3  (an EAGLE head proposes instead of the
//                                                    draft model: EAGLE-1/2 or EAGLE-3 as the
//                                                    directory's config says, or seeded random;
//                                                    scripts/hf_eagle_parity.py --workdir keeps
//                                                    target/ and eagle/)
//
// Per batch B: B greedy requests (prompts of the period task of scripts/hf_parity.py for trained
// checkpoints, random for --synthetic) served to T new tokens by a plain engine, then by a
// speculative engine per k (every step drafts k), graphs on. Reported per run: decode tokens/s
// (generated tokens over the wall time of decode steps), latency per token (p50 decode step over
// the tokens a request commits per step), acceptance, and for speculative runs the device time
// of each phase of a step (prep, propose, verify, accept; events inside the step graph) and the
// overhead of a step over its models' work: (prep + accept) / (propose + verify).
// scripts/hf_spec_parity.py trains the pair (--workdir keeps target/ and draft/).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "common/device.h"
#include "common/error.h"
#include "engine/engine.h"
#include "engine/model_config.h"
#include "engine/spec/eagle_weights.h"
#include "engine/weights.h"

namespace {

using namespace graphdecode;

struct Run {
  std::string kind;  // "plain", "draft", "lookup", "eagle"
  std::int32_t batch = 0, k = 0;
  double tokens_per_s = 0, p50_step_us = 0, tokens_per_row = 1, us_per_token = 0;
  double acceptance = 0;
  double phase_us[4] = {};
  double overhead = 0;
};

Run serve(const HostWeights& target, const HostWeights* draft, const EagleWeights* eagle,
          bool lookup, std::int32_t batch, std::int32_t k,
          const std::vector<std::vector<std::int32_t>>& prompts, std::int32_t new_tokens) {
  EngineConfig ec;
  ec.max_batch = batch;
  std::int32_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, static_cast<std::int32_t>(p.size()));
  ec.max_context = longest + new_tokens;
  ec.max_step_tokens = 4096;
  if (k > 0) {
    ec.speculative.max_draft_tokens = k;
    ec.speculative.k_by_batch = {{batch, k}};
    ec.speculative.proposer = lookup  ? SpecProposer::kNgram
                              : eagle ? SpecProposer::kEagle
                                      : SpecProposer::kDraftModel;
  }
  const bool model = k > 0 && !lookup && eagle == nullptr;
  Engine engine(target, ec, model ? draft : nullptr, k > 0 && !lookup ? eagle : nullptr);
  for (std::int32_t r = 0; r < batch; ++r) {
    RequestSpec s;
    s.prompt = prompts[static_cast<std::size_t>(r) % prompts.size()];
    s.max_new_tokens = new_tokens;
    engine.submit(std::move(s));
  }
  // Prefill first (every request admitted at once), then time the decode steps alone.
  while (engine.stats().decode_steps == 0 && engine.step()) {
  }
  const EngineStats before = engine.stats();
  engine.run_until_idle();
  const EngineStats s = engine.stats();
  Run r;
  r.kind = k == 0 ? "plain" : lookup ? "lookup" : eagle ? "eagle" : "draft";
  r.batch = batch;
  r.k = k;
  const double decode_s = s.busy_s - before.busy_s;
  r.tokens_per_s = static_cast<double>(s.generated_tokens - before.generated_tokens) / decode_s;
  r.p50_step_us = s.decode_p50_us;
  if (k > 0) {
    r.tokens_per_row = s.tokens_per_spec_row();
    r.acceptance =
        s.drafted_tokens ? static_cast<double>(s.accepted_tokens) / s.drafted_tokens : 0.0;
    for (int p = 0; p < 4; ++p)
      r.phase_us[p] =
          s.spec_steps ? s.spec_phase_us[static_cast<std::size_t>(p)] / s.spec_steps : 0.0;
    const double work = r.phase_us[1] + r.phase_us[2];
    r.overhead = work > 0 ? (r.phase_us[0] + r.phase_us[3]) / work : 0.0;
  }
  r.us_per_token = r.p50_step_us / r.tokens_per_row;
  return r;
}

// Prompts of the period task (scripts/hf_parity.py): a pattern of P distinct tokens of block P.
std::vector<std::vector<std::int32_t>> task_prompts(std::int32_t n, std::int32_t len,
                                                    std::mt19937& rng) {
  std::vector<std::vector<std::int32_t>> out;
  for (std::int32_t i = 0; i < n; ++i) {
    const std::int32_t p = 2 + static_cast<std::int32_t>(rng() % 11);
    std::vector<std::int32_t> block(16);
    for (std::int32_t j = 0; j < 16; ++j) block[static_cast<std::size_t>(j)] = j;
    std::shuffle(block.begin(), block.end(), rng);
    std::vector<std::int32_t> prompt;
    for (std::int32_t t = 0; t < len; ++t)
      prompt.push_back(block[static_cast<std::size_t>(t % p)] + 16 * p);
    out.push_back(prompt);
  }
  return out;
}

int run_main(int argc, char** argv) {
  std::string target_dir, draft_dir, eagle_dir, json;
  std::vector<std::int32_t> batches = {1, 8, 32, 64}, ks = {1, 2, 3, 4, 5};
  std::int32_t new_tokens = 128, prompt_len = 64, draft_layers = 2;
  bool synthetic = false, lookup = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--target")
      target_dir = next();
    else if (a == "--draft")
      draft_dir = next();
    else if (a == "--synthetic")
      synthetic = true;
    else if (a == "--draft-layers")
      draft_layers = std::stoi(next());
    else if (a == "--lookup")
      lookup = true;
    else if (a == "--eagle")
      eagle_dir = next();
    else if (a == "--batches")
      batches = bench::parse_list("--batches", next());
    else if (a == "--ks")
      ks = bench::parse_list("--ks", next());
    else if (a == "--new-tokens")
      new_tokens = std::stoi(next());
    else if (a == "--prompt-len")
      prompt_len = std::stoi(next());
    else if (a == "--json")
      json = next();
    else {
      std::fprintf(stderr,
                   "usage: bench_spec (--target DIR --draft DIR | --synthetic "
                   "[--draft-layers N]) [--lookup | --eagle DIR|synthetic|synthetic3] [--batches "
                   "..] [--ks ..] "
                   "[--new-tokens T] [--prompt-len L] [--json PATH]\n");
      return 2;
    }
  }
  if (!cuda_device_available()) {
    std::fprintf(stderr, "bench_spec: no CUDA device\n");
    return 2;
  }
  GD_REQUIRE(synthetic != !target_dir.empty(), "target", target_dir,
             "either --synthetic or --target DIR");
  const HostWeights target =
      synthetic ? synthetic_weights(llama_1b_config(), 1) : load_checkpoint(target_dir);
  HostWeights draft;
  if (synthetic) {
    ModelConfig c = target.config;
    c.num_hidden_layers = draft_layers;
    c.layers.resize(static_cast<std::size_t>(draft_layers));
    draft = synthetic_weights(c, 1);
  } else if (!draft_dir.empty()) {
    draft = load_checkpoint(draft_dir);
  }
  const EagleWeights head = eagle_dir.empty()           ? EagleWeights{}
                            : eagle_dir == "synthetic"  ? synthetic_eagle_weights(target.config, 2)
                            : eagle_dir == "synthetic3" ? synthetic_eagle3_weights(target.config, 2)
                                                        : load_eagle_head(eagle_dir);
  const EagleWeights* eagle = eagle_dir.empty() ? nullptr : &head;
  std::mt19937 rng(7);
  std::vector<std::vector<std::int32_t>> prompts;
  if (synthetic) {
    for (int i = 0; i < 16; ++i) {
      std::vector<std::int32_t> p(static_cast<std::size_t>(prompt_len));
      for (auto& t : p) t = static_cast<std::int32_t>(rng() % target.config.vocab_size);
      prompts.push_back(p);
    }
  } else {
    prompts = task_prompts(16, prompt_len, rng);
  }
  std::printf("target %d layers hidden %d, draft %d layers (%s); %d new tokens per request\n",
              target.config.num_hidden_layers, target.config.hidden_size,
              draft.config.num_hidden_layers,
              lookup  ? "prompt lookup"
              : eagle ? (head.config.eagle3() ? "EAGLE-3 head proposes" : "EAGLE head proposes")
                      : "draft model",
              new_tokens);
  std::printf("%6s %7s %3s %10s %9s %9s %8s %8s %7s %7s %7s %7s %8s %8s\n", "kind", "batch", "k",
              "tok/s", "speedup", "step us", "tok/row", "us/tok", "accept", "prep", "propose",
              "verify", "accept", "overhead");
  std::vector<Run> runs;
  for (std::int32_t b : batches) {
    const Run plain = serve(target, nullptr, nullptr, false, b, 0, prompts, new_tokens);
    runs.push_back(plain);
    for (std::int32_t k : ks) {
      runs.push_back(
          serve(target, lookup ? nullptr : &draft, eagle, lookup, b, k, prompts, new_tokens));
    }
    for (std::size_t i = runs.size() - ks.size() - 1; i < runs.size(); ++i) {
      const Run& r = runs[i];
      std::printf(
          "%6s %7d %3d %10.0f %9.2f %9.1f %8.2f %8.1f %7.3f %7.1f %7.1f %7.1f %8.1f "
          "%7.1f%%\n",
          r.kind.c_str(), r.batch, r.k, r.tokens_per_s, r.tokens_per_s / plain.tokens_per_s,
          r.p50_step_us, r.tokens_per_row, r.us_per_token, r.acceptance, r.phase_us[0],
          r.phase_us[1], r.phase_us[2], r.phase_us[3], 100.0 * r.overhead);
    }
  }
  if (!json.empty()) {
    std::ofstream js(json);
    js << "{\"runs\": [";
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const Run& r = runs[i];
      js << (i ? ", " : "") << "{\"kind\": \"" << r.kind << "\", \"batch\": " << r.batch
         << ", \"k\": " << r.k << ", \"tokens_per_s\": " << r.tokens_per_s
         << ", \"p50_step_us\": " << r.p50_step_us << ", \"tokens_per_row\": " << r.tokens_per_row
         << ", \"us_per_token\": " << r.us_per_token << ", \"acceptance\": " << r.acceptance
         << ", \"phase_us\": [" << r.phase_us[0] << ", " << r.phase_us[1] << ", " << r.phase_us[2]
         << ", " << r.phase_us[3] << "], \"overhead\": " << r.overhead << "}";
    }
    js << "]}\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return graphdecode::bench::bench_main("bench_spec", argc, argv, run_main);
}
