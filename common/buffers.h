// RAII owners of device and pinned host memory. Move-only; destructors never throw.
//
// All of graphdecode's device memory is taken at start-up through these owners; nothing on the
// step path allocates.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "common/cuda_check.h"

namespace graphdecode {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t count) : count_(count) {
    if (count_ > 0) GD_CUDA(cudaMalloc(reinterpret_cast<void**>(&ptr_), count_ * sizeof(T)));
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return count_ * sizeof(T); }
  bool empty() const noexcept { return count_ == 0; }

  // Host <-> device copies of the first n elements (n defaults to the whole buffer).
  void upload(const T* src, std::size_t n, cudaStream_t s = nullptr) {
    GD_REQUIRE(n <= count_, "n", n, "upload larger than the buffer");
    GD_CUDA(cudaMemcpyAsync(ptr_, src, n * sizeof(T), cudaMemcpyHostToDevice, s));
  }
  void download(T* dst, std::size_t n, cudaStream_t s = nullptr) const {
    GD_REQUIRE(n <= count_, "n", n, "download larger than the buffer");
    GD_CUDA(cudaMemcpyAsync(dst, ptr_, n * sizeof(T), cudaMemcpyDeviceToHost, s));
  }
  void fill_bytes(int byte, cudaStream_t s = nullptr) {
    if (count_ > 0) GD_CUDA(cudaMemsetAsync(ptr_, byte, bytes(), s));
  }

 private:
  void reset() noexcept {
    if (ptr_) GD_CUDA_NOTHROW(cudaFree(ptr_));
    ptr_ = nullptr;
    count_ = 0;
  }
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

// Page-locked host memory: the source of the one async copy per step.
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t count) : count_(count) {
    if (count_ > 0) GD_CUDA(cudaMallocHost(reinterpret_cast<void**>(&ptr_), count_ * sizeof(T)));
  }
  ~PinnedBuffer() { reset(); }
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  T* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return count_; }
  T& operator[](std::size_t i) noexcept { return ptr_[i]; }
  const T& operator[](std::size_t i) const noexcept { return ptr_[i]; }

 private:
  void reset() noexcept {
    if (ptr_) GD_CUDA_NOTHROW(cudaFreeHost(ptr_));
    ptr_ = nullptr;
    count_ = 0;
  }
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace graphdecode
