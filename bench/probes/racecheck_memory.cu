// Diagnosis probe (engine/NOTES.md "Next steps" 6): what makes compute-sanitizer racecheck's host
// memory grow with the length of an engine test. One small kernel that uses shared memory (a
// barrier-ordered exchange, so racecheck has accesses to track) is launched N times in one of
// four ways; the probe prints its own resident memory (VmRSS, where the sanitizer's in-process
// part lives) at every quarter, so the growth per launch of each way can be compared:
//   plain      kernel<<<>>> in a stream
//   pdl        launch_pdl (cudaLaunchAttributeProgrammaticStreamSerialization), as the layer does
//   graph      one captured graph of 100 plain launches, replayed N / 100 times
//   graph_pdl  the same graph of PDL launches
//   plain_sync plain, the host waiting for each launch before the next
//
//   compute-sanitizer --tool racecheck probe_racecheck_memory MODE [N] [SMEM_KB]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "common/cuda_check.h"
#include "common/pdl.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kGraphLaunches = 100;

__global__ void __launch_bounds__(kThreads)
    exchange_kernel(const float* in, float* out, int words) {
  graphdecode::pdl_wait_for_prior_grid();
  graphdecode::pdl_launch_dependents();
  extern __shared__ float buf[];
  for (int i = threadIdx.x; i < words; i += kThreads)
    buf[i] = in[blockIdx.x * kThreads + threadIdx.x] + i;
  __syncthreads();
  float s = 0.f;
  for (int i = threadIdx.x; i < words; i += kThreads) s += buf[words - 1 - i];
  out[blockIdx.x * kThreads + threadIdx.x] = s;
}

long rss_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);  // lines survive the memory guard's SIGKILL
  const std::string mode = argc > 1 ? argv[1] : "plain";
  const int n = argc > 2 ? std::atoi(argv[2]) : 2000;
  const int smem_kb = argc > 3 ? std::atoi(argv[3]) : 32;
  if (mode != "plain" && mode != "pdl" && mode != "graph" && mode != "graph_pdl" &&
      mode != "plain_sync") {
    std::fprintf(stderr, "usage: %s plain|pdl|graph|graph_pdl|plain_sync [N] [SMEM_KB]\n", argv[0]);
    return 2;
  }
  try {
    const int blocks = 264;
    const int words = smem_kb * 1024 / 4;
    const std::size_t smem = static_cast<std::size_t>(words) * 4;
    GD_CUDA(cudaFuncSetAttribute(exchange_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(smem)));
    float *in = nullptr, *out = nullptr;
    GD_CUDA(cudaMalloc(&in, blocks * kThreads * sizeof(float)));
    GD_CUDA(cudaMalloc(&out, blocks * kThreads * sizeof(float)));
    GD_CUDA(cudaMemset(in, 0, blocks * kThreads * sizeof(float)));
    cudaStream_t stream = nullptr;
    GD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const bool pdl = mode == "pdl" || mode == "graph_pdl";
    auto launch = [&] {
      if (pdl) {
        graphdecode::launch_pdl(exchange_kernel, dim3(blocks), dim3(kThreads), smem, stream,
                                static_cast<const float*>(in), out, words);
      } else {
        exchange_kernel<<<blocks, kThreads, smem, stream>>>(in, out, words);
        GD_CHECK_LAUNCH();
      }
    };
    cudaGraphExec_t exec = nullptr;
    if (mode.rfind("graph", 0) == 0) {
      cudaGraph_t graph = nullptr;
      GD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < kGraphLaunches; ++i) launch();
      GD_CUDA(cudaStreamEndCapture(stream, &graph));
      GD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      GD_CUDA(cudaGraphDestroy(graph));
    }
    std::printf("mode %s, %d launches of %d CTAs x %d threads, %d KB shared memory\n", mode.c_str(),
                n, blocks, kThreads, smem_kb);
    std::printf("launches %6d  VmRSS %8.1f MB\n", 0, rss_kb() / 1024.0);
    const int step = exec != nullptr ? kGraphLaunches : 1;
    for (int done = 0; done < n; done += step) {
      if (exec != nullptr)
        GD_CUDA(cudaGraphLaunch(exec, stream));
      else
        launch();
      if (mode == "plain_sync") GD_CUDA(cudaStreamSynchronize(stream));
      const int now = done + step;
      if (now % (n / 4 > 0 ? n / 4 : 1) < step || now >= n) {
        GD_CUDA(cudaStreamSynchronize(stream));
        std::printf("launches %6d  VmRSS %8.1f MB\n", now, rss_kb() / 1024.0);
      }
    }
    GD_CUDA(cudaStreamSynchronize(stream));
    if (exec != nullptr) GD_CUDA(cudaGraphExecDestroy(exec));
    GD_CUDA(cudaStreamDestroy(stream));
    GD_CUDA(cudaFree(in));
    GD_CUDA(cudaFree(out));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "probe_racecheck_memory: %s\n", e.what());
    return 1;
  }
  return 0;
}
