// CPU tests of the host-side helpers of engine/kernels: RoPE inverse frequencies (default, linear,
// Llama 3 scaling against values worked out by hand from HF's _compute_llama3_parameters), their
// validation, the Philox4x32-10 generator against the Random123 known-answer vectors, the float
// order key used by the top-k / top-p radix select, the scalar definitions of sampling_math.h, and
// the CPU sampling reference (sampling_reference.h) on hand-worked rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "common/error.h"
#include "engine/kernels/philox.h"
#include "engine/kernels/rope_freqs.h"
#include "engine/kernels/sampling_math.h"
#include "sampling_reference.h"

namespace graphdecode {
namespace {

TEST(RopeInvFreq, DefaultMatchesClosedForm) {
  RopeConfig c;
  c.head_dim = 64;
  c.theta = 10000.0;
  const std::vector<double> inv = rope_inv_freq(c);
  ASSERT_EQ(inv.size(), 32u);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_NEAR(inv[1], 0.7498942093324559, 1e-15);     // 10000^(-2/64)
  EXPECT_NEAR(inv[16], 0.01, 1e-15);                  // 10000^(-32/64)
  EXPECT_NEAR(inv[31], 1.333521432163324e-4, 1e-17);  // 10000^(-62/64)
  for (std::size_t i = 1; i < inv.size(); ++i) EXPECT_LT(inv[i], inv[i - 1]);
}

TEST(RopeInvFreq, LinearDividesByFactor) {
  RopeConfig c;
  c.head_dim = 128;
  c.theta = 10000.0;
  const std::vector<double> base = rope_inv_freq(c);
  c.scaling.type = RopeScalingType::kLinear;
  c.scaling.factor = 4.0;
  const std::vector<double> lin = rope_inv_freq(c);
  for (std::size_t i = 0; i < base.size(); ++i) EXPECT_DOUBLE_EQ(lin[i], base[i] / 4.0);
}

// Llama 3.1 8B: theta 500000, head_dim 128, factor 8, low 1, high 4, original 8192. Then
// low_freq_wavelen = 8192, high_freq_wavelen = 2048 and wavelen_i = 2 pi 500000^(i / 64):
//   i <= 28: wavelen <= 1956.5 < 2048      -> unchanged
//   i = 29..34: 2401.7 .. 6695.1            -> smoothed
//   i >= 35: wavelen >= 8218.7 > 8192       -> divided by 8
// i = 30 by hand: inv = 500000^(-60/128) = 0.0021311195, wavelen = 2948.3026,
//   s = (8192 / 2948.3026 - 1) / 3 = 0.59285, inv * ((1 - s) / 8 + s) = 0.0013718936.
TEST(RopeInvFreq, Llama3ScalingMatchesHandComputedValues) {
  RopeConfig c;
  c.head_dim = 128;
  c.theta = 500000.0;
  c.scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 8192};
  const std::vector<double> inv = rope_inv_freq(c);
  ASSERT_EQ(inv.size(), 64u);
  const struct {
    int i;
    double want;
  } cases[] = {
      {0, 1.0},
      {20, 0.016560440080994446},    // high frequency: unchanged
      {28, 0.0032114459947525913},   // last unchanged
      {29, 0.002166570763503359},    // first smoothed
      {30, 0.0013718935677611381},   // smoothed (worked above)
      {34, 0.00017850781276799638},  // last smoothed
      {35, 9.556212353964683e-05},   // first divided: 0.0007644969883171747 / 8
      {63, 3.068925988914511e-07},   // 2.455140791131609e-06 / 8
  };
  for (const auto& k : cases) EXPECT_NEAR(inv[k.i], k.want, 1e-12 * k.want) << "i = " << k.i;
  // The smoothed band is monotone and lies between the two unscaled bounds.
  for (int i = 29; i <= 34; ++i) {
    const double raw = 1.0 / std::pow(500000.0, i / 64.0);
    EXPECT_LT(inv[i], raw);
    EXPECT_GT(inv[i], raw / 8.0);
    EXPECT_LT(inv[i], inv[i - 1]);
  }
}

template <typename F>
::testing::AssertionResult refuses(F&& f, const std::string& field) {
  try {
    f();
  } catch (const Error& e) {
    if (e.field() == field) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "field() is '" << e.field() << "': " << e.what();
  }
  return ::testing::AssertionFailure() << "accepted";
}

TEST(RopeInvFreq, BadConfigNamesTheField) {
  RopeConfig c;
  c.head_dim = 96;
  EXPECT_TRUE(refuses([&] { rope_inv_freq(c); }, "head_dim"));
  c = {};
  c.theta = 0.5;
  EXPECT_TRUE(refuses([&] { rope_inv_freq(c); }, "theta"));
  c = {};
  c.scaling = {RopeScalingType::kLinear, 0.0};
  EXPECT_TRUE(refuses([&] { rope_inv_freq(c); }, "scaling.factor"));
  c = {};
  c.scaling = {RopeScalingType::kLlama3, 8.0, 4.0, 4.0, 8192};
  EXPECT_TRUE(refuses([&] { rope_inv_freq(c); }, "scaling.high_freq_factor"));
  c.scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 0};
  EXPECT_TRUE(refuses([&] { rope_inv_freq(c); }, "scaling.original_max_position_embeddings"));
  c.scaling = {static_cast<RopeScalingType>(7)};
  EXPECT_TRUE(refuses([&] { rope_inv_freq(c); }, "scaling.type"));
}

// Random123's kat_vectors for philox4x32 with 10 rounds.
TEST(Philox, KnownAnswerVectors) {
  const struct {
    Philox4 ctr;
    std::uint32_t k0, k1;
    Philox4 want;
  } kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       0xffffffffu,
       0xffffffffu,
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       0xa4093822u,
       0x299f31d0u,
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const auto& k : kats) {
    const Philox4 got = philox4x32_10(k.ctr, k.k0, k.k1);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(got.v[j], k.want.v[j]) << "word " << j;
  }
}

TEST(Philox, SamplingStreamDependsOnSeedStepAndGroupOnly) {
  const Philox4 a = sampling_random(42, 7, 3);
  const Philox4 b = sampling_random(42, 7, 3);
  const Philox4 c = sampling_random(42, 8, 3);
  const Philox4 d = sampling_random(43, 7, 3);
  const Philox4 e = sampling_random(42, 7, 4);
  const Philox4 f = sampling_random(42 + (1ull << 32), 7, 3);  // high seed word matters
  const Philox4 g = sampling_random(42, 7 + (1ull << 32), 3);  // high step word matters
  EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0);
  for (const Philox4* o : {&c, &d, &e, &f, &g}) EXPECT_NE(std::memcmp(&a, o, sizeof a), 0);
}

std::uint32_t bits_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

TEST(FloatOrderKey, MonotoneAndZeroesEqual) {
  EXPECT_EQ(float_order_key(bits_of(0.f)), float_order_key(bits_of(-0.f)));
  std::mt19937_64 rng(1234);
  std::uniform_real_distribution<float> u(-1e4f, 1e4f);
  std::vector<float> v = {-std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::denorm_min(),
                          0.f,
                          -1.f,
                          1.f};
  for (int i = 0; i < 2000; ++i) v.push_back(u(rng));
  for (float a : v)
    for (int j = 0; j < 20; ++j) {
      const float b = v[(static_cast<std::size_t>(j) * 7919 + 13) % v.size()];
      const std::uint32_t ka = float_order_key(bits_of(a)), kb = float_order_key(bits_of(b));
      EXPECT_EQ(a < b, ka < kb) << a << " vs " << b;
      EXPECT_EQ(a == b, ka == kb) << a << " vs " << b;
    }
}

// ---- sampling_math.h -------------------------------------------------------------------------

using namespace graphdecode::sampling;

std::vector<float> special_and_random_floats(std::size_t n, std::uint64_t seed) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.f,
                          -0.f,
                          1.f,
                          -1.f,
                          kInf,
                          -kInf,
                          std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(),
                          1e-30f,
                          -3.5e12f};
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint32_t> bits;
  while (v.size() < n) {
    const float f = [&] {
      const std::uint32_t b = bits(rng);
      float x;
      std::memcpy(&x, &b, sizeof x);
      return x;
    }();
    if (f == f) v.push_back(f);
  }
  return v;
}

TEST(SamplingMath, KeyToFloatInvertsTheOrderKey) {
  for (float x : special_and_random_floats(5000, 7)) {
    const float back = key_to_float(key_of(x));
    if (x == 0.f) {
      EXPECT_EQ(bits_of(back), 0u) << "zeros come back as +0";
    } else {
      EXPECT_EQ(bits_of(back), bits_of(x)) << x;
    }
  }
}

TEST(SamplingMath, BucketTopValueBoundsItsBucket) {
  for (float x : special_and_random_floats(5000, 8)) {
    if (std::isinf(x)) continue;
    const std::uint32_t b = bucket_of(key_of(x));
    const float top = bucket_top_value(b);
    EXPECT_GE(top, x) << x;
    if (top != 0.f) EXPECT_EQ(bucket_of(key_of(top)), b) << x;  // -0 has +0's key
    if (b + 1 < static_cast<std::uint32_t>(kBuckets) && std::isfinite(bucket_top_value(b + 1)) &&
        bucket_of(key_of(bucket_top_value(b + 1))) == b + 1)
      EXPECT_LT(top, bucket_top_value(b + 1));
  }
  EXPECT_TRUE(std::isfinite(bucket_top_value(0)));
  EXPECT_TRUE(std::isfinite(bucket_top_value(kBuckets - 1)));
  // 8 buckets per octave: [1, 1.125) is one bucket.
  EXPECT_EQ(bucket_top_value(bucket_of(key_of(1.f))), std::nextafter(1.125f, 0.f));
  EXPECT_EQ(bucket_of(key_of(1.125f)), bucket_of(key_of(1.f)) + 1);
  EXPECT_EQ(bucket_top_value(bucket_of(key_of(-1.f))), -1.f);
}

TEST(SamplingMath, TopPTarget) {
  EXPECT_EQ(top_p_target(0.5f, 0), 1u);
  EXPECT_EQ(top_p_target(0.f, 1000), 1u);
  EXPECT_EQ(top_p_target(-2.f, 1000), 1u);
  EXPECT_EQ(top_p_target(0.5f, 10), 5u);
  EXPECT_EQ(top_p_target(0.5f, 11), 6u);  // ceil(5.5)
  EXPECT_EQ(top_p_target(2.f, 11), 11u);  // clamped to the total
  const std::uint64_t big = std::uint64_t{1} << 40;
  EXPECT_LT(top_p_target(std::nextafter(1.f, 0.f), big), big);
  std::mt19937_64 rng(9);
  std::uniform_int_distribution<std::uint64_t> tot(1, std::uint64_t{1} << 62);
  for (int i = 0; i < 1000; ++i) {
    const std::uint64_t a = tot(rng), b = tot(rng);
    EXPECT_LE(top_p_target(0.95f, std::min(a, b)), top_p_target(0.95f, std::max(a, b)));
    const std::uint64_t r = top_p_target(0.95f, a);
    EXPECT_GE(r, 1u);
    EXPECT_LE(r, a);
  }
}

TEST(SamplingMath, UintToFloatRoundsTowardZero) {
  EXPECT_EQ(uint_to_float_rz(0), 0.f);
  EXPECT_EQ(uint_to_float_rz(16777215u), 16777215.f);
  EXPECT_EQ(uint_to_float_rz(16777219u), 16777218.f);  // nearest would give 16777220
  EXPECT_EQ(uint_to_float_rz(0xffffffffu), 4294967040.f);
  std::mt19937_64 rng(10);
  std::uniform_int_distribution<std::uint32_t> u;
  for (int i = 0; i < 10000; ++i) {
    const std::uint32_t r = u(rng);
    const float f = uint_to_float_rz(r);
    EXPECT_LE(static_cast<double>(f), static_cast<double>(r));
    EXPECT_GT(static_cast<double>(std::nextafter(f, INFINITY)), static_cast<double>(r));
  }
}

TEST(SamplingMath, GumbelSpanFitsThePruningBound) {
  const float hi = gumbel_of(0), lo = gumbel_of(0xffffffffu);
  EXPECT_NEAR(hi, 22.87f, 0.01f);
  EXPECT_NEAR(lo, -2.81f, 0.01f);
  EXPECT_LT(hi - lo + 0.1f, kGumbelSpan);
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<std::uint32_t> u;
  for (int i = 0; i < 10000; ++i) {
    const std::uint32_t a = u(rng), b = u(rng);
    const float ga = gumbel_of(a);
    EXPECT_GE(ga, lo);
    EXPECT_LE(ga, hi);
    if (a < b) EXPECT_GE(ga, gumbel_of(b));  // decreasing in the random word
  }
}

TEST(SamplingMath, FixedPointMass) {
  EXPECT_EQ(mass_of_x(0.f), std::uint64_t{1} << 40);
  EXPECT_EQ(mass_of_x(-std::numeric_limits<float>::infinity()), 0u);
  EXPECT_EQ(mass_of_x(std::numeric_limits<float>::quiet_NaN()), 0u);
  EXPECT_EQ(mass_of_x(-30.f), 0u);  // exp(-30) 2^40 = 0.1
  EXPECT_GT(mass_of_x(-27.f), 0u);
  EXPECT_NEAR(static_cast<double>(mass_of_x(-1.f)), std::exp(-1.0) * 1099511627776.0, 1e6);
  EXPECT_EQ(mass_of(2.f, 2.f, 5.f), std::uint64_t{1} << 40);
}

TEST(SamplingMath, PackedMaxPrefersLargerKeyThenLowerIndex) {
  EXPECT_GT(pack_max(5, 100), pack_max(4, 0));
  EXPECT_GT(pack_max(5, 3), pack_max(5, 4));
  EXPECT_GT(pack_max(key_of(-std::numeric_limits<float>::infinity()), 0x3fffff), 0u);
  EXPECT_EQ(packed_index(pack_max(77, 12345)), 12345u);
  EXPECT_EQ(packed_key(pack_max(77, 12345)), 77u);
}

// ---- the CPU reference ------------------------------------------------------------------------

using testing::Expected;
using testing::reference_sample;
using testing::SampleParams;
using testing::Verdict;

std::vector<int> kept_of(const Expected& e) {
  std::vector<int> k;
  for (std::size_t i = 0; i < e.verdict.size(); ++i)
    if (e.verdict[i] == Verdict::kIn) k.push_back(static_cast<int>(i));
  return k;
}

TEST(SamplingReference, GreedyAndDegenerateRowsTakeTheArgmax) {
  const std::vector<float> l = {1.f, 3.f, 2.f, 3.f, 0.f};
  for (float t : {0.f, -1.f, std::numeric_limits<float>::quiet_NaN(), 1e-39f}) {
    const Expected e = reference_sample(l.data(), 5, {t, 0, 1.f, 1, 2});
    EXPECT_TRUE(e.greedy) << t;
    EXPECT_EQ(e.token, 1) << t;  // lowest index among the tied maxima
  }
  const std::vector<float> inf = {1.f, std::numeric_limits<float>::infinity(), 2.f};
  const Expected e = reference_sample(inf.data(), 3, {1.f, 0, 1.f, 1, 2});
  EXPECT_TRUE(e.greedy);
  EXPECT_EQ(e.token, 1);
}

TEST(SamplingReference, TopKKeepsEveryTieAtTheKthValue) {
  const std::vector<float> l = {0.f, 1.f, 1.f, 1.f, 2.f};
  EXPECT_EQ(kept_of(reference_sample(l.data(), 5, {1.f, 1, 1.f})), (std::vector<int>{4}));
  EXPECT_EQ(kept_of(reference_sample(l.data(), 5, {1.f, 2, 1.f})), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(kept_of(reference_sample(l.data(), 5, {1.f, 4, 1.f})), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(kept_of(reference_sample(l.data(), 5, {1.f, 5, 1.f})).size(), 5u);  // k >= vocab: off
  EXPECT_EQ(kept_of(reference_sample(l.data(), 5, {1.f, 0, 1.f})).size(), 5u);
}

TEST(SamplingReference, TopPKeepsTheSmallestPrefixReachingP) {
  // Masses relative to the max: 1/4, 1/2, 1 (Z = 1.75).
  const std::vector<float> l = {0.f, std::log(2.f), std::log(4.f)};
  EXPECT_EQ(kept_of(reference_sample(l.data(), 3, {1.f, 0, 0.5f})), (std::vector<int>{2}));
  EXPECT_EQ(kept_of(reference_sample(l.data(), 3, {1.f, 0, 0.6f})), (std::vector<int>{1, 2}));
  EXPECT_EQ(kept_of(reference_sample(l.data(), 3, {1.f, 0, 0.9f})), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(kept_of(reference_sample(l.data(), 3, {1.f, 0, 1e-6f})), (std::vector<int>{2}));
  // Top-p applies to the top-k set: with k = 2, Z = 1.5 and p = 0.6 keeps the top token only.
  EXPECT_EQ(kept_of(reference_sample(l.data(), 3, {1.f, 2, 0.6f})), (std::vector<int>{2}));
  // Ties at the boundary are all kept.
  const std::vector<float> t = {1.f, 1.f, 1.f, 5.f};
  const Expected e = reference_sample(t.data(), 4, {100.f, 0, 0.3f});
  EXPECT_EQ(kept_of(e), (std::vector<int>{0, 1, 2, 3}));
}

// Against the old double-precision allowed set: the reference's kIn tokens are inside it, its kOut
// tokens outside, on random rows with plateaus.
TEST(SamplingReference, AgreesWithADoublePrecisionAllowedSet) {
  std::mt19937_64 rng(12);
  std::normal_distribution<float> n(0.f, 2.f);
  const SampleParams cases[] = {
      {1.f, 0, 0.9f}, {0.7f, 20, 1.f}, {1.3f, 50, 0.8f}, {0.5f, 0, 0.3f}, {2.f, 5, 0.99f}};
  for (int rep = 0; rep < 20; ++rep) {
    const int vocab = 500;
    std::vector<float> l(vocab);
    for (float& x : l) x = n(rng);
    if (rep % 3 == 0)
      for (int i = 0; i < vocab; i += 9) l[i] = 1.5f;
    for (const SampleParams& p : cases) {
      const Expected e = reference_sample(l.data(), vocab, p);
      std::vector<int> order(vocab);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
      const double kth = p.top_k > 0 ? l[order[p.top_k - 1]] : -INFINITY;
      const double lmax = l[order[0]];
      double z = 0;
      for (float x : l)
        if (x >= kth) z += std::exp((x - lmax) / p.temperature);
      for (int i = 0; i < vocab; ++i) {
        double above = 0;
        for (float x : l)
          if (x > l[i] && x >= kth) above += std::exp((x - lmax) / p.temperature);
        const bool in_k = l[i] >= kth;
        const double frac = above / z;
        if (!in_k || frac > p.top_p + 1e-6) EXPECT_EQ(e.verdict[i], Verdict::kOut) << i;
        if (in_k && frac < p.top_p - 1e-6) EXPECT_EQ(e.verdict[i], Verdict::kIn) << i;
      }
      EXPECT_TRUE(e.verdict[e.token] == Verdict::kIn);
    }
  }
}

TEST(SamplingReference, DrawsMoveWithTheStepAndStayInTheKeptSet) {
  std::vector<float> l(1000, 0.f);
  std::set<int> seen;
  for (std::uint64_t step = 0; step < 64; ++step) {
    const Expected e = reference_sample(l.data(), 1000, {1.f, 0, 1.f, 12345, step});
    seen.insert(e.token);
    const Expected again = reference_sample(l.data(), 1000, {1.f, 0, 1.f, 12345, step});
    EXPECT_EQ(e.token, again.token);
  }
  EXPECT_GE(seen.size(), 40u);
  std::mt19937_64 rng(13);
  std::normal_distribution<float> n(0.f, 1.f);
  for (float& x : l) x = n(rng);
  for (std::uint64_t step = 0; step < 64; ++step) {
    const Expected e = reference_sample(l.data(), 1000, {0.8f, 30, 0.9f, 99, step});
    EXPECT_EQ(e.verdict[e.token], Verdict::kIn);
    EXPECT_LE(e.kept, 30);
  }
}

}  // namespace
}  // namespace graphdecode
