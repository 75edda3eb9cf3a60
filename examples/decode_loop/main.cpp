// decode_loop: the main example. Embeds graphdecode::Engine as a serving loop would:
// submits a stream of requests (random prompts of mixed lengths, mixed output lengths, greedy
// and sampled), runs continuous batching to completion with decode steps by CUDA-graph replay,
// streams the first request's tokens, and prints throughput and per-step latency.
//
//   decode_loop [--checkpoint DIR | --model 1b|small|cross-1b|cross-small] [--requests N]
//               [--prompt-len L] [--new-tokens T] [--max-batch B] [--max-context C]
//               [--temperature X] [--top-k K] [--top-p P] [--seed S] [--graphs on|off]
//               [--max-encoder-len E] [--encoder-states device|host] [--sync]
//
// Decode steps are pipelined (EngineConfig::pipeline: step t + 1 is written and launched while
// the device runs step t); --sync runs the synchronous loop for the A/B. Printed: the host-to-host
// decode step time (between consecutive returns of step() that delivered decode steps) beside
// the device's time per decode step (timing events): pipelined, they should agree within 3%.
//
// Default: the Llama-3.2-1B shape on seeded synthetic weights. With no CUDA device it says so
// and exits 1.
//
// Cross-attention models (--model cross-1b: the 1B shape with 4 gated cross layers; cross-small;
// or an Mllama checkpoint): every request brings synthetic encoder states, as a vision encoder
// would hand them over, of a length uniform in [1, E] (E = --max-encoder-len, default 6400: a
// four-tile image), and every fourth request is text only; their cross K/V are projected when
// they are admitted and every decode step replays one graph whatever the mix. The states live in
// one device buffer (the path a DLPack tensor takes) or, with --encoder-states host, in host
// memory (copied at submit).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "attention/reference.h"
#include "common/buffers.h"
#include "common/cuda_check.h"
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
  std::int32_t max_encoder_len = 6400;
  bool device_states = true;
  bool sync = false;  // --sync: no pipelining (the A/B)
};

int usage() {
  std::fprintf(
      stderr,
      "usage: decode_loop [--checkpoint DIR | --model 1b|small|cross-1b|cross-small]\n"
      "                   [--requests N] [--prompt-len L] [--new-tokens T]\n"
      "                   [--max-batch B] [--max-context C] [--temperature X]\n"
      "                   [--top-k K] [--top-p P] [--seed S] [--graphs on|off]\n"
      "                   [--max-encoder-len E] [--encoder-states device|host] [--sync]\n");
  return 2;
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--sync") {
      o.sync = true;
      continue;
    }
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
    else if (a == "--max-encoder-len")
      o.max_encoder_len = std::stoi(v);
    else if (a == "--encoder-states")
      o.device_states = v != "host";
    else
      return false;
  }
  return o.model == "1b" || o.model == "small" || o.model == "cross-1b" || o.model == "cross-small";
}

ModelConfig synthetic_config(const std::string& model) {
  if (model == "small") return small_test_config();
  if (model == "cross-1b") return mllama_1b_class_config();
  if (model == "cross-small") return small_cross_test_config();
  return llama_1b_config();
}

// Encoder states for every request: one buffer of E rows ~ N(0, 1) in bf16; request r reads its
// first encoder_len rows (their content does not change the cost).
std::vector<std::uint16_t> synthetic_states(std::int32_t rows, std::int32_t hidden,
                                            std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<std::uint16_t> s(static_cast<std::size_t>(rows) * hidden);
  for (auto& x : s) x = reference::float_to_bf16(n(rng));
  return s;
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
    const HostWeights weights = !o.checkpoint.empty()
                                    ? load_checkpoint(o.checkpoint)
                                    : synthetic_weights(synthetic_config(o.model), o.seed);
    const ModelConfig& mc = weights.config;
    const bool cross = mc.any_cross();
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
    ec.pipeline = !o.sync;
    if (cross) ec.max_encoder_len = o.max_encoder_len;
    Engine engine(weights, ec);
    // Cross models: the requests' encoder states (device: one buffer, valid until the end).
    std::vector<std::uint16_t> states;
    DeviceBuffer<std::uint16_t> device_states;
    if (cross) {
      states = synthetic_states(o.max_encoder_len, mc.hidden_size, o.seed + 17);
      std::printf(
          "encoder states: %d cross layers, lengths uniform in [1, %d] (1 request in 4 "
          "text only), %s memory\n",
          mc.num_cross_layers(), o.max_encoder_len, o.device_states ? "device" : "host");
      if (o.device_states) {
        device_states = DeviceBuffer<std::uint16_t>(states.size());
        device_states.upload(states.data(), states.size(), engine.stream());
        GD_CUDA(cudaStreamSynchronize(engine.stream()));
      }
    }
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
    std::int64_t encoder_keys = 0;
    for (std::int32_t r = 0; r < o.requests; ++r) {
      RequestSpec s;
      s.prompt.resize(static_cast<std::size_t>(uniform(o.prompt_len / 2, 3 * o.prompt_len / 2)));
      for (auto& t : s.prompt) t = uniform(0, mc.vocab_size - 1);
      s.max_new_tokens = uniform(std::max(1, o.new_tokens / 2), o.new_tokens);
      if (r % 2 == 1) s.sampling = {o.temperature, o.top_k, o.top_p, o.seed * 1000003 + r};
      if (cross && r % 4 != 3) {
        s.encoder.length = uniform(1, o.max_encoder_len);
        s.encoder.width = mc.hidden_size;
        s.encoder.on_device = o.device_states;
        s.encoder.data = o.device_states ? device_states.data() : states.data();
        encoder_keys += s.encoder.length;
      }
      TokenCallback cb;
      if (r == 0) cb = [&](const TokenEvent& e) { first_tokens.push_back(e.token); };
      engine.submit(std::move(s), std::move(cb));
    }
    // Host-to-host decode step time: between consecutive returns of step() that each delivered
    // a decode step (a prefill in between breaks the pair).
    std::vector<double> host_us;
    host_us.reserve(1 << 16);
    auto last = std::chrono::steady_clock::now();
    bool last_decode = false;
    while (engine.step()) {
      const auto now = std::chrono::steady_clock::now();
      const bool decode = engine.last_plan().kind == StepKind::kDecode;
      if (decode && last_decode)
        host_us.push_back(std::chrono::duration<double, std::micro>(now - last).count());
      last = now;
      last_decode = decode;
    }

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
    // Every step's wall time, the prefill steps' included (their split shown: a change in the
    // prefill path moves this figure while the decode step stays the same).
    std::printf(
        "throughput %.0f generated tokens/s over %.2f s of steps (prefill steps %.3f s of it, "
        "device %.3f s)\n",
        s.tokens_per_s(), s.busy_s, s.prefill_wall_us * 1e-6, s.prefill_device_us * 1e-6);
    if (cross)
      std::printf("encoder keys projected at admission: %lld (mean %.0f per image request)\n",
                  static_cast<long long>(encoder_keys),
                  static_cast<double>(encoder_keys) / std::max(1, o.requests - o.requests / 4));
    std::printf(
        "decode step latency (host launch to tokens on host): p50 %.1f us, p90 %.1f us, "
        "p99 %.1f us\n",
        s.decode_p50_us, s.decode_p90_us, s.decode_p99_us);
    const auto pct = [](std::vector<double> v, double q) {
      if (v.empty()) return 0.0;
      const auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1));
      std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
      return v[k];
    };
    const double h50 = pct(host_us, 0.5);
    std::printf(
        "%s: %lld steps pipelined, %lld synchronous, %lld rows discarded (ended a step before)\n",
        o.sync ? "synchronous (--sync)" : "pipelined", static_cast<long long>(s.pipelined_steps),
        static_cast<long long>(s.sync_steps), static_cast<long long>(s.discarded_rows));
    std::printf(
        "decode step host-to-host: p50 %.1f us, p90 %.1f us, p99 %.1f us (%zu pairs) | device "
        "(events): p50 %.1f us, p90 %.1f us, p99 %.1f us | host/device p50 %.3f\n",
        h50, pct(host_us, 0.9), pct(host_us, 0.99), host_us.size(), s.device_p50_us,
        s.device_p90_us, s.device_p99_us, s.device_p50_us > 0 ? h50 / s.device_p50_us : 0.0);
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
