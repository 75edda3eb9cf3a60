// CPU tests of the host-side helpers of engine/kernels: RoPE inverse frequencies (default, linear,
// Llama 3 scaling against values worked out by hand from HF's _compute_llama3_parameters), their
// validation, the Philox4x32-10 generator against the Random123 known-answer vectors, and the
// float order key used by the top-k / top-p radix select.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/error.h"
#include "engine/kernels/philox.h"
#include "engine/kernels/rope_freqs.h"

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

}  // namespace
}  // namespace graphdecode
