// bench_gemm: the decode GEMMs of a Llama at rows 1, 2, 4, 8 (or --rows): the skinny kernel
// (engine/kernels/skinny_gemm.h), the stream GEMV (engine/kernels/stream_gemv.h) and the warpgroup
// GEMM (engine/kernels/wgmma_gemm.h, `wgmma us`, 0 where it does not take the shape) vs cuBLAS
// (Gemm::set_skinny(false)) vs what Gemm picks by default (`auto`: engine/gemm.h) vs the floor.
//
//   bench_gemm [--shape 1b|8b] [--rows 1,2,4,8] [--json PATH] [--reps N]
//
// Shapes, y[rows][n] = x[rows][k] W^T, bf16 out but lm_head (float out):
//   1b (Llama-3.2-1B, 16 layers): qkv k 2048 n 3072, o 2048 x 2048, gate_up 2048 x 16384,
//       down 8192 x 2048, lm_head 2048 x 128256;
//   8b (Llama-3.1-8B, 32 layers): qkv 4096 x 6144, o 4096 x 4096, gate_up 4096 x 28672,
//       down 14336 x 4096, lm_head 4096 x 128256.
// Time: a CUDA graph of 20 launches, replayed `reps` times (default 200, after 5 warm-up
// replays); median replay device time (events around each replay) / 20. The launches cycle
// through copies of W that together are >= 2.5x the L2, so W comes from HBM as in a real step
// where each layer's weights are cold. Floor = W bytes / the measured D2D copy bandwidth (read +
// write bytes / time, as bench_attention). Also: the GEMM time of one decode step (every layer's
// qkv + o + gate_up + down, plus lm_head) per path.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "common/buffers.h"
#include "common/cuda_check.h"
#include "common/device.h"
#include "common/error.h"
#include "common/stream.h"
#include "engine/gemm.h"
#include "engine/kernels/stream_gemv.h"
#include "engine/kernels/wgmma_gemm.h"
#include "graphs/cuda_graph.h"

namespace graphdecode::bench {
namespace {

constexpr int kLaunches = 20;  // GEMMs per graph

struct Shape {
  const char* name;
  std::int32_t k, n;
  GemmOut out;
};
struct Model {
  const char* name;
  int layers;
  Shape shapes[5];
};
constexpr Model k1B{"1b",
                    16,
                    {{"qkv", 2048, 3072, GemmOut::kBF16},
                     {"o", 2048, 2048, GemmOut::kBF16},
                     {"gate_up", 2048, 16384, GemmOut::kBF16},
                     {"down", 8192, 2048, GemmOut::kBF16},
                     {"lm_head", 2048, 128256, GemmOut::kF32}}};
constexpr Model k8B{"8b",
                    32,
                    {{"qkv", 4096, 6144, GemmOut::kBF16},
                     {"o", 4096, 4096, GemmOut::kBF16},
                     {"gate_up", 4096, 28672, GemmOut::kBF16},
                     {"down", 14336, 4096, GemmOut::kBF16},
                     {"lm_head", 4096, 128256, GemmOut::kF32}}};
std::vector<std::int32_t> g_rows = {1, 2, 4, 8};  // --rows

// Median device time of one replay of `graph` over `reps` replays, after 5 warm-up replays.
double replay_median_us(const CudaGraph& graph, int reps, cudaStream_t s) {
  for (int i = 0; i < 5; ++i) graph.launch(s);
  std::vector<Event> start(reps), stop(reps);
  for (int i = 0; i < reps; ++i) {
    start[i].record(s);
    graph.launch(s);
    stop[i].record(s);
  }
  GD_CUDA(cudaStreamSynchronize(s));
  std::vector<double> us(reps);
  for (int i = 0; i < reps; ++i) us[i] = 1e3 * stop[i].elapsed_ms_since(start[i]);
  return median(us);
}

struct Result {
  const Shape* shape = nullptr;
  std::int32_t rows = 0, copies = 0;
  double weight_bytes = 0, cublas_us = 0, skinny_us = 0, stream_us = 0, auto_us = 0, floor_us = 0;
  double wgmma_us = 0;            // 0: the warpgroup GEMM does not take the shape
  std::int32_t wgmma_splits = 0;  // its cluster's CTAs over k (wgmma_gemm_splits)
  const char* auto_path = "";     // what Gemm's default took: stream, skinny or cuBLAS
  bool skinny_taken = false;      // false: the skinny setting fell back to cuBLAS
  bool stream_taken = false;      // false: the stream GEMV does not take the shape (stream_us 0)
};

// One shape at every row count: W copies live across the row counts.
void bench_shape(const Shape& sh, Gemm& gemm, double copy_gbps, std::int64_t l2_bytes, int reps,
                 cudaStream_t s, std::vector<Result>& out) {
  const std::size_t welems = static_cast<std::size_t>(sh.n) * sh.k;
  const double wbytes = 2.0 * static_cast<double>(welems);
  const int copies =
      std::clamp(static_cast<int>(2.5 * static_cast<double>(l2_bytes) / wbytes) + 1, 1, kLaunches);
  std::vector<DeviceBuffer<std::uint16_t>> w;
  for (int c = 0; c < copies; ++c) {
    w.emplace_back(welems);
    fill_random(w.back(), 1000 + c, s, 0.f);  // uniform in [-1, 1]
  }
  const std::int32_t max_rows = *std::max_element(g_rows.begin(), g_rows.end());
  DeviceBuffer<std::uint16_t> x(static_cast<std::size_t>(max_rows) * sh.k);
  fill_random(x, 7, s, 0.f);
  const std::size_t esize = sh.out == GemmOut::kF32 ? 4 : 2;
  DeviceBuffer<std::uint8_t> y(static_cast<std::size_t>(max_rows) * sh.n * esize);
  for (std::int32_t rows : g_rows) {
    Result r{&sh, rows, copies, wbytes};
    r.floor_us = wbytes / (copy_gbps * 1e3);
    gemm.set_wgmma(false);  // the cuBLAS and skinny columns
    for (bool skinny : {false, true}) {
      gemm.set_skinny(skinny);
      const auto args = [&](int i) {
        return GemmArgs{x.data(), w[i % copies].data(), y.data(), rows, sh.k, sh.n, sh.out};
      };
      if (skinny) r.skinny_taken = gemm.uses_skinny(args(0));
      const CudaGraph graph = CudaGraph::capture(s, [&] {
        for (int i = 0; i < kLaunches; ++i) gemm.run(args(i), s);
      });
      (skinny ? r.skinny_us : r.cublas_us) = replay_median_us(graph, reps, s) / kLaunches;
    }
    gemm.set_skinny_mode(Gemm::SkinnyMode::kAuto);  // the default Gemm: what the engine runs
    gemm.set_wgmma(true);
    const GemmArgs args0{x.data(), w[0].data(), y.data(), rows, sh.k, sh.n, sh.out};
    r.auto_path = gemm.uses_stream_gemv(args0) ? "stream"
                  : gemm.uses_skinny(args0)    ? "skinny"
                  : gemm.uses_wgmma(args0)     ? "wgmma"
                                               : "cuBLAS";
    {
      const CudaGraph graph = CudaGraph::capture(s, [&] {
        for (int i = 0; i < kLaunches; ++i)
          gemm.run({x.data(), w[i % copies].data(), y.data(), rows, sh.k, sh.n, sh.out}, s);
      });
      r.auto_us = replay_median_us(graph, reps, s) / kLaunches;
    }
    const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
    r.stream_taken = stream_gemv_supported(dev, rows, sh.k);
    if (r.stream_taken) {
      const CudaGraph graph = CudaGraph::capture(s, [&] {
        for (int i = 0; i < kLaunches; ++i)
          stream_gemv(
              dev,
              {x.data(), w[i % copies].data(), y.data(), rows, sh.k, sh.n, sh.out == GemmOut::kF32},
              s);
      });
      r.stream_us = replay_median_us(graph, reps, s) / kLaunches;
    }
    if (wgmma_gemm_supported(rows, sh.k, sh.n)) {
      const CudaGraph graph = CudaGraph::capture(s, [&] {
        for (int i = 0; i < kLaunches; ++i)
          wgmma_gemm(
              dev,
              {x.data(), w[i % copies].data(), y.data(), rows, sh.k, sh.n, sh.out == GemmOut::kF32},
              s);
      });
      r.wgmma_us = replay_median_us(graph, reps, s) / kLaunches;
      r.wgmma_splits = wgmma_gemm_splits(sh.k, sh.n);
    }
    out.push_back(r);
  }
  gemm.set_skinny(true);
}

const Result& find(const std::vector<Result>& rs, const char* name, std::int32_t rows) {
  for (const Result& r : rs)
    if (r.rows == rows && std::string(r.shape->name) == name) return r;
  GD_FAIL(std::string("no result for ") + name);
}

// GEMM time of one decode step: every layer's qkv + o + gate_up + down, then lm_head.
struct StepTotal {
  std::int32_t rows = 0;
  double cublas_us = 0, skinny_us = 0, stream_us = 0, auto_us = 0, floor_us = 0, wgmma_us = 0;
  bool stream_complete = true;  // false: a shape the stream GEMV does not take (no stream total)
};
std::vector<StepTotal> step_totals(const Model& model, const std::vector<Result>& rs) {
  std::vector<StepTotal> t;
  for (std::int32_t rows : g_rows) {
    StepTotal st{rows};
    for (const Shape& sh : model.shapes) {
      const Result& r = find(rs, sh.name, rows);
      const int times = std::string(sh.name) == "lm_head" ? 1 : model.layers;
      st.cublas_us += times * r.cublas_us;
      st.skinny_us += times * r.skinny_us;
      st.stream_us += times * r.stream_us;
      st.wgmma_us += times * r.wgmma_us;
      st.stream_complete = st.stream_complete && r.stream_taken;
      st.auto_us += times * r.auto_us;
      st.floor_us += times * r.floor_us;
    }
    t.push_back(st);
  }
  return t;
}

void print(const Model& model, const std::vector<Result>& rs,
           const std::vector<StepTotal>& totals) {
  std::printf("\n%-8s %6s %7s %4s %8s %6s %10s %10s %10s %10s %6s %10s %7s %9s %8s %8s %8s %8s\n",
              "shape", "k", "n", "M", "W MiB", "copies", "cuBLAS us", "skinny us", "stream us",
              "wgmma us", "split", "auto us", "auto", "floor us", "%floor", "cuB%flr", "str%flr",
              "speedup");
  for (const Result& r : rs)
    std::printf(
        "%-8s %6d %7d %4d %8.1f %6d %10.2f %10.2f %10.2f %10.2f %6d %10.2f %7s %9.2f %7.1f%% "
        "%7.1f%% %7.1f%% %7.2fx%s\n",
        r.shape->name, r.shape->k, r.shape->n, r.rows, r.weight_bytes / 1048576.0, r.copies,
        r.cublas_us, r.skinny_us, r.stream_us, r.wgmma_us, r.wgmma_splits, r.auto_us, r.auto_path,
        r.floor_us, 100.0 * r.floor_us / r.skinny_us, 100.0 * r.floor_us / r.cublas_us,
        r.stream_taken ? 100.0 * r.floor_us / r.stream_us : 0.0, r.cublas_us / r.skinny_us,
        r.skinny_taken ? "" : "  (skinny fell back to cuBLAS)");
  std::printf("\none decode step's GEMMs (%d x (qkv + o + gate_up + down) + lm_head)\n",
              model.layers);
  std::printf("%4s %12s %12s %12s %12s %12s %12s %8s\n", "M", "cuBLAS us", "skinny us", "stream us",
              "wgmma us", "auto us", "floor us", "speedup");
  for (const StepTotal& t : totals) {
    char stream[16] = "         n/a";  // a shape without the stream GEMV: no total to show
    if (t.stream_complete) std::snprintf(stream, sizeof stream, "%12.1f", t.stream_us);
    std::printf("%4d %12.1f %12.1f %s %12.1f %12.1f %12.1f %7.2fx\n", t.rows, t.cublas_us,
                t.skinny_us, stream, t.wgmma_us, t.auto_us, t.floor_us, t.cublas_us / t.skinny_us);
  }
}

void write_json(const std::string& path, const Model& model, const cudaDeviceProp& prop,
                double copy_gbps, int reps, const std::vector<Result>& rs,
                const std::vector<StepTotal>& totals) {
  std::ofstream f(path);
  GD_REQUIRE(f.good(), "--json", path, "cannot open the JSON output");
  f << "{\n  \"bench\": \"bench_gemm\",\n  \"shape\": \"" << model.name
    << "\",\n  \"layers\": " << model.layers << ",\n  \"device\": \"" << prop.name << "\",\n"
    << "  \"sms\": " << prop.multiProcessorCount << ",\n  \"l2_bytes\": " << prop.l2CacheSize
    << ",\n  \"copy_gbps\": " << copy_gbps << ",\n  \"reps\": " << reps
    << ",\n  \"launches_per_graph\": " << kLaunches << ",\n  \"results\": [\n";
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const Result& r = rs[i];
    f << "    {\"shape\": \"" << r.shape->name << "\", \"k\": " << r.shape->k
      << ", \"n\": " << r.shape->n << ", \"rows\": " << r.rows << ", \"out\": \""
      << (r.shape->out == GemmOut::kF32 ? "f32" : "bf16")
      << "\", \"weight_bytes\": " << r.weight_bytes << ", \"copies\": " << r.copies
      << ", \"cublas_us\": " << r.cublas_us << ", \"skinny_us\": " << r.skinny_us
      << ", \"stream_us\": " << r.stream_us << ", \"wgmma_us\": " << r.wgmma_us
      << ", \"auto_us\": " << r.auto_us << ", \"auto_path\": \"" << r.auto_path
      << "\", \"floor_us\": " << r.floor_us
      << ", \"skinny_pct_floor\": " << 100.0 * r.floor_us / r.skinny_us
      << ", \"cublas_pct_floor\": " << 100.0 * r.floor_us / r.cublas_us
      << ", \"skinny_taken\": " << (r.skinny_taken ? "true" : "false")
      << ", \"stream_taken\": " << (r.stream_taken ? "true" : "false") << "}"
      << (i + 1 < rs.size() ? "," : "") << "\n";
  }
  f << "  ],\n  \"step_totals\": [\n";
  for (std::size_t i = 0; i < totals.size(); ++i) {
    const StepTotal& t = totals[i];
    f << "    {\"rows\": " << t.rows << ", \"cublas_us\": " << t.cublas_us
      << ", \"skinny_us\": " << t.skinny_us << ", \"stream_us\": ";
    if (t.stream_complete)
      f << t.stream_us;
    else
      f << "null";
    f << ", \"wgmma_us\": " << t.wgmma_us << ", \"auto_us\": " << t.auto_us
      << ", \"floor_us\": " << t.floor_us << "}" << (i + 1 < totals.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
}

int run_main(int argc, char** argv) {
  std::string json;
  int reps = 200;
  const Model* model = &k1B;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(50, std::atoi(argv[++i]));
    } else if (a == "--rows" && i + 1 < argc) {
      g_rows = parse_list("--rows", argv[++i]);
      for (const std::int32_t r : g_rows)
        GD_REQUIRE(r >= 1 && r <= 128, "--rows", r, "each row count must be 1..128");
    } else if (a == "--shape" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "1b" || std::string(argv[i + 1]) == "8b")) {
      model = std::string(argv[++i]) == "8b" ? &k8B : &k1B;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--shape 1b|8b] [--rows 1,2,4,8] [--json PATH] [--reps N>=50]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!cuda_device_available()) {
    std::fprintf(stderr, "bench_gemm: no CUDA device; this benchmark needs a GPU\n");
    return 2;
  }
  int dev = 0;
  GD_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  GD_CUDA(cudaGetDeviceProperties(&prop, dev));
  Stream s;
  const double copy_gbps = copy_bandwidth_gbps(s);
  std::printf("device: %s, %d SMs, L2 %.0f MiB; D2D copy %.0f GB/s (read + write)\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize / 1048576.0, copy_gbps);
  std::printf("shape %s (%d layers); auto = Gemm's default choice (engine/gemm.h)\n", model->name,
              model->layers);
  std::printf("time = median of %d replays of a %d-GEMM graph / %d; floor = W bytes / copy GB/s\n",
              reps, kLaunches, kLaunches);
  Gemm gemm;
  std::vector<Result> rs;
  for (const Shape& sh : model->shapes)
    bench_shape(sh, gemm, copy_gbps, prop.l2CacheSize, reps, s, rs);
  const std::vector<StepTotal> totals = step_totals(*model, rs);
  print(*model, rs, totals);
  if (!json.empty()) write_json(json, *model, prop, copy_gbps, reps, rs, totals);
  return 0;
}

}  // namespace
}  // namespace graphdecode::bench

int main(int argc, char** argv) {
  return graphdecode::bench::bench_main("bench_gemm", argc, argv, graphdecode::bench::run_main);
}
