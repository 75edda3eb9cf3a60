// bench_decode: one decode step of a Llama (Llama-3.2-1B or Llama-3.1-8B shape, seeded synthetic
// weights) against the floor of (weight bytes + KV bytes) / measured copy bandwidth; graph vs
// eager; and the engine's step (the same forward + device sampling) with every row greedy beside
// every row sampling.
//
//   bench_decode [--shape 1b|8b] [--batches 1,8,64] [--context 1024[,4096,...]] [--reps N]
//                [--json PATH] [--quick] [--no-flush] [--sampling T,K,P]
//
// Per (B, L): the model on its runtime + StepGraphs (decode captured for bucket B only, so no
// padding rows), B requests with L prefix tokens: pages reserved through the step's page ledger
// (applied eagerly) and every pool's K/V filled with random bf16, not prefilled: a prefill of B x L
// tokens would need a step capacity the decode step does not. Every step is the same decode step
// (prefix_len = L, extend_len = 1): it rewrites position L, so lengths are reset rather than grown
// and every rep reads the same L + 1 keys per request.
// Device time: events around StepGraphs::step (write + one copy + graph launch), median over reps
// after warm-up, each after an L2 flush (a read of 4x the L2); the same with use_graphs off
// (eager). Host time: CPU time of step() with the device drained before each call.
// Floor: bytes = weights read per step (every tensor once; a tied embedding counts once, as the
// lm_head that reads all of it) + K/V read (B x (L + 1) x layers x 2 x kv_heads x head_dim x 2);
// floor_us = bytes / D2D copy bandwidth (read + write) measured in the same run.
// Sampling (issue 38): the rig also captures engine/sampling_step.h's step over the same runtime
// (DecodeRig, RigSteps::kWithSampling). `greedy us` = that graph with every row greedy (the
// forward, the greedy argmax and the token publish: what the engine's DecodeRunner replays);
// `sampled us` = the same graph with every row at temperature 0.8, top-k 50, top-p 0.95 (or the
// --sampling row: temperature, top-k (0 = off), top-p (1 = off)), seeded per row (only the step
// image's aux words differ). Both graph-replayed, same method as `graph us`,
// in interleaved rounds (greedy, sampled, greedy, sampled; each time the lower of its two
// medians), so that a drift of the device between the two series (clocks, heat) is not taken for
// the cost of sampling.
// Checks: every greedy token has its row's largest logit; every sampled token is among its row's
// top-k largest logits (any token of the row when top-k is off). Pools are sized from B and L (B x
// pages of L + 1 keys, plus the reserved page); a cell whose weights + pools + headroom exceed 90%
// of the device's free memory is skipped with the reason.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "bench/decode_rig.cuh"
#include "common/buffers.h"
#include "common/cuda_check.h"
#include "common/device.h"
#include "common/error.h"
#include "common/request_rules.h"
#include "common/stream.h"
#include "engine/llama_model.h"
#include "engine/model_config.h"
#include "engine/model_step.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/step_context.h"
#include "engine/sampling_step.h"
#include "engine/scheduler.h"
#include "engine/weights.h"
#include "graphs/step_graphs.h"

namespace graphdecode::bench {
namespace {

constexpr std::int32_t kPage = 16;
constexpr int kWarmup = 10;
constexpr std::uint64_t kSeed = 1234;
// The issue's sampled row: temperature 0.8, top-k 50, top-p 0.95 (decode_loop's default mix);
// --sampling replaces it.
SamplingParams g_sampled{0.8f, 50, 0.95f, kSeed};
// Device memory beyond weights and KV pools: activations (max_tokens = B rows), logits
// ([B][vocab] float: 66 MB at B = 128), the sampler's workspace, cuBLAS workspace, graphs. 1 GiB
// was bench_decode's headroom before the 8B shape; 2 GiB covers the 8B activations with margin.
constexpr double kHeadroomBytes = 2.0 * (1 << 30);

// ---- configs ------------------------------------------------------------------------------------

// Device bytes of the model's KV pools for these options.
double kv_pool_bytes(const ModelConfig& c, const RuntimeOptions& o) {
  const AttentionLayout layout = llama_attention_layout(c);
  double bytes = 0;
  for (AttentionKind k : {AttentionKind::kFull, AttentionKind::kSliding}) {
    if (!layout.has(k)) continue;
    const KvPoolConfig pc = pool_config(layout, o, k);
    bytes += static_cast<double>(pc.geometry.num_pages) *
             static_cast<double>(kv_page_bytes(pc.shape, pc.geometry.page_size));
  }
  return bytes;
}

// ---- results ------------------------------------------------------------------------------------

struct Result {
  std::int32_t batch = 0, context = 0;
  bool skipped = false;
  std::string note;
  StepTimes graph, eager;
  StepTimes greedy, sampled;  // the engine's step (forward + sampling), graph replay
  double weight_bytes = 0, kv_bytes = 0, floor_us = 0;
  double logit_max_abs = 0, logit_rms = 0, graph_eager_max_diff = 0;
  std::int32_t greedy_is_argmax = 0;    // rows whose greedy token is the row's argmax
  std::int32_t sampled_in_top_k = 0;    // rows whose sampled token is among the top 50
  std::int32_t sampled_not_greedy = 0;  // rows whose sampled token differs from the greedy one
  bool sane = false;
  double speedup() const { return eager.device_us / graph.device_us; }
  double pct_floor() const { return 100.0 * floor_us / graph.device_us; }
  double pct_floor_greedy() const { return 100.0 * floor_us / greedy.device_us; }
  double sampled_over_greedy() const { return sampled.device_us / greedy.device_us; }
  double gbps() const { return (weight_bytes + kv_bytes) / (graph.device_us * 1e-6) / 1e9; }
};

// The engine's step with every row greedy, then every row sampling (g_sampled), both by graph
// replay; checks the tokens each left against the logits of the same step.
void time_sampling(DecodeRig& rig, std::int32_t vocab, int reps, Timer& t, cudaStream_t s,
                   Result& r) {
  const std::size_t rows = rig.requests.size();
  std::vector<float> logits(rows * static_cast<std::size_t>(vocab));
  std::vector<std::int32_t> greedy(rows), sampled(rows);
  const auto run = [&](const SamplingParams& p, std::vector<std::int32_t>& tokens) {
    rig.set_sampling(p);
    const StepTimes times = time_steps(*rig.sampling_graphs, rig.desc(), true, kWarmup, reps, t, s);
    GD_CUDA(cudaMemcpyAsync(tokens.data(), rig.sampling->published(), rows * sizeof(std::int32_t),
                            cudaMemcpyDeviceToHost, s));
    return times;
  };
  const auto lower = [](const StepTimes& a, const StepTimes& b) {
    return StepTimes{std::min(a.device_us, b.device_us), std::min(a.host_us, b.host_us)};
  };
  const StepTimes greedy1 = run(SamplingParams{}, greedy);
  // Every step of the rig rewrites the same position from the same inputs: these are the logits
  // both the greedy and the sampled rows saw.
  GD_CUDA(cudaMemcpyAsync(logits.data(), rig.model->logits(), logits.size() * sizeof(float),
                          cudaMemcpyDeviceToHost, s));
  const StepTimes sampled1 = run(g_sampled, sampled);
  const StepTimes greedy2 = run(SamplingParams{}, greedy);
  const StepTimes sampled2 = run(g_sampled, sampled);
  r.greedy = lower(greedy1, greedy2);
  r.sampled = lower(sampled1, sampled2);
  GD_CUDA(cudaStreamSynchronize(s));
  std::fprintf(stderr, "rounds B=%d L=%d: greedy %.1f, %.1f us; sampled %.1f, %.1f us\n", r.batch,
               r.context, greedy1.device_us, greedy2.device_us, sampled1.device_us,
               sampled2.device_us);
  for (std::size_t i = 0; i < rows; ++i) {
    const float* row = logits.data() + i * static_cast<std::size_t>(vocab);
    // A maximum, not the first one: bf16-rounded logits can tie, and the tie rule is the kernel's.
    const float max_logit = *std::max_element(row, row + vocab);
    r.greedy_is_argmax += greedy[i] >= 0 && greedy[i] < vocab && row[greedy[i]] == max_logit;
    r.sampled_not_greedy += sampled[i] != greedy[i];
    const std::int32_t tok = sampled[i];
    if (tok < 0 || tok >= vocab) continue;
    const auto above = std::count_if(row, row + vocab, [&](float x) { return x > row[tok]; });
    r.sampled_in_top_k += g_sampled.top_k <= 0 || above < g_sampled.top_k;
  }
}

Result bench_shape(const HostWeights& w, std::int32_t b, std::int32_t l, int reps, double copy_gbps,
                   Timer& t, cudaStream_t s) {
  Result r;
  r.batch = b;
  r.context = l;
  const ModelConfig& c = w.config;
  std::size_t free_b = 0, total_b = 0;
  GD_CUDA(cudaMemGetInfo(&free_b, &total_b));
  // Weights + pools + headroom (activations, logits, cuBLAS workspace, graphs).
  const double need = static_cast<double>(w.total_bytes()) +
                      kv_pool_bytes(c, decode_only_options(b, l, kPage)) + kHeadroomBytes;
  if (need > 0.9 * static_cast<double>(free_b)) {
    r.skipped = true;
    char note[160];
    std::snprintf(note, sizeof(note),
                  "does not fit: weights + KV pools + headroom %.1f GB > 90%% of %.1f GB free",
                  need / 1e9, static_cast<double>(free_b) / 1e9);
    r.note = note;
    return r;
  }
  DecodeRig rig(w, decode_only_options(b, l, kPage), b, l, {}, 0, kSeed, s,
                RigSteps::kWithSampling);
  const GraphEagerRun run = time_graph_and_eager(rig, c.vocab_size, kWarmup, reps, t, s);
  time_sampling(rig, c.vocab_size, reps, t, s, r);
  r.graph = run.graph;
  r.eager = run.eager;
  r.logit_max_abs = run.logit_max_abs;
  r.logit_rms = run.logit_rms;
  r.graph_eager_max_diff = run.graph_eager_max_diff;
  r.sane = run.sane && r.greedy_is_argmax == b && r.sampled_in_top_k == b;
  // Every tensor once: the tied lm_head reads the whole embedding (the B gathered rows are not
  // counted again).
  r.weight_bytes = static_cast<double>(w.total_bytes());
  r.kv_bytes = static_cast<double>(b) * (l + 1) * c.num_hidden_layers * 2.0 *
               c.num_key_value_heads * c.head_dim * 2.0;
  r.floor_us = (r.weight_bytes + r.kv_bytes) / (copy_gbps * 1e9) * 1e6;
  return r;
}

// host us: CPU time of one graph step() (write + copy + launch), device drained first.
// logit rms / g-e diff: sanity of the synthetic forward, and graph vs eager max |difference|.
// greedy us / sampled us: the engine's step (forward + sampling), s/g their ratio; %fl g: the
// floor over the greedy step.
void print_table(const std::vector<Result>& rs) {
  std::printf("%5s %6s %9s %9s %7s %9s %6s %6s %8s %7s %8s %9s %9s %6s %6s\n", "B", "L", "graph us",
              "eager us", "speedup", "floor us", "%floor", "GB/s", "host us", "lg rms", "g-e diff",
              "greedy us", "sampled us", "s/g", "%fl g");
  for (const Result& r : rs) {
    if (r.skipped) {
      std::printf("%5d %6d   skipped: %s\n", r.batch, r.context, r.note.c_str());
      continue;
    }
    std::printf(
        "%5d %6d %9.1f %9.1f %7.2f %9.1f %5.1f%% %6.0f %8.2f %7.3f %8.2g %9.1f %9.1f %6.3f "
        "%5.1f%%%s\n",
        r.batch, r.context, r.graph.device_us, r.eager.device_us, r.speedup(), r.floor_us,
        r.pct_floor(), r.gbps(), r.graph.host_us, r.logit_rms, r.graph_eager_max_diff,
        r.greedy.device_us, r.sampled.device_us, r.sampled_over_greedy(), r.pct_floor_greedy(),
        r.sane ? "" : "  NOT SANE");
    if (!r.sane)
      std::printf("        greedy = argmax on %d / %d rows, sampled in top-%d on %d / %d\n",
                  r.greedy_is_argmax, r.batch, g_sampled.top_k, r.sampled_in_top_k, r.batch);
  }
}

void write_json(const std::string& path, const std::string& shape, const cudaDeviceProp& dev,
                const ModelConfig& c, double copy_gbps, int reps, bool flush,
                const std::vector<Result>& rs) {
  std::ofstream f(path);
  GD_REQUIRE(f.good(), "--json", path, "cannot open the JSON output");
  f.precision(10);
  f << "{\n  \"bench\": \"bench_decode\",\n  \"shape\": \"" << shape << "\",\n"
    << "  \"device\": \"" << dev.name << "\",\n"
    << "  \"sms\": " << dev.multiProcessorCount << ",\n  \"l2_bytes\": " << dev.l2CacheSize
    << ",\n  \"copy_gbps\": " << copy_gbps << ",\n  \"reps\": " << reps
    << ",\n  \"l2_flush\": " << (flush ? "true" : "false") << ",\n"
    << "  \"config\": {\"hidden\": " << c.hidden_size
    << ", \"intermediate\": " << c.intermediate_size << ", \"layers\": " << c.num_hidden_layers
    << ", \"heads\": " << c.num_attention_heads << ", \"kv_heads\": " << c.num_key_value_heads
    << ", \"head_dim\": " << c.head_dim << ", \"vocab\": " << c.vocab_size
    << ", \"tied\": " << (c.tie_word_embeddings ? "true" : "false") << ", \"page_size\": " << kPage
    << ", \"dtype\": \"bf16\"},\n  \"sampled_row\": {\"temperature\": " << g_sampled.temperature
    << ", \"top_k\": " << g_sampled.top_k << ", \"top_p\": " << g_sampled.top_p
    << ", \"seed\": " << g_sampled.seed << "},\n  \"results\": [\n";
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const Result& r = rs[i];
    f << "    {\"B\": " << r.batch << ", \"L\": " << r.context
      << ", \"skipped\": " << (r.skipped ? "true" : "false");
    if (r.skipped) {
      f << ", \"note\": \"" << r.note << "\"";
    } else {
      f << ", \"graph_us\": " << r.graph.device_us << ", \"eager_us\": " << r.eager.device_us
        << ", \"speedup\": " << r.speedup() << ", \"floor_us\": " << r.floor_us
        << ", \"pct_of_floor\": " << r.pct_floor() << ", \"gbps\": " << r.gbps()
        << ", \"weight_bytes\": " << r.weight_bytes << ", \"kv_bytes\": " << r.kv_bytes
        << ", \"graph_host_us\": " << r.graph.host_us << ", \"eager_host_us\": " << r.eager.host_us
        << ", \"logit_max_abs\": " << r.logit_max_abs << ", \"logit_rms\": " << r.logit_rms
        << ", \"graph_eager_max_diff\": " << r.graph_eager_max_diff
        << ", \"greedy_step_us\": " << r.greedy.device_us
        << ", \"sampled_step_us\": " << r.sampled.device_us
        << ", \"sampled_over_greedy\": " << r.sampled_over_greedy()
        << ", \"greedy_pct_of_floor\": " << r.pct_floor_greedy()
        << ", \"greedy_host_us\": " << r.greedy.host_us
        << ", \"sampled_host_us\": " << r.sampled.host_us
        << ", \"greedy_is_argmax_rows\": " << r.greedy_is_argmax
        << ", \"sampled_in_top_k_rows\": " << r.sampled_in_top_k
        << ", \"sampled_not_greedy_rows\": " << r.sampled_not_greedy
        << ", \"sane\": " << (r.sane ? "true" : "false");
    }
    f << "}" << (i + 1 < rs.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
}

int run_main(int argc, char** argv) {
  std::string json, batches_arg, context_arg, shape = "1b";
  int reps = 0;
  bool quick = false, flush = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (a == "--shape" && i + 1 < argc) {
      shape = argv[++i];
      GD_REQUIRE(shape == "1b" || shape == "8b", "--shape", shape, "expected 1b or 8b");
    } else if (a == "--batches" && i + 1 < argc) {
      batches_arg = argv[++i];
    } else if (a == "--context" && i + 1 < argc) {
      context_arg = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(5, std::atoi(argv[++i]));
    } else if (a == "--quick") {  // small model, few reps: a smoke run
      quick = true;
    } else if (a == "--sampling" && i + 1 < argc) {
      float t = 0.f, p = 0.f;
      int k = 0;
      const char* v = argv[++i];
      GD_REQUIRE(
          std::sscanf(v, "%f,%d,%f", &t, &k, &p) == 3 && t > 0.f && k >= 0 && p > 0.f && p <= 1.f,
          "--sampling", v, "expected T,K,P with T > 0, K >= 0, 0 < P <= 1");
      g_sampled = SamplingParams{t, k, p, kSeed};
    } else if (a == "--no-flush") {  // L2 left warm between steps (diagnosis only)
      flush = false;
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--shape 1b|8b] [--batches 1,8,64] [--context 1024[,4096]] [--reps N>=5] "
          "[--json PATH] [--quick] [--no-flush] [--sampling T,K,P]\n",
          argv[0]);
      return a == "--help" ? 0 : 2;
    }
  }
  // Explicit flags win over --quick's defaults.
  const std::vector<std::int32_t> batches =
      parse_list("--batches", batches_arg.empty() ? (quick ? "1,8" : "1,8,64") : batches_arg);
  const std::vector<std::int32_t> contexts =
      parse_list("--context", context_arg.empty() ? (quick ? "256" : "1024") : context_arg);
  if (reps == 0) reps = quick ? 20 : 100;
  if (!cuda_device_available()) {
    std::fprintf(stderr, "bench_decode: no CUDA device; this benchmark needs a GPU\n");
    return 2;
  }
  int dev_id = 0;
  GD_CUDA(cudaGetDevice(&dev_id));
  cudaDeviceProp dev{};
  GD_CUDA(cudaGetDeviceProperties(&dev, dev_id));
  Stream s;
  const double copy_gbps = copy_bandwidth_gbps(s);
  const ModelConfig config = bench_model_config(shape, quick);
  const HostWeights weights = synthetic_weights(config, kSeed);
  std::printf("device: %s, %d SMs, L2 %.0f MiB; D2D copy %.0f GB/s (read + write)\n", dev.name,
              dev.multiProcessorCount, dev.l2CacheSize / 1048576.0, copy_gbps);
  std::printf(
      "model: %s Llama (hidden %d, inter %d, %d layers, %d q / %d kv heads, head dim %d, vocab %d, "
      "%s), synthetic weights %.2f GB bf16; page %d; %d reps, L2 flush %s\n",
      quick ? "quick" : (shape == "8b" ? "Llama-3.1-8B" : "Llama-3.2-1B"), config.hidden_size,
      config.intermediate_size, config.num_hidden_layers, config.num_attention_heads,
      config.num_key_value_heads, config.head_dim, config.vocab_size,
      config.tie_word_embeddings ? "tied" : "untied",
      static_cast<double>(weights.total_bytes()) / 1e9, kPage, reps, flush ? "on" : "off");

  Timer t(reps, flush, static_cast<std::size_t>(dev.l2CacheSize), s);
  std::vector<Result> rs;
  // A progress line per cell and the JSON rewritten after each: an 8B sweep takes minutes, and a
  // run stopped by a time limit keeps the cells it measured.
  for (std::int32_t b : batches)
    for (std::int32_t l : contexts) {
      const auto start = std::chrono::steady_clock::now();
      rs.push_back(bench_shape(weights, b, l, reps, copy_gbps, t, s));
      const Result& r = rs.back();
      std::fprintf(stderr, "bench_decode: B=%d L=%d %s in %.1f s\n", b, l,
                   r.skipped ? "skipped" : "measured",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      if (!json.empty()) write_json(json, shape, dev, config, copy_gbps, reps, flush, rs);
    }
  std::printf(
      "sampled rows: temperature %.1f, top-k %d, top-p %.2f, seed %llu + row; greedy rows: "
      "temperature 0\n",
      g_sampled.temperature, g_sampled.top_k, g_sampled.top_p,
      static_cast<unsigned long long>(g_sampled.seed));
  print_table(rs);
  const bool all_sane =
      std::all_of(rs.begin(), rs.end(), [](const Result& r) { return r.skipped || r.sane; });
  if (!all_sane)
    std::fprintf(stderr,
                 "bench_decode: non-finite or all-zero logits, or a token check failed (see "
                 "table)\n");
  return all_sane ? 0 : 1;
}

}  // namespace
}  // namespace graphdecode::bench

int main(int argc, char** argv) {
  return graphdecode::bench::bench_main("bench_decode", argc, argv, graphdecode::bench::run_main);
}
