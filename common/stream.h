// RAII owners of CUDA streams and events. Move-only; destructors never throw.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/cuda_check.h"

namespace graphdecode {

class Stream {
 public:
  Stream() { GD_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() {
    if (s_) GD_CUDA_NOTHROW(cudaStreamDestroy(s_));
  }
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    if (this != &o) {
      if (s_) GD_CUDA_NOTHROW(cudaStreamDestroy(s_));
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const noexcept { return s_; }
  operator cudaStream_t() const noexcept { return s_; }
  void synchronize() const { GD_CUDA(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  explicit Event(unsigned flags = cudaEventDefault) {
    GD_CUDA(cudaEventCreateWithFlags(&e_, flags));
  }
  ~Event() {
    if (e_) GD_CUDA_NOTHROW(cudaEventDestroy(e_));
  }
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    if (this != &o) {
      if (e_) GD_CUDA_NOTHROW(cudaEventDestroy(e_));
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const noexcept { return e_; }
  void record(cudaStream_t s) { GD_CUDA(cudaEventRecord(e_, s)); }
  // Recorded by every replay of a graph captured from `s` (an external event-record node; a plain
  // record under capture only orders work inside the graph); outside capture, record().
  void record_external(cudaStream_t s) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    GD_CUDA(cudaStreamIsCapturing(s, &capturing));
    if (capturing == cudaStreamCaptureStatusActive) {
      GD_CUDA(cudaEventRecordWithFlags(e_, s, cudaEventRecordExternal));
    } else {
      record(s);
    }
  }
  void synchronize() const { GD_CUDA(cudaEventSynchronize(e_)); }
  // Milliseconds from `start` to this event; both must have completed.
  float elapsed_ms_since(const Event& start) const {
    float ms = 0.f;
    GD_CUDA(cudaEventElapsedTime(&ms, start.e_, e_));
    return ms;
  }

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace graphdecode
