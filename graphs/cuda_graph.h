// RAII owner of one captured CUDA graph and its executable instance.
//
// capture() runs `body` on `stream` under cudaStreamCaptureModeThreadLocal and always ends the
// capture, also when `body` throws (the half-built graph is discarded and the error rethrown), so
// the stream is never left capturing.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <exception>
#include <utility>

#include "common/cuda_check.h"

namespace graphdecode {

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph() { reset(); }
  CudaGraph(CudaGraph&& o) noexcept
      : graph_(std::exchange(o.graph_, nullptr)), exec_(std::exchange(o.exec_, nullptr)) {}
  CudaGraph& operator=(CudaGraph&& o) noexcept {
    if (this != &o) {
      reset();
      graph_ = std::exchange(o.graph_, nullptr);
      exec_ = std::exchange(o.exec_, nullptr);
    }
    return *this;
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  template <typename Body>
  static CudaGraph capture(cudaStream_t stream, Body&& body) {
    GD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      body();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      GD_CUDA_NOTHROW(cudaStreamEndCapture(stream, &broken));
      if (broken) GD_CUDA_NOTHROW(cudaGraphDestroy(broken));
      GD_CUDA_NOTHROW(cudaGetLastError());
      throw;
    }
    CudaGraph g;
    GD_CUDA(cudaStreamEndCapture(stream, &g.graph_));
    GD_CUDA(cudaGraphInstantiate(&g.exec_, g.graph_, 0));
    return g;
  }

  void launch(cudaStream_t stream) const { GD_CUDA(cudaGraphLaunch(exec_, stream)); }
  // Uploads the executable graph's resources now, so its first launch pays no setup.
  void upload(cudaStream_t stream) const { GD_CUDA(cudaGraphUpload(exec_, stream)); }
  bool valid() const noexcept { return exec_ != nullptr; }
  std::size_t num_nodes() const {
    std::size_t n = 0;
    if (graph_) GD_CUDA(cudaGraphGetNodes(graph_, nullptr, &n));
    return n;
  }

 private:
  void reset() noexcept {
    if (exec_) GD_CUDA_NOTHROW(cudaGraphExecDestroy(exec_));
    if (graph_) GD_CUDA_NOTHROW(cudaGraphDestroy(graph_));
    exec_ = nullptr;
    graph_ = nullptr;
  }
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace graphdecode
