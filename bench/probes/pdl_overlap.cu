// Probe: when does a programmatic dependent (PDL) kernel start behind a primary that triggers at
// once and then sleeps 100 us? Prints, per case, how many of the secondary's CTAs started before
// the primary's write (they read the flag as 0 before their griddepcontrol.wait).
// Cases vary the primary's launch (plain <<<>>> / with the PDL attribute itself), the secondary's
// shared memory (0 / 112 KB per CTA) and whether the primary's carveout prefers shared memory.
//   target probe_pdl_overlap (or nvcc -std=c++20 -arch=sm_90a -O2 -I. bench/probes/pdl_overlap.cu)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "common/pdl.cuh"  // the handshake as graphdecode's kernels make it

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

__global__ void primary(int* flag, long long delay_ns) {
  graphdecode::pdl_launch_dependents();
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (static_cast<long long>(t - t0) < delay_ns);
  if (blockIdx.x == 0 && threadIdx.x == 0) atomicExch(flag, 1);
}

// (The dynamic shared memory is only reserved, to occupy an SM as the attention kernel does.)
__global__ void secondary(const int* flag, int* early) {
  const int seen = atomicAdd(const_cast<int*>(flag), 0);  // before the wait
  graphdecode::pdl_wait_for_prior_grid();
  if (threadIdx.x == 0 && seen == 0) atomicAdd(early, 1);
}

int main() {
  int *flag, *early;
  CK(cudaMalloc(&flag, 4));
  CK(cudaMalloc(&early, 4));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int big = 112 * 1024;
  CK(cudaFuncSetAttribute(secondary, cudaFuncAttributeMaxDynamicSharedMemorySize, big));
  for (int pdl_primary = 0; pdl_primary < 2; ++pdl_primary)
    for (int smem : {0, big})
      for (int carve : {-1, 100})
        for (int pblocks : {1, 64}) {
          CK(cudaFuncSetAttribute(primary, cudaFuncAttributePreferredSharedMemoryCarveout, carve));
          CK(cudaMemsetAsync(flag, 0, 4, s));
          CK(cudaMemsetAsync(early, 0, 4, s));
          cudaLaunchAttribute attr[1];
          attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
          attr[0].val.programmaticStreamSerializationAllowed = 1;
          cudaLaunchConfig_t pc{};
          pc.gridDim = dim3(pblocks);
          pc.blockDim = dim3(256);
          pc.stream = s;
          pc.attrs = attr;
          pc.numAttrs = pdl_primary;
          CK(cudaLaunchKernelEx(&pc, primary, flag, 100000LL));
          cudaLaunchConfig_t sc{};
          sc.gridDim = dim3(264);
          sc.blockDim = dim3(128);
          sc.dynamicSmemBytes = smem;
          sc.stream = s;
          sc.attrs = attr;
          sc.numAttrs = 1;
          CK(cudaLaunchKernelEx(&sc, secondary, static_cast<const int*>(flag), early));
          int h = -1;
          CK(cudaMemcpyAsync(&h, early, 4, cudaMemcpyDeviceToHost, s));
          CK(cudaStreamSynchronize(s));
          std::printf(
              "primary %-5s %2d CTAs carveout %4d | secondary smem %6d: %3d of 264 CTAs early\n",
              pdl_primary ? "PDL" : "plain", pblocks, carve, smem, h);
        }
  return 0;
}
