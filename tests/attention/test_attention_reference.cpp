// CPU tests of the float64 reference (attention/reference.h): dtype conversions, hand-computed
// tiny cases (causal, window, cross, GQA, empty rows, default scale), a naive re-implementation on
// random shuffled-page batches, the merge identity, and its speed at 32k context.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/reference.h"
#include "common/error.h"
#include "host_batch.h"

namespace graphdecode {
namespace {

using reference::AttentionResult;
using reference::HostBatch;
using reference::KeyRange;
using testing::HostPagedBatch;
using testing::Req;
using testing::Rng;
using testing::Shape;

constexpr double kInf = std::numeric_limits<double>::infinity();
const double e = std::exp(1.0);

// ---- conversions ------------------------------------------------------------------------------

TEST(ReferenceDtype, Bf16RoundTripsEveryPattern) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float f = reference::bf16_to_float(static_cast<std::uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(reference::bf16_to_float(reference::float_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(reference::float_to_bf16(f), b) << std::hex << b;
  }
}

TEST(ReferenceDtype, Fp16RoundTripsEveryPattern) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float f = reference::fp16_to_float(static_cast<std::uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(reference::fp16_to_float(reference::float_to_fp16(f))));
      continue;
    }
    ASSERT_EQ(reference::float_to_fp16(f), b) << std::hex << b;
  }
}

TEST(ReferenceDtype, RoundsToNearestEven) {
  EXPECT_EQ(reference::float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(reference::float_to_bf16(1.0f + 0x1p-8f), 0x3f80);      // tie -> even
  EXPECT_EQ(reference::float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(reference::float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_EQ(reference::float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(reference::float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(reference::float_to_fp16(1.0f + 0x1p-11f), 0x3c00);      // tie -> even
  EXPECT_EQ(reference::float_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(reference::float_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(reference::float_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(reference::float_to_fp16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(reference::float_to_fp16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(reference::float_to_fp16(0x1p-25f), 0x0000);  // tie -> even (zero)
  EXPECT_EQ(reference::float_to_fp16(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(reference::float_to_fp16(-0x1p-14f), 0x8400);           // smallest normal
  EXPECT_EQ(reference::float_to_fp16(1023.5f * 0x1p-24f), 0x0400);  // rounds up into normals
  EXPECT_EQ(reference::float_to_fp16(std::numeric_limits<float>::infinity()), 0x7c00);
}

// ---- hand-computed cases ------------------------------------------------------------------------

// A tiny pool with an identity page table in slot 0: token pos of kv head h lives in page
// pos / page_size. Values are exact in bf16.
struct Tiny {
  std::int32_t d, ps, hkv, pages;
  std::vector<std::uint16_t> k, v, q;
  std::vector<std::int32_t> table;
  Tiny(std::int32_t n_keys, std::int32_t head_dim, std::int32_t num_kv_heads = 1,
       std::int32_t page_size = 2)
      : d(head_dim), ps(page_size), hkv(num_kv_heads), pages((n_keys + page_size - 1) / page_size) {
    k.assign(static_cast<std::size_t>(pages) * hkv * ps * d, 0);
    v = k;
    for (std::int32_t p = 0; p < pages; ++p) table.push_back(p);
  }
  PagedKvView view() {
    PagedKvView vw;
    vw.k = k.data();
    vw.v = v.data();
    vw.page_table = table.data();
    vw.max_pages_per_slot = pages;
    vw.page_size = ps;
    vw.num_kv_heads = hkv;
    vw.head_dim = d;
    vw.num_pages = pages;
    return vw;
  }
  void set(std::int32_t h, std::int32_t pos, std::vector<float> kk, std::vector<float> vv) {
    const std::int64_t off = kv_element_offset(view(), pos / ps, h, pos % ps);
    for (std::int32_t i = 0; i < d; ++i) {
      k[off + i] = reference::float_to_bf16(kk[i]);
      v[off + i] = reference::float_to_bf16(vv[i]);
    }
  }
  void add_query(std::vector<float> x) {
    for (float f : x) q.push_back(reference::float_to_bf16(f));
  }
};

AttentionConfig cfg(std::int32_t hq, std::int32_t hkv, std::int32_t d, AttentionMode mode,
                    float scale = 1.f) {
  AttentionConfig c;
  c.num_q_heads = hq;
  c.num_kv_heads = hkv;
  c.head_dim = d;
  c.dtype = DType::kBF16;
  c.mode = mode;
  c.sm_scale = scale;
  return c;
}

struct OneRequest {
  std::int32_t slot = 0, q_start[2] = {0, 0}, kv_len = 0;
  HostBatch batch(std::int32_t q_len, std::int32_t kv, std::int32_t window = -1) {
    q_start[1] = q_len;
    kv_len = kv;
    return HostBatch{1, &slot, q_start, &kv_len, window};
  }
};

TEST(ReferenceHand, OneQueryTwoKeys) {
  Tiny t(2, 2);
  t.set(0, 0, {1, 0}, {1, 0});
  t.set(0, 1, {0, 0}, {0, 1});
  t.add_query({1, 0});
  OneRequest one;
  const AttentionResult r = reference::attention(cfg(1, 1, 2, AttentionMode::kCausal),
                                                 one.batch(1, 2), t.view(), t.q.data());
  EXPECT_NEAR(r.at(0, 0, 0), e / (e + 1), 1e-12);
  EXPECT_NEAR(r.at(0, 0, 1), 1 / (e + 1), 1e-12);
  EXPECT_NEAR(r.lse[0], std::log(e + 1), 1e-12);
}

TEST(ReferenceHand, CausalExtendSeesOnlyEarlierKeys) {
  Tiny t(2, 2);
  t.set(0, 0, {1, 0}, {1, 0});
  t.set(0, 1, {0, 1}, {0, 1});
  t.add_query({1, 0});  // position 0
  t.add_query({0, 1});  // position 1
  OneRequest one;
  const AttentionResult r = reference::attention(cfg(1, 1, 2, AttentionMode::kCausal),
                                                 one.batch(2, 2), t.view(), t.q.data());
  EXPECT_NEAR(r.at(0, 0, 0), 1.0, 1e-12);
  EXPECT_NEAR(r.at(0, 0, 1), 0.0, 1e-12);
  EXPECT_NEAR(r.lse[0], 1.0, 1e-12);
  EXPECT_NEAR(r.at(1, 0, 0), 1 / (1 + e), 1e-12);
  EXPECT_NEAR(r.at(1, 0, 1), e / (1 + e), 1e-12);
  EXPECT_NEAR(r.lse[1], std::log(1 + e), 1e-12);
}

TEST(ReferenceHand, SlidingWindow) {
  // Keys 0..2 with scores 0 (q . k = 0 for all) so o is the mean of the visible values.
  Tiny t(3, 2);
  t.set(0, 0, {0, 0}, {1, 0});
  t.set(0, 1, {0, 0}, {0, 1});
  t.set(0, 2, {0, 0}, {-1, -1});
  t.add_query({1, 1});  // decode at position 2
  OneRequest one;
  const auto c = cfg(1, 1, 2, AttentionMode::kCausal);
  struct Want {
    std::int32_t window;
    double o0, o1, lse;
  };
  for (const Want w :
       {Want{0, -1, -1, 0}, Want{1, -0.5, 0, std::log(2.0)}, Want{2, 0, 0, std::log(3.0)},
        Want{100, 0, 0, std::log(3.0)}, Want{-1, 0, 0, std::log(3.0)}}) {
    const AttentionResult r =
        reference::attention(c, one.batch(1, 3, w.window), t.view(), t.q.data());
    EXPECT_NEAR(r.at(0, 0, 0), w.o0, 1e-12) << "window " << w.window;
    EXPECT_NEAR(r.at(0, 0, 1), w.o1, 1e-12) << "window " << w.window;
    EXPECT_NEAR(r.lse[0], w.lse, 1e-12) << "window " << w.window;
  }
}

TEST(ReferenceHand, InvalidPagesBeforeTheWindowAreNeverRead) {
  Tiny t(6, 2);  // pages of 2: keys {0,1} {2,3} {4,5}
  for (std::int32_t pos = 0; pos < 6; ++pos) t.set(0, pos, {0, 0}, {float(pos), 0});
  t.add_query({1, 1});  // decode at position 5
  t.table[0] = kInvalidPage;
  OneRequest one;
  const auto c = cfg(1, 1, 2, AttentionMode::kCausal);
  // window 3: keys 2..5 visible, page 0 never touched.
  const AttentionResult r = reference::attention(c, one.batch(1, 6, 3), t.view(), t.q.data());
  EXPECT_NEAR(r.at(0, 0, 0), 3.5, 1e-12);
  // Full attention must read page 0: the reference refuses the broken page table.
  EXPECT_THROW(reference::attention(c, one.batch(1, 6, -1), t.view(), t.q.data()), Error);
}

TEST(ReferenceHand, CrossSeesAllKeysAndIgnoresTheWindow) {
  Tiny t(2, 2);
  t.set(0, 0, {1, 0}, {1, 0});
  t.set(0, 1, {0, 1}, {0, 1});
  t.add_query({1, 0});
  t.add_query({0, 1});
  OneRequest one;
  const AttentionResult r = reference::attention(
      cfg(1, 1, 2, AttentionMode::kCross), one.batch(2, 2, /*window=*/0), t.view(), t.q.data());
  EXPECT_NEAR(r.at(0, 0, 0), e / (1 + e), 1e-12);
  EXPECT_NEAR(r.at(1, 0, 1), e / (1 + e), 1e-12);
  EXPECT_NEAR(r.lse[0], std::log(1 + e), 1e-12);
  EXPECT_NEAR(r.lse[1], std::log(1 + e), 1e-12);
}

TEST(ReferenceHand, EmptyRowsGetZeroAndMinusInf) {
  Tiny t(2, 2);
  t.set(0, 0, {1, 0}, {1, 0});
  t.set(0, 1, {0, 1}, {0, 1});
  t.add_query({1, 0});
  OneRequest one;
  // Cross with no encoder keys.
  AttentionResult r = reference::attention(cfg(1, 1, 2, AttentionMode::kCross), one.batch(1, 0),
                                           t.view(), t.q.data());
  EXPECT_EQ(r.at(0, 0, 0), 0.0);
  EXPECT_EQ(r.lse[0], -kInf);
  // A key range that excludes every visible key.
  r = reference::attention(cfg(1, 1, 2, AttentionMode::kCausal), one.batch(1, 2, 0), t.view(),
                           t.q.data(), KeyRange{0, 1});
  EXPECT_EQ(r.at(0, 0, 1), 0.0);
  EXPECT_EQ(r.lse[0], -kInf);
}

TEST(ReferenceHand, DefaultScaleIsOneOverSqrtHeadDim) {
  Tiny t(2, 4);
  t.set(0, 0, {1, 1, 1, 1}, {1, 0, 0, 0});
  t.set(0, 1, {0, 0, 0, 0}, {0, 1, 0, 0});
  t.add_query({1, 1, 1, 1});  // scores 4 / sqrt(4) = 2 and 0
  OneRequest one;
  const AttentionResult r = reference::attention(cfg(1, 1, 4, AttentionMode::kCausal, 0.f),
                                                 one.batch(1, 2), t.view(), t.q.data());
  EXPECT_NEAR(r.at(0, 0, 0), e * e / (e * e + 1), 1e-12);
  EXPECT_NEAR(r.lse[0], std::log(e * e + 1), 1e-12);
}

TEST(ReferenceHand, GqaMapsQueryHeadsToKvHeads) {
  Tiny t(1, 2, /*num_kv_heads=*/2);
  t.set(0, 0, {1, 0}, {0.5f, 0.25f});
  t.set(1, 0, {0, 1}, {-0.5f, 1});
  for (int h = 0; h < 4; ++h) t.add_query({2, 3});  // 4 q heads, group 2
  OneRequest one;
  const AttentionResult r = reference::attention(cfg(4, 2, 2, AttentionMode::kCausal),
                                                 one.batch(1, 1), t.view(), t.q.data());
  for (int h = 0; h < 4; ++h) {
    const bool second = h >= 2;  // heads 2, 3 read kv head 1
    EXPECT_NEAR(r.at(0, h, 0), second ? -0.5 : 0.5, 1e-12) << h;
    EXPECT_NEAR(r.at(0, h, 1), second ? 1.0 : 0.25, 1e-12) << h;
    EXPECT_NEAR(r.lse[h], second ? 3.0 : 2.0, 1e-12) << h;
  }
}

// ---- random batches: a naive re-implementation over extracted (logical) K/V
// ----------------------

// Straight from the semantics, no shared code beyond the dtype conversion: query i of a causal
// request sits at kv_len - q_len + i and sees keys pos - window_left <= k <= pos.
AttentionResult naive(const HostPagedBatch& b) {
  const Shape& s = b.shape();
  const bool cross = s.mode == AttentionMode::kCross;
  AttentionResult res;
  res.total_q = b.total_q();
  res.num_heads = s.num_q_heads;
  res.head_dim = s.head_dim;
  res.o.assign(static_cast<std::size_t>(res.total_q) * s.num_q_heads * s.head_dim, 0);
  res.lse.assign(static_cast<std::size_t>(res.total_q) * s.num_q_heads, -kInf);
  const std::int32_t group = s.num_q_heads / s.num_kv_heads, d = s.head_dim;
  for (std::int32_t r = 0; r < b.num_requests(); ++r) {
    const testing::RequestData data = b.extract(r);
    const Req req = b.reqs()[r];
    for (std::int32_t i = 0; i < req.q_len; ++i) {
      const std::int64_t pos = req.kv_len - req.q_len + i;
      for (std::int32_t h = 0; h < s.num_q_heads; ++h) {
        const std::int32_t g = h / group;
        std::vector<double> sc;
        std::vector<std::int32_t> keys;
        for (std::int32_t k = 0; k < req.kv_len; ++k) {
          const bool vis =
              cross || (k <= pos && (b.window_left() < 0 || k >= pos - b.window_left()));
          if (!vis) continue;
          double dotp = 0;
          for (std::int32_t j = 0; j < d; ++j)
            dotp +=
                reference::to_float(
                    data.q[(static_cast<std::size_t>(i) * s.num_q_heads + h) * d + j], s.dtype) *
                reference::to_float(data.k[(static_cast<std::size_t>(g) * req.kv_len + k) * d + j],
                                    s.dtype);
          sc.push_back(dotp / std::sqrt(double(d)));
          keys.push_back(k);
        }
        if (sc.empty()) continue;
        double mx = -kInf, sum = 0;
        for (double x : sc) mx = std::max(mx, x);
        const std::int32_t row = b.q_start()[r] + i;
        for (std::size_t n = 0; n < sc.size(); ++n) {
          const double p = std::exp(sc[n] - mx);
          sum += p;
          for (std::int32_t j = 0; j < d; ++j)
            res.at(row, h, j) +=
                p *
                reference::to_float(
                    data.v[(static_cast<std::size_t>(g) * req.kv_len + keys[n]) * d + j], s.dtype);
        }
        for (std::int32_t j = 0; j < d; ++j) res.at(row, h, j) /= sum;
        res.lse[static_cast<std::size_t>(row) * s.num_q_heads + h] = mx + std::log(sum);
      }
    }
  }
  return res;
}

double max_diff(const AttentionResult& a, const AttentionResult& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.o.size(); ++i) m = std::max(m, std::abs(a.o[i] - b.o[i]));
  for (std::size_t i = 0; i < a.lse.size(); ++i) {
    if (std::isinf(a.lse[i]) || std::isinf(b.lse[i])) {
      if (a.lse[i] != b.lse[i]) return kInf;
      continue;
    }
    m = std::max(m, std::abs(a.lse[i] - b.lse[i]));
  }
  return m;
}

TEST(ReferenceRandom, MatchesNaiveOnShuffledPages) {
  Rng rng(12345);
  int cases = 0;
  for (AttentionMode mode : {AttentionMode::kCausal, AttentionMode::kCross}) {
    for (std::int32_t page : {1, 3, 16}) {
      for (std::int32_t window : {-1, 0, 1, 3, 5, 16, 40}) {
        for (DType dt : {DType::kBF16, DType::kFP16}) {
          Shape s{8, 2, 16, page, dt, mode};
          std::vector<Req> reqs;
          // page 3 also gets long query blocks (the reference splits queries into blocks of 32)
          std::uniform_int_distribution<std::int32_t> ql(0, page == 3 ? 80 : 9), pl(0, 60);
          for (int r = 0; r < 5; ++r) {
            const std::int32_t q = ql(rng);
            reqs.push_back(Req{q, pl(rng) + (mode == AttentionMode::kCausal ? q : 0)});
          }
          HostPagedBatch b(s, testing::capacity_for(s, reqs, rng));
          b.fill(reqs, testing::FillOptions{window, window >= 0 && page > 1}, rng);
          const double diff = max_diff(b.reference(), naive(b));
          EXPECT_LT(diff, 1e-12) << "page " << page << " window " << window;
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 84);
}

TEST(ReferenceRandom, MergeOfPrefixAndSuffixEqualsWhole) {
  Rng rng(777);
  for (std::int32_t window : {-1, 0, 2, 7, 33}) {
    Shape s{4, 1, 32, 4, DType::kBF16, AttentionMode::kCausal};
    const std::vector<Req> reqs = {{5, 40}, {1, 17}, {9, 9}, {3, 64}};
    HostPagedBatch b(s, testing::capacity_for(s, reqs, rng));
    b.fill(reqs, testing::FillOptions{window, false}, rng);
    for (std::int32_t split : {0, 1, 20, 39, 64}) {
      const AttentionResult merged =
          reference::merge_states(b.reference(KeyRange{0, split}), b.reference(KeyRange{split}));
      EXPECT_LT(max_diff(merged, b.reference()), 1e-12)
          << "window " << window << " split " << split;
    }
  }
}

TEST(ReferenceRandom, MergeOfTwoEmptyStatesIsEmpty) {
  AttentionResult a;
  a.total_q = 1;
  a.num_heads = 1;
  a.head_dim = 2;
  a.o = {0.5, 0.5};
  a.lse = {-kInf};
  const AttentionResult m = reference::merge_states(a, a);
  EXPECT_EQ(m.o[0], 0.0);
  EXPECT_EQ(m.lse[0], -kInf);
}

TEST(ReferenceSpeed, Decode32kContext32Heads) {
  Rng rng(1);
  Shape s{32, 8, 128, 16, DType::kBF16, AttentionMode::kCausal};
  const std::vector<Req> reqs = {{1, 32768}};
  HostPagedBatch b(s, testing::capacity_for(s, reqs, rng));
  b.fill(reqs, testing::FillOptions{}, rng);
  const auto t0 = std::chrono::steady_clock::now();
  const AttentionResult r = b.reference();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("reference: 1 x 32768 keys x 32 heads x d128 in %.2f s\n", secs);
  EXPECT_LT(secs, 30.0);
  for (double x : r.o) ASSERT_LE(std::abs(x), 1.0);  // a convex combination of values in [-1, 1]
}

}  // namespace
}  // namespace graphdecode
