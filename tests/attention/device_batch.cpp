// Device side of the random paged batches. See device_batch.h.
#include "device_batch.h"

#include "common/cuda_check.h"
#include "common/error.h"

namespace graphdecode::testing {

DevicePagedBatch::DevicePagedBatch(const Shape& shape, const Capacity& cap)
    : shape_(shape),
      cap_(cap),
      k_(static_cast<std::size_t>(cap.num_pages) * shape.num_kv_heads * shape.page_size *
         shape.head_dim),
      v_(k_.size()),
      q_(static_cast<std::size_t>(cap.max_q_tokens) * shape.num_q_heads * shape.head_dim),
      out_(q_.size()),
      lse_(static_cast<std::size_t>(cap.max_q_tokens) * shape.num_q_heads),
      page_table_(static_cast<std::size_t>(cap.max_slots) * cap.max_pages_per_slot),
      num_requests_(1),
      slot_(cap.max_batch),
      kv_len_(cap.max_batch),
      q_start_(cap.max_batch + 1),
      window_left_(1) {}

void DevicePagedBatch::upload_all_but_pool(const HostPagedBatch& host, cudaStream_t stream) {
  const Capacity& c = host.capacity();
  GD_REQUIRE(c.num_pages == cap_.num_pages && c.max_batch == cap_.max_batch &&
                 c.max_slots == cap_.max_slots && c.max_pages_per_slot == cap_.max_pages_per_slot &&
                 c.max_q_tokens == cap_.max_q_tokens,
             "capacity", c.max_batch, "host batch has another capacity");
  host_num_requests_ = host.num_requests();
  host_window_left_ = host.window_left();
  num_requests_.upload(&host_num_requests_, 1, stream);
  window_left_.upload(&host_window_left_, 1, stream);
  slot_.upload(host.slot().data(), host.slot().size(), stream);
  kv_len_.upload(host.kv_len().data(), host.kv_len().size(), stream);
  q_start_.upload(host.q_start().data(), host.q_start().size(), stream);
  page_table_.upload(host.page_table().data(), host.page_table().size(), stream);
  q_.upload(host.q().data(), host.q().size(), stream);
}

void DevicePagedBatch::upload(const HostPagedBatch& host, cudaStream_t stream) {
  upload_all_but_pool(host, stream);
  k_.upload(host.k().data(), host.k().size(), stream);
  v_.upload(host.v().data(), host.v().size(), stream);
}

AttentionBatch DevicePagedBatch::batch(bool with_window_ptr) const {
  AttentionBatch b;
  b.num_requests = num_requests_.data();
  b.slot = slot_.data();
  b.q_start = q_start_.data();
  b.kv_len = kv_len_.data();
  b.window_left = with_window_ptr ? window_left_.data() : nullptr;
  return b;
}

PagedKvView DevicePagedBatch::view() const {
  PagedKvView v;
  v.k = k_.data();
  v.v = v_.data();
  v.page_table = page_table_.data();
  v.max_pages_per_slot = cap_.max_pages_per_slot;
  v.page_size = shape_.page_size;
  v.num_kv_heads = shape_.num_kv_heads;
  v.head_dim = shape_.head_dim;
  v.num_pages = cap_.num_pages;
  return v;
}

void DevicePagedBatch::poison_outputs(cudaStream_t stream) {
  out_.fill_bytes(0xff, stream);  // 0xffff: NaN in bf16 and fp16
  lse_.fill_bytes(0xff, stream);  // 0xffffffff: NaN in float
}

std::vector<std::uint16_t> DevicePagedBatch::download_out(std::int32_t rows,
                                                          cudaStream_t stream) const {
  std::vector<std::uint16_t> h(static_cast<std::size_t>(rows) * shape_.num_q_heads *
                               shape_.head_dim);
  out_.download(h.data(), h.size(), stream);
  GD_CUDA(cudaStreamSynchronize(stream));
  return h;
}

std::vector<float> DevicePagedBatch::download_lse(std::int32_t rows, cudaStream_t stream) const {
  std::vector<float> h(static_cast<std::size_t>(rows) * shape_.num_q_heads);
  lse_.download(h.data(), h.size(), stream);
  GD_CUDA(cudaStreamSynchronize(stream));
  return h;
}

}  // namespace graphdecode::testing
