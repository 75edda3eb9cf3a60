// decode_loop: the main example. Embeds graphdecode::Engine as a serving loop would:
// submits a stream of requests (random prompts of mixed lengths, mixed output lengths, greedy
// and sampled), runs continuous batching to completion with decode steps by CUDA-graph replay,
// streams the first request's tokens, and prints throughput and per-step latency.
//
//   decode_loop [--checkpoint DIR | --model 1b|small] [--requests N] [--prompt-len L]
//               [--new-tokens T] [--max-batch B] [--max-context C] [--temperature X]
//               [--top-k K] [--top-p P] [--seed S] [--graphs on|off]
//
// Default: the Llama-3.2-1B shape on seeded synthetic weights. With no CUDA device it says so
// and exits 1.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "common/device.h"
#include "common/error.h"
#include "engine/engine.h"
#include "engine/model_config.h"
#include "engine/weights.h"

namespace {

using namespace graphdecode;

struct Options {
  std::string checkpoint;
  std::string model = "1b";
  std::int32_t requests = 96;
  std::int32_t prompt_len = 256;  // mean; each prompt is uniform in [len/2, 3 len/2]
  std::int32_t new_tokens = 128;  // most per request; each is uniform in [T/2, T]
  std::int32_t max_batch = 32;
  std::int32_t max_context = 1024;
  float temperature = 0.8f;
  std::int32_t top_k = 50;
  float top_p = 0.95f;
  std::uint64_t seed = 1;
  bool graphs = true;
};

int usage() {
  std::fprintf(stderr,
               "usage: decode_loop [--checkpoint DIR | --model 1b|small] [--requests N]\n"
               "                   [--prompt-len L] [--new-tokens T] [--max-batch B]\n"
               "                   [--max-context C] [--temperature X] [--top-k K] [--top-p P]\n"
               "                   [--seed S] [--graphs on|off]\n");
  return 2;
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return false;
    const std::string v = argv[++i];
    if (a == "--checkpoint")
      o.checkpoint = v;
    else if (a == "--model")
      o.model = v;
    else if (a == "--requests")
      o.requests = std::stoi(v);
    else if (a == "--prompt-len")
      o.prompt_len = std::stoi(v);
    else if (a == "--new-tokens")
      o.new_tokens = std::stoi(v);
    else if (a == "--max-batch")
      o.max_batch = std::stoi(v);
    else if (a == "--max-context")
      o.max_context = std::stoi(v);
    else if (a == "--temperature")
      o.temperature = std::stof(v);
    else if (a == "--top-k")
      o.top_k = std::stoi(v);
    else if (a == "--top-p")
      o.top_p = std::stof(v);
    else if (a == "--seed")
      o.seed = std::stoull(v);
    else if (a == "--graphs")
      o.graphs = v != "off";
    else
      return false;
  }
  return o.model == "1b" || o.model == "small";
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
    std::fprintf(stderr, "decode_loop: no CUDA device found; the engine needs an NVIDIA GPU.\n");
    return 1;
  }
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const HostWeights weights =
        !o.checkpoint.empty()
            ? load_checkpoint(o.checkpoint)
            : synthetic_weights(o.model == "1b" ? llama_1b_config() : small_test_config(), o.seed);
    const ModelConfig& mc = weights.config;
    std::printf("model: %s, %d layers, hidden %d, heads %d/%d x %d, vocab %d, %.2f GB bf16 (%s)\n",
                mc.architecture.c_str(), mc.num_hidden_layers, mc.hidden_size,
                mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim, mc.vocab_size,
                static_cast<double>(weights.total_bytes()) * 1e-9,
                o.checkpoint.empty() ? "synthetic" : o.checkpoint.c_str());

    EngineConfig ec;
    ec.max_batch = o.max_batch;
    ec.max_context = o.max_context;
    ec.max_step_tokens = 2048;
    ec.use_graphs = o.graphs;
    Engine engine(weights, ec);
    const double setup_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("engine: max batch %d, max context %d, %zu graphs (%.1f MiB), set up in %.1f s\n",
                ec.max_batch, ec.max_context, engine.graphs().num_graphs(),
                static_cast<double>(engine.graphs().graph_memory_bytes()) / (1 << 20), setup_s);

    // Mixed prompt and output lengths, so requests join and leave the batch between steps. Even
    // requests are greedy, odd ones sample with their own seed.
    std::mt19937_64 rng(o.seed);
    const auto uniform = [&rng](std::int32_t lo, std::int32_t hi) {
      return std::uniform_int_distribution<std::int32_t>(lo, hi)(rng);
    };
    std::vector<std::int32_t> first_tokens;
    for (std::int32_t r = 0; r < o.requests; ++r) {
      RequestSpec s;
      s.prompt.resize(static_cast<std::size_t>(uniform(o.prompt_len / 2, 3 * o.prompt_len / 2)));
      for (auto& t : s.prompt) t = uniform(0, mc.vocab_size - 1);
      s.max_new_tokens = uniform(std::max(1, o.new_tokens / 2), o.new_tokens);
      if (r % 2 == 1) s.sampling = {o.temperature, o.top_k, o.top_p, o.seed * 1000003 + r};
      TokenCallback cb;
      if (r == 0) cb = [&](const TokenEvent& e) { first_tokens.push_back(e.token); };
      engine.submit(std::move(s), std::move(cb));
    }
    engine.run_until_idle();

    std::printf("request 0 (greedy) streamed %zu tokens:", first_tokens.size());
    for (std::size_t i = 0; i < first_tokens.size() && i < 16; ++i)
      std::printf(" %d", first_tokens[i]);
    std::printf("%s\n", first_tokens.size() > 16 ? " ..." : "");
    const EngineStats s = engine.stats();
    std::printf(
        "requests %lld finished | prompt tokens %lld, generated %lld | steps %lld (prefill %lld, "
        "decode %lld; graph %lld, eager %lld)\n",
        static_cast<long long>(s.finished), static_cast<long long>(s.prompt_tokens),
        static_cast<long long>(s.generated_tokens), static_cast<long long>(s.steps),
        static_cast<long long>(s.prefill_steps), static_cast<long long>(s.decode_steps),
        static_cast<long long>(s.graph_steps), static_cast<long long>(s.eager_steps));
    std::printf("throughput %.0f generated tokens/s over %.2f s of steps\n", s.tokens_per_s(),
                s.busy_s);
    std::printf(
        "decode step latency (host launch to tokens on host): p50 %.1f us, p90 %.1f us, "
        "p99 %.1f us\n",
        s.decode_p50_us, s.decode_p90_us, s.decode_p99_us);
    if (s.finished != o.requests) {
      std::fprintf(stderr, "decode_loop: %lld of %d requests finished\n",
                   static_cast<long long>(s.finished), o.requests);
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode_loop: %s\n", e.what());
    return 1;
  }
  return 0;
}
