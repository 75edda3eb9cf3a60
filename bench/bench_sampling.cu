// bench_sampling: per-call device time of sample() (engine/kernels/sampling.h) at the 1B Llama's
// vocabulary (128256, float32 logits), batch 1..256, against the kernel it replaced (legacy,
// bench/sampling_legacy.cuh) on the same data in the same run.
//
//   bench_sampling [--json PATH] [--reps N] [--batches B,B,...] [--cases C,C,...]
//   bench_sampling --profile B DIST CASE   (3 eager calls of one case, for ncu; DIST flat|peaked)
//
// Cases (kCases): all greedy; all temperature 0.8; all top-k 50; all top-p 0.95; all top-k 50 +
// top-p 0.95; the engine's mix (odd rows greedy, even rows T 0.8 + top-k 50 + top-p 0.95); all
// top-k 1000; all top-p 0.7; all top-p 0.5; all T 1.2 + top-p 0.95. Logits: near-flat
// (N(0, 1): the synthetic-weight models' rows, almost every token has mass at T 0.8) and peaked
// (N(0, 1) background with 8 tokens 10-15 above it, like a trained model). Time: one sample() call
// captured in a CUDA graph, median device time (events around each replay) of `reps` replays after
// warm-up; "flushed": a read of 2x the L2 before each replay (cold logits); "warm": back-to-back
// replays (logits as L2 kept them; in the engine the LM-head GEMM has just written them).
// "extra" = time minus the all-greedy time of the same batch, distribution and L2 mode.
// Per-pass breakdown (warm): graphs of the scan alone, scan + filter, and all passes; the
// differences are what filter and the rest (check and resolve) add (each partial graph starts by
// clearing the rows' candidate counts, a kernel timed alone and subtracted; the workspace is
// cleared after them, as they leave the filter's accumulators set).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "bench/sampling_legacy.cuh"
#include "common/buffers.h"
#include "common/cuda_check.h"
#include "common/device.h"
#include "common/error.h"
#include "common/stream.h"
#include "engine/kernels/sampling.h"
#include "engine/kernels/sampling_kernels.cuh"
#include "graphs/cuda_graph.h"

namespace graphdecode::bench {
namespace {

constexpr std::int32_t kVocab = 128256;
constexpr std::int32_t kBatches[] = {1, 8, 32, 64, 128, 256};
constexpr int kSpikes = 8;

// The cases: every row (or, for "mix", every even row; odd rows greedy) at temperature t, top-k k
// (0: off), top-p p (1: off). The last four take the paths a sweep of the step found over 3% of
// greedy (bench/NOTES 137): the histogram (k1000), the histogram with approximate masses (p0.5;
// p0.7 too until draw rows began at 0.7, bench/NOTES 138), and draw rows at a high temperature,
// whose lists near-flat rows overflowed before the draw floor (T1.2p0.95).
struct Case {
  const char* name;
  float t;
  std::int32_t k;
  float p;
  bool mix;
};
constexpr Case kCases[] = {
    {"greedy", 0.f, 0, 1.f, false},        {"T0.8", 0.8f, 0, 1.f, false},
    {"k50", 0.8f, 50, 1.f, false},         {"p0.95", 0.8f, 0, 0.95f, false},
    {"k50+p0.95", 0.8f, 50, 0.95f, false}, {"mix", 0.8f, 50, 0.95f, true},
    {"k1000", 0.8f, 1000, 1.f, false},     {"p0.7", 0.8f, 0, 0.7f, false},
    {"p0.5", 0.8f, 0, 0.5f, false},        {"T1.2p0.95", 1.2f, 0, 0.95f, false}};
constexpr int kConfigs = static_cast<int>(std::size(kCases));
constexpr int kGreedy = 0;  // kCases[0]: every other case's "extra" is over it

// The kCases index of `name` (refused by name, as the value of `flag`, when there is none).
int case_index(const char* flag, const std::string& name) {
  int c = 0;
  while (c < kConfigs && name != kCases[c].name) ++c;
  GD_REQUIRE(c < kConfigs, flag, name, "unknown case");
  return c;
}

// --cases: names from kCases; greedy always runs first.
std::vector<int> parse_cases(const std::string& list) {
  std::vector<int> out{kGreedy};
  for (const std::string& name : split_list("--cases", list)) {
    const int c = case_index("--cases", name);
    if (c != kGreedy) out.push_back(c);
  }
  return out;
}
constexpr const char* kDistNames[] = {"flat", "peaked"};

__device__ float normal_of(std::uint64_t i, std::uint64_t seed) {  // Box-Muller, one per index
  const std::uint32_t a = hash32(2 * i * 0x9e3779b97f4a7c15ull + seed);
  const std::uint32_t b = hash32((2 * i + 1) * 0x9e3779b97f4a7c15ull + seed);
  const float u1 = (static_cast<float>(a) + 1.f) * 2.3283064e-10f;  // (0, 1]
  const float u2 = static_cast<float>(b) * 2.3283064e-10f;
  return sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
}

__global__ void fill_normal(float* p, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = normal_of(i, seed);
}

__global__ void add_spikes(float* p, int rows, int vocab, std::uint64_t seed) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= rows * kSpikes) return;
  const int r = t / kSpikes;
  const std::uint32_t h = hash32(seed * 31 + t);
  p[static_cast<std::size_t>(r) * vocab + h % vocab] =
      10.f + 5.f * (hash32(h) & 0xffffff) * (1.f / 16777216.f);
}

struct Rig {
  int rows;
  DeviceBuffer<float> logits, temp, top_p;
  DeviceBuffer<std::int32_t> top_k, tokens, num_rows, path;
  DeviceBuffer<std::uint64_t> seed, step;
  DeviceBuffer<std::uint8_t> ws;
  explicit Rig(int b)
      : rows(b),
        logits(static_cast<std::size_t>(b) * kVocab),
        temp(b),
        top_p(b),
        top_k(b),
        tokens(b),
        num_rows(1),
        path(b),
        seed(b),
        step(b),
        ws(sampling_workspace_bytes(b, kVocab)) {
    ws.fill_bytes(0);
  }
  SamplingArgs args() {
    SamplingArgs a;
    a.logits = logits.data();
    a.temperature = temp.data();
    a.top_k = top_k.data();
    a.top_p = top_p.data();
    a.seed = seed.data();
    a.step = step.data();
    a.tokens = tokens.data();
    a.num_rows = num_rows.data();
    a.max_rows = rows;
    a.vocab = kVocab;
    a.workspace = ws.data();
    a.workspace_bytes = ws.bytes();
    a.path = path.data();
    return a;
  }
  void set_config(int c, cudaStream_t s) {
    std::vector<float> t(rows), p(rows);
    std::vector<std::int32_t> k(rows);
    std::vector<std::uint64_t> sd(rows), st(rows);
    for (int r = 0; r < rows; ++r) {
      const Case& cs = kCases[c];
      const bool sampled = cs.t > 0.f && (!cs.mix || r % 2 == 0);
      t[r] = sampled ? cs.t : 0.f;
      k[r] = sampled ? cs.k : 0;
      p[r] = sampled ? cs.p : 1.f;
      sd[r] = 0x1234567ull * (r + 1);
      st[r] = 1000 + r;
    }
    temp.upload(t.data(), rows, s);
    top_p.upload(p.data(), rows, s);
    top_k.upload(k.data(), rows, s);
    seed.upload(sd.data(), rows, s);
    step.upload(st.data(), rows, s);
    num_rows.upload(&rows, 1, s);
    GD_CUDA(cudaStreamSynchronize(s));
  }
};

struct Flush {
  DeviceBuffer<int4> buf;
  DeviceBuffer<int> sink;
  explicit Flush(std::int64_t l2_bytes)
      : buf(static_cast<std::size_t>(2 * l2_bytes) / sizeof(int4)), sink(1) {
    buf.fill_bytes(1);
  }
  void run(cudaStream_t s) {
    l2_flush_read<<<1024, 256, 0, s>>>(buf.data(), buf.size(), sink.data());
    GD_CHECK_LAUNCH();
  }
};

// The partial graphs below run the scan and filter without resolve, which resets each row's
// candidate count: replayed, a draw row's list would grow every replay (its picks found over a
// longer list each time, or none once it overflowed). This kernel, first in each partial graph and
// timed alone, clears it.
__global__ void clear_candidate_counts(const sampling::Launch L) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < L.a.max_rows) L.ws.state(r).cand_count = 0;
}

void launch_clear(const sampling::Launch& L, cudaStream_t s) {
  clear_candidate_counts<<<(L.a.max_rows + 255) / 256, 256, 0, s>>>(L);
  GD_CHECK_LAUNCH();
}

// Median device time (us) of one replay of `g`, after 3 warm-up replays.
double replay_us(const CudaGraph& g, int reps, Flush* flush, cudaStream_t s) {
  for (int i = 0; i < 3; ++i) {
    if (flush) flush->run(s);
    g.launch(s);
  }
  std::vector<Event> start(reps), stop(reps);
  for (int i = 0; i < reps; ++i) {
    if (flush) flush->run(s);
    start[i].record(s);
    g.launch(s);
    stop[i].record(s);
  }
  GD_CUDA(cudaStreamSynchronize(s));
  std::vector<double> us(reps);
  for (int i = 0; i < reps; ++i) us[i] = 1e3 * stop[i].elapsed_ms_since(start[i]);
  return median(us);
}

struct Result {
  int batch = 0, dist = 0, config = 0;
  bool flushed = false;
  double new_us = 0, legacy_us = 0, extra_us = 0;
  double scan_us = 0, filter_us = 0, resolve_us = 0;  // warm only
  int fast_rows = 0, exact_rows = 0, sampled_rows = 0, agree = 0;
};

std::vector<std::int32_t> download(const DeviceBuffer<std::int32_t>& b, int n, cudaStream_t s) {
  std::vector<std::int32_t> v(n);
  b.download(v.data(), n, s);
  GD_CUDA(cudaStreamSynchronize(s));
  return v;
}

void bench_batch(int batch, int dist, int reps, int legacy_reps, const std::vector<int>& cases,
                 Flush& flush, cudaStream_t s, std::vector<Result>& out) {
  Rig rig(batch);
  const std::size_t n = static_cast<std::size_t>(batch) * kVocab;
  fill_normal<<<1024, 256, 0, s>>>(rig.logits.data(), n, 0x5eed0000ull + batch * 2 + dist);
  GD_CHECK_LAUNCH();
  if (dist == 1) {
    add_spikes<<<(batch * kSpikes + 255) / 256, 256, 0, s>>>(rig.logits.data(), batch, kVocab,
                                                             0xabcull + batch);
    GD_CHECK_LAUNCH();
  }
  double greedy_us[2] = {0, 0};
  for (int c : cases) {
    rig.set_config(c, s);
    const SamplingArgs a = rig.args();
    // Which path each row took, and agreement with the legacy kernel's tokens.
    sample(a, s);
    const auto tok = download(rig.tokens, batch, s), path = download(rig.path, batch, s);
    legacy::sample(a, s);
    const auto old_tok = download(rig.tokens, batch, s);
    Result base;
    base.batch = batch, base.dist = dist, base.config = c;
    for (int r = 0; r < batch; ++r) {
      base.agree += tok[r] == old_tok[r];
      if (path[r] == static_cast<int>(SamplingPath::kGreedy)) continue;
      ++base.sampled_rows;
      (path[r] == static_cast<int>(SamplingPath::kFast) ? base.fast_rows : base.exact_rows) += 1;
    }
    const CudaGraph g_new = CudaGraph::capture(s, [&] { sample(a, s); });
    const CudaGraph g_old = CudaGraph::capture(s, [&] { legacy::sample(a, s); });
    const sampling::Launch L = sampling::make_launch(a);
    const CudaGraph g_clear = CudaGraph::capture(s, [&] { launch_clear(L, s); });
    const CudaGraph g_scan = CudaGraph::capture(s, [&] {
      launch_clear(L, s);
      sampling::launch_scan(L, s);
    });
    const CudaGraph g_scan_filter = CudaGraph::capture(s, [&] {
      launch_clear(L, s);
      sampling::launch_scan(L, s);
      sampling::launch_filter(L, s);
    });
    const double clear_us = replay_us(g_clear, reps, nullptr, s);
    const double scan_us = replay_us(g_scan, reps, nullptr, s) - clear_us;
    const double scan_filter_us = replay_us(g_scan_filter, reps, nullptr, s) - clear_us;
    rig.ws.fill_bytes(0, s);  // the partial graphs left the filter's accumulators set
    for (int f = 0; f < 2; ++f) {
      Result r = base;
      r.flushed = f == 1;
      if (!r.flushed) {
        r.scan_us = scan_us;
        r.filter_us = scan_filter_us - scan_us;
      }
      r.new_us = replay_us(g_new, reps, r.flushed ? &flush : nullptr, s);
      r.legacy_us = replay_us(g_old, legacy_reps, r.flushed ? &flush : nullptr, s);
      if (c == kGreedy) greedy_us[f] = r.new_us;
      r.extra_us = r.new_us - greedy_us[f];
      if (!r.flushed) r.resolve_us = r.new_us - scan_filter_us;
      out.push_back(r);
    }
  }
}

void print(const std::vector<Result>& rs) {
  std::printf("\n%5s %-7s %-8s %-10s %9s %10s %9s %8s %10s %9s  %s\n", "B", "logits", "L2", "case",
              "new us", "legacy us", "extra us", "speedup", "fast/smp", "=legacy",
              "scan/filter/check+resolve us (warm)");
  for (const Result& r : rs) {
    std::printf("%5d %-7s %-8s %-10s %9.1f %10.1f %9.1f %7.1fx %5d/%-4d %4d/%-4d", r.batch,
                kDistNames[r.dist], r.flushed ? "flushed" : "warm", kCases[r.config].name, r.new_us,
                r.legacy_us, r.extra_us, r.legacy_us / r.new_us, r.fast_rows, r.sampled_rows,
                r.agree, r.batch);
    if (!r.flushed) std::printf("  %6.1f/%6.1f/%6.1f", r.scan_us, r.filter_us, r.resolve_us);
    std::printf("\n");
  }
}

void write_json(const std::string& path, const cudaDeviceProp& prop, int reps, int legacy_reps,
                const std::vector<Result>& rs) {
  std::ofstream f(path);
  GD_REQUIRE(f.good(), "--json", path, "cannot open the JSON output");
  f << "{\n  \"bench\": \"bench_sampling\",\n  \"device\": \"" << prop.name << "\",\n"
    << "  \"sms\": " << prop.multiProcessorCount << ",\n  \"l2_bytes\": " << prop.l2CacheSize
    << ",\n  \"vocab\": " << kVocab << ",\n  \"reps\": " << reps
    << ",\n  \"legacy_reps\": " << legacy_reps << ",\n  \"results\": [\n";
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const Result& r = rs[i];
    f << "    {\"batch\": " << r.batch << ", \"logits\": \"" << kDistNames[r.dist]
      << "\", \"l2\": \"" << (r.flushed ? "flushed" : "warm") << "\", \"case\": \""
      << kCases[r.config].name << "\", \"new_us\": " << r.new_us
      << ", \"legacy_us\": " << r.legacy_us << ", \"extra_over_greedy_us\": " << r.extra_us
      << ", \"scan_us\": " << r.scan_us << ", \"filter_us\": " << r.filter_us
      << ", \"resolve_us\": " << r.resolve_us << ", \"sampled_rows\": " << r.sampled_rows
      << ", \"fast_rows\": " << r.fast_rows << ", \"exact_rows\": " << r.exact_rows
      << ", \"tokens_equal_legacy\": " << r.agree << "}" << (i + 1 < rs.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
}

// Three eager calls of one case (for a profiler to pick up).
int profile(int batch, const std::string& dist, const std::string& config, cudaStream_t s) {
  const int c = case_index("CASE", config);
  Rig rig(batch);
  fill_normal<<<1024, 256, 0, s>>>(rig.logits.data(), static_cast<std::size_t>(batch) * kVocab,
                                   0x5eedull);
  GD_CHECK_LAUNCH();
  if (dist == "peaked") {
    add_spikes<<<(batch * kSpikes + 255) / 256, 256, 0, s>>>(rig.logits.data(), batch, kVocab, 7);
    GD_CHECK_LAUNCH();
  }
  rig.set_config(c, s);
  for (int i = 0; i < 3; ++i) sample(rig.args(), s);
  GD_CUDA(cudaStreamSynchronize(s));
  return 0;
}

int run_main(int argc, char** argv) {
  std::string json;
  int reps = 100;
  std::vector<std::int32_t> batches(std::begin(kBatches), std::end(kBatches));
  std::vector<int> cases(kConfigs);
  for (int c = 0; c < kConfigs; ++c) cases[c] = c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(20, std::atoi(argv[++i]));
    } else if (a == "--batches" && i + 1 < argc) {
      batches = parse_list("--batches", argv[++i]);
    } else if (a == "--cases" && i + 1 < argc) {
      cases = parse_cases(argv[++i]);
    } else if (a == "--profile" && i + 3 < argc) {
      Stream s;
      return profile(std::atoi(argv[i + 1]), argv[i + 2], argv[i + 3], s.get());
    } else {
      std::fprintf(stderr,
                   "usage: %s [--json PATH] [--reps N>=20] [--batches B,B,...] [--cases C,C,...]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!cuda_device_available()) {
    std::fprintf(stderr, "bench_sampling: no CUDA device; this benchmark needs a GPU\n");
    return 2;
  }
  const int legacy_reps = std::max(10, reps / 5);  // the legacy kernel takes up to milliseconds
  int dev = 0;
  GD_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  GD_CUDA(cudaGetDeviceProperties(&prop, dev));
  Stream s;
  std::printf("device: %s, %d SMs, L2 %.0f MiB; vocab %d float32\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize / 1048576.0, kVocab);
  std::printf("time = median of %d graph replays (legacy: %d) of one sample() call\n", reps,
              legacy_reps);
  Flush flush(prop.l2CacheSize);
  std::vector<Result> rs;
  for (int dist = 0; dist < 2; ++dist)
    for (int b : batches) bench_batch(b, dist, reps, legacy_reps, cases, flush, s.get(), rs);
  print(rs);
  if (!json.empty()) write_json(json, prop, reps, legacy_reps, rs);
  return 0;
}

}  // namespace
}  // namespace graphdecode::bench

int main(int argc, char** argv) {
  return graphdecode::bench::bench_main("bench_sampling", argc, argv, graphdecode::bench::run_main);
}
