// Diagnosis probe (issue 38): where the one-grid MLP block's time goes (engine/kernels/
// stream_mlp.h), against the stream GEMVs and cuBLAS over the same bytes. On the 1B shape (hidden
// 2048, inter 8192) or the 8B (4096, 14336), random weights and x, each launch after an L2 flush,
// eager (no kernel before it):
//   * medians of N launches, us, with their bytes' rate: stream_mlp; the stream GEMV and cuBLAS
//     (Gemm with the GEMV and the warpgroup GEMM off) over gate_up (n 2 inter, k hidden) and over
//     down (n hidden, k inter);
//   * stream_mlp's trace (StreamMlpArgs::trace) of the last launch: per point, min / median / max
//     over the CTAs of the time since the trace's first stamp, us.
//
//   probe_stream_mlp_trace [--shape 1b|8b] [--rows R] [--reps N] [--coop] [--fma]
//     (StreamMlpArgs::cooperative, ::fma; --fma: rows <= 2)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "common/buffers.h"
#include "common/cuda_check.h"
#include "common/stream.h"
#include "engine/gemm.h"
#include "engine/kernels/stream_gemv.h"
#include "engine/kernels/stream_mlp.h"

namespace graphdecode::bench {
namespace {

constexpr const char* kStampNames[kStreamMlpStamps] = {
    "producer entry", "gate/up issued", "all issued",     "consumers waited", "x staged",
    "first act tile", "act tiles done", "barrier passed", "act staged",       "end"};

int run(int argc, char** argv) {
  int rows = 1, reps = 20;
  bool cooperative = false, fma = false;
  std::string shape = "1b";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--coop") == 0) cooperative = true;
    if (std::strcmp(argv[i], "--fma") == 0) fma = true;
    if (i + 1 >= argc) continue;
    if (std::strcmp(argv[i], "--rows") == 0) rows = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(3, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--shape") == 0) shape = argv[i + 1];
  }
  GD_REQUIRE(shape == "1b" || shape == "8b", "--shape", shape, "expected 1b or 8b");
  const int h = shape == "8b" ? 4096 : 2048, inter = shape == "8b" ? 14336 : 8192;
  Stream s;
  const SkinnyGemmDevice dev = SkinnyGemmDevice::current();
  DeviceBuffer<std::uint16_t> x(static_cast<std::size_t>(rows) * h), norm_w(h),
      gate_up(static_cast<std::size_t>(2) * inter * h), down(static_cast<std::size_t>(h) * inter),
      act(static_cast<std::size_t>(rows) * inter), y(static_cast<std::size_t>(rows) * h),
      gu_out(static_cast<std::size_t>(rows) * 2 * inter);
  fill_random(x, 1, s.get());
  fill_random(norm_w, 2, s.get());
  fill_random(gate_up, 3, s.get());
  fill_random(down, 4, s.get());
  std::vector<float> sq_host(static_cast<std::size_t>(rows), 0.3f * h);
  DeviceBuffer<float> sq(static_cast<std::size_t>(rows));
  GD_CUDA(cudaMemcpyAsync(sq.data(), sq_host.data(), rows * sizeof(float), cudaMemcpyHostToDevice,
                          s.get()));
  DeviceBuffer<std::uint32_t> sync(kStreamMlpSyncWords);
  sync.fill_bytes(0, s.get());
  const int grid = stream_mlp_grid(dev, h);
  DeviceBuffer<std::uint64_t> trace(static_cast<std::size_t>(grid) * kStreamMlpStamps);
  const std::size_t flush_bytes = std::size_t{256} << 20;
  DeviceBuffer<int4> flush(flush_bytes / sizeof(int4));
  DeviceBuffer<int> sink(1);
  flush.fill_bytes(1, s.get());

  StreamMlpArgs a;
  a.x = x.data();
  a.norm_weight = norm_w.data();
  a.sum_sq_in = sq.data();
  a.parts = 1;
  a.w_gate_up = gate_up.data();
  a.w_down = down.data();
  a.act = act.data();
  a.y = y.data();
  a.sync = sync.data();
  a.trace = trace.data();
  a.cooperative = cooperative;
  a.fma = fma;
  a.rows = rows;
  a.hidden = h;
  a.inter = inter;

  const auto time_us = [&](const std::function<void()>& launch) {
    std::vector<double> us;
    Event e0, e1;
    for (int r = 0; r < reps + 2; ++r) {
      l2_flush_read<<<1024, 256, 0, s.get()>>>(flush.data(), flush.size(), sink.data());
      GD_CHECK_LAUNCH();
      e0.record(s.get());
      launch();
      e1.record(s.get());
      e1.synchronize();
      if (r >= 2) us.push_back(1000.0 * e1.elapsed_ms_since(e0));
    }
    return median(us);
  };
  const double mlp_bytes = 2.0 * (3.0 * inter * h);
  const double t_mlp = time_us([&] { stream_mlp(dev, a, s.get()); });
  const double t_gu = time_us([&] {
    stream_gemv(dev, {x.data(), gate_up.data(), gu_out.data(), rows, h, 2 * inter, false}, s.get());
  });
  const double t_down = time_us([&] {
    stream_gemv(dev, {act.data(), down.data(), y.data(), rows, inter, h, false}, s.get());
  });
  Gemm cublas;  // Gemm::run's cuBLAS path: no stream GEMV, no warpgroup GEMM
  cublas.set_gemv_mode(Gemm::GemvMode::kOff);
  cublas.set_wgmma(false);
  const double c_gu = time_us([&] {
    cublas.run({x.data(), gate_up.data(), gu_out.data(), rows, h, 2 * inter, GemmOut::kBF16},
               s.get());
  });
  const double c_down = time_us([&] {
    cublas.run({act.data(), down.data(), y.data(), rows, inter, h, GemmOut::kBF16}, s.get());
  });
  const double gu_bytes = 2.0 * 2 * inter * h, down_bytes = 2.0 * inter * h;
  std::printf("shape %s (hidden %d, inter %d), rows %d, %d reps, L2 flushed, eager%s%s\n",
              shape.c_str(), h, inter, rows, reps, cooperative ? ", cooperative launch" : "",
              fma ? ", FMA consumers" : "");
  std::printf("%-28s %9s %9s\n", "kernel", "us", "TB/s");
  std::printf("%-28s %9.2f %9.2f\n", "stream_mlp", t_mlp, mlp_bytes / t_mlp / 1e6);
  std::printf("%-28s %9.2f %9.2f\n", "stream_gemv gate_up", t_gu, gu_bytes / t_gu / 1e6);
  std::printf("%-28s %9.2f %9.2f\n", "stream_gemv down", t_down, down_bytes / t_down / 1e6);
  std::printf("%-28s %9.2f\n", "gate_up + down", t_gu + t_down);
  std::printf("%-28s %9.2f %9.2f\n", "cuBLAS gate_up", c_gu, gu_bytes / c_gu / 1e6);
  std::printf("%-28s %9.2f %9.2f\n", "cuBLAS down", c_down, down_bytes / c_down / 1e6);
  std::printf("%-28s %9.2f\n", "cuBLAS gate_up + down", c_gu + c_down);

  // The trace of the last stream_mlp launch.
  l2_flush_read<<<1024, 256, 0, s.get()>>>(flush.data(), flush.size(), sink.data());
  GD_CHECK_LAUNCH();
  stream_mlp(dev, a, s.get());
  std::vector<std::uint64_t> t(trace.size());
  GD_CUDA(cudaMemcpyAsync(t.data(), trace.data(), t.size() * 8, cudaMemcpyDeviceToHost, s.get()));
  GD_CUDA(cudaStreamSynchronize(s.get()));
  std::uint64_t t0 = ~0ull;
  for (const std::uint64_t v : t) t0 = std::min(t0, v);  // a consumer may stamp first
  std::printf("\ntrace, us since the first stamp, over %d CTAs\n%-18s %8s %8s %8s\n", grid, "point",
              "min", "median", "max");
  for (int k = 0; k < kStreamMlpStamps; ++k) {
    std::vector<double> v;
    for (int b = 0; b < grid; ++b)
      v.push_back(1e-3 *
                  static_cast<double>(t[static_cast<std::size_t>(b) * kStreamMlpStamps + k] - t0));
    std::sort(v.begin(), v.end());
    std::printf("%-18s %8.2f %8.2f %8.2f\n", kStampNames[k], v.front(), median(v), v.back());
  }
  return 0;
}

}  // namespace
}  // namespace graphdecode::bench

int main(int argc, char** argv) {
  return graphdecode::bench::bench_main("probe_stream_mlp_trace", argc, argv,
                                        graphdecode::bench::run);
}
