// CPU tests of the random paged-batch harness (host_batch.h) that the GPU tests rely on: layout
// invariants (shuffled pages, random slots, kInvalidPage, dummy slot/page, never-zero values),
// extract/implant keeping a request's output, and the merge-test construction (prefix as a cross
// request + new tokens as a causal request, merged = whole).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "attention/reference.h"
#include "common/request_rules.h"
#include "host_batch.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;

TEST(HostBatch, LayoutInvariants) {
  Rng rng(99);
  for (std::int32_t page : {1, 16, 64}) {
    for (std::int32_t window : {-1, 0, 5, 100}) {
      const Shape s{8, 2, 64, page, DType::kBF16, AttentionMode::kCausal};
      std::vector<Req> reqs;
      std::uniform_int_distribution<std::int32_t> ql(1, 20), pl(0, 2000);
      for (int r = 0; r < 12; ++r) {
        const std::int32_t q = ql(rng);
        reqs.push_back(Req{q, pl(rng) + q});
      }
      const Capacity cap = capacity_for(s, reqs, rng);
      HostPagedBatch b(s, cap);
      b.fill(reqs, FillOptions{window, window >= 0}, rng);
      const std::int32_t mpps = cap.max_pages_per_slot;
      EXPECT_GE(mpps * page, cap.max_kv_len);
      // Dummy slot 0 -> dummy page 0; no live request uses either.
      for (std::int32_t p = 0; p < mpps; ++p) EXPECT_EQ(b.page_table()[p], 0);
      std::set<std::int32_t> slots, pages;
      bool slots_sorted = true, some_request_non_monotonic = false;
      for (std::int32_t r = 0; r < b.num_requests(); ++r) {
        const std::int32_t slot = b.slot()[r];
        EXPECT_GT(slot, 0);
        EXPECT_LT(slot, cap.max_slots);
        EXPECT_TRUE(slots.insert(slot).second) << "slot reused";
        if (r > 0 && slot < b.slot()[r - 1]) slots_sorted = false;
        const Req& q = reqs[r];
        EXPECT_EQ(b.kv_len()[r], q.kv_len);
        EXPECT_EQ(b.q_start()[r + 1] - b.q_start()[r], q.q_len);
        const std::int32_t n = pages_for_tokens(q.kv_len, page);
        const std::int32_t first =
            window >= 0 ? swa_first_resident_page(q.kv_len - q.q_len, window, page) : 0;
        std::int32_t prev = -1;
        for (std::int32_t p = 0; p < mpps; ++p) {
          const std::int32_t e = b.page_table()[static_cast<std::size_t>(slot) * mpps + p];
          if (p < first || p >= n) {
            EXPECT_EQ(e, kInvalidPage) << "entry " << p;
            continue;
          }
          EXPECT_GT(e, 0);
          EXPECT_LT(e, cap.num_pages);
          EXPECT_TRUE(pages.insert(e).second) << "page reused";
          if (prev >= 0 && e < prev) some_request_non_monotonic = true;
          prev = e;
        }
      }
      EXPECT_FALSE(slots_sorted);
      if (window < 0) {  // with a window few pages stay resident
        EXPECT_TRUE(some_request_non_monotonic);
      }
      // Rows past num_requests: padding slot, garbage lengths.
      for (std::int32_t r = b.num_requests(); r < cap.max_batch; ++r)
        EXPECT_EQ(b.slot()[r], kPaddingSlot);
      for (std::uint16_t x : b.k()) {
        const float f = reference::to_float(x, s.dtype);
        ASSERT_TRUE(std::abs(f) >= 1.f / 64 && std::abs(f) <= 1.f) << f;
      }
    }
  }
}

// The determinism tests move a request between batches with extract / implant.
TEST(HostBatch, ImplantKeepsTheRequestsReferenceOutput) {
  Rng rng(5);
  for (AttentionMode mode : {AttentionMode::kCausal, AttentionMode::kCross}) {
    for (std::int32_t window : {-1, 7}) {
      const Shape s{4, 2, 32, 16, DType::kFP16, mode};
      const Req target{3, 300};
      const std::vector<Req> alone = {target};
      const std::vector<Req> crowd = {{1, 50}, {2, 17}, target, {5, 999}};
      HostPagedBatch a(s, capacity_for(s, alone, rng));
      a.fill(alone, FillOptions{window, window >= 0}, rng);
      HostPagedBatch b(s, capacity_for(s, crowd, rng));
      b.fill(crowd, FillOptions{window, window >= 0}, rng);
      b.implant(2, a.extract(0));
      const auto ra = a.reference(), rb = b.reference();
      const std::size_t row_elems = static_cast<std::size_t>(s.num_q_heads) * s.head_dim;
      const std::size_t off = static_cast<std::size_t>(b.q_start()[2]);
      for (std::size_t i = 0; i < target.q_len * row_elems; ++i)
        ASSERT_EQ(ra.o[i], rb.o[off * row_elems + i]);
      for (std::size_t i = 0; i < target.q_len * static_cast<std::size_t>(s.num_q_heads); ++i)
        ASSERT_EQ(ra.lse[i], rb.lse[off * s.num_q_heads + i]);
    }
  }
}

// The merge GPU test's construction, checked with the reference alone.
TEST(HostBatch, PrefixAsCrossPlusNewTokensAsCausalMergeToTheWhole) {
  Rng rng(11);
  const Shape shape{8, 2, 32, 16, DType::kBF16, AttentionMode::kCausal};
  Shape cross = shape;
  cross.mode = AttentionMode::kCross;
  const std::vector<Req> whole_reqs = {{5, 105}, {1, 301}, {64, 64}, {17, 117}, {1, 1}};
  std::vector<Req> pre_reqs, suf_reqs;
  for (const Req& r : whole_reqs) {
    pre_reqs.push_back(Req{r.q_len, r.kv_len - r.q_len});
    suf_reqs.push_back(Req{r.q_len, r.q_len});
  }
  HostPagedBatch whole(shape, capacity_for(shape, whole_reqs, rng));
  whole.fill(whole_reqs, {}, rng);
  HostPagedBatch pre(cross, capacity_for(cross, pre_reqs, rng));
  pre.fill(pre_reqs, {}, rng);
  HostPagedBatch suf(shape, capacity_for(shape, suf_reqs, rng));
  suf.fill(suf_reqs, {}, rng);
  for (std::int32_t r = 0; r < whole.num_requests(); ++r) {
    const RequestData d = whole.extract(r);
    const Req& w = whole_reqs[r];
    pre.implant(r, slice_keys(d, shape, w.kv_len, 0, w.kv_len - w.q_len));
    suf.implant(r, slice_keys(d, shape, w.kv_len, w.kv_len - w.q_len, w.kv_len));
  }
  const auto merged = reference::merge_states(pre.reference(), suf.reference());
  const auto ref = whole.reference();
  for (std::size_t i = 0; i < ref.o.size(); ++i) ASSERT_NEAR(merged.o[i], ref.o[i], 1e-12) << i;
  for (std::size_t i = 0; i < ref.lse.size(); ++i) ASSERT_NEAR(merged.lse[i], ref.lse[i], 1e-12);
}

}  // namespace
}  // namespace graphdecode
