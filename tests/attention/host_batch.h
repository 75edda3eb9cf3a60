// Test support: a random paged attention batch built on the HOST (no device needed).
//
// fill() draws, for a list of requests (q_len, kv_len):
//   * slots: distinct random rows of the page table, never kPaddingSlot (0), in random order;
//   * pages: a random permutation of pool pages 1..num_pages-1 (page 0 is the reserved dummy),
//     handed out in that order, so each request's pages are shuffled and non-monotonic;
//   * page table [max_slots][max_pages_per_slot]: kInvalidPage in every unused entry; the dummy
//     slot 0's row points at page 0; with invalidate_before_window, a causal request's entries
//     for pages wholly before its step's first visible key are kInvalidPage too (as the SWA pool
//     leaves them) — no kernel may read them;
//   * K/V pool and Q: random values in [-1, -1/64] U [1/64, 1] (never zero), every page of the
//     pool (used or not), so reading a wrong page shows up in the output.
// Metadata rows past num_requests hold garbage that no kernel may read.
//
// DevicePagedBatch (device_batch.h) uploads it to fixed device buffers; the float64 reference
// (attention/reference.h) reads the host copies kept here.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "attention/paged_attention.h"
#include "attention/reference.h"
#include "common/dtype.h"
#include "memory/kv_layout.h"

namespace graphdecode::testing {

using Rng = std::mt19937_64;

struct Shape {
  std::int32_t num_q_heads = 32;
  std::int32_t num_kv_heads = 8;
  std::int32_t head_dim = 128;
  std::int32_t page_size = 16;
  DType dtype = DType::kBF16;
  AttentionMode mode = AttentionMode::kCausal;
};

// One request of a step. Causal: kv_len = prefix + extend and q_len = extend (decode 1, verify N,
// draft-extend-v2 / prefill any). Cross: kv_len = the encoder length, q_len any.
struct Req {
  std::int32_t q_len = 1;
  std::int32_t kv_len = 1;
};

// Everything sized once; fill() may be called again with any batch that fits (graph tests).
struct Capacity {
  std::int32_t max_batch = 0;
  std::int32_t max_q_tokens = 0;
  std::int32_t max_kv_len = 0;
  std::int32_t max_slots = 0;           // page-table rows, incl. the dummy slot 0
  std::int32_t max_pages_per_slot = 0;  // >= pages_for_tokens(max_kv_len, page_size)
  std::int32_t num_pages = 0;           // pool pages, incl. the dummy page 0
};

// A capacity that fits `reqs` with some random slack (extra slots, pages, page-table columns).
Capacity capacity_for(const Shape& shape, const std::vector<Req>& reqs, Rng& rng);
// The elementwise max of two capacities (for a graph captured once and replayed with others).
Capacity max_capacity(const Capacity& a, const Capacity& b);

struct FillOptions {
  std::int32_t window_left = -1;          // < 0 = full
  bool invalidate_before_window = false;  // causal: kInvalidPage before the first visible page
};

// Logical content of one request, independent of where its pages are.
struct RequestData {
  std::vector<std::uint16_t> k, v;  // [num_kv_heads][kv_len][head_dim]
  std::vector<std::uint16_t> q;     // [q_len][num_q_heads][head_dim]
};

class HostPagedBatch {
 public:
  HostPagedBatch(const Shape& shape, const Capacity& cap);

  // Redraws slots, pages, page table, the whole K/V pool and Q for `reqs`.
  void fill(const std::vector<Req>& reqs, const FillOptions& opts, Rng& rng);

  // Copies one request's K/V (through its page table) and Q out / in. implant requires the same
  // q_len and kv_len; it is how a request keeps its data while moving between batches.
  RequestData extract(std::int32_t r) const;
  void implant(std::int32_t r, const RequestData& data);

  // Overwrite Q with fresh random values (K/V and layout unchanged).
  void redraw_q(Rng& rng);

  AttentionConfig config(bool deterministic = false, std::int32_t split_tokens = 0) const;
  reference::HostBatch host_batch() const;
  PagedKvView host_view() const;  // host pointers
  reference::AttentionResult reference(reference::KeyRange keys = {}) const;

  std::int32_t num_requests() const { return static_cast<std::int32_t>(reqs_.size()); }
  std::int32_t total_q() const { return q_start_[reqs_.size()]; }
  std::int32_t window_left() const { return window_left_; }
  const std::vector<Req>& reqs() const { return reqs_; }
  const Shape& shape() const { return shape_; }
  const Capacity& capacity() const { return cap_; }

  // Host arrays, laid out exactly as uploaded.
  const std::vector<std::int32_t>& slot() const { return slot_; }        // [max_batch]
  const std::vector<std::int32_t>& q_start() const { return q_start_; }  // [max_batch + 1]
  const std::vector<std::int32_t>& kv_len() const { return kv_len_; }    // [max_batch]
  const std::vector<std::int32_t>& page_table() const { return page_table_; }
  const std::vector<std::uint16_t>& k() const { return k_; }  // [num_pages][hkv][page][d]
  const std::vector<std::uint16_t>& v() const { return v_; }
  const std::vector<std::uint16_t>& q() const { return q_; }  // [max_q_tokens][hq][d]

 private:
  std::int64_t kv_offset(std::int32_t r, std::int32_t head, std::int32_t pos) const;

  Shape shape_;
  Capacity cap_;
  std::vector<Req> reqs_;
  std::int32_t window_left_ = -1;
  std::vector<std::int32_t> slot_, q_start_, kv_len_, page_table_;
  std::vector<std::uint16_t> k_, v_, q_;
};

// Keys [begin, end) of a request's logical data whose kv_len is `kv_len` (q copied unchanged):
// e.g. the cached prefix or the new tokens of an extend, as a request of their own.
RequestData slice_keys(const RequestData& whole, const Shape& shape, std::int32_t kv_len,
                       std::int32_t begin, std::int32_t end);

// Random values in [-1, -1/64] U [1/64, 1] as dtype bits (never zero), from a fast generator.
void fill_random(std::vector<std::uint16_t>& dst, DType dtype, std::uint64_t seed);

}  // namespace graphdecode::testing
