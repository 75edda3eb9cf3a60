// bench_decode: one decode step of a 1B-class Llama (Llama-3.2-1B shape, seeded synthetic weights)
// against the floor of (weight bytes + KV bytes) / measured copy bandwidth; graph vs eager.
//
//   bench_decode [--batches 1,8,64] [--context 1024[,4096,...]] [--reps N] [--json PATH]
//                [--quick] [--no-flush]
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
#include "common/stream.h"
#include "engine/llama_model.h"
#include "engine/model_config.h"
#include "engine/model_step.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/step_context.h"
#include "engine/weights.h"
#include "graphs/step_graphs.h"

namespace graphdecode::bench {
namespace {

constexpr std::int32_t kPage = 16;
constexpr int kWarmup = 10;
constexpr std::uint64_t kSeed = 1234;

// ---- configs ------------------------------------------------------------------------------------

// The Llama-3.2-1B shape (engine/model_config.h); --quick shrinks it for a smoke run.
ModelConfig llama32_1b_config(bool quick) {
  ModelConfig c = llama_1b_config();
  if (!quick) return c;
  c.vocab_size = 32000;
  c.hidden_size = 512;
  c.intermediate_size = 1536;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.layers.assign(static_cast<std::size_t>(c.num_hidden_layers), LayerAttention{});
  c.validate();
  return c;
}

// Decode only: B rows, KV extent L + 1, one slot per request (plus the padding slot).
RuntimeOptions decode_options(std::int32_t b, std::int32_t l) {
  RuntimeOptions o;
  o.max_batch = b;
  o.max_tokens = b;
  o.max_new_tokens = 1;
  o.max_kv_len = l + 1;
  o.page_size = kPage;
  o.max_slots = b + 1;
  return o;
}

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
  double weight_bytes = 0, kv_bytes = 0, floor_us = 0;
  double logit_max_abs = 0, logit_rms = 0, graph_eager_max_diff = 0;
  bool sane = false;
  double speedup() const { return eager.device_us / graph.device_us; }
  double pct_floor() const { return 100.0 * floor_us / graph.device_us; }
  double gbps() const { return (weight_bytes + kv_bytes) / (graph.device_us * 1e-6) / 1e9; }
};

Result bench_shape(const HostWeights& w, std::int32_t b, std::int32_t l, int reps, double copy_gbps,
                   Timer& t, cudaStream_t s) {
  Result r;
  r.batch = b;
  r.context = l;
  const ModelConfig& c = w.config;
  std::size_t free_b = 0, total_b = 0;
  GD_CUDA(cudaMemGetInfo(&free_b, &total_b));
  // Weights + pools + headroom (activations, logits, cuBLAS workspace, graphs).
  const double need =
      static_cast<double>(w.total_bytes()) + kv_pool_bytes(c, decode_options(b, l)) + (1 << 30);
  if (need > 0.9 * static_cast<double>(free_b)) {
    r.skipped = true;
    r.note = "does not fit in device memory";
    return r;
  }
  DecodeRig rig(w, decode_options(b, l), b, l, {}, 0, kSeed, s);
  const GraphEagerRun run = time_graph_and_eager(rig, c.vocab_size, kWarmup, reps, t, s);
  r.graph = run.graph;
  r.eager = run.eager;
  r.logit_max_abs = run.logit_max_abs;
  r.logit_rms = run.logit_rms;
  r.graph_eager_max_diff = run.graph_eager_max_diff;
  r.sane = run.sane;
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
void print_table(const std::vector<Result>& rs) {
  std::printf("%5s %6s %9s %9s %7s %9s %6s %6s %8s %7s %8s\n", "B", "L", "graph us", "eager us",
              "speedup", "floor us", "%floor", "GB/s", "host us", "lg rms", "g-e diff");
  for (const Result& r : rs) {
    if (r.skipped) {
      std::printf("%5d %6d   skipped: %s\n", r.batch, r.context, r.note.c_str());
      continue;
    }
    std::printf("%5d %6d %9.1f %9.1f %7.2f %9.1f %5.1f%% %6.0f %8.2f %7.3f %8.2g%s\n", r.batch,
                r.context, r.graph.device_us, r.eager.device_us, r.speedup(), r.floor_us,
                r.pct_floor(), r.gbps(), r.graph.host_us, r.logit_rms, r.graph_eager_max_diff,
                r.sane ? "" : "  NOT SANE");
  }
}

void write_json(const std::string& path, const cudaDeviceProp& dev, const ModelConfig& c,
                double copy_gbps, int reps, bool flush, const std::vector<Result>& rs) {
  std::ofstream f(path);
  GD_REQUIRE(f.good(), "--json", path, "cannot open the JSON output");
  f.precision(10);
  f << "{\n  \"bench\": \"bench_decode\",\n  \"device\": \"" << dev.name << "\",\n"
    << "  \"sms\": " << dev.multiProcessorCount << ",\n  \"l2_bytes\": " << dev.l2CacheSize
    << ",\n  \"copy_gbps\": " << copy_gbps << ",\n  \"reps\": " << reps
    << ",\n  \"l2_flush\": " << (flush ? "true" : "false") << ",\n"
    << "  \"config\": {\"hidden\": " << c.hidden_size
    << ", \"intermediate\": " << c.intermediate_size << ", \"layers\": " << c.num_hidden_layers
    << ", \"heads\": " << c.num_attention_heads << ", \"kv_heads\": " << c.num_key_value_heads
    << ", \"head_dim\": " << c.head_dim << ", \"vocab\": " << c.vocab_size
    << ", \"tied\": " << (c.tie_word_embeddings ? "true" : "false") << ", \"page_size\": " << kPage
    << ", \"dtype\": \"bf16\"},\n  \"results\": [\n";
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
        << ", \"sane\": " << (r.sane ? "true" : "false");
    }
    f << "}" << (i + 1 < rs.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
}

int run_main(int argc, char** argv) {
  std::string json, batches_arg, context_arg;
  int reps = 0;
  bool quick = false, flush = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (a == "--batches" && i + 1 < argc) {
      batches_arg = argv[++i];
    } else if (a == "--context" && i + 1 < argc) {
      context_arg = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(5, std::atoi(argv[++i]));
    } else if (a == "--quick") {  // small model, few reps: a smoke run
      quick = true;
    } else if (a == "--no-flush") {  // L2 left warm between steps (diagnosis only)
      flush = false;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--batches 1,8,64] [--context 1024[,4096]] [--reps N>=5] "
                   "[--json PATH] [--quick] [--no-flush]\n",
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
  const ModelConfig config = llama32_1b_config(quick);
  const HostWeights weights = synthetic_weights(config, kSeed);
  std::printf("device: %s, %d SMs, L2 %.0f MiB; D2D copy %.0f GB/s (read + write)\n", dev.name,
              dev.multiProcessorCount, dev.l2CacheSize / 1048576.0, copy_gbps);
  std::printf(
      "model: %s Llama (hidden %d, inter %d, %d layers, %d q / %d kv heads, head dim %d, vocab %d, "
      "tied), synthetic weights %.2f GB bf16; page %d; %d reps, L2 flush %s\n",
      quick ? "quick" : "Llama-3.2-1B", config.hidden_size, config.intermediate_size,
      config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
      config.head_dim, config.vocab_size, static_cast<double>(weights.total_bytes()) / 1e9, kPage,
      reps, flush ? "on" : "off");

  Timer t(reps, flush, static_cast<std::size_t>(dev.l2CacheSize), s);
  std::vector<Result> rs;
  for (std::int32_t b : batches)
    for (std::int32_t l : contexts) rs.push_back(bench_shape(weights, b, l, reps, copy_gbps, t, s));
  print_table(rs);
  if (!json.empty()) write_json(json, dev, config, copy_gbps, reps, flush, rs);
  const bool all_sane =
      std::all_of(rs.begin(), rs.end(), [](const Result& r) { return r.skipped || r.sane; });
  if (!all_sane) std::fprintf(stderr, "bench_decode: non-finite or all-zero logits (see table)\n");
  return all_sane ? 0 : 1;
}

}  // namespace
}  // namespace graphdecode::bench

int main(int argc, char** argv) {
  try {
    return graphdecode::bench::run_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode: %s\n", e.what());
    return 1;
  }
}
