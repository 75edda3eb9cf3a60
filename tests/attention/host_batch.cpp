// Random paged batches on the host. See host_batch.h.
#include "host_batch.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"
#include "common/request_rules.h"

namespace graphdecode::testing {
namespace {

// Garbage in metadata rows past num_requests: any kernel that reads them fails loudly.
constexpr std::int32_t kGarbage = 1 << 30;

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

void fill_random(std::vector<std::uint16_t>& dst, DType dtype, std::uint64_t seed) {
  // 8192 magnitudes uniform in [1/64, 1] (finer than bf16/fp16 resolution near 1), each value a
  // random magnitude with a random sign: fast enough for pools of hundreds of millions.
  constexpr std::uint32_t kLevels = 8192;
  static_assert((kLevels & (kLevels - 1)) == 0);
  std::vector<std::uint16_t> table(2 * kLevels);
  for (std::uint32_t i = 0; i < kLevels; ++i) {
    const float mag = 1.0f / 64.0f + (63.0f / 64.0f) * (static_cast<float>(i) + 0.5f) / kLevels;
    table[i] = reference::from_float(mag, dtype);
    table[kLevels + i] = reference::from_float(-mag, dtype);
  }
  std::uint64_t state = seed;
  const std::size_t n = dst.size();
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const std::uint64_t bits = splitmix64(state);
    for (std::size_t j = 0; j < 4; ++j) dst[i + j] = table[(bits >> (16 * j)) & (2 * kLevels - 1)];
  }
  for (const std::uint64_t bits = splitmix64(state); i < n; ++i)
    dst[i] = table[(bits >> (16 * (i % 4))) & (2 * kLevels - 1)];
}

Capacity capacity_for(const Shape& shape, const std::vector<Req>& reqs, Rng& rng) {
  Capacity c;
  const auto b = static_cast<std::int32_t>(reqs.size());
  std::int32_t total_q = 0, max_kv = 1, pages = 0;
  for (const Req& r : reqs) {
    total_q += r.q_len;
    max_kv = std::max(max_kv, r.kv_len);
    pages += pages_for_tokens(r.kv_len, shape.page_size);
  }
  c.max_batch = std::max(1, b + static_cast<std::int32_t>(rng() % 3));
  c.max_q_tokens = std::max(1, total_q + static_cast<std::int32_t>(rng() % 5));
  c.max_kv_len = max_kv;
  c.max_slots = c.max_batch + 1 + static_cast<std::int32_t>(rng() % (c.max_batch + 4));
  c.max_pages_per_slot =
      pages_for_tokens(c.max_kv_len, shape.page_size) + static_cast<std::int32_t>(rng() % 2);
  c.num_pages = 1 + pages + static_cast<std::int32_t>(rng() % 8);
  return c;
}

Capacity max_capacity(const Capacity& a, const Capacity& b) {
  return Capacity{std::max(a.max_batch, b.max_batch),
                  std::max(a.max_q_tokens, b.max_q_tokens),
                  std::max(a.max_kv_len, b.max_kv_len),
                  std::max(a.max_slots, b.max_slots),
                  std::max(a.max_pages_per_slot, b.max_pages_per_slot),
                  std::max(a.num_pages, b.num_pages)};
}

HostPagedBatch::HostPagedBatch(const Shape& shape, const Capacity& cap) : shape_(shape), cap_(cap) {
  const std::size_t pool = static_cast<std::size_t>(cap.num_pages) * shape.num_kv_heads *
                           shape.page_size * shape.head_dim;
  k_.resize(pool);
  v_.resize(pool);
  q_.resize(static_cast<std::size_t>(cap.max_q_tokens) * shape.num_q_heads * shape.head_dim);
}

void HostPagedBatch::fill(const std::vector<Req>& reqs, const FillOptions& opts, Rng& rng) {
  const auto b = static_cast<std::int32_t>(reqs.size());
  GD_REQUIRE(b <= cap_.max_batch && b < cap_.max_slots, "num_requests", b, "batch over capacity");
  const bool causal = shape_.mode == AttentionMode::kCausal;
  reqs_ = reqs;
  window_left_ = opts.window_left;

  // Slots: distinct, random, never the dummy slot 0.
  std::vector<std::int32_t> slots(cap_.max_slots - 1);
  std::iota(slots.begin(), slots.end(), 1);
  std::shuffle(slots.begin(), slots.end(), rng);
  // Pages: a random permutation of 1..num_pages-1, handed out in order.
  std::vector<std::int32_t> pages(cap_.num_pages - 1);
  std::iota(pages.begin(), pages.end(), 1);
  std::shuffle(pages.begin(), pages.end(), rng);

  const std::int32_t mpps = cap_.max_pages_per_slot;
  page_table_.assign(static_cast<std::size_t>(cap_.max_slots) * mpps, kInvalidPage);
  std::fill(page_table_.begin(), page_table_.begin() + mpps, 0);  // dummy slot -> dummy page
  slot_.assign(cap_.max_batch, kPaddingSlot);
  kv_len_.assign(cap_.max_batch, kGarbage);
  q_start_.assign(cap_.max_batch + 1, kGarbage);
  q_start_[0] = 0;
  std::size_t next_page = 0;
  for (std::int32_t r = 0; r < b; ++r) {
    const Req& req = reqs[r];
    GD_REQUIRE(req.kv_len >= 0 && req.kv_len <= cap_.max_kv_len, "kv_len", req.kv_len,
               "request over capacity");
    GD_REQUIRE(req.q_len >= 0 && (!causal || req.q_len <= req.kv_len), "q_len", req.q_len,
               "causal q_len must not exceed kv_len");
    slot_[r] = slots[r];
    kv_len_[r] = req.kv_len;
    q_start_[r + 1] = q_start_[r] + req.q_len;
    const std::int32_t n = pages_for_tokens(req.kv_len, shape_.page_size);
    GD_REQUIRE(next_page + n <= pages.size(), "num_pages", cap_.num_pages, "pool too small");
    const std::int32_t first_resident =
        causal && opts.invalidate_before_window
            ? swa_first_resident_page(req.kv_len - req.q_len, opts.window_left, shape_.page_size)
            : 0;
    for (std::int32_t p = 0; p < n; ++p) {
      const std::int32_t page = pages[next_page++];
      page_table_[static_cast<std::size_t>(slots[r]) * mpps + p] =
          p < first_resident ? kInvalidPage : page;
    }
  }
  GD_REQUIRE(q_start_[b] <= cap_.max_q_tokens, "total_q", q_start_[b], "queries over capacity");

  fill_random(k_, shape_.dtype, rng());
  fill_random(v_, shape_.dtype, rng());
  fill_random(q_, shape_.dtype, rng());
}

void HostPagedBatch::redraw_q(Rng& rng) {
  fill_random(q_, shape_.dtype, rng());
}

std::int64_t HostPagedBatch::kv_offset(std::int32_t r, std::int32_t head, std::int32_t pos) const {
  const PagedKvView view = host_view();
  const std::int32_t page = page_of_token(view, slot_[r], pos);
  return page == kInvalidPage ? -1 : kv_element_offset(view, page, head, pos % shape_.page_size);
}

RequestData HostPagedBatch::extract(std::int32_t r) const {
  const Req& req = reqs_[r];
  const std::int32_t d = shape_.head_dim, hq = shape_.num_q_heads;
  RequestData out;
  out.k.assign(static_cast<std::size_t>(shape_.num_kv_heads) * req.kv_len * d, 0);
  out.v.assign(out.k.size(), 0);
  for (std::int32_t h = 0; h < shape_.num_kv_heads; ++h) {
    for (std::int32_t pos = 0; pos < req.kv_len; ++pos) {
      const std::int64_t off = kv_offset(r, h, pos);
      if (off < 0) continue;  // an invalidated page: its keys are never visible
      const std::size_t dst = (static_cast<std::size_t>(h) * req.kv_len + pos) * d;
      std::copy_n(&k_[off], d, &out.k[dst]);
      std::copy_n(&v_[off], d, &out.v[dst]);
    }
  }
  const std::size_t q0 = static_cast<std::size_t>(q_start_[r]) * hq * d;
  out.q.assign(q_.begin() + q0, q_.begin() + q0 + static_cast<std::size_t>(req.q_len) * hq * d);
  return out;
}

void HostPagedBatch::implant(std::int32_t r, const RequestData& data) {
  const Req& req = reqs_[r];
  const std::int32_t d = shape_.head_dim, hq = shape_.num_q_heads;
  GD_REQUIRE(data.k.size() == static_cast<std::size_t>(shape_.num_kv_heads) * req.kv_len * d &&
                 data.q.size() == static_cast<std::size_t>(req.q_len) * hq * d,
             "request", r, "implanted data has another shape");
  for (std::int32_t h = 0; h < shape_.num_kv_heads; ++h) {
    for (std::int32_t pos = 0; pos < req.kv_len; ++pos) {
      const std::int64_t off = kv_offset(r, h, pos);
      if (off < 0) continue;
      const std::size_t src = (static_cast<std::size_t>(h) * req.kv_len + pos) * d;
      std::copy_n(&data.k[src], d, &k_[off]);
      std::copy_n(&data.v[src], d, &v_[off]);
    }
  }
  std::copy(data.q.begin(), data.q.end(),
            q_.begin() + static_cast<std::size_t>(q_start_[r]) * hq * d);
}

RequestData slice_keys(const RequestData& whole, const Shape& shape, std::int32_t kv_len,
                       std::int32_t begin, std::int32_t end) {
  RequestData part;
  part.q = whole.q;
  const std::size_t d = shape.head_dim;
  for (std::int32_t h = 0; h < shape.num_kv_heads; ++h) {
    const std::size_t from = (static_cast<std::size_t>(h) * kv_len + begin) * d;
    const std::size_t to = (static_cast<std::size_t>(h) * kv_len + end) * d;
    part.k.insert(part.k.end(), whole.k.begin() + from, whole.k.begin() + to);
    part.v.insert(part.v.end(), whole.v.begin() + from, whole.v.begin() + to);
  }
  return part;
}

AttentionConfig HostPagedBatch::config(bool deterministic, std::int32_t split_tokens) const {
  AttentionConfig c;
  c.num_q_heads = shape_.num_q_heads;
  c.num_kv_heads = shape_.num_kv_heads;
  c.head_dim = shape_.head_dim;
  c.dtype = shape_.dtype;
  c.mode = shape_.mode;
  c.max_batch = cap_.max_batch;
  c.max_q_tokens = cap_.max_q_tokens;
  c.max_kv_len = cap_.max_kv_len;
  c.deterministic = deterministic;
  c.split_tokens = split_tokens;
  return c;
}

reference::HostBatch HostPagedBatch::host_batch() const {
  reference::HostBatch hb;
  hb.num_requests = num_requests();
  hb.slot = slot_.data();
  hb.q_start = q_start_.data();
  hb.kv_len = kv_len_.data();
  hb.window_left = window_left_;
  return hb;
}

PagedKvView HostPagedBatch::host_view() const {
  PagedKvView v;
  v.k = const_cast<std::uint16_t*>(k_.data());
  v.v = const_cast<std::uint16_t*>(v_.data());
  v.page_table = page_table_.data();
  v.max_pages_per_slot = cap_.max_pages_per_slot;
  v.page_size = shape_.page_size;
  v.num_kv_heads = shape_.num_kv_heads;
  v.head_dim = shape_.head_dim;
  v.num_pages = cap_.num_pages;
  return v;
}

reference::AttentionResult HostPagedBatch::reference(reference::KeyRange keys) const {
  return reference::attention(config(), host_batch(), host_view(), q_.data(), keys);
}

}  // namespace graphdecode::testing
