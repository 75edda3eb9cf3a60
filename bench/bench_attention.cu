// bench_attention: paged attention speed on the device, against its measured copy bandwidth.
//
//   bench_attention [--json PATH] [--reps N] [--quick]
//
// * Device copy bandwidth: large cudaMemcpy D2D, bytes = read + write.
// * Decode: B in {1, 8, 64, 256} x L in {512, 2048, 8192, 32768}, 32 q / 8 kv heads, head dim 128,
//   bf16, page 16, random data, shuffled pages; default and deterministic split. Shapes whose pool
//   does not fit in free device memory are skipped.
// * Verify/extend: N = 4 and 8 queries per request at B = 64, L = 8192.
// Time = median over `reps` (>= 50) CUDA-graph replays of PagedAttention::run after warm-up. The
// L2 is flushed before each timed replay by a kernel that READS a buffer of 4x the L2 size (clean
// lines, no write-back during the timed replay); only the replay is between the timing events.
// Three graphs per shape, replays alternating: `us` = one run() (plan + attention, a standalone
// call); `layer us` = one run_planned() (a model plans once a step); `step us` = per layer of a
// graph of plan() + K run_planned() calls on K layers with their own K/V (K <= 16, cold after the
// flush): the time attention adds to a decode step, without the one graph launch per call that
// the first two columns include.
// bytes = K + V read + Q + out; GB/s and % of the measured copy bandwidth; flops = 4 Hq D B times
// the causal (query, key) pairs of a request, N L - N (N - 1) / 2 (= L for decode).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention/paged_attention.h"
#include "bench/bench_util.cuh"
#include "common/buffers.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "common/stream.h"
#include "graphs/cuda_graph.h"

namespace graphdecode::bench {
namespace {

constexpr std::int32_t kHq = 32, kHkv = 8;
std::int32_t g_head_dim = 128;  // --head-dim 64: the Llama-1B model's attention shape

// ---- measurements -------------------------------------------------------------------------------

struct Device {
  std::string name;
  std::int64_t l2_bytes = 0;
  std::int32_t sms = 0;
};

Device device_info() {
  int dev = 0;
  GD_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  GD_CUDA(cudaGetDeviceProperties(&p, dev));
  return Device{p.name, p.l2CacheSize, p.multiProcessorCount};
}

// Median device time of `reps` replays of each graph, each replay after an L2 flush (5 warm-up
// replays each). The graphs' replays alternate, so clock or power drift after a heavy shape
// shifts all of them alike (timing them one after the other once showed a 30 us gap at B=256
// between two graphs whose kernels ncu times equal).
bool g_flush = true;       // --no-flush turns the L2 flush off, to tell cold-cache costs apart
bool g_tile_hint = true;   // --narrow-tiles: no AttentionBatch::query_tokens_hint
bool g_dense_hint = true;  // --no-dense: no AttentionBatch::requests_hint (dense decode kernel)
// Diagnosis of the paged-gather cost: --page N (default 16), and where a request's pages lie in
// the pool (bench/NOTES.md 69, 71): shuffled over the whole pool (the table's), or
// --shuffle-within N (shuffled inside aligned groups of N pool pages: near in address, far in DRAM
// order), --ordered-pages (consecutive), --reversed-pages (consecutive, last to first),
// --interleaved-pages (request i holds pool pages i, i + B, i + 2B, ...: what an in-order
// allocator hands out when B requests grow one page at a time).
enum class PageLayout { kShuffled, kOrdered, kReversed, kInterleaved };
std::int32_t g_page = 16;
PageLayout g_layout = PageLayout::kShuffled;
std::int32_t g_shuffle_within = 0;  // kShuffled: group size, 0 = the whole pool

std::vector<double> replay_medians_us(const std::vector<const CudaGraph*>& graphs, int reps,
                                      const DeviceBuffer<int4>& flush, DeviceBuffer<int>& sink,
                                      cudaStream_t s) {
  for (int i = 0; i < 5; ++i)
    for (const CudaGraph* g : graphs) g->launch(s);
  const std::size_t n = graphs.size();
  std::vector<Event> start(reps * n), stop(reps * n);
  for (int i = 0; i < reps; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      if (g_flush) {
        l2_flush_read<<<1024, 256, 0, s>>>(flush.data(), flush.size(), sink.data());
        GD_CHECK_LAUNCH();
      }
      start[i * n + j].record(s);
      graphs[j]->launch(s);
      stop[i * n + j].record(s);
    }
  }
  GD_CUDA(cudaStreamSynchronize(s));
  std::vector<double> medians;
  for (std::size_t j = 0; j < n; ++j) {
    std::vector<double> us(reps);
    for (int i = 0; i < reps; ++i) us[i] = 1e3 * stop[i * n + j].elapsed_ms_since(start[i * n + j]);
    medians.push_back(median(us));
  }
  return medians;
}

struct Result {
  std::string kind;  // "decode" or "verify"
  std::int32_t batch = 0, kv_len = 0, q_per_req = 1;
  bool deterministic = false;
  bool skipped = false;
  std::string note;
  double us = 0, layer_us = 0, gbps = 0, pct_copy = 0, tflops = 0, bytes = 0;
  std::int32_t step_layers = 0;  // K of the in-step graph (0: not measured, K/V too large)
  double step_us = 0;            // per layer of plan() + K x run_planned()
};

// Layers of the in-step graph: 16, fewer when 16 copies of the K/V would not fit in 16 GiB.
constexpr std::int32_t kStepLayers = 16;
constexpr double kStepPoolBytes = 16.0 * (1 << 30);

// One shape: build a random paged batch with shuffled pages, capture run() in a graph, time
// `reps` replays each after an L2 flush.
Result bench_shape(std::int32_t b, std::int32_t l, std::int32_t n, bool det, int reps,
                   double copy_gbps, const DeviceBuffer<int4>& flush, DeviceBuffer<int>& sink,
                   std::mt19937_64& rng, cudaStream_t s) {
  Result r;
  r.kind = n == 1 ? "decode" : "verify";
  r.batch = b;
  r.kv_len = l;
  r.q_per_req = n;
  r.deterministic = det;
  const std::int32_t ppr = (l + g_page - 1) / g_page;
  const std::int64_t num_pages = static_cast<std::int64_t>(b) * ppr + 1;
  const std::size_t pool = static_cast<std::size_t>(num_pages) * kHkv * g_page * g_head_dim;
  const std::size_t q_elems = static_cast<std::size_t>(b) * n * kHq * g_head_dim;
  std::size_t free_b = 0, total_b = 0;
  GD_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const double layer_bytes = 2.0 * pool * 2;
  const double need = layer_bytes + 2.0 * q_elems * 2 + (1 << 28);  // + workspace headroom
  if (need > 0.9 * free_b || num_pages >= (std::int64_t{1} << 31)) {
    r.skipped = true;
    r.note = "does not fit in device memory";
    return r;
  }
  std::int32_t layers = kStepLayers;
  while (layers >= 2 && (layers * layer_bytes > kStepPoolBytes ||
                         need + (layers - 1) * layer_bytes > 0.9 * free_b))
    --layers;
  r.step_layers = layers >= 2 ? layers : 0;
  // ks[0], vs[0]: the layer the per-call graphs use; the others only serve the in-step graph.
  std::vector<DeviceBuffer<std::uint16_t>> ks, vs;
  for (std::int32_t i = 0; i < std::max(1, r.step_layers); ++i) {
    ks.emplace_back(pool);
    vs.emplace_back(pool);
    fill_random(ks.back(), rng(), s);
    fill_random(vs.back(), rng(), s);
  }
  DeviceBuffer<std::uint16_t> q(q_elems), out(q_elems);
  fill_random(q, rng(), s);

  // Shuffled pages (never page 0; unless a diagnosis layout is asked for), shuffled slots (never
  // slot 0). pages[i * ppr + p] is page p of request i.
  std::vector<std::int32_t> pages(num_pages - 1), slots(b);
  std::iota(pages.begin(), pages.end(), 1);
  if (g_layout == PageLayout::kShuffled) {
    const std::size_t group = g_shuffle_within > 0 ? g_shuffle_within : pages.size();
    for (std::size_t g = 0; g < pages.size(); g += group)
      std::shuffle(pages.begin() + g, pages.begin() + std::min(pages.size(), g + group), rng);
  } else if (g_layout == PageLayout::kReversed) {
    for (std::int32_t i = 0; i < b; ++i)
      std::reverse(pages.begin() + static_cast<std::size_t>(i) * ppr,
                   pages.begin() + static_cast<std::size_t>(i + 1) * ppr);
  } else if (g_layout == PageLayout::kInterleaved) {
    for (std::int32_t i = 0; i < b; ++i)
      for (std::int32_t p = 0; p < ppr; ++p)
        pages[static_cast<std::size_t>(i) * ppr + p] = 1 + p * b + i;
  }
  std::iota(slots.begin(), slots.end(), 1);
  std::shuffle(slots.begin(), slots.end(), rng);
  std::vector<std::int32_t> table(static_cast<std::size_t>(b + 1) * ppr, 0);
  for (std::int32_t i = 0; i < b; ++i)
    for (std::int32_t p = 0; p < ppr; ++p)
      table[static_cast<std::size_t>(slots[i]) * ppr + p] =
          pages[static_cast<std::size_t>(i) * ppr + p];
  std::vector<std::int32_t> q_start(b + 1), kv_len(b, l);
  for (std::int32_t i = 0; i <= b; ++i) q_start[i] = i * n;
  const std::int32_t nreq = b;
  DeviceBuffer<std::int32_t> d_table(table.size()), d_slot(b), d_qs(b + 1), d_kv(b), d_n(1);
  d_table.upload(table.data(), table.size(), s);
  d_slot.upload(slots.data(), b, s);
  d_qs.upload(q_start.data(), b + 1, s);
  d_kv.upload(kv_len.data(), b, s);
  d_n.upload(&nreq, 1, s);
  GD_CUDA(cudaStreamSynchronize(s));

  AttentionConfig cfg;
  cfg.num_q_heads = kHq;
  cfg.num_kv_heads = kHkv;
  cfg.head_dim = g_head_dim;
  cfg.dtype = DType::kBF16;
  cfg.mode = AttentionMode::kCausal;
  cfg.max_batch = b;
  cfg.max_q_tokens = b * n;
  cfg.max_kv_len = l;
  cfg.deterministic = det;
  const PagedAttention attn(cfg);
  AttentionBatch batch;
  batch.num_requests = d_n.data();
  batch.slot = d_slot.data();
  batch.q_start = d_qs.data();
  batch.kv_len = d_kv.data();
  // The call's query tokens, as an engine's extend step gives them (wide tiles from 4096 rows).
  batch.query_tokens_hint = g_tile_hint ? b * n : 0;
  // ...and its requests, as an engine's decode step gives them (the dense decode kernel at d64).
  batch.requests_hint = g_dense_hint && n == 1 ? b : 0;
  PagedKvView kv;
  kv.k = ks[0].data();
  kv.v = vs[0].data();
  kv.page_table = d_table.data();
  kv.max_pages_per_slot = ppr;
  kv.page_size = g_page;
  kv.num_kv_heads = kHkv;
  kv.head_dim = g_head_dim;
  kv.num_pages = static_cast<std::int32_t>(num_pages);

  // A step: plan + attention. A layer of a model: attention only (the plan is made once a step).
  const auto warm_capture = [&](auto&& body) {
    for (int i = 0; i < 3; ++i) body();
    return CudaGraph::capture(s, body);
  };
  const CudaGraph step =
      warm_capture([&] { attn.run(batch, kv, q.data(), out.data(), nullptr, s); });
  attn.plan(batch, s);
  const CudaGraph layer =
      warm_capture([&] { attn.run_planned(batch, kv, q.data(), out.data(), nullptr, s); });
  std::vector<const CudaGraph*> graphs{&step, &layer};
  CudaGraph in_step;
  if (r.step_layers > 0) {
    in_step = warm_capture([&] {
      attn.plan(batch, s);
      for (std::int32_t i = 0; i < r.step_layers; ++i) {
        PagedKvView layer_kv = kv;
        layer_kv.k = ks[i].data();
        layer_kv.v = vs[i].data();
        // Behind the previous layer's attention (it writes out and the partials only), a layer
        // reads its work and K/V while that one finishes; the first one is right behind plan().
        attn.run_planned(batch, layer_kv, q.data(), out.data(), nullptr, s,
                         i == 0 ? PriorWrites::kAnything : PriorWrites::kQueryAndNewKv);
      }
    });
    graphs.push_back(&in_step);
  }
  const std::vector<double> us = replay_medians_us(graphs, reps, flush, sink, s);
#if GD_ATTN_TRACE
  // One more replay of each graph after a flush, its per-CTA timestamps to GD_TRACE_DIR.
  if (const char* dir = std::getenv("GD_TRACE_DIR")) {
    for (std::size_t j = 0; j < 2; ++j) {
      GD_CUDA(cudaStreamSynchronize(s));
      attn::clear_trace();
      l2_flush_read<<<1024, 256, 0, s>>>(flush.data(), flush.size(), sink.data());
      GD_CHECK_LAUNCH();
      graphs[j]->launch(s);
      GD_CUDA(cudaStreamSynchronize(s));
      const std::vector<unsigned long long> t = attn::read_trace();
      const std::string path = std::string(dir) + "/trace_" + (j ? "layer" : "call") + "_b" +
                               std::to_string(b) + "_l" + std::to_string(l) + "_n" +
                               std::to_string(n) + ".bin";
      std::ofstream(path, std::ios::binary)
          .write(reinterpret_cast<const char*>(t.data()), t.size() * 8);
    }
  }
#endif
  r.us = us[0];
  r.layer_us = us[1];
  if (r.step_layers > 0) r.step_us = us[2] / r.step_layers;
  r.bytes = 2.0 * b * static_cast<double>(l) * kHkv * g_head_dim * 2 + 2.0 * q_elems * 2;
  r.gbps = r.bytes / (r.us * 1e-6) / 1e9;
  r.pct_copy = 100.0 * r.gbps / copy_gbps;
  // Causal: query i of the n sees l - n + i + 1 keys, n l - n (n - 1) / 2 in all.
  const double visible = static_cast<double>(n) * l - 0.5 * n * (n - 1.0);
  r.tflops = 4.0 * visible * kHq * g_head_dim * b / (r.us * 1e-6) / 1e12;
  return r;
}

// ---- output -------------------------------------------------------------------------------------

void print_table(const std::vector<Result>& rs) {
  // us: plan + attention (a standalone call); layer us: attention alone (a model plans once a
  // step and runs every layer on that plan); step us: per layer of a K-layer step graph.
  // GB/s, %copy and TFLOP/s use the standalone time.
  std::printf("%-7s %5s %6s %2s %-5s %10s %9s %9s %9s %7s %8s\n", "kind", "B", "L", "N", "split",
              "us", "layer us", "step us", "GB/s", "%copy", "TFLOP/s");
  for (const Result& r : rs) {
    if (r.skipped) {
      std::printf("%-7s %5d %6d %2d %-5s   skipped: %s\n", r.kind.c_str(), r.batch, r.kv_len,
                  r.q_per_req, r.deterministic ? "det" : "auto", r.note.c_str());
      continue;
    }
    char step[32] = "-";
    if (r.step_layers > 0) std::snprintf(step, sizeof step, "%.1f", r.step_us);
    std::printf("%-7s %5d %6d %2d %-5s %10.1f %9.1f %9s %9.0f %6.1f%% %8.1f\n", r.kind.c_str(),
                r.batch, r.kv_len, r.q_per_req, r.deterministic ? "det" : "auto", r.us, r.layer_us,
                step, r.gbps, r.pct_copy, r.tflops);
  }
}

void write_json(const std::string& path, const Device& dev, double copy_gbps, int reps,
                const std::vector<Result>& rs) {
  std::ofstream f(path);
  GD_REQUIRE(f.good(), "--json", path, "cannot open the JSON output");
  f << "{\n  \"bench\": \"bench_attention\",\n  \"device\": \"" << dev.name << "\",\n"
    << "  \"l2_bytes\": " << dev.l2_bytes << ",\n  \"sms\": " << dev.sms << ",\n"
    << "  \"copy_gbps\": " << copy_gbps << ",\n  \"reps\": " << reps << ",\n"
    << "  \"shape\": {\"num_q_heads\": " << kHq << ", \"num_kv_heads\": " << kHkv
    << ", \"head_dim\": " << g_head_dim << ", \"dtype\": \"bf16\", \"page_size\": " << g_page
    << "},\n"
    << "  \"results\": [\n";
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const Result& r = rs[i];
    f << "    {\"kind\": \"" << r.kind << "\", \"B\": " << r.batch << ", \"L\": " << r.kv_len
      << ", \"N\": " << r.q_per_req
      << ", \"deterministic\": " << (r.deterministic ? "true" : "false")
      << ", \"skipped\": " << (r.skipped ? "true" : "false");
    if (!r.skipped)
      f << ", \"us\": " << r.us << ", \"layer_us\": " << r.layer_us
        << ", \"step_layers\": " << r.step_layers << ", \"step_us\": " << r.step_us
        << ", \"bytes\": " << r.bytes << ", \"gbps\": " << r.gbps
        << ", \"pct_copy\": " << r.pct_copy << ", \"tflops\": " << r.tflops;
    else
      f << ", \"note\": \"" << r.note << "\"";
    f << "}" << (i + 1 < rs.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
}

__global__ void empty_kernel() {}

// The launch floor: a graph of one empty kernel, timed like every shape.
double empty_graph_us(int reps, const DeviceBuffer<int4>& flush, DeviceBuffer<int>& sink,
                      cudaStream_t s) {
  const CudaGraph g = CudaGraph::capture(s, [&] {
    empty_kernel<<<1, 32, 0, s>>>();
    GD_CHECK_LAUNCH();
  });
  return replay_medians_us({&g}, reps, flush, sink, s)[0];
}

int run_main(int argc, char** argv) {
  std::string json;
  int reps = 100;
  bool quick = false, small = false;
  int only_b = 0, only_l = 0, only_n = 1;  // --shape: one shape (adaptive split), for profiling
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(50, std::atoi(argv[++i]));
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--small-batch") {  // B 1 and 8 only, adaptive split only: for tuning
      small = true;
    } else if (a == "--shape" && i + 1 < argc) {
      if (std::sscanf(argv[++i], "%d,%d,%d", &only_b, &only_l, &only_n) < 2 || only_b < 1 ||
          only_l < 1 || only_n < 1) {
        std::fprintf(stderr, "--shape wants B,L or B,L,N (positive)\n");
        return 2;
      }
    } else if (a == "--narrow-tiles") {  // no query-token hint: 64-row extend tiles (A/B)
      g_tile_hint = false;
    } else if (a == "--no-dense") {  // no requests hint: the base decode kernel (A/B)
      g_dense_hint = false;
    } else if (a == "--no-flush") {  // L2 left warm between replays (diagnosis only)
      g_flush = false;
    } else if (a == "--page" && i + 1 < argc) {  // page size (diagnosis only)
      g_page = std::atoi(argv[++i]);
      if (g_page < 1) {
        std::fprintf(stderr, "--page wants a positive page size\n");
        return 2;
      }
    } else if (a == "--head-dim" && i + 1 < argc) {  // 64, 128 or 256 (default 128)
      g_head_dim = std::atoi(argv[++i]);
      if (g_head_dim != 64 && g_head_dim != 128 && g_head_dim != 256) {
        std::fprintf(stderr, "--head-dim wants 64, 128 or 256\n");
        return 2;
      }
    } else if (a == "--ordered-pages") {  // diagnosis only, as the four below
      g_layout = PageLayout::kOrdered;
    } else if (a == "--reversed-pages") {
      g_layout = PageLayout::kReversed;
    } else if (a == "--interleaved-pages") {
      g_layout = PageLayout::kInterleaved;
    } else if (a == "--shuffle-within" && i + 1 < argc) {
      g_layout = PageLayout::kShuffled;
      g_shuffle_within = std::atoi(argv[++i]);
      if (g_shuffle_within < 1) {
        std::fprintf(stderr, "--shuffle-within wants a positive page count\n");
        return 2;
      }
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--json PATH] [--reps N>=50] [--quick] [--small-batch] [--shape B,L[,N]] "
          "[--narrow-tiles] [--no-dense] [--no-flush] [--page N] [--ordered-pages | "
          "--reversed-pages | --shuffle-within N | --interleaved-pages] [--head-dim D]\n",
          argv[0]);
      return 2;
    }
  }
  const Device dev = device_info();
  Stream s;
  const double copy_gbps = copy_bandwidth_gbps(s);
  std::printf("device: %s, %d SMs, L2 %.0f MiB; D2D copy %.0f GB/s (read + write)\n",
              dev.name.c_str(), dev.sms, dev.l2_bytes / 1048576.0, copy_gbps);

  const std::size_t flush_bytes = std::max<std::size_t>(4 * dev.l2_bytes, 64 << 20);
  DeviceBuffer<int4> flush(flush_bytes / sizeof(int4));
  DeviceBuffer<int> sink(1);
  flush.fill_bytes(0, s);
  std::mt19937_64 rng(20261122);

  std::printf("graph launch floor (one empty kernel, same timing method): %.1f us\n",
              empty_graph_us(reps, flush, sink, s));

  std::vector<Result> rs;
  std::vector<std::int32_t> batches{1, 8, 64, 256};
  std::vector<std::int32_t> lens{512, 2048, 8192, 32768};
  if (quick) batches = {1, 64}, lens = {2048, 8192};
  if (small) batches = {1, 8}, lens = {512, 1024, 2048, 4096, 8192, 32768};
  if (only_b > 0) {
    rs.push_back(bench_shape(only_b, only_l, only_n, false, reps, copy_gbps, flush, sink, rng, s));
    batches.clear();
  }
  for (bool det : {false, true}) {
    if (small && det) continue;
    for (std::int32_t b : batches)
      for (std::int32_t l : lens)
        rs.push_back(bench_shape(b, l, 1, det, reps, copy_gbps, flush, sink, rng, s));
  }
  for (bool det : {false, true})
    for (std::int32_t n : {4, 8})
      if (!small && only_b == 0)
        rs.push_back(bench_shape(64, 8192, n, det, reps, copy_gbps, flush, sink, rng, s));

  print_table(rs);
  if (!json.empty()) write_json(json, dev, copy_gbps, reps, rs);
  return 0;
}

}  // namespace
}  // namespace graphdecode::bench

int main(int argc, char** argv) {
  return graphdecode::bench::bench_main("bench_attention", argc, argv,
                                        graphdecode::bench::run_main);
}
