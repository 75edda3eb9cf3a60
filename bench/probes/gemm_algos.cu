// Diagnosis probe (issue 38): how far cuBLAS's default pick is from the fastest cuBLASLt algorithm
// on the model's linear layers, by row count. Per shape (rows, in, out), y[rows][out] = x W^T as
// engine/gemm.cpp runs it (column-major: C [out][rows] = W^T-as-stored x), bf16 in, fp32
// accumulation, bf16 out:
//   default us  cublasGemmEx(CUBLAS_GEMM_DEFAULT), what Gemm::run calls today;
//   lt[0] us    cublasLt's first heuristic answer;
//   best us     the fastest of up to --algos heuristic answers (its index, split-K and tile ids);
//   floor us    (W + x + y bytes) / the device copy rate (read + write), and the product's time at
//               the dense bf16 peak, whichever is longer.
// Every time is the median of --reps launches, each after an L2 flush, on random data; the best
// algorithm's output is checked against the default's (max |diff| / max |y|).
//
//   probe_gemm_algos [--shape 1b|8b] [--rows 1,8,32,64,128] [--algos 32] [--reps 20]
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"

namespace graphdecode::bench {
namespace {

#define PROBE_CUBLAS(expr)                                                                   \
  do {                                                                                       \
    const cublasStatus_t st_ = (expr);                                                       \
    GD_REQUIRE(st_ == CUBLAS_STATUS_SUCCESS, #expr, static_cast<int>(st_), "cuBLAS failed"); \
  } while (0)

struct LinearShape {
  const char* name;
  std::int32_t in, out;
};

struct Flusher {
  DeviceBuffer<int4> buf;
  DeviceBuffer<int> sink{1};
  Flusher() {
    int dev = 0, l2 = 0;
    GD_CUDA(cudaGetDevice(&dev));
    GD_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    buf = DeviceBuffer<int4>(static_cast<std::size_t>(l2) * 4 / sizeof(int4));
    buf.fill_bytes(1, nullptr);
  }
  void operator()(cudaStream_t s) {
    l2_flush_read<<<1024, 256, 0, s>>>(buf.data(), buf.size(), sink.data());
    GD_CHECK_LAUNCH();
  }
};

template <typename Fn>
double time_us(Fn&& fn, int reps, Flusher& flush, cudaStream_t s) {
  fn();  // warm-up
  fn();
  std::vector<double> us;
  Event e0, e1;
  for (int i = 0; i < reps; ++i) {
    flush(s);
    e0.record(s);
    fn();
    e1.record(s);
    e1.synchronize();
    us.push_back(1e3 * e1.elapsed_ms_since(e0));
  }
  return median(us);
}

double bf16_value(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

double max_abs(const std::vector<std::uint16_t>& v) {
  double m = 0;
  for (const std::uint16_t x : v) m = std::max(m, std::fabs(bf16_value(x)));
  return m;
}

int run(int argc, char** argv) {
  std::string shape = "1b";
  std::vector<std::int32_t> rows = {1, 8, 16, 32, 64, 128, 256};
  int max_algos = 32, reps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--shape" && i + 1 < argc) {
      shape = argv[++i];
    } else if (a == "--rows" && i + 1 < argc) {
      rows = parse_list("--rows", argv[++i]);
    } else if (a == "--algos" && i + 1 < argc) {
      max_algos = std::atoi(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--shape 1b|8b] [--rows 1,8,...] [--algos N] [--reps N]\n",
                   argv[0]);
      return 2;
    }
  }
  const ModelConfig c = bench_model_config(shape, false);
  const std::int32_t h = c.hidden_size;
  const std::vector<LinearShape> shapes = {
      {"qkv", h, c.q_size() + 2 * c.kv_size()},
      {"o", c.q_size(), h},
      {"gate_up", h, 2 * c.intermediate_size},
      {"down", c.intermediate_size, h},
      {"lm_head", h, c.vocab_size},
  };
  Stream stream;
  cudaDeviceProp prop{};
  GD_CUDA(cudaGetDeviceProperties(&prop, 0));
  const double copy_gbps = copy_bandwidth_gbps(stream);
  const double peak = dense_bf16_peak_tflops(prop.name);
  std::printf("device: %s; copy %.0f GB/s; peak %.0f TFLOP/s; shape %s; %d reps, L2 flushed\n",
              prop.name, copy_gbps, peak, shape.c_str(), reps);
  std::printf("%-8s %5s %6s %7s %10s %9s %9s %9s %5s %6s %5s %9s %8s\n", "gemm", "rows", "in",
              "out", "default", "lt[0]", "best", "floor", "algo", "splitK", "tile", "def/best",
              "diff");

  cublasHandle_t handle = nullptr;
  cublasLtHandle_t lt = nullptr;
  PROBE_CUBLAS(cublasCreate(&handle));
  PROBE_CUBLAS(cublasSetAtomicsMode(handle, CUBLAS_ATOMICS_NOT_ALLOWED));
  PROBE_CUBLAS(cublasLtCreate(&lt));
  const std::size_t ws_bytes = std::size_t{32} << 20;
  DeviceBuffer<std::uint8_t> ws(ws_bytes);
  ws.fill_bytes(0, stream);
  PROBE_CUBLAS(cublasSetStream(handle, stream));
  PROBE_CUBLAS(cublasSetWorkspace(handle, ws.data(), ws_bytes));
  Flusher flush;

  for (const LinearShape& ls : shapes) {
    DeviceBuffer<std::uint16_t> w(static_cast<std::size_t>(ls.in) * ls.out);
    fill_random(w, 7, stream);
    for (const std::int32_t m : rows) {
      if (ls.out == c.vocab_size && m > 256) continue;  // prefill computes one logit row each
      DeviceBuffer<std::uint16_t> x(static_cast<std::size_t>(m) * ls.in);
      DeviceBuffer<std::uint16_t> y(static_cast<std::size_t>(m) * ls.out);
      fill_random(x, 11 + m, stream);
      const float alpha = 1.f, beta = 0.f;
      auto gemm_default = [&] {
        PROBE_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, ls.out, m, ls.in, &alpha,
                                  w.data(), CUDA_R_16BF, ls.in, x.data(), CUDA_R_16BF, ls.in, &beta,
                                  y.data(), CUDA_R_16BF, ls.out, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
      };
      const double t_def = time_us(gemm_default, reps, flush, stream);
      std::vector<std::uint16_t> y_def(y.size());
      GD_CUDA(cudaMemcpyAsync(y_def.data(), y.data(), y.bytes(), cudaMemcpyDeviceToHost, stream));
      GD_CUDA(cudaStreamSynchronize(stream));

      cublasLtMatmulDesc_t desc = nullptr;
      cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
      cublasLtMatmulPreference_t pref = nullptr;
      PROBE_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      PROBE_CUBLAS(
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      PROBE_CUBLAS(
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      PROBE_CUBLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ls.in, ls.out, ls.in));
      PROBE_CUBLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, ls.in, m, ls.in));
      PROBE_CUBLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, ls.out, m, ls.out));
      PROBE_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
      PROBE_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
      constexpr int kMaxAlgos = 64;
      cublasLtMatmulHeuristicResult_t res[kMaxAlgos] = {};
      int found = 0;
      PROBE_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref,
                                                  std::min(max_algos, kMaxAlgos), res, &found));
      double t_first = 0, t_best = 1e30;
      int best = -1;
      for (int i = 0; i < found; ++i) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        auto gemm_lt = [&] {
          PROBE_CUBLAS(cublasLtMatmul(lt, desc, &alpha, w.data(), la, x.data(), lb, &beta, y.data(),
                                      lc, y.data(), lc, &res[i].algo, ws.data(), ws_bytes, stream));
        };
        const double t = time_us(gemm_lt, reps, flush, stream);
        if (i == 0) t_first = t;
        if (t < t_best) {
          t_best = t;
          best = i;
        }
      }
      int split = 0, tile = 0;
      double diff = -1;
      if (best >= 0) {
        std::size_t got = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&res[best].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                             &split, sizeof(split), &got);
        cublasLtMatmulAlgoConfigGetAttribute(&res[best].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                             sizeof(tile), &got);
        PROBE_CUBLAS(cublasLtMatmul(lt, desc, &alpha, w.data(), la, x.data(), lb, &beta, y.data(),
                                    lc, y.data(), lc, &res[best].algo, ws.data(), ws_bytes,
                                    stream));
        std::vector<std::uint16_t> y_best(y.size());
        GD_CUDA(
            cudaMemcpyAsync(y_best.data(), y.data(), y.bytes(), cudaMemcpyDeviceToHost, stream));
        GD_CUDA(cudaStreamSynchronize(stream));
        double d = 0;
        for (std::size_t k = 0; k < y_best.size(); ++k)
          d = std::max(d, std::fabs(bf16_value(y_best[k]) - bf16_value(y_def[k])));
        diff = d / std::max(1e-30, max_abs(y_def));
      }
      const double bytes =
          2.0 * (static_cast<double>(ls.in) * ls.out + static_cast<double>(m) * (ls.in + ls.out));
      const double floor_us = std::max(bytes / (copy_gbps * 1e3),
                                       peak > 0 ? 2.0 * m * ls.in * ls.out / (peak * 1e6) : 0.0);
      std::printf("%-8s %5d %6d %7d %10.2f %9.2f %9.2f %9.2f %5d %6d %5d %9.3f %8.1e\n", ls.name, m,
                  ls.in, ls.out, t_def, t_first, t_best, floor_us, best, split, tile,
                  t_def / t_best, diff);
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(desc);
    }
  }
  cublasLtDestroy(lt);
  cublasDestroy(handle);
  return 0;
}

}  // namespace
}  // namespace graphdecode::bench

int main(int argc, char** argv) {
  return graphdecode::bench::bench_main("probe_gemm_algos", argc, argv, graphdecode::bench::run);
}
