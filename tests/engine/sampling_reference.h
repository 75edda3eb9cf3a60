// CPU reference of device sampling (engine/kernels/sampling.h): the definition computed the plain
// way (sort, prefix sums, score every kept token), with the scalar pieces of sampling_math.h.
//
// The device's expf, logf and log1pf may differ from the host's by a few ulp, so the reference
// carries intervals: every integer mass as [floor(e (1 - d) 2^40), floor(e (1 + d) 2^40)] with d
// above the combined ulp error; a token is kIn when it is kept for every mass in the intervals,
// kOut when for none, kBoundary otherwise. The expected token is the best-scoring kIn token; the
// case is `ambiguous` (any kIn or kBoundary token is then accepted) when a kBoundary token or a
// second kIn token scores within kScoreTolerance of it.
#pragma once

#include <cstdint>
#include <vector>

namespace graphdecode::testing {

struct SampleParams {
  float temperature = 0.f;
  std::int32_t top_k = 0;
  float top_p = 1.f;
  std::uint64_t seed = 0, step = 0;
};

enum class Verdict : std::uint8_t { kOut = 0, kIn = 1, kBoundary = 2 };

struct Expected {
  int token = 0;                 // the reference token
  bool ambiguous = false;        // host / device rounding could change the token
  bool greedy = false;           // decided as argmax (T <= 0, or a non-finite max or 1 / T)
  int kept = 0;                  // kIn tokens
  std::vector<Verdict> verdict;  // per token (empty for greedy rows)

  // Whether the device's token agrees with the reference.
  bool accepts(int device_token) const;
};

constexpr double kMassUlpSlack = 5e-7;  // device expf <= 2 ulp, host <= 1 ulp: 3 x 2^-23 < 5e-7
constexpr float kScoreTolerance =
    1e-4f;  // host vs device logf / log1pf on scores of magnitude <= 30

Expected reference_sample(const float* logits, int vocab, const SampleParams& p);

}  // namespace graphdecode::testing
