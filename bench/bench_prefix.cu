// bench_prefix: prefix caching across requests, by the Engine, with the cache on and off.
//
//   bench_prefix [--requests 64] [--shared 2048] [--own 128] [--new-tokens 32]
//                [--max-batch 64] [--step-tokens 1024] [--json PATH]
//
// Workload: every request is a shared system prompt (--shared tokens) followed by its own tokens
// (--own), greedy, --new-tokens generated; synthetic 1B-class weights (llama_1b_config). One
// request with the system prompt is served first and not timed (the prompt is "already in the
// cache" from earlier traffic when the cache is on; the same warm-up runs with it off), then all
// requests are submitted at once and served to the end. Reported per mode: time to first token
// (from the submission, p50 / p99 / max), wall time of the batch, prompt tokens prefilled,
// generated tokens/s over the batch's wall time, and the cache's hit rate, pages and evictions.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "common/device.h"
#include "common/error.h"
#include "engine/engine.h"
#include "engine/model_config.h"
#include "engine/weights.h"

namespace {

using namespace graphdecode;
using Clock = std::chrono::steady_clock;

struct Options {
  std::int32_t requests = 64, shared = 2048, own = 128, new_tokens = 32;
  std::int32_t max_batch = 64, step_tokens = 1024;
};

struct Result {
  bool cache = false;
  double ttft_p50_ms = 0, ttft_p99_ms = 0, ttft_max_ms = 0, wall_ms = 0, tokens_per_s = 0;
  std::int64_t prefilled = 0, hit_tokens = 0, lookup_tokens = 0, cached_pages = 0, evictions = 0;
  std::int64_t prefill_steps = 0, decode_steps = 0;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

Result serve(const HostWeights& w, const Options& o, bool cache,
             const std::vector<std::int32_t>& system,
             const std::vector<std::vector<std::int32_t>>& own) {
  EngineConfig ec;
  ec.max_batch = o.max_batch;
  ec.max_step_tokens = o.step_tokens;
  ec.max_context = o.shared + o.own + o.new_tokens;
  ec.prefix_cache = cache;
  Engine engine(w, ec);
  // Warm-up: the system prompt served once (graphs captured, and cached when the cache is on).
  RequestSpec warm;
  warm.prompt = system;
  warm.prompt.push_back(1);
  warm.max_new_tokens = 2;
  engine.submit(warm);
  engine.run_until_idle();
  const EngineStats before = engine.stats();

  std::map<RequestId, double> first_ms;
  std::int64_t generated = 0;
  const Clock::time_point t0 = Clock::now();
  for (std::int32_t r = 0; r < o.requests; ++r) {
    RequestSpec s;
    s.prompt = system;
    s.prompt.insert(s.prompt.end(), own[static_cast<std::size_t>(r)].begin(),
                    own[static_cast<std::size_t>(r)].end());
    s.max_new_tokens = o.new_tokens;
    engine.submit(std::move(s), [&](const TokenEvent& e) {
      ++generated;
      if (!first_ms.count(e.id))
        first_ms[e.id] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    });
  }
  engine.run_until_idle();
  const double wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const EngineStats s = engine.stats();

  Result r;
  r.cache = cache;
  std::vector<double> ttft;
  for (const auto& [id, ms] : first_ms) ttft.push_back(ms);
  r.ttft_p50_ms = percentile(ttft, 0.5);
  r.ttft_p99_ms = percentile(ttft, 0.99);
  r.ttft_max_ms = percentile(ttft, 1.0);
  r.wall_ms = wall_ms;
  r.tokens_per_s = static_cast<double>(generated) / (wall_ms * 1e-3);
  r.prefilled = s.prompt_tokens - before.prompt_tokens;
  r.hit_tokens = s.prefix_hit_tokens - before.prefix_hit_tokens;
  r.lookup_tokens = s.prefix_lookup_tokens - before.prefix_lookup_tokens;
  r.cached_pages = s.prefix_cached_pages;
  r.evictions = s.prefix_evictions;
  r.prefill_steps = s.prefill_steps - before.prefill_steps;
  r.decode_steps = s.decode_steps - before.decode_steps;
  return r;
}

int run_main(int argc, char** argv) {
  Options o;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : "0"; };
    if (a == "--requests")
      o.requests = std::stoi(next());
    else if (a == "--shared")
      o.shared = std::stoi(next());
    else if (a == "--own")
      o.own = std::stoi(next());
    else if (a == "--new-tokens")
      o.new_tokens = std::stoi(next());
    else if (a == "--max-batch")
      o.max_batch = std::stoi(next());
    else if (a == "--step-tokens")
      o.step_tokens = std::stoi(next());
    else if (a == "--json")
      json = next();
    else {
      std::fprintf(stderr,
                   "usage: bench_prefix [--requests N] [--shared S] [--own T] [--new-tokens G] "
                   "[--max-batch B] [--step-tokens K] [--json PATH]\n");
      return 2;
    }
  }
  if (!cuda_device_available()) {
    std::fprintf(stderr, "bench_prefix: no CUDA device\n");
    return 2;
  }
  GD_REQUIRE(o.requests >= 1 && o.shared >= 1 && o.own >= 1 && o.new_tokens >= 1, "options",
             o.requests, "requests, shared, own and new-tokens must be positive");
  const HostWeights w = synthetic_weights(llama_1b_config(), 1);
  std::mt19937 rng(7);
  const auto vocab = static_cast<std::uint32_t>(w.config.vocab_size);
  std::vector<std::int32_t> system(static_cast<std::size_t>(o.shared));
  for (auto& t : system) t = static_cast<std::int32_t>(rng() % vocab);
  std::vector<std::vector<std::int32_t>> own(static_cast<std::size_t>(o.requests));
  for (auto& p : own) {
    p.resize(static_cast<std::size_t>(o.own));
    for (auto& t : p) t = static_cast<std::int32_t>(rng() % vocab);
  }
  std::printf(
      "1B-class synthetic, %d requests: %d shared + %d own prompt tokens, %d new tokens; "
      "max_batch %d, %d prefill tokens per step\n",
      o.requests, o.shared, o.own, o.new_tokens, o.max_batch, o.step_tokens);
  std::printf("%6s %10s %10s %10s %10s %10s %10s %8s %8s %9s %9s\n", "cache", "ttft p50", "p99",
              "max ms", "wall ms", "tok/s", "prefilled", "hit %", "pf steps", "cached pg",
              "evicted");
  std::vector<Result> runs;
  for (const bool cache : {false, true}) {
    const Result r = serve(w, o, cache, system, own);
    runs.push_back(r);
    std::printf("%6s %10.1f %10.1f %10.1f %10.1f %10.0f %10lld %7.1f%% %8lld %9lld %9lld\n",
                cache ? "on" : "off", r.ttft_p50_ms, r.ttft_p99_ms, r.ttft_max_ms, r.wall_ms,
                r.tokens_per_s, static_cast<long long>(r.prefilled),
                r.lookup_tokens ? 100.0 * r.hit_tokens / r.lookup_tokens : 0.0,
                static_cast<long long>(r.prefill_steps), static_cast<long long>(r.cached_pages),
                static_cast<long long>(r.evictions));
  }
  std::printf("cache on vs off: ttft p50 %.2fx lower, wall %.2fx lower, tok/s %.2fx\n",
              runs[0].ttft_p50_ms / std::max(runs[1].ttft_p50_ms, 1e-9),
              runs[0].wall_ms / std::max(runs[1].wall_ms, 1e-9),
              runs[1].tokens_per_s / std::max(runs[0].tokens_per_s, 1e-9));
  if (!json.empty()) {
    std::ofstream js(json);
    js << "{\"requests\": " << o.requests << ", \"shared\": " << o.shared << ", \"own\": " << o.own
       << ", \"new_tokens\": " << o.new_tokens << ", \"max_batch\": " << o.max_batch
       << ", \"step_tokens\": " << o.step_tokens << ", \"runs\": [";
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const Result& r = runs[i];
      js << (i ? ", " : "") << "{\"cache\": " << (r.cache ? "true" : "false")
         << ", \"ttft_p50_ms\": " << r.ttft_p50_ms << ", \"ttft_p99_ms\": " << r.ttft_p99_ms
         << ", \"ttft_max_ms\": " << r.ttft_max_ms << ", \"wall_ms\": " << r.wall_ms
         << ", \"tokens_per_s\": " << r.tokens_per_s << ", \"prefilled\": " << r.prefilled
         << ", \"hit_tokens\": " << r.hit_tokens << ", \"lookup_tokens\": " << r.lookup_tokens
         << ", \"prefill_steps\": " << r.prefill_steps << ", \"decode_steps\": " << r.decode_steps
         << ", \"cached_pages\": " << r.cached_pages << ", \"evictions\": " << r.evictions << "}";
    }
    js << "]}\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return graphdecode::bench::bench_main("bench_prefix", argc, argv, run_main);
}
