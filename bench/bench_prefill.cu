// bench_prefill: prompt processing by the Engine as a user gets it (issue 38): time to first token
// and prompt tokens/s for one request and for a batch submitted at once, and the fraction of the
// GPU's dense bf16 peak that is.
//
//   bench_prefill [--shape 1b|8b] [--prompts 512,2048,8192] [--requests 1,16]
//                 [--step-tokens 512[,8192]] [--json PATH] [--quick]
//
// How the engine prefills today (engine/engine.h, engine/scheduler.h, engine/decode_runner.h): the
// scheduler cuts admitted prompts into chunks of at most EngineConfig::max_step_tokens new tokens
// per step (default 512; requests packed FIFO into a step), and each such extend step runs
// EAGERLY (only decode steps are captured as graphs), prep + plan + forward + device sampling of
// the rows that finished their prompt, then one D2H copy of the tokens and a host wait. So a
// prompt of P tokens takes ceil(P / max_step_tokens) eager steps; --step-tokens sweeps the budget
// (the default is what a user gets without tuning).
//
// Per (step tokens, requests n, prompt P): one Engine (synthetic seeded weights, max_batch = the
// largest n, max_context = the largest P + 1, prefix cache OFF so a repeat is not a cache hit;
// the prompts are fresh random ids every run anyway), n requests of P tokens, max_new_tokens 1,
// greedy, submitted at once; t0 = just before the first submit. TTFT of a request = t0 to its
// token callback (the token on the host). Reported: first / median / last TTFT (the last is the
// batch's prefill wall time), prompt tokens/s = n * P / last TTFT, TFLOP/s and % of peak from the
// FLOP count below over the last TTFT, and the device time of the run's prefill steps (the
// engine's timing events, EngineStats::prefill_device_us: last TTFT minus it is what the host
// adds). Each cell runs at least twice, the first untimed (cuBLAS
// heuristics, lazy module loads), and is repeated while it has run under 3 timed reps and 3 s;
// figures are medians over the timed reps.
//
// FLOPs of one request of P prompt tokens (multiply-add = 2 FLOPs; what must be computed, not
// what the kernels compute):
//   2 * P * (layers * (hidden * (q + 2 kv) + q * hidden + 3 * hidden * inter))   linear layers
// + 2 * hidden * vocab                                                          lm_head, last row
// + layers * 4 * q_heads * head_dim * P * (P + 1) / 2                         causal QK^T and PV
// where q = q_heads * head_dim, kv = kv_heads * head_dim. This is "2 * params * tokens + attention"
// with params counted as the matmul weights a token passes through: the embedding is a gather
// (0 FLOPs) and lm_head runs on one row per request (LogitRows::kLastPerRequest); norms, RoPE,
// SwiGLU and softmax are not counted. Peak: dense_bf16_peak_tflops (bench_util.cuh) from the name.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "common/cuda_check.h"
#include "common/device.h"
#include "common/error.h"
#include "engine/engine.h"
#include "engine/model_config.h"
#include "engine/weights.h"

namespace graphdecode::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kSeed = 1234;
// Repeats of a cell: at least kMinTimed timed runs, more while under both kMaxTimed runs and
// kRepeatBudgetS seconds (8B, 16 x 8k is ~5-10 s a run: it then runs once timed after its warm-up).
constexpr int kMinTimed = 1, kMaxTimed = 3;
constexpr double kRepeatBudgetS = 3.0;

double prefill_flops(const ModelConfig& c, std::int64_t prompt) {
  const double h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), inter = c.intermediate_size;
  const double linear = c.num_hidden_layers * (h * (q + 2 * kv) + q * h + 3 * h * inter);
  const double p = static_cast<double>(prompt);
  const double attention =
      c.num_hidden_layers * 4.0 * c.num_attention_heads * c.head_dim * p * (p + 1) / 2;
  return 2 * p * linear + 2 * h * c.vocab_size + attention;
}

struct Cell {
  std::int32_t step_tokens = 0, requests = 0, prompt = 0;
  bool skipped = false;
  std::string note;
  int timed_runs = 0;
  std::int64_t prefill_steps = 0;  // of one run
  double ttft_first_ms = 0, ttft_p50_ms = 0, ttft_last_ms = 0;
  double device_ms = 0;  // the run's prefill steps on the device (EngineStats::prefill_device_us)
  double flops = 0;
  double tokens_per_s() const {
    return requests * static_cast<double>(prompt) / (ttft_last_ms * 1e-3);
  }
  double tflops() const { return flops / (ttft_last_ms * 1e-3) / 1e12; }
};

struct RunTimes {
  double first_ms = 0, p50_ms = 0, last_ms = 0, device_ms = 0;
  std::int64_t prefill_steps = 0;
};

// n fresh random prompts of `prompt` tokens submitted at once, served until every first token
// is on the host.
RunTimes run_once(Engine& engine, std::int32_t n, std::int32_t prompt, std::mt19937& rng) {
  const auto vocab = static_cast<std::uint32_t>(engine.model().config().vocab_size);
  std::vector<RequestSpec> specs(static_cast<std::size_t>(n));
  for (RequestSpec& s : specs) {
    s.prompt.resize(static_cast<std::size_t>(prompt));
    for (auto& t : s.prompt) t = static_cast<std::int32_t>(rng() % vocab);
    s.max_new_tokens = 1;
  }
  const std::int64_t steps_before = engine.stats().prefill_steps;
  const double device_before = engine.stats().prefill_device_us;
  std::map<RequestId, double> first_ms;
  const Clock::time_point t0 = Clock::now();
  for (RequestSpec& s : specs)
    engine.submit(std::move(s), [&](const TokenEvent& e) {
      if (!first_ms.count(e.id))
        first_ms[e.id] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    });
  engine.run_until_idle();
  GD_REQUIRE(static_cast<std::int32_t>(first_ms.size()) == n, "first tokens", first_ms.size(),
             "every request must deliver its first token");
  std::vector<double> ms;
  for (const auto& [id, t] : first_ms) ms.push_back(t);
  RunTimes r;
  r.first_ms = *std::min_element(ms.begin(), ms.end());
  r.last_ms = *std::max_element(ms.begin(), ms.end());
  r.p50_ms = median(ms);
  r.prefill_steps = engine.stats().prefill_steps - steps_before;
  r.device_ms = (engine.stats().prefill_device_us - device_before) * 1e-3;
  return r;
}

Cell bench_cell(Engine& engine, std::int32_t step_tokens, std::int32_t n, std::int32_t prompt,
                std::mt19937& rng) {
  Cell c;
  c.step_tokens = step_tokens;
  c.requests = n;
  c.prompt = prompt;
  c.flops = n * prefill_flops(engine.model().config(), prompt);
  run_once(engine, n, prompt, rng);  // warm-up, untimed
  std::vector<double> first, p50, last, device;
  const Clock::time_point start = Clock::now();
  while (static_cast<int>(last.size()) < kMinTimed ||
         (static_cast<int>(last.size()) < kMaxTimed &&
          std::chrono::duration<double>(Clock::now() - start).count() < kRepeatBudgetS)) {
    const RunTimes r = run_once(engine, n, prompt, rng);
    first.push_back(r.first_ms);
    p50.push_back(r.p50_ms);
    last.push_back(r.last_ms);
    device.push_back(r.device_ms);
    c.prefill_steps = r.prefill_steps;
  }
  c.timed_runs = static_cast<int>(last.size());
  c.ttft_first_ms = median(first);
  c.ttft_p50_ms = median(p50);
  c.ttft_last_ms = median(last);
  c.device_ms = median(device);
  return c;
}

void print_cell(const Cell& c, double peak_tflops) {
  if (c.skipped) {
    std::printf("%6d %4d %6d   skipped: %s\n", c.step_tokens, c.requests, c.prompt, c.note.c_str());
    return;
  }
  std::printf("%6d %4d %6d %10.2f %10.2f %10.2f %11.0f %8.1f", c.step_tokens, c.requests, c.prompt,
              c.ttft_first_ms, c.ttft_p50_ms, c.ttft_last_ms, c.tokens_per_s(), c.tflops());
  if (peak_tflops > 0)
    std::printf(" %6.1f%%", 100.0 * c.tflops() / peak_tflops);
  else
    std::printf(" %7s", "-");
  std::printf(" %6lld %4d %9.2f\n", static_cast<long long>(c.prefill_steps), c.timed_runs,
              c.device_ms);
}

void write_json(const std::string& path, const std::string& shape, const cudaDeviceProp& dev,
                double peak_tflops, const std::string& peak_source, const ModelConfig& m,
                const std::vector<Cell>& cells) {
  std::ofstream f(path);
  GD_REQUIRE(f.good(), "--json", path, "cannot open the JSON output");
  f.precision(10);
  f << "{\n  \"bench\": \"bench_prefill\",\n  \"shape\": \"" << shape << "\",\n  \"device\": \""
    << dev.name << "\",\n  \"peak_bf16_dense_tflops\": " << peak_tflops
    << ",\n  \"peak_source\": \"" << peak_source
    << "\",\n  \"config\": {\"hidden\": " << m.hidden_size
    << ", \"intermediate\": " << m.intermediate_size << ", \"layers\": " << m.num_hidden_layers
    << ", \"heads\": " << m.num_attention_heads << ", \"kv_heads\": " << m.num_key_value_heads
    << ", \"head_dim\": " << m.head_dim << ", \"vocab\": " << m.vocab_size
    << ", \"tied\": " << (m.tie_word_embeddings ? "true" : "false")
    << "},\n  \"prefix_cache\": false,\n  \"results\": [\n";
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const Cell& c = cells[i];
    f << "    {\"step_tokens\": " << c.step_tokens << ", \"requests\": " << c.requests
      << ", \"prompt\": " << c.prompt << ", \"skipped\": " << (c.skipped ? "true" : "false");
    if (c.skipped) {
      f << ", \"note\": \"" << c.note << "\"";
    } else {
      f << ", \"ttft_first_ms\": " << c.ttft_first_ms << ", \"ttft_p50_ms\": " << c.ttft_p50_ms
        << ", \"ttft_last_ms\": " << c.ttft_last_ms << ", \"tokens_per_s\": " << c.tokens_per_s()
        << ", \"flops\": " << c.flops << ", \"tflops\": " << c.tflops()
        << ", \"pct_of_peak\": " << (peak_tflops > 0 ? 100.0 * c.tflops() / peak_tflops : 0.0)
        << ", \"prefill_steps\": " << c.prefill_steps << ", \"timed_runs\": " << c.timed_runs
        << ", \"device_ms\": " << c.device_ms;
    }
    f << "}" << (i + 1 < cells.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
}

// Escapes nothing but quotes and backslashes: notes are error messages in a JSON string.
std::string json_safe(std::string s) {
  for (char& ch : s)
    if (ch == '"' || ch == '\\' || ch == '\n') ch = '\'';
  return s;
}

int run_main(int argc, char** argv) {
  std::string json, shape = "1b", prompts_arg, requests_arg, step_arg;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (a == "--shape" && i + 1 < argc) {
      shape = argv[++i];
      GD_REQUIRE(shape == "1b" || shape == "8b", "--shape", shape, "expected 1b or 8b");
    } else if (a == "--prompts" && i + 1 < argc) {
      prompts_arg = argv[++i];
    } else if (a == "--requests" && i + 1 < argc) {
      requests_arg = argv[++i];
    } else if (a == "--step-tokens" && i + 1 < argc) {
      step_arg = argv[++i];
    } else if (a == "--quick") {  // small model and prompts: a smoke run
      quick = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--shape 1b|8b] [--prompts 512,2048,8192] [--requests 1,16] "
                   "[--step-tokens 512[,8192]] [--json PATH] [--quick]\n",
                   argv[0]);
      return a == "--help" ? 0 : 2;
    }
  }
  const std::vector<std::int32_t> prompts = parse_list(
      "--prompts", prompts_arg.empty() ? (quick ? "128,512" : "512,2048,8192") : prompts_arg);
  const std::vector<std::int32_t> requests =
      parse_list("--requests", requests_arg.empty() ? (quick ? "1,4" : "1,16") : requests_arg);
  // 512: EngineConfig's default max_step_tokens (what a user gets).
  const std::vector<std::int32_t> step_tokens =
      parse_list("--step-tokens", step_arg.empty() ? "512" : step_arg);
  if (!cuda_device_available()) {
    std::fprintf(stderr, "bench_prefill: no CUDA device; this benchmark needs a GPU\n");
    return 2;
  }
  int dev_id = 0;
  GD_CUDA(cudaGetDevice(&dev_id));
  cudaDeviceProp dev{};
  GD_CUDA(cudaGetDeviceProperties(&dev, dev_id));
  std::string peak_source;
  const double peak = dense_bf16_peak_tflops(dev.name, &peak_source);
  const ModelConfig config = bench_model_config(shape, quick);
  const HostWeights weights = synthetic_weights(config, kSeed);
  std::printf("device: %s, %d SMs; dense bf16 peak %s\n", dev.name, dev.multiProcessorCount,
              peak > 0 ? (std::to_string(static_cast<int>(peak)) + " TFLOP/s (" + peak_source +
                          ", detected from the device name)")
                             .c_str()
                       : "unknown for this device name: % of peak not reported");
  std::printf(
      "model: %s (hidden %d, inter %d, %d layers, %d q / %d kv heads, head dim %d, vocab %d), "
      "synthetic weights %.2f GB bf16; prefix cache off; greedy, max_new_tokens 1\n",
      quick ? "quick" : (shape == "8b" ? "Llama-3.1-8B shape" : "Llama-3.2-1B shape"),
      config.hidden_size, config.intermediate_size, config.num_hidden_layers,
      config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.vocab_size,
      static_cast<double>(weights.total_bytes()) / 1e9);
  std::printf("%6s %4s %6s %10s %10s %10s %11s %8s %7s %6s %4s %9s\n", "chunk", "n", "P",
              "ttft0 ms", "ttft50 ms", "ttft ms", "prompt t/s", "TFLOP/s", "%peak", "steps", "reps",
              "device ms");
  const std::int32_t max_n = *std::max_element(requests.begin(), requests.end());
  const std::int32_t max_p = *std::max_element(prompts.begin(), prompts.end());
  std::mt19937 rng(7);
  std::vector<Cell> cells;
  bool failed = false;
  for (const std::int32_t chunk : step_tokens) {
    try {
      EngineConfig ec;
      ec.max_batch = max_n;
      ec.max_step_tokens = chunk;
      ec.max_context = max_p + 1;
      ec.prefix_cache = false;
      Engine engine(weights, ec);
      for (const std::int32_t n : requests)
        for (const std::int32_t p : prompts) {
          cells.push_back(bench_cell(engine, chunk, n, p, rng));
          print_cell(cells.back(), peak);
          std::fflush(stdout);
        }
    } catch (const std::exception& e) {
      // An engine that cannot be built or fails (out of memory, a limit): its cells are skipped
      // with the reason, the other step budgets still run.
      failed = true;
      for (const std::int32_t n : requests)
        for (const std::int32_t p : prompts) {
          const bool done = std::any_of(cells.begin(), cells.end(), [&](const Cell& c) {
            return c.step_tokens == chunk && c.requests == n && c.prompt == p;
          });
          if (done) continue;
          Cell c;
          c.step_tokens = chunk;
          c.requests = n;
          c.prompt = p;
          c.skipped = true;
          c.note = json_safe(e.what()).substr(0, 200);
          cells.push_back(c);
          print_cell(c, peak);
        }
    }
  }
  if (!json.empty()) write_json(json, shape, dev, peak, peak_source, config, cells);
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace graphdecode::bench

int main(int argc, char** argv) {
  return graphdecode::bench::bench_main("bench_prefill", argc, argv, graphdecode::bench::run_main);
}
