// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
// counter-based generator behind device sampling. Pure function of (counter, key): the same
// request seed and step give the same numbers on any row of any batch, on the host and the device.
#pragma once

#include <array>
#include <cstdint>

#if defined(__CUDACC__)
#define GD_PHILOX_HD __host__ __device__ __forceinline__
#else
#define GD_PHILOX_HD inline
#endif

namespace graphdecode {

struct Philox4 {
  std::uint32_t v[4];
};

GD_PHILOX_HD std::uint32_t philox_mulhi(std::uint32_t a, std::uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<std::uint32_t>((static_cast<std::uint64_t>(a) * b) >> 32);
#endif
}

// Philox4x32 with 10 rounds: counter c[4], key k[2].
GD_PHILOX_HD Philox4 philox4x32_10(Philox4 c, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const std::uint32_t hi0 = philox_mulhi(kM0, c.v[0]), lo0 = kM0 * c.v[0];
    const std::uint32_t hi1 = philox_mulhi(kM1, c.v[2]), lo1 = kM1 * c.v[2];
    c = Philox4{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
  }
  return c;
}

// The four random words of sampling group `group` (vocab indices 4 * group .. 4 * group + 3) for a
// request's (seed, step): key = seed, counter = (group, 0, step).
GD_PHILOX_HD Philox4 sampling_random(std::uint64_t seed, std::uint64_t step, std::uint32_t group) {
  return philox4x32_10(Philox4{{group, 0u, static_cast<std::uint32_t>(step),
                                static_cast<std::uint32_t>(step >> 32)}},
                       static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

// Monotone map of a float to uint32 (a < b  <=>  key(a) < key(b) for non-NaN floats; -0 and +0
// share a key). Top-k and top-p thresholds are keys.
GD_PHILOX_HD std::uint32_t float_order_key(std::uint32_t bits) {
  if (bits == 0x80000000u) bits = 0u;  // -0 -> +0
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

}  // namespace graphdecode
