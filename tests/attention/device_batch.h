// Test support: a HostPagedBatch uploaded to fixed device buffers, plus outputs.
//
// Buffers are allocated once for the capacity, so a graph captured against batch() / view() and
// replayed after another upload() reads the new batch (graph tests rely on this).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "attention/paged_attention.h"
#include "common/buffers.h"
#include "host_batch.h"

namespace graphdecode::testing {

class DevicePagedBatch {
 public:
  DevicePagedBatch(const Shape& shape, const Capacity& cap);

  // Uploads pool, page table, metadata (num_requests, slot, q_start, kv_len, window_left) and Q.
  // Enqueued on `stream`; the host batch must stay alive until the stream is synchronized.
  void upload(const HostPagedBatch& host, cudaStream_t stream);
  // Only metadata + page table + Q (the pool unchanged), e.g. after HostPagedBatch::implant.
  void upload_all_but_pool(const HostPagedBatch& host, cudaStream_t stream);

  // Device batch; with_window_ptr = false passes window_left = nullptr (full attention).
  AttentionBatch batch(bool with_window_ptr = true) const;
  PagedKvView view() const;

  // Fills out (bf16/fp16 all-ones bits: NaN) and lse (float NaN) with a NaN pattern.
  void poison_outputs(cudaStream_t stream);

  void* out() const { return out_.data(); }
  float* lse() const { return lse_.data(); }
  const void* q() const { return q_.data(); }
  void* q_mut() { return q_.data(); }

  // Downloads the first `rows` rows of out / lse (synchronizes `stream`).
  std::vector<std::uint16_t> download_out(std::int32_t rows, cudaStream_t stream) const;
  std::vector<float> download_lse(std::int32_t rows, cudaStream_t stream) const;

 private:
  Shape shape_;
  Capacity cap_;
  DeviceBuffer<std::uint16_t> k_, v_, q_, out_;  // pool [num_pages][hkv][page][d]; q/out rows
  DeviceBuffer<float> lse_;                      // [max_q_tokens][hq]
  DeviceBuffer<std::int32_t> page_table_;        // [max_slots][max_pages_per_slot]
  DeviceBuffer<std::int32_t> num_requests_;      // [1]
  DeviceBuffer<std::int32_t> slot_, kv_len_;     // [max_batch]
  DeviceBuffer<std::int32_t> q_start_;           // [max_batch + 1]
  DeviceBuffer<std::int32_t> window_left_;       // [1]
  std::int32_t host_num_requests_ = 0;           // kept alive for the async copy
  std::int32_t host_window_left_ = -1;
};

}  // namespace graphdecode::testing
