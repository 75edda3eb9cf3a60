// Facts about the CUDA device, asked once.
#pragma once

#include <cuda_runtime.h>

namespace graphdecode {

// True when at least one CUDA device is present and usable. Never throws: tests use it to skip.
inline bool cuda_device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
}

}  // namespace graphdecode
