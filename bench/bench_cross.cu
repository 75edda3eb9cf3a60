// bench_cross: one decode step of a cross-attention model (Mllama's text decoder, seeded synthetic
// weights) at batch 1, 8 and 64 with mixed encoder lengths up to 6400 keys (a four-tile image),
// against the floor of (weights + self KV + cross KV bytes read per step) / measured copy
// bandwidth, graph vs eager; and the one-off cost of projecting a request's encoder states into
// the cross pool (LlamaModel::encode) at admission.
//
//   bench_cross [--shape 1b|11b] [--batches 1,8,64] [--context 1024] [--reps N] [--json PATH]
//               [--quick] [--no-flush]
//
// Shapes: 1b = the Llama-3.2-1B shape with 4 gated cross layers (20 layers, 16 self + cross at 3,
// 8, 13, 18; engine/model_config.h mllama_1b_class_config); 11b = Llama-3.2-11B-Vision's text
// decoder (40 layers, 8 cross; 19.6 GB of bf16 weights: an H100 holds it with B = 64's pools).
// Per B: requests with L prefix tokens in the self pools and encoder lengths cycling through
// {6400, 0, 1600, 3200, 4800, 400, 6400, 2400} (B = 1: one 6400-key image; text-only requests
// among the others), every pool's pages reserved through the step's ledger and filled with random
// bf16 (not prefilled or projected: the timed step reads the same bytes either way). Every step is
// the same decode step (prefix L, extend 1). Device time: events around StepGraphs::step, median
// over reps after warm-up, each after an L2 flush; the same eagerly.
// Floor bytes per step: every weight the step reads (all but the embedding table, of which B
// rows, and the cross layers' k/v projections, which only run at admission) + self K/V
// (B x (L + 1) x self layers) + cross K/V (sum of encoder lengths x cross layers), each
// x 2 (K, V) x kv_heads x head_dim x 2 bytes.
// Encode: median device time of encode() for 1600 and 6400 states (host states: the H2D copy
// included; device states), against its floor (states + k/v weights read, K/V written).
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
#include <numeric>
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
constexpr std::uint64_t kSeed = 4321;
constexpr std::int32_t kMaxEncoder = 6400;
constexpr std::int32_t kEncoderMix[] = {6400, 0, 1600, 3200, 4800, 400, 6400, 2400};

ModelConfig bench_config(const std::string& shape, bool quick) {
  ModelConfig c = shape == "11b" ? mllama_11b_text_config() : mllama_1b_class_config();
  if (!quick) return c;
  c.vocab_size = 32000;
  c.hidden_size = 512;
  c.intermediate_size = 1536;
  c.num_hidden_layers = 5;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.layers.assign(5, LayerAttention{});
  c.layers[3] = {AttentionKind::kCross, -1};
  c.validate();
  return c;
}

std::vector<std::int32_t> encoder_lengths(std::int32_t b, std::int32_t max_len) {
  std::vector<std::int32_t> lens;
  for (std::int32_t r = 0; r < b; ++r)
    lens.push_back(std::min(max_len, kEncoderMix[r % std::size(kEncoderMix)]));
  return lens;
}

RuntimeOptions decode_options(std::int32_t b, std::int32_t l, std::int32_t max_enc,
                              std::int32_t cross_pages) {
  RuntimeOptions o;
  o.max_batch = b;
  o.max_tokens = b;
  o.max_new_tokens = 1;
  o.max_kv_len = l + 1;
  o.max_encoder_len = max_enc;
  o.page_size = kPage;
  o.max_slots = b + 2;  // + one slot for the encode timing
  o.cross_pages = cross_pages;
  return o;
}

// Cross pages for `lens` and the encode slot (max_enc keys), plus the reserved page.
std::int32_t cross_pages_for(const std::vector<std::int32_t>& lens, std::int32_t max_enc) {
  std::int32_t pages = pages_for_tokens(max_enc, kPage) + 1;
  for (std::int32_t l : lens) pages += pages_for_tokens(l, kPage);
  return pages;
}

double pool_bytes(const ModelConfig& c, const RuntimeOptions& o) {
  const AttentionLayout layout = llama_attention_layout(c);
  double bytes = 0;
  for (AttentionKind k : {AttentionKind::kFull, AttentionKind::kSliding, AttentionKind::kCross}) {
    if (!layout.has(k)) continue;
    const KvPoolConfig pc = pool_config(layout, o, k);
    bytes += static_cast<double>(pc.geometry.num_pages) *
             static_cast<double>(kv_page_bytes(pc.shape, pc.geometry.page_size));
  }
  return bytes;
}

// Bytes of the cross layers' k/v projections (read at admission only).
double cross_kv_weight_bytes(const ModelConfig& c) {
  return static_cast<double>(c.num_cross_layers()) * 2.0 * c.kv_size() * c.hidden_size * 2.0;
}

struct Result {
  std::int32_t batch = 0, context = 0, text_only = 0;
  std::int64_t encoder_keys = 0;
  std::int32_t longest = 0;
  bool skipped = false;
  std::string note;
  StepTimes graph, eager;
  double weight_bytes = 0, kv_bytes = 0, cross_bytes = 0, floor_us = 0;
  double logit_rms = 0, graph_eager_max_diff = 0;
  bool sane = false;
  double speedup() const { return eager.device_us / graph.device_us; }
  double pct_floor() const { return 100.0 * floor_us / graph.device_us; }
  double gbps() const {
    return (weight_bytes + kv_bytes + cross_bytes) / (graph.device_us * 1e-6) / 1e9;
  }
};

struct EncodeResult {
  std::int32_t length = 0;
  bool on_device = false;
  double us = 0, floor_us = 0;
};

Result bench_shape(const HostWeights& w, std::int32_t b, std::int32_t l, std::int32_t max_enc,
                   int reps, double copy_gbps, Timer& t, cudaStream_t s,
                   std::vector<EncodeResult>* encodes) {
  Result r;
  r.batch = b;
  r.context = l;
  const ModelConfig& c = w.config;
  const std::vector<std::int32_t> lens = encoder_lengths(b, max_enc);
  r.encoder_keys = std::accumulate(lens.begin(), lens.end(), std::int64_t{0});
  r.longest = *std::max_element(lens.begin(), lens.end());
  r.text_only = static_cast<std::int32_t>(std::count(lens.begin(), lens.end(), 0));
  std::size_t free_b = 0, total_b = 0;
  GD_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const RuntimeOptions o = decode_options(b, l, max_enc, cross_pages_for(lens, max_enc));
  const double need = static_cast<double>(w.total_bytes()) + pool_bytes(c, o) + (1 << 30);
  if (need > 0.9 * static_cast<double>(free_b)) {
    r.skipped = true;
    r.note = "does not fit in device memory";
    return r;
  }
  DecodeRig rig(w, o, b, l, lens, max_enc, kSeed, s);
  const GraphEagerRun run = time_graph_and_eager(rig, c.vocab_size, kWarmup, reps, t, s);
  r.graph = run.graph;
  r.eager = run.eager;
  r.logit_rms = run.logit_rms;
  r.graph_eager_max_diff = run.graph_eager_max_diff;
  r.sane = run.sane;
  const double kv_row = 2.0 * c.num_key_value_heads * c.head_dim * 2.0;  // K + V of one key
  const double embed = static_cast<double>(c.input_vocab_size()) * c.hidden_size * 2.0;
  r.weight_bytes = static_cast<double>(w.total_bytes()) - embed - cross_kv_weight_bytes(c) +
                   static_cast<double>(b) * c.hidden_size * 2.0;
  const std::int32_t self_layers = c.num_hidden_layers - c.num_cross_layers();
  r.kv_bytes = static_cast<double>(b) * (l + 1) * self_layers * kv_row;
  r.cross_bytes = static_cast<double>(r.encoder_keys) * c.num_cross_layers() * kv_row;
  r.floor_us = (r.weight_bytes + r.kv_bytes + r.cross_bytes) / (copy_gbps * 1e9) * 1e6;

  if (encodes != nullptr) {  // the one-off projection at admission
    const std::size_t elems = static_cast<std::size_t>(max_enc) * c.hidden_size;
    DeviceBuffer<std::uint16_t> dev(elems);
    fill_random(dev, kSeed + 99, s);
    std::vector<std::uint16_t> host(elems);
    dev.download(host.data(), elems, s);
    GD_CUDA(cudaStreamSynchronize(s));
    for (const std::int32_t len : {1600, max_enc}) {
      for (const bool on_device : {false, true}) {
        const EncoderStatesView v{on_device ? dev.data() : host.data(), len, on_device};
        for (int i = 0; i < 3; ++i) rig.model->encode(*rig.runtime, rig.encode_slot, v, s);
        GD_CUDA(cudaStreamSynchronize(s));
        const int n_reps = std::max(5, reps / 5);
        for (int i = 0; i < n_reps; ++i) {
          t.flush_now(s);
          t.start[static_cast<std::size_t>(i)].record(s);
          rig.model->encode(*rig.runtime, rig.encode_slot, v, s);
          t.stop[static_cast<std::size_t>(i)].record(s);
          GD_CUDA(cudaStreamSynchronize(s));  // pageable H2D copies: one at a time
          t.us[static_cast<std::size_t>(i)] =
              1e3 * t.stop[static_cast<std::size_t>(i)].elapsed_ms_since(
                        t.start[static_cast<std::size_t>(i)]);
        }
        EncodeResult e;
        e.length = len;
        e.on_device = on_device;
        e.us = median(std::vector<double>(t.us.begin(), t.us.begin() + n_reps));
        const double bytes = static_cast<double>(len) * c.hidden_size * 2.0 +
                             cross_kv_weight_bytes(c) +
                             static_cast<double>(len) * c.num_cross_layers() * kv_row;
        e.floor_us = bytes / (copy_gbps * 1e9) * 1e6;
        encodes->push_back(e);
      }
    }
  }
  return r;
}

void print_table(const std::vector<Result>& rs) {
  std::printf("%5s %6s %6s %6s %5s %9s %9s %7s %9s %6s %6s %8s %7s %8s\n", "B", "L", "enc", "max",
              "text", "graph us", "eager us", "speedup", "floor us", "%floor", "GB/s", "host us",
              "lg rms", "g-e diff");
  for (const Result& r : rs) {
    if (r.skipped) {
      std::printf("%5d %6d   skipped: %s\n", r.batch, r.context, r.note.c_str());
      continue;
    }
    std::printf("%5d %6d %6lld %6d %5d %9.1f %9.1f %7.2f %9.1f %5.1f%% %6.0f %8.2f %7.3f %8.2g%s\n",
                r.batch, r.context, static_cast<long long>(r.encoder_keys), r.longest, r.text_only,
                r.graph.device_us, r.eager.device_us, r.speedup(), r.floor_us, r.pct_floor(),
                r.gbps(), r.graph.host_us, r.logit_rms, r.graph_eager_max_diff,
                r.sane ? "" : "  NOT SANE");
  }
}

void write_json(const std::string& path, const cudaDeviceProp& dev, const ModelConfig& c,
                const std::string& shape, double copy_gbps, int reps, bool flush,
                const std::vector<Result>& rs, const std::vector<EncodeResult>& es) {
  std::ofstream f(path);
  GD_REQUIRE(f.good(), "--json", path, "cannot open the JSON output");
  f.precision(10);
  f << "{\n  \"bench\": \"bench_cross\",\n  \"device\": \"" << dev.name << "\",\n"
    << "  \"copy_gbps\": " << copy_gbps << ",\n  \"reps\": " << reps
    << ",\n  \"l2_flush\": " << (flush ? "true" : "false") << ",\n  \"shape\": \"" << shape
    << "\",\n  \"config\": {\"hidden\": " << c.hidden_size
    << ", \"intermediate\": " << c.intermediate_size << ", \"layers\": " << c.num_hidden_layers
    << ", \"cross_layers\": " << c.num_cross_layers() << ", \"heads\": " << c.num_attention_heads
    << ", \"kv_heads\": " << c.num_key_value_heads << ", \"head_dim\": " << c.head_dim
    << ", \"vocab\": " << c.vocab_size << ", \"page_size\": " << kPage << "},\n  \"results\": [\n";
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const Result& r = rs[i];
    f << "    {\"B\": " << r.batch << ", \"L\": " << r.context
      << ", \"encoder_keys\": " << r.encoder_keys << ", \"longest_encoder\": " << r.longest
      << ", \"text_only\": " << r.text_only << ", \"skipped\": " << (r.skipped ? "true" : "false");
    if (!r.skipped) {
      f << ", \"graph_us\": " << r.graph.device_us << ", \"eager_us\": " << r.eager.device_us
        << ", \"floor_us\": " << r.floor_us << ", \"pct_of_floor\": " << r.pct_floor()
        << ", \"weight_bytes\": " << r.weight_bytes << ", \"kv_bytes\": " << r.kv_bytes
        << ", \"cross_kv_bytes\": " << r.cross_bytes << ", \"graph_host_us\": " << r.graph.host_us
        << ", \"graph_eager_max_diff\": " << r.graph_eager_max_diff
        << ", \"sane\": " << (r.sane ? "true" : "false");
    }
    f << "}" << (i + 1 < rs.size() ? "," : "") << "\n";
  }
  f << "  ],\n  \"encode\": [\n";
  for (std::size_t i = 0; i < es.size(); ++i) {
    f << "    {\"length\": " << es[i].length << ", \"states\": \""
      << (es[i].on_device ? "device" : "host") << "\", \"us\": " << es[i].us
      << ", \"floor_us\": " << es[i].floor_us << "}" << (i + 1 < es.size() ? "," : "") << "\n";
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
    } else if (a == "--batches" && i + 1 < argc) {
      batches_arg = argv[++i];
    } else if (a == "--context" && i + 1 < argc) {
      context_arg = argv[++i];
    } else if (a == "--shape" && i + 1 < argc) {
      shape = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(5, std::atoi(argv[++i]));
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--no-flush") {
      flush = false;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--shape 1b|11b] [--batches 1,8,64] [--context 1024] [--reps N>=5] "
                   "[--json PATH] [--quick] [--no-flush]\n",
                   argv[0]);
      return a == "--help" ? 0 : 2;
    }
  }
  if (shape != "1b" && shape != "11b") {
    std::fprintf(stderr, "bench_cross: --shape is 1b or 11b\n");
    return 2;
  }
  const std::vector<std::int32_t> batches =
      parse_list("--batches", batches_arg.empty() ? (quick ? "1,8" : "1,8,64") : batches_arg);
  const std::vector<std::int32_t> contexts =
      parse_list("--context", context_arg.empty() ? (quick ? "256" : "1024") : context_arg);
  if (reps == 0) reps = quick ? 20 : 100;
  const std::int32_t max_enc = quick ? 1600 : kMaxEncoder;
  if (!cuda_device_available()) {
    std::fprintf(stderr, "bench_cross: no CUDA device; this benchmark needs a GPU\n");
    return 2;
  }
  int dev_id = 0;
  GD_CUDA(cudaGetDevice(&dev_id));
  cudaDeviceProp dev{};
  GD_CUDA(cudaGetDeviceProperties(&dev, dev_id));
  Stream s;
  const double copy_gbps = copy_bandwidth_gbps(s);
  const ModelConfig config = bench_config(shape, quick);
  const HostWeights weights = synthetic_weights(config, kSeed);
  std::printf("device: %s, %d SMs, L2 %.0f MiB; D2D copy %.0f GB/s (read + write)\n", dev.name,
              dev.multiProcessorCount, dev.l2CacheSize / 1048576.0, copy_gbps);
  std::printf(
      "model: %s Mllama text decoder (hidden %d, inter %d, %d layers of which %d cross, %d q / %d "
      "kv heads, head dim %d, vocab %d + %d), synthetic weights %.2f GB bf16; page %d; encoder "
      "lengths cycle 6400,0,1600,3200,4800,400,6400,2400 (max %d); %d reps, L2 flush %s\n",
      quick ? "quick" : shape.c_str(), config.hidden_size, config.intermediate_size,
      config.num_hidden_layers, config.num_cross_layers(), config.num_attention_heads,
      config.num_key_value_heads, config.head_dim, config.vocab_size, config.extra_input_tokens,
      static_cast<double>(weights.total_bytes()) / 1e9, kPage, max_enc, reps, flush ? "on" : "off");

  Timer t(reps, flush, static_cast<std::size_t>(dev.l2CacheSize), s);
  std::vector<Result> rs;
  std::vector<EncodeResult> es;
  for (std::int32_t b : batches)
    for (std::int32_t l : contexts)
      rs.push_back(
          bench_shape(weights, b, l, max_enc, reps, copy_gbps, t, s, es.empty() ? &es : nullptr));
  std::printf(
      "decode step (enc: encoder keys in the batch, max: longest, text: text-only "
      "requests; floor: weights + self KV + cross KV read per step at the copy rate)\n");
  print_table(rs);
  std::printf(
      "encode at admission (cross k/v projections + k_norm + writes into the cross pool, "
      "every cross layer; host states include the H2D copy)\n");
  std::printf("%7s %7s %10s %10s %7s\n", "length", "states", "us", "floor us", "%floor");
  for (const EncodeResult& e : es)
    std::printf("%7d %7s %10.1f %10.1f %6.1f%%\n", e.length, e.on_device ? "device" : "host", e.us,
                e.floor_us, 100.0 * e.floor_us / e.us);
  if (!json.empty()) write_json(json, dev, config, shape, copy_gbps, reps, flush, rs, es);
  const bool all_sane =
      std::all_of(rs.begin(), rs.end(), [](const Result& r) { return r.skipped || r.sane; });
  if (!all_sane) std::fprintf(stderr, "bench_cross: non-finite or all-zero logits (see table)\n");
  return all_sane ? 0 : 1;
}

}  // namespace
}  // namespace graphdecode::bench

int main(int argc, char** argv) {
  return graphdecode::bench::bench_main("bench_cross", argc, argv, graphdecode::bench::run_main);
}
