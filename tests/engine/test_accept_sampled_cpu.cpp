// CPU tests of sampled speculative acceptance: the scalar rules (accept_sampled_rules.h) on
// worked values, the CPU reference (accept_sampled_reference.h) lossless by chi-square with its
// controls failing the same test (the reference is what the GPU test holds the kernel to), and
// the argument checks of accept_sampled (they throw before any CUDA call).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "accept_sampled_reference.h"
#include "attention_check.h"  // test_rng / seed_note
#include "common/error.h"
#include "engine/kernels/philox.h"
#include "engine/spec/accept_sampled.h"
#include "engine/spec/accept_sampled_rules.h"
#include "sampling_reference.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;
namespace rules = graphdecode::accept_rules;
using rules::u128;

// floor(a b / 2^128) by schoolbook multiplication of 32-bit limbs.
u128 mul_hi_slow(u128 a, u128 b) {
  std::uint32_t x[4], y[4];
  for (int i = 0; i < 4; ++i) {
    x[i] = static_cast<std::uint32_t>(a >> (32 * i));
    y[i] = static_cast<std::uint32_t>(b >> (32 * i));
  }
  std::uint64_t acc[8] = {};
  for (int i = 0; i < 4; ++i) {
    std::uint64_t carry = 0;
    for (int j = 0; j < 4; ++j) {
      const std::uint64_t t = static_cast<std::uint64_t>(x[i]) * y[j] + acc[i + j] + carry;
      acc[i + j] = t & 0xffffffffu;
      carry = t >> 32;
    }
    acc[i + 4] += carry;
  }
  u128 hi = 0;
  for (int i = 7; i >= 4; --i) hi = (hi << 32) | acc[i];
  return hi;
}

TEST(AcceptSampledRules, MulHi128MatchesLongMultiplication) {
  std::mt19937_64 rng(12345);
  auto word = [&] { return (static_cast<u128>(rng()) << 64) | rng(); };
  const u128 ones = ~u128{0};
  EXPECT_TRUE(rules::mul_hi_128(ones, ones) == ones - 1);
  EXPECT_TRUE(rules::mul_hi_128(ones, 1000) == 999);
  EXPECT_TRUE(rules::mul_hi_128(u128{1} << 127, 6) == 3);
  for (int i = 0; i < 20000; ++i) {
    const u128 a = word(), b = i % 2 ? word() >> (rng() % 128) : word();
    ASSERT_TRUE(rules::mul_hi_128(a, b) == mul_hi_slow(a, b)) << "case " << i;
    ASSERT_TRUE(rules::mul_hi_128(a, b) < b || b == 0);
  }
}

TEST(AcceptSampledRules, AcceptTestOnWorkedValues) {
  // u = (w + 1/2) 2^-32 < p / q.
  const std::uint32_t half = 0x80000000u;
  EXPECT_TRUE(rules::accept_draft(1, 2, 1, 1, half - 1));     // u just below 1/2
  EXPECT_FALSE(rules::accept_draft(1, 2, 1, 1, half));        // u just above 1/2
  EXPECT_TRUE(rules::accept_draft(3, 4, 3, 4, 0xffffffffu));  // p = q: always
  EXPECT_TRUE(rules::accept_draft(5, 8, 1, 4, 0xffffffffu));  // p > q: always
  EXPECT_FALSE(rules::accept_draft(0, 8, 1, 4, 0));           // p = 0: never
  // q(x) = 0 (no distribution, or x outside the draft's kept set): judged as a point mass q = 1.
  EXPECT_TRUE(rules::accept_draft(1, 4, 0, 9, 0x3fffffffu));
  EXPECT_FALSE(rules::accept_draft(1, 4, 0, 9, 0x40000000u));
  // p = 1/3 against q = 2/3 accepts half the uniforms.
  EXPECT_TRUE(rules::accept_draft(1, 3, 2, 3, half - 1));
  EXPECT_FALSE(rules::accept_draft(1, 3, 2, 3, half));
  EXPECT_EQ(rules::accept_cap(5, -1), 5);
  EXPECT_EQ(rules::accept_cap(5, 0), 0);
  EXPECT_EQ(rules::accept_cap(5, 3), 3);
  EXPECT_EQ(rules::accept_cap(5, 9), 5);
}

TEST(AcceptSampledRules, ResidualWeightsBalance) {
  // sum_y (mp zq - mq zp) = 0, so the positive parts equal the negative parts: the residual's
  // total is the total-variation distance times zp zq, exactly.
  std::mt19937_64 rng(7);
  for (int t = 0; t < 200; ++t) {
    const int n = 1 + static_cast<int>(rng() % 50);
    std::vector<std::uint64_t> mp(n), mq(n);
    std::uint64_t zp = 0, zq = 0;
    for (int y = 0; y < n; ++y) {
      mp[y] = rng() % 3 ? rng() >> 24 : 0;  // masses up to 2^40
      mq[y] = rng() % 3 ? rng() >> 24 : 0;
      zp += mp[y], zq += mq[y];
    }
    if (zp == 0 || zq == 0) continue;
    u128 pos = 0, neg = 0;
    for (int y = 0; y < n; ++y) {
      pos += rules::residual_weight(mp[y], zp, mq[y], zq);
      neg += rules::residual_weight(mq[y], zq, mp[y], zp);
    }
    ASSERT_TRUE(pos == neg) << "case " << t;
  }
  EXPECT_TRUE(rules::residual_weight(3, 4, 1, 4) == 8);  // 3 * 4 - 1 * 4
  EXPECT_TRUE(rules::residual_weight(1, 4, 3, 4) == 0);
}

// The accept and residual streams use counter word 1 = 1, 2; the sampler's counters have word 1
// = 0: Philox is a bijection of the counter for a key, so their blocks never coincide.
TEST(AcceptSampledRules, StreamsAreNotTheSamplersWords) {
  std::mt19937_64 rng(99);
  for (int t = 0; t < 100; ++t) {
    const std::uint64_t seed = rng(), pos = rng() % 100000;
    const Philox4 a = rules::stream_words(seed, pos, rules::kAcceptStream);
    const Philox4 b = rules::stream_words(seed, pos, rules::kResidualStream);
    for (std::uint32_t g = 0; g < 64; ++g) {
      const Philox4 s = sampling_random(seed, pos, g);
      ASSERT_FALSE(a.v[0] == s.v[0] && a.v[1] == s.v[1] && a.v[2] == s.v[2] && a.v[3] == s.v[3]);
      ASSERT_FALSE(b.v[0] == s.v[0] && b.v[1] == s.v[1] && b.v[2] == s.v[2] && b.v[3] == s.v[3]);
    }
    EXPECT_NE(a.v[0], b.v[0]);
  }
}

TEST(AcceptSampledRules, ChiSquareMachinery) {
  // Exact upper 1e-5 quantiles 19.51, 41.30, 88.60; Wilson-Hilferty errs high (conservative),
  // most at df = 1.
  EXPECT_NEAR(chi_square_critical(1), 19.51, 2.5);
  EXPECT_NEAR(chi_square_critical(10), 41.30, 1.0);
  EXPECT_NEAR(chi_square_critical(39), 88.60, 0.5);
  const std::vector<double> p = {0.5, 0.25, 0.25, 0.0};
  const ChiSquare fair = chi_square({500, 250, 250, 0}, p);
  EXPECT_TRUE(fair.passes()) << fair.describe();
  EXPECT_EQ(fair.df, 2);
  EXPECT_FALSE(chi_square({500, 250, 249, 1}, p).passes());  // a draw outside the support
  EXPECT_FALSE(chi_square({400, 300, 300, 0}, p).passes());
}

// The reference acceptance on the CPU, its drafts and bonus tokens drawn by the sampling
// reference with the engine's counters (draft i and target row i share seed and position): the
// first committed token ~ p_0, the second given a >= 1 ~ p_1, the third given a = 2 ~ p_2; the
// controls (every draft accepted; the residual drawn from p) fail the same test.
struct Config {
  const char* name;
  SampleParams params;
  bool point_drafts;
};

const Config kConfigs[] = {
    {"temperature", {1.f, 0, 1.f}, false},    {"top-k", {0.8f, 12, 1.f}, false},
    {"top-p", {1.f, 0, 0.8f}, false},         {"top-k+top-p", {0.7f, 15, 0.9f}, false},
    {"point drafts", {0.9f, 0, 0.95f}, true},
};

TEST(AcceptSampledReference, LosslessByChiSquare) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  const int vocab = 40, k = 2;
  const long n = sanitize_mode() ? 4000 : 20000;
  for (const Config& cfg : kConfigs) {
    SCOPED_TRACE(cfg.name);
    const LosslessScenario s =
        make_lossless_scenario(rng, vocab, k, cfg.params, cfg.point_drafts, n);
    ASSERT_EQ(s.vocab, vocab) << "no scenario whose controls fail clearly";
    std::vector<std::vector<long>> hist(3, std::vector<long>(vocab, 0));
    std::vector<long> all(vocab, 0), as_p(vocab, 0);
    std::uniform_int_distribution<std::uint64_t> u64;
    for (long r = 0; r < n; ++r) {
      AcceptCase c;
      c.vocab = vocab, c.k = k, c.seed = u64(rng);
      c.first_position = 1 + u64(rng) % 100000;
      c.point_drafts = cfg.point_drafts;
      for (int i = 0; i <= k; ++i) {
        SampleParams sp = cfg.params;
        sp.seed = c.seed, sp.step = c.first_position + i;
        c.target_logits.push_back(s.target[i].data());
        c.target_stats.push_back(s.target_stats[i]);
        c.target_tokens.push_back(reference_sample(s.target[i].data(), vocab, sp).token);
        if (i == k) break;
        c.draft_logits.push_back(s.draft[i].data());
        c.draft_stats.push_back(s.draft_stats[i]);
        c.drafts.push_back(cfg.point_drafts ? s.point_tokens[i]
                                            : reference_sample(s.draft[i].data(), vocab, sp).token);
      }
      const AcceptOutcome o = reference_accept(c);
      ASSERT_EQ(static_cast<int>(o.tokens.size()), o.accepted + 1);
      for (int j = 0; j < static_cast<int>(o.tokens.size()); ++j) ++hist[j][o.tokens[j]];
      ++all[c.drafts[0]];
      // The residual-as-p bug: a rejected first draft replaced by an independent draw from p_0.
      SampleParams indep = cfg.params;
      indep.seed = c.seed ^ 0x9e3779b97f4a7c15ull, indep.step = c.first_position;
      ++as_p[o.accepted >= 1 ? c.drafts[0]
                             : reference_sample(s.target[0].data(), vocab, indep).token];
    }
    for (int j = 0; j <= k; ++j) {
      const ChiSquare t = chi_square(hist[j], s.p[j]);
      EXPECT_TRUE(t.passes()) << "token " << j << ": " << t.describe();
      EXPECT_GT(t.total, j == 0 ? n - 1 : n / 50) << "token " << j << " was rarely reached";
    }
    const ChiSquare c1 = chi_square(all, s.p[0]), c2 = chi_square(as_p, s.p[0]);
    EXPECT_FALSE(c1.passes()) << "accept-all control: " << c1.describe();
    EXPECT_FALSE(c2.passes()) << "residual-as-p control: " << c2.describe();
    std::printf("[ %s: first token %.1f (df %d, critical %.1f); controls %.1f, %.1f ]\n", cfg.name,
                chi_square(hist[0], s.p[0]).stat, chi_square(hist[0], s.p[0]).df,
                chi_square(hist[0], s.p[0]).critical, c1.stat, c2.stat);
  }
}

// ---- argument checks (all refused before any CUDA call) ----------------------------------------

TEST(AcceptSampledArgs, BadArgumentsNameTheField) {
  std::int32_t scalars[16] = {}, ids[8] = {}, pos[8] = {}, aux[12] = {}, out[32] = {}, toks[8] = {};
  float logits[8] = {};
  SamplingRowStats stats[8] = {};
  AcceptSampledArgs good;
  good.verify.scalars = scalars;
  good.verify.token_id = ids;
  good.verify.token_position = pos;
  good.k = 1;
  good.vocab = 4;
  good.target_logits = logits;
  good.target_stats = stats;
  good.target_tokens = toks;
  good.draft_logits = logits;
  good.draft_stats = stats;
  good.draft_rows = 2;
  good.aux = aux;
  good.aux_words = 6;
  good.seed_lo_word = 3, good.seed_hi_word = 4, good.accept_limit_word = 5;
  good.out = out;
  good.stride = 3;
  good.max_rows = 2;
  auto refused = [](const AcceptSampledArgs& a, const std::string& field) {
    try {
      accept_sampled(a, nullptr);
    } catch (const Error& e) {
      return e.field() == field ? ::testing::AssertionSuccess()
                                : ::testing::AssertionFailure() << e.what();
    }
    return ::testing::AssertionFailure() << "accepted";
  };
  auto with = [&](auto change) {
    AcceptSampledArgs a = good;
    change(a);
    return a;
  };
  using A = AcceptSampledArgs&;
  EXPECT_TRUE(refused(with([](A a) { a.k = -1; }), "k"));
  EXPECT_TRUE(refused(with([](A a) { a.k = kMaxAcceptSampledDrafts + 1; }), "k"));
  EXPECT_TRUE(refused(with([](A a) { a.vocab = 0; }), "vocab"));
  EXPECT_TRUE(
      refused(with([](A a) { a.logits_type = static_cast<LogitsType>(7); }), "logits_type"));
  EXPECT_TRUE(refused(with([](A a) { a.verify.token_position = nullptr; }), "verify"));
  EXPECT_TRUE(refused(with([](A a) { a.target_logits = nullptr; }), "target_logits"));
  EXPECT_TRUE(refused(with([](A a) { a.target_stride = 3; }), "target_stride"));
  EXPECT_TRUE(refused(with([](A a) { a.target_stats = nullptr; }), "target_stats"));
  EXPECT_TRUE(refused(with([](A a) { a.target_tokens = nullptr; }), "target_tokens"));
  EXPECT_TRUE(refused(with([](A a) { a.draft_kind = static_cast<DraftKind>(5); }), "draft_kind"));
  EXPECT_TRUE(refused(with([](A a) { a.draft_logits = nullptr; }), "draft_logits"));
  EXPECT_TRUE(refused(with([](A a) { a.draft_stride = 2; }), "draft_stride"));
  EXPECT_TRUE(refused(with([](A a) { a.draft_stats = nullptr; }), "draft_stats"));
  EXPECT_TRUE(refused(with([](A a) { a.draft_rows = 1; }), "draft_rows"));
  EXPECT_TRUE(refused(with([](A a) { a.aux = nullptr; }), "aux"));
  EXPECT_TRUE(refused(with([](A a) { a.aux_words = 0; }), "aux_words"));
  EXPECT_TRUE(refused(with([](A a) { a.seed_lo_word = 6; }), "seed_lo_word"));
  EXPECT_TRUE(refused(with([](A a) { a.seed_hi_word = -1; }), "seed_hi_word"));
  EXPECT_TRUE(refused(with([](A a) { a.aux_words = 5; }), "accept_limit_word"));
  EXPECT_TRUE(refused(with([](A a) { a.out = nullptr; }), "out"));
  EXPECT_TRUE(refused(with([](A a) { a.stride = 2; }), "stride"));
  EXPECT_TRUE(refused(with([](A a) { a.max_rows = 0; }), "max_rows"));
  // Point-mass drafts need no draft rows; k = 0 needs no draft either (both then fail later
  // fields only).
  EXPECT_TRUE(refused(with([](A a) {
                        a.draft_kind = DraftKind::kPointMass;
                        a.draft_logits = nullptr, a.draft_stats = nullptr, a.draft_rows = 0;
                        a.out = nullptr;
                      }),
                      "out"));
  EXPECT_TRUE(refused(with([](A a) {
                        a.k = 0;
                        a.draft_logits = nullptr;
                        a.max_rows = 0;
                      }),
                      "max_rows"));
}

}  // namespace
}  // namespace graphdecode
