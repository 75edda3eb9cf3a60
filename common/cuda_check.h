// Checked CUDA calls: every runtime call goes through GD_CUDA, every launch is followed by
// GD_CHECK_LAUNCH(). Both throw graphdecode::Error with the CUDA error name and the call site.
#pragma once

#include <cuda_runtime.h>

#include "common/error.h"

namespace graphdecode::detail {
inline void throw_cuda(cudaError_t err, const char* expr, const char* file, int line) {
  throw Error(std::string("CUDA call failed: ") + expr + ": " + cudaGetErrorName(err) + " (" +
                  cudaGetErrorString(err) + ")",
              location(file, line));
}
}  // namespace graphdecode::detail

#define GD_CUDA(expr)                                                        \
  do {                                                                       \
    cudaError_t gd_err_ = (expr);                                            \
    if (gd_err_ != cudaSuccess)                                              \
      ::graphdecode::detail::throw_cuda(gd_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports launch-configuration errors at the launch site.
#define GD_CHECK_LAUNCH() GD_CUDA(cudaGetLastError())

// For destructors, which must not throw: the error is dropped on purpose (a destructor running
// during unwinding has nowhere to report it), but the sticky error state is cleared.
#define GD_CUDA_NOTHROW(expr) static_cast<void>(expr)
