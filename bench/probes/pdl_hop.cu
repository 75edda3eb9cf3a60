// Probe: what one kernel boundary costs in a replayed graph, by how the dependent learns that its
// input is ready. A chain of N small kernels (each CTA reads a word the previous kernel's next CTA
// wrote and writes its own) is captured once and replayed; the replay's median time over N is the
// cost of a hop. Modes:
//   plain      no PDL: the dependent launches when the previous grid has completed
//   pdl        PDL launch, griddepcontrol.wait, then the trigger (graphdecode's promise, pdl.cuh)
//   pdl_early  PDL launch, the trigger at entry, then griddepcontrol.wait
//   flag       PDL launch, the trigger at entry, no griddepcontrol.wait: thread 0 polls the
//              previous kernel's counter (ld.acquire.gpu) until every CTA of it has arrived; each
//              CTA arrives after its writes (__syncthreads, then red.release.gpu by thread 0)
//   flag_after as flag, the trigger after the poll (at most two kernels of the chain resident)
//   ll         PDL launch, the trigger at entry, no griddepcontrol.wait: each thread polls its
//              input word itself, a 64-bit (tag, value) pair stored in one access (NCCL's LL
//              protocol): no counter, no barrier, one L2 round trip from the store to the reader
//   free       PDL launch, the trigger at entry, no dependency at all (launch throughput)
// Then the same chain inside one kernel (a persistent grid, phase i of CTA b reading what phase
// i - 1 of CTA b + 1 wrote): `ll` words, or a counter per phase (`flag`'s arrival and poll).
// The last kernel's words are checked (every mode must produce N); with `smem` each CTA reserves
// that much dynamic shared memory, as the engine's stream GEMVs and attention do.
//   target probe_pdl_hop (or nvcc -std=c++20 -arch=sm_90a -O2 -I. bench/probes/pdl_hop.cu)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/cuda_check.h"  // GD_CUDA: a failed call throws graphdecode::Error
#include "common/pdl.cuh"

enum Mode { kPlain, kPdl, kPdlEarly, kFlag, kFlagAfter, kLl, kFree, kModes };
const char* const kNames[] = {"plain", "pdl", "pdl_early", "flag", "flag_after", "ll", "free"};

constexpr int kThreads = 128;

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void add_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// ll mode: a word is (tag << 32 | value), tag = the writing kernel's index + 1 (the words are
// zeroed before each replay).
__device__ __forceinline__ unsigned long long load_relaxed(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_relaxed(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__global__ void __launch_bounds__(kThreads)
    hop_ll(int index, const unsigned long long* in, unsigned long long* out) {
  graphdecode::pdl_launch_dependents();
  const int g = static_cast<int>(gridDim.x);
  unsigned v = 0;
  if (in != nullptr) {
    const unsigned long long* w = in + ((blockIdx.x + 1) % g) * kThreads + threadIdx.x;
    unsigned long long x;
    do {
      x = load_relaxed(w);
    } while (static_cast<unsigned>(x >> 32) != static_cast<unsigned>(index));
    v = static_cast<unsigned>(x);
  }
  store_relaxed(out + blockIdx.x * kThreads + threadIdx.x,
                (static_cast<unsigned long long>(index + 1) << 32) | (v + 1u));
}

// The chain inside one grid: n phases, ll words (words[n][grid * kThreads], zeroed) or counters.
__global__ void __launch_bounds__(kThreads)
    chain_in_grid(int n, bool ll, unsigned long long* words, unsigned* counters) {
  const int g = static_cast<int>(gridDim.x);
  const size_t stride = static_cast<size_t>(g) * kThreads;
  const int from = ((blockIdx.x + 1) % g) * kThreads + threadIdx.x,
            own = blockIdx.x * kThreads + threadIdx.x;
  unsigned v = 0;
  for (int i = 0; i < n; ++i) {
    if (i > 0) {
      if (ll) {
        unsigned long long x;
        do {
          x = load_relaxed(words + (i - 1) * stride + from);
        } while (static_cast<unsigned>(x >> 32) != static_cast<unsigned>(i));
        v = static_cast<unsigned>(x);
      } else {
        if (threadIdx.x == 0)
          while (load_acquire(counters + i - 1) < static_cast<unsigned>(g)) {
          }
        __syncthreads();
        v = static_cast<unsigned>(words[(i - 1) * stride + from]);
      }
    }
    if (ll) {
      store_relaxed(words + i * stride + own,
                    (static_cast<unsigned long long>(i + 1) << 32) | (v + 1u));
    } else {
      words[i * stride + own] = v + 1u;
      __syncthreads();
      if (threadIdx.x == 0) add_release(counters + i, 1u);
    }
  }
}

// in: [grid * kThreads] of the kernel before (nullptr for the first); out: this kernel's words.
__global__ void __launch_bounds__(kThreads) hop(int mode, bool reserve, const int* in, int* out,
                                                const unsigned* wait_on, unsigned* arrive_on) {
  extern __shared__ int reserved[];
  const int g = static_cast<int>(gridDim.x);
  if (mode == kPdlEarly || mode == kFlag || mode == kFree) graphdecode::pdl_launch_dependents();
  if (mode == kPdl || mode == kPdlEarly) graphdecode::pdl_wait_for_prior_grid();
  if ((mode == kFlag || mode == kFlagAfter) && wait_on != nullptr) {
    if (threadIdx.x == 0)
      while (load_acquire(wait_on) < static_cast<unsigned>(g)) {
      }
    __syncthreads();
  }
  if (mode == kPdl || mode == kFlagAfter) graphdecode::pdl_launch_dependents();
  const int from = ((blockIdx.x + 1) % g) * kThreads + threadIdx.x;  // the next CTA's word
  const int v = (in != nullptr && mode != kFree) ? in[from] : 0;
  out[blockIdx.x * kThreads + threadIdx.x] = v + 1;
  if (mode == kFlag || mode == kFlagAfter) {
    __syncthreads();
    if (threadIdx.x == 0) add_release(arrive_on, 1u);
  }
  if (reserve && threadIdx.x == 0) reserved[0] = v;  // keeps the reservation
}

// Median ms of `launch` (between two events on s) over 200 runs after 30 warm-up runs; `before`
// runs ahead of each, outside the events.
template <typename Before, typename Launch>
float median_ms(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, Before&& before, Launch&& launch) {
  std::vector<float> ms;
  for (int r = 0; r < 230; ++r) {
    before();
    GD_CUDA(cudaEventRecord(e0, s));
    launch();
    GD_CUDA(cudaEventRecord(e1, s));
    GD_CUDA(cudaEventSynchronize(e1));
    float t = 0.f;
    GD_CUDA(cudaEventElapsedTime(&t, e0, e1));
    if (r >= 30) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 64;  // kernels in the chain
  int sms = 0;
  GD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int max_grid = 2 * sms;
  int* words;
  unsigned* counters;
  GD_CUDA(cudaMalloc(&words, sizeof(int) * static_cast<size_t>(n) * max_grid * kThreads));
  unsigned long long* ll_words;
  GD_CUDA(cudaMalloc(&ll_words,
                     sizeof(unsigned long long) * static_cast<size_t>(n) * max_grid * kThreads));
  GD_CUDA(cudaMalloc(&counters, sizeof(unsigned) * n));
  GD_CUDA(cudaFuncSetAttribute(hop, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  GD_CUDA(cudaFuncSetAttribute(hop_ll, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  cudaStream_t s;
  GD_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  GD_CUDA(cudaEventCreate(&e0));
  GD_CUDA(cudaEventCreate(&e1));
  std::printf("chain of %d kernels of %d threads, us per hop (median of 200 replays), %d SMs\n", n,
              kThreads, sms);
  std::printf("%-11s %6s %8s %10s %6s\n", "mode", "grid", "smem KB", "us / hop", "check");
  for (const int grid : {sms, max_grid}) {
    for (const int smem_kb : {0, 100}) {
      for (int mode = 0; mode < kModes; ++mode) {
        const size_t smem = static_cast<size_t>(smem_kb) * 1024;
        cudaGraph_t graph;
        GD_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        GD_CUDA(cudaMemsetAsync(counters, 0, sizeof(unsigned) * n, s));
        GD_CUDA(
            cudaMemsetAsync(words, 0, sizeof(int) * static_cast<size_t>(n) * grid * kThreads, s));
        GD_CUDA(cudaMemsetAsync(
            ll_words, 0, sizeof(unsigned long long) * static_cast<size_t>(n) * grid * kThreads, s));
        for (int i = 0; i < n; ++i) {
          cudaLaunchConfig_t cfg{};
          cfg.gridDim = dim3(grid);
          cfg.blockDim = dim3(kThreads);
          cfg.dynamicSmemBytes = smem;
          cfg.stream = s;
          cudaLaunchAttribute attr[1];
          attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
          attr[0].val.programmaticStreamSerializationAllowed = 1;
          cfg.attrs = attr;
          cfg.numAttrs = (mode == kPlain || i == 0) ? 0 : 1;
          const int* in = i == 0 ? nullptr : words + static_cast<size_t>(i - 1) * grid * kThreads;
          int* out = words + static_cast<size_t>(i) * grid * kThreads;
          const unsigned* wait_on = i == 0 ? nullptr : counters + i - 1;
          if (mode == kLl) {
            const size_t stride = static_cast<size_t>(grid) * kThreads;
            const unsigned long long* lin = i == 0 ? nullptr : ll_words + (i - 1) * stride;
            GD_CUDA(cudaLaunchKernelEx(&cfg, hop_ll, i, lin, ll_words + i * stride));
          } else {
            GD_CUDA(cudaLaunchKernelEx(&cfg, hop, mode, smem > 0, in, out, wait_on, counters + i));
          }
        }
        GD_CUDA(cudaStreamEndCapture(s, &graph));
        cudaGraphExec_t exec;
        GD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        const float ms = median_ms(
            s, e0, e1, [] {}, [&] { GD_CUDA(cudaGraphLaunch(exec, s)); });
        std::vector<int> last(static_cast<size_t>(grid) * kThreads);
        if (mode == kLl) {
          std::vector<unsigned long long> w(last.size());
          GD_CUDA(cudaMemcpy(w.data(), ll_words + static_cast<size_t>(n - 1) * grid * kThreads,
                             sizeof(unsigned long long) * w.size(), cudaMemcpyDeviceToHost));
          for (size_t j = 0; j < w.size(); ++j) last[j] = static_cast<int>(w[j] & 0xffffffffu);
        } else {
          GD_CUDA(cudaMemcpy(last.data(), words + static_cast<size_t>(n - 1) * grid * kThreads,
                             sizeof(int) * last.size(), cudaMemcpyDeviceToHost));
        }
        const int want = mode == kFree ? 1 : n;
        const bool ok = std::all_of(last.begin(), last.end(), [&](int v) { return v == want; });
        std::printf("%-11s %6d %8d %10.3f %6s\n", kNames[mode], grid, smem_kb, 1000.0 * ms / n,
                    ok ? "ok" : "WRONG");
        GD_CUDA(cudaGraphExecDestroy(exec));
        GD_CUDA(cudaGraphDestroy(graph));
      }
    }
  }
  std::printf("the same chain in one grid (%d phases), us per phase\n", n);
  for (const int grid : {sms, max_grid}) {
    for (const bool ll : {true, false}) {
      const size_t words_bytes =
          sizeof(unsigned long long) * static_cast<size_t>(n) * grid * kThreads;
      const float ms = median_ms(
          s, e0, e1,
          [&] {
            GD_CUDA(cudaMemsetAsync(ll_words, 0, words_bytes, s));
            GD_CUDA(cudaMemsetAsync(counters, 0, sizeof(unsigned) * n, s));
          },
          [&] {
            chain_in_grid<<<grid, kThreads, 0, s>>>(n, ll, ll_words, counters);
            GD_CUDA(cudaGetLastError());
          });
      std::printf("%-11s %6d %8d %10.3f\n", ll ? "grid_ll" : "grid_flag", grid, 0, 1000.0 * ms / n);
    }
  }
  return 0;
}
