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

// ---- one (B, L) rig -----------------------------------------------------------------------------

// Members are destroyed in reverse order: graphs, program, model, runtime, then the step.
struct Rig {
  std::unique_ptr<StepContext> step;
  std::unique_ptr<ModelRuntime> runtime;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<ModelStep> program;
  std::unique_ptr<StepGraphs> graphs;
  std::vector<StepRequest> requests;  // [B] decode rows: prefix L, extend 1
  std::vector<std::int32_t> tokens;   // [B]

  Rig(const HostWeights& w, std::int32_t b, std::int32_t l, cudaStream_t s) {
    const RuntimeOptions o = decode_options(b, l);
    const AttentionLayout layout = llama_attention_layout(w.config);
    const StepCapacity cap = step_capacity(o, std::span<const AttentionLayout>(&layout, 1));
    step = std::make_unique<StepContext>(cap, ledger_pools(cap, o));
    runtime = std::make_unique<ModelRuntime>(layout, o, *step, 0, s);
    model = std::make_unique<LlamaModel>(w, o, s);
    program = std::make_unique<ModelStep>(*runtime, *model);
    StepGraphsConfig gc;
    gc.buckets = {b};
    graphs = std::make_unique<StepGraphs>(step->input(), *program, gc);
    KvLedger& ledger = step->ledger();
    std::vector<std::int32_t> slots(static_cast<std::size_t>(b));
    for (auto& slot : slots) slot = ledger.acquire();
    // L + 1 positions per request, a page at a time round-robin over requests (pages interleave
    // as they would in a running engine), applied whenever the step-sized batches fill up.
    for (std::int32_t done = 0; done < l + 1; done += kPage) {
      for (std::int32_t slot : slots) {
        if (!has_room()) apply_commands(s);
        ledger.extend(slot, std::min(kPage, l + 1 - done));
      }
    }
    apply_commands(s);
    for (AttentionKind kind : {AttentionKind::kFull, AttentionKind::kSliding}) {
      if (!runtime->has_pool(kind)) continue;
      const KvPool& pool = runtime->pool(kind);
      const KvPoolConfig& pc = pool.config();
      const std::size_t elems = static_cast<std::size_t>(pc.geometry.num_pages) *
                                pc.shape.num_kv_heads * pc.geometry.page_size * pc.shape.head_dim;
      for (std::int32_t layer = 0; layer < pc.shape.num_layers; ++layer) {
        const PagedKvView v = pool.view(layer);
        for (void* p : {v.k, v.v}) {
          fill_random(static_cast<std::uint16_t*>(p), elems,
                      kSeed + static_cast<std::uint64_t>(layer) * 7 + kind_index(kind), s);
        }
      }
    }
    GD_CUDA(cudaStreamSynchronize(s));
    for (std::int32_t r = 0; r < b; ++r) {
      requests.push_back({slots[static_cast<std::size_t>(r)], l, 1, 0});
      tokens.push_back((r * 7919 + 11) % w.config.vocab_size);
    }
    graphs->capture(s);
  }

  StepDesc desc() const {
    StepDesc d;
    d.mode = StepMode::kDecode;
    d.tokens_per_request = 1;
    d.requests = requests;
    d.token_ids = tokens;
    return d;  // no table commands: the pages were applied at setup
  }

 private:
  bool has_room() const {
    // One extend of <= one page: 2 commands, 2 page ids.
    const KvLedger& ledger = step->ledger();
    for (std::int32_t i = 0; i < ledger.num_pools(); ++i)
      if (!ledger.commands(i).has_room(RequestSlots::kMaxCommandsPerOp, 2)) return false;
    return true;
  }
  void apply_commands(cudaStream_t s) {
    KvLedger& ledger = step->ledger();
    for (std::int32_t i = 0; i < ledger.num_pools(); ++i) {
      const TableCommandBatch& c = ledger.commands(i);
      if (!c.empty()) runtime->pool(ledger.config(i).geometry.kind).table().apply(c, s);
    }
    ledger.clear_commands();
  }
};

// ---- timing -------------------------------------------------------------------------------------

// L2 flush buffer and per-rep events, made once (nothing is allocated in the timed loops).
struct Timer {
  Timer(int reps, bool flush_on, std::size_t l2_bytes, cudaStream_t s)
      : flush_l2(flush_on),
        flush(std::max<std::size_t>(4 * l2_bytes, 64 << 20) / sizeof(int4)),
        start(static_cast<std::size_t>(reps)),
        stop(static_cast<std::size_t>(reps)),
        us(static_cast<std::size_t>(reps)) {
    flush.fill_bytes(0, s);
  }
  bool flush_l2;
  DeviceBuffer<int4> flush;  // [4 x L2 bytes / 16]
  DeviceBuffer<int> sink{1};
  std::vector<Event> start, stop;  // [reps]
  std::vector<double> us;          // [reps]
};

struct StepTimes {
  double device_us = 0, host_us = 0;
};

StepTimes time_steps(Rig& rig, bool use_graphs, int reps, Timer& t, cudaStream_t s) {
  rig.graphs->set_use_graphs(use_graphs);
  const StepDesc d = rig.desc();
  const StepPath want = use_graphs ? StepPath::kGraph : StepPath::kEager;
  for (int i = 0; i < kWarmup; ++i) {
    const StepPath p = rig.graphs->step(d, s);
    GD_REQUIRE(p == want, "path", static_cast<int>(p), "the step did not take the expected path");
  }
  GD_CUDA(cudaStreamSynchronize(s));
  StepTimes r;
  // Device time: the host runs ahead (bounded by StepInput's ring of two images).
  for (int i = 0; i < reps; ++i) {
    if (t.flush_l2) {
      l2_flush_read<<<1024, 256, 0, s>>>(t.flush.data(), t.flush.size(), t.sink.data());
      GD_CHECK_LAUNCH();
    }
    t.start[static_cast<std::size_t>(i)].record(s);
    rig.graphs->step(d, s);
    t.stop[static_cast<std::size_t>(i)].record(s);
  }
  GD_CUDA(cudaStreamSynchronize(s));
  for (int i = 0; i < reps; ++i) {
    const auto u = static_cast<std::size_t>(i);
    t.us[u] = 1e3 * t.stop[u].elapsed_ms_since(t.start[u]);
  }
  r.device_us = median(t.us);
  // Host time: device drained first, so no back-pressure from the pinned ring is counted.
  for (int i = 0; i < reps; ++i) {
    GD_CUDA(cudaStreamSynchronize(s));
    const auto t0 = std::chrono::steady_clock::now();
    rig.graphs->step(d, s);
    const auto t1 = std::chrono::steady_clock::now();
    t.us[static_cast<std::size_t>(i)] = std::chrono::duration<double, std::micro>(t1 - t0).count();
  }
  GD_CUDA(cudaStreamSynchronize(s));
  r.host_us = median(t.us);
  return r;
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

// Logits [B][vocab] of the last step: all finite and not all zero, or the forward is broken.
void check_logits(Result& r, const LlamaModel& m, std::vector<float>& graph_logits,
                  std::vector<float>& eager_logits, cudaStream_t s) {
  std::int32_t bad = 0;
  GD_CUDA(cudaMemcpyAsync(&bad, m.bad_token_flag(), sizeof(bad), cudaMemcpyDeviceToHost, s));
  GD_CUDA(cudaStreamSynchronize(s));
  double sq = 0;
  bool finite = bad == 0;
  for (std::size_t i = 0; i < graph_logits.size(); ++i) {
    const double g = graph_logits[i];
    finite = finite && std::isfinite(g) && std::isfinite(eager_logits[i]);
    r.logit_max_abs = std::max(r.logit_max_abs, std::abs(g));
    r.graph_eager_max_diff = std::max(r.graph_eager_max_diff, std::abs(g - eager_logits[i]));
    sq += g * g;
  }
  r.logit_rms = std::sqrt(sq / static_cast<double>(graph_logits.size()));
  r.sane = finite && r.logit_rms > 1e-3;
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
  const double need =
      static_cast<double>(w.total_bytes()) + kv_pool_bytes(c, decode_options(b, l)) + (1 << 30);
  if (need > 0.9 * static_cast<double>(free_b)) {
    r.skipped = true;
    r.note = "does not fit in device memory";
    return r;
  }
  Rig rig(w, b, l, s);
  const std::size_t n = static_cast<std::size_t>(b) * static_cast<std::size_t>(c.vocab_size);
  std::vector<float> graph_logits(n), eager_logits(n);
  r.graph = time_steps(rig, true, reps, t, s);
  GD_CUDA(cudaMemcpyAsync(graph_logits.data(), rig.model->logits(), n * sizeof(float),
                          cudaMemcpyDeviceToHost, s));
  r.eager = time_steps(rig, false, reps, t, s);
  GD_CUDA(cudaMemcpyAsync(eager_logits.data(), rig.model->logits(), n * sizeof(float),
                          cudaMemcpyDeviceToHost, s));
  check_logits(r, *rig.model, graph_logits, eager_logits, s);
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

// "1,8,64" -> {1, 8, 64}; every entry positive.
std::vector<std::int32_t> parse_list(const std::string& flag, const std::string& text) {
  std::vector<std::int32_t> v;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const long x = std::strtol(item.c_str(), &end, 10);
    GD_REQUIRE(!item.empty() && *end == '\0' && x > 0 && x < (1l << 30), flag, item,
               "expected a comma-separated list of positive integers");
    v.push_back(static_cast<std::int32_t>(x));
  }
  GD_REQUIRE(!v.empty(), flag, text, "empty list");
  return v;
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
