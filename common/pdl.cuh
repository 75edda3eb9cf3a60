// Programmatic dependent launch (PDL, sm_90+), device side. A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start while the kernel before it in the
// stream still runs; these are the two halves of that handshake.
//
// The promise graphdecode's kernels keep (PriorWrites::kQueryAndNewKv relies on it): a kernel
// lets its dependents start only after its own wait for the grid before it, or, when it is
// launched without PDL (so everything before it has completed when it starts), at once. One
// exception: the QKV epilogue triggers at its start; its dependent, the attention, reads early
// only what neither it nor the qkv GEMM before it writes (engine/kernels/qkv_epilogue.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdlib>
#include <utility>

#include "common/cuda_check.h"

namespace graphdecode {

// Blocks until the grid before this one in the stream has completed and its memory is visible.
// A no-op when this kernel was launched without PDL.
__device__ __forceinline__ void pdl_wait_for_prior_grid() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// Lets the kernel after this one (if it is a PDL launch) be scheduled once every CTA of this
// grid has called this or exited. It still waits for this grid's completion before reading.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Host side. False when GRAPHDECODE_PDL=0 was in the environment at the first call: launch_pdl
// (the attention's launch among them) and the warpgroup GEMM then launch plainly (A/B of the model
// step in bench_decode; read once, so a process never mixes the two inside one captured graph).
// cuBLAS's kernels are never programmatic dependents.
inline bool pdl_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("GRAPHDECODE_PDL");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

// kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent of the kernel before
// it in the stream. The kernel must call pdl_wait_for_prior_grid() before it touches memory that
// any kernel before it writes (or reads, where it writes), and may trigger its own dependents only
// after that wait (the promise above). Checks the launch.
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  GD_CUDA(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
  GD_CHECK_LAUNCH();
}

// A launch of `grid` x `block` in thread-block clusters of `cluster`, as a programmatic dependent
// of the kernel before it when `pdl` (occupancy queries pass false); cfg points into `attr`, which
// must outlive its use. For cudaLaunchKernelEx and cudaOccupancyMaxActiveClusters alike.
inline cudaLaunchConfig_t cluster_launch_config(dim3 grid, dim3 block, std::size_t smem,
                                                cudaStream_t stream, dim3 cluster, bool pdl,
                                                cudaLaunchAttribute (&attr)[2]) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster.x;
  attr[0].val.clusterDim.y = cluster.y;
  attr[0].val.clusterDim.z = cluster.z;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 2 : 1;
  return cfg;
}

}  // namespace graphdecode
