// The scalar definitions of device sampling (sampling.h), host and device: the order key and its
// inverse, the radix bucket of a key, the fixed-point mass, the Gumbel noise and score, the top-p
// target, and the packed (key, index) order that every argmax uses. Every kernel path and the CPU
// reference in the tests call these, so they all mean the same numbers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "engine/kernels/philox.h"

namespace graphdecode::sampling {

// Radix digit of the first histogram level: the top 12 bits of the order key (sign, 8 exponent
// bits, 3 mantissa bits: 8 buckets per octave). Why 12: a bucket of N(0, 1) logits (the synthetic
// models' near-flat rows) holds at most ~3% of the vocabulary, so the boundary buckets fit the
// candidate list, while 4096 bins of two u32 arrays still fit 32 KB of shared memory per CTA.
constexpr int kDigitBits = 12;
constexpr int kBuckets = 1 << kDigitBits;
constexpr float kMassScale = 1099511627776.f;  // 2^40: fixed-point probability (mass <= 1)

// gumbel_of() spans [-2.82, 22.88] (u from 2^-33 to 1 - 2^-24): a token whose (l - max) / T is
// below -kGumbelSpan scores below the top token, which every kept set holds, so it can be skipped
// without changing the draw.
constexpr float kGumbelSpan = 26.f;

GD_PHILOX_HD float float_of_bits(std::uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
#endif
}

GD_PHILOX_HD std::uint32_t bits_of_float(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
#endif
}

GD_PHILOX_HD std::uint32_t key_of(float v) {
  return float_order_key(bits_of_float(v));
}

// Inverse of float_order_key (the key of -0 comes back as +0).
GD_PHILOX_HD float key_to_float(std::uint32_t key) {
  return float_of_bits((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

GD_PHILOX_HD std::uint32_t bucket_of(std::uint32_t key) {
  return key >> (32 - kDigitBits);
}

// The largest finite value of bucket b (its top key, clamped to [-FLT_MAX, FLT_MAX]): the common
// reference the approximate bucket masses are expressed against.
GD_PHILOX_HD float bucket_top_value(std::uint32_t b) {
  constexpr std::uint32_t kLowest = 0x00800000u;   // key of -FLT_MAX
  constexpr std::uint32_t kHighest = 0xff7fffffu;  // key of +FLT_MAX
  std::uint32_t k = (b << (32 - kDigitBits)) | ((1u << (32 - kDigitBits)) - 1u);
  k = k < kLowest ? kLowest : (k > kHighest ? kHighest : k);
  return key_to_float(k);
}

// floor(exp(x) * 2^40) for x = (l - max) / T <= 0; 0 for NaN.
GD_PHILOX_HD std::uint64_t mass_of_x(float x) {
  const float e = expf(x) * kMassScale;  // exact scaling by a power of two
  if (!(e > 0.f)) return 0;
#if defined(__CUDA_ARCH__)
  return __float2ull_rz(e);
#else
  return static_cast<std::uint64_t>(e);
#endif
}

// The scaled logit x = (l - max) / T that masses and the pruning test use (a separate multiply:
// never fused, so host and device agree).
GD_PHILOX_HD float scaled_logit(float v, float top, float inv_t) {
  return (v - top) * inv_t;
}

GD_PHILOX_HD std::uint64_t mass_of(float v, float top, float inv_t) {
  return mass_of_x(scaled_logit(v, top, inv_t));
}

// uint32 -> float rounded toward zero (the device's __uint2float_rz on the host).
GD_PHILOX_HD float uint_to_float_rz(std::uint32_t r) {
#if defined(__CUDA_ARCH__)
  return __uint2float_rz(r);
#else
  if (r >= (1u << 24)) {
    int width = 0;
    for (std::uint32_t t = r; t != 0; t >>= 1) ++width;
    r &= ~((1u << (width - 24)) - 1u);  // keep the top 24 significant bits: exact below
  }
  return static_cast<float>(r);
#endif
}

// Gumbel noise from one random word: u = (r + 1/2) 2^-32 in (0, 1) (r rounded toward zero, so u
// never reaches 1), E = -log1p(-u) exponential(1) with full precision near 0, G = -log(E).
GD_PHILOX_HD float gumbel_of(std::uint32_t r) {
  const float u = fmaf(uint_to_float_rz(r), 2.3283064365386963e-10f, 1.1641532182693481e-10f);
  return -logf(-log1pf(-fminf(u, 0.99999994f)));
}

// The Gumbel-max score of logit v: (v - max) / T + G, one fused multiply-add on host and device.
GD_PHILOX_HD float score_of(float v, float top, float inv_t, std::uint32_t r) {
  return fmaf(v - top, inv_t, gumbel_of(r));
}

// The top-p target for a top-k set of integer mass `total`: token i is kept when the mass of
// strictly larger logits is < the target; ceil(p * total) clamped to [1, total].
GD_PHILOX_HD std::uint64_t top_p_target(float p, std::uint64_t total) {
  const double want = static_cast<double>(p) * static_cast<double>(total);
  std::uint64_t rem = 1;
  if (want >= static_cast<double>(total))
    rem = total;
  else if (want > 0.0)
    rem = static_cast<std::uint64_t>(ceil(want));
  if (rem > total) rem = total;
  return rem == 0 ? 1 : rem;
}

// (key, index) packed so that the unsigned maximum is the largest key, lowest index on ties; 0 is
// "none" (every key of a non-NaN float is > 0).
GD_PHILOX_HD std::uint64_t pack_max(std::uint32_t key, std::uint32_t index) {
  return (static_cast<std::uint64_t>(key) << 32) | (0xffffffffu - index);
}
GD_PHILOX_HD std::uint32_t packed_index(std::uint64_t p) {
  return 0xffffffffu - static_cast<std::uint32_t>(p);
}
GD_PHILOX_HD std::uint32_t packed_key(std::uint64_t p) {
  return static_cast<std::uint32_t>(p >> 32);
}

// Top-k and top-p switches of a sampled row (sampling.h).
GD_PHILOX_HD bool top_k_on(std::int32_t k, std::int32_t vocab) {
  return k > 0 && k < vocab;
}
GD_PHILOX_HD bool top_p_on(float p) {
  return p < 1.f;
}

}  // namespace graphdecode::sampling
