// The scalar rules of sampled speculative acceptance (accept_sampled.h), host and device: the
// random words, the accept test and the residual weights. The kernel and the tests' CPU reference
// both call these, so a decision depends only on the masses it is given.
//
// Random words: Philox4x32-10 keyed by the request's seed (philox.h), counter
//   (0, stream, position, position >> 32), position = the absolute position of the token being
//   decided (the same number the sampler uses as its step for that token).
// The sampler's counters are (group, 0, step, step >> 32): their word 1 is always 0, so a word-1
// stream of 1 or 2 can never collide with any token's Gumbel noise, whatever the vocabulary.
//   stream 1 (kAcceptStream): word 0 = the accept test's uniform u = (w + 1/2) 2^-32 in (0, 1);
//   stream 2 (kResidualStream): words 0..3 = a 128-bit integer R (word 0 least significant) that
//     picks the residual token by inverse CDF: the token whose cumulative weight interval holds
//     floor(R W / 2^128), W the total residual weight.
// A position is decided once (it is committed, then never verified again), so each stream's word
// is used at most once per request and position.
#pragma once

#include <cstdint>

#include "common/request_rules.h"
#include "engine/kernels/philox.h"

namespace graphdecode::accept_rules {

using u128 = unsigned __int128;

constexpr std::uint32_t kAcceptStream = 1;
constexpr std::uint32_t kResidualStream = 2;

GD_HD Philox4 stream_words(std::uint64_t seed, std::uint64_t position, std::uint32_t stream) {
  return philox4x32_10(Philox4{{0u, stream, static_cast<std::uint32_t>(position),
                                static_cast<std::uint32_t>(position >> 32)}},
                       static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

// The accept test's uniform word for the token at `position`.
GD_HD std::uint32_t accept_word(std::uint64_t seed, std::uint64_t position) {
  return stream_words(seed, position, kAcceptStream).v[0];
}

// The residual draw's 128-bit integer for the token at `position`.
GD_HD u128 residual_random(std::uint64_t seed, std::uint64_t position) {
  const Philox4 w = stream_words(seed, position, kResidualStream);
  const std::uint64_t lo = (static_cast<std::uint64_t>(w.v[1]) << 32) | w.v[0];
  const std::uint64_t hi = (static_cast<std::uint64_t>(w.v[3]) << 32) | w.v[2];
  return (static_cast<u128>(hi) << 64) | lo;
}

// u = (w + 1/2) 2^-32: exact in double, in (0, 1).
GD_HD double uniform_of(std::uint32_t w) {
  return (static_cast<double>(w) + 0.5) * 0x1p-32;
}

// The accept test of draft x: p(x) = mp / zp, q(x) = mq / zq (integer masses of the filtered
// distributions; a point mass is mass 1 of total 1). Accept with probability min(1, p / q):
// u q < p, in double (correctly rounded on host and device: no fused operations). A draft the
// proposal gives no mass (mq = 0: a proposer without a distribution, or a token outside the
// draft's kept set) is judged as a point mass q = 1, which keeps any proposal lossless.
GD_HD bool accept_draft(std::uint64_t mp, std::uint64_t zp, std::uint64_t mq, std::uint64_t zq,
                        std::uint32_t word) {
  if (mq == 0 || zq == 0) mq = 1, zq = 1;
  if (zp == 0 || mp == 0) return false;
  const double p = static_cast<double>(mp) / static_cast<double>(zp);
  const double q = static_cast<double>(mq) / static_cast<double>(zq);
  return uniform_of(word) * q < p;
}

// Residual weight of token y, proportional to max(0, p(y) - q(y)): mp(y) zq - mq(y) zp when
// positive. Exact: masses <= 2^40 and totals <= 2^22 * 2^40 give products < 2^103, and a row's sum
// < 2^125.
GD_HD u128 residual_weight(std::uint64_t mp, std::uint64_t zp, std::uint64_t mq, std::uint64_t zq) {
  const u128 a = static_cast<u128>(mp) * zq, b = static_cast<u128>(mq) * zp;
  return a > b ? a - b : 0;
}

// floor(a b / 2^128): the inverse-CDF target of a 128-bit uniform a over [0, b). Its error in
// any token's probability is below 2^-128.
GD_HD u128 mul_hi_128(u128 a, u128 b) {
  const std::uint64_t a0 = static_cast<std::uint64_t>(a), a1 = static_cast<std::uint64_t>(a >> 64);
  const std::uint64_t b0 = static_cast<std::uint64_t>(b), b1 = static_cast<std::uint64_t>(b >> 64);
  const u128 p00 = static_cast<u128>(a0) * b0, p01 = static_cast<u128>(a0) * b1;
  const u128 p10 = static_cast<u128>(a1) * b0, p11 = static_cast<u128>(a1) * b1;
  const u128 mid = (p00 >> 64) + static_cast<std::uint64_t>(p01) + static_cast<std::uint64_t>(p10);
  return p11 + (p01 >> 64) + (p10 >> 64) + (mid >> 64);
}

// The number of drafts a request may accept: its limit word (< 0 = all k), at most k.
GD_HD std::int32_t accept_cap(std::int32_t k, std::int32_t limit) {
  return limit < 0 || limit > k ? k : limit;
}

}  // namespace graphdecode::accept_rules
