// Host vectors to and from device buffers, for GPU tests (to_host waits for the stream).
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "common/buffers.h"
#include "common/cuda_check.h"

namespace graphdecode::testing {

template <typename T>
DeviceBuffer<T> to_device(const std::vector<T>& h, cudaStream_t s) {
  DeviceBuffer<T> d(h.size());
  d.upload(h.data(), h.size(), s);
  return d;
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer<T>& d, cudaStream_t s) {
  std::vector<T> h(d.size());
  d.download(h.data(), h.size(), s);
  GD_CUDA(cudaStreamSynchronize(s));
  return h;
}

}  // namespace graphdecode::testing
