// CPU reference of sampled speculative acceptance (engine/spec/accept_sampled.h) in double
// precision, with the same Philox words (engine/spec/accept_sampled_rules.h), and the chi-square
// machinery of the losslessness tests.
//
// Masses are exp(x) 2^40 in double (x = the float scaled logit the device uses), so they differ
// from the device's floor(expf(x) 2^40) by a few 1e-7 relative. A decision whose uniform lies
// within that error of p / q, or a residual target within it of a cumulative boundary, is
// ambiguous: given the device's output the reference follows the device there and accepts any
// token the error allows; it counts them (tests bound how often).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/kernels/sampling.h"
#include "sampling_reference.h"

namespace graphdecode::testing {

// The row stats the sampling reference implies (a point mass for greedy rows; Z rounded from
// double masses). False when a token's membership depends on rounding (a kBoundary verdict).
bool reference_row_stats(const float* logits, int vocab, const SampleParams& p,
                         SamplingRowStats& out);

// p(y) of every token of a row under `stats`, in double (the point mass when point_token >= 0).
std::vector<double> reference_distribution(const float* logits, int vocab,
                                           const SamplingRowStats& stats);

// One request of a speculative step, as the kernel sees it.
struct AcceptCase {
  int vocab = 0, k = 0;
  int limit = -1;                              // accept limit word (< 0 = all)
  std::uint64_t seed = 0;                      // the request's seed
  std::uint64_t first_position = 0;            // position of the token decided after verify row 0
  std::vector<int> drafts;                     // [k] d_1 .. d_k
  std::vector<const float*> target_logits;     // [k + 1]
  std::vector<SamplingRowStats> target_stats;  // [k + 1]
  std::vector<int> target_tokens;              // [k + 1] the target sampler's tokens
  bool point_drafts = false;                   // DraftKind::kPointMass
  std::vector<const float*> draft_logits;      // [k] (unused with point drafts)
  std::vector<SamplingRowStats> draft_stats;   // [k]
};

struct AcceptOutcome {
  std::vector<int> tokens;  // committed: d_1 .. d_a, then the last token
  int accepted = 0;         // a
  bool rejected = false;    // stopped at a rejection (else every allowed draft was accepted)
  int ambiguous = 0;        // decisions host / device rounding could flip
  bool ok = true;           // with a device row: it agrees with the reference
  std::string why;
};

// The reference acceptance of one request. `device` (its out row: count, tokens), when given, is
// checked: exact where the decision is clear, followed where it is ambiguous.
AcceptOutcome reference_accept(const AcceptCase& c, const std::int32_t* device = nullptr);

// Tolerances (probability units): device masses are within ~5e-7 relative of exp(x) 2^40, plus
// one unit of 2^-40 of flooring per token.
constexpr double kRatioRelTol = 4e-6;
constexpr double kResidualTol = 5e-6;

// Pearson's chi-square of observed counts against probabilities p (same length). Tokens with
// p = 0 must never be observed (`impossible` counts them); tokens whose expected count is < 5
// are pooled (into the smallest bin when the pool stays < 5). `critical` is the upper 1e-5
// quantile for `df` degrees of freedom (Wilson-Hilferty).
struct ChiSquare {
  double stat = 0.0, critical = 0.0;
  int df = 0;
  long total = 0, impossible = 0;
  // No draw outside the support, and the statistic within the critical value (df = 0: a single
  // bin, nothing to test beyond the support).
  bool passes() const { return impossible == 0 && (df < 1 || stat <= critical); }
  std::string describe() const;
};
ChiSquare chi_square(const std::vector<long>& observed, const std::vector<double>& p);
double chi_square_critical(int df);  // upper 1e-5 quantile
// Expected chi-square of `observed ~ q` tested against p with n draws (the non-centrality plus
// df): how strongly a wrong distribution q fails the test.
double chi_square_expected(const std::vector<double>& q, const std::vector<double>& p, long n);

// A losslessness scenario: one request's parameters, fixed target rows p_0 .. p_k and draft rows
// q_0 .. q_{k-1} (the target's plus noise, so acceptance is partial), or fixed point-mass drafts
// (each p_i's most likely token), each accepted with probability >= 0.25 (later tokens are reached
// often). Redrawn until both controls below would fail a
// chi-square test of n draws by a wide margin (expected statistic >= 4 x the critical value):
// accepting every draft (the first token ~ q_0), and drawing the residual from p instead of
// max(0, p - q).
struct LosslessScenario {
  int vocab = 0, k = 0;
  SampleParams params;  // seed and step unset
  bool point_drafts = false;
  std::vector<std::vector<float>> target, draft;            // [k + 1][vocab], [k][vocab]
  std::vector<SamplingRowStats> target_stats, draft_stats;  // the reference's stats
  std::vector<int> point_tokens;                            // [k] with point drafts
  std::vector<std::vector<double>> p;                       // [k + 1] target distributions
  std::vector<double> accept_all, residual_as_p;            // first-token laws of the controls
};
LosslessScenario make_lossless_scenario(std::mt19937_64& rng, int vocab, int k,
                                        const SampleParams& params, bool point_drafts, long n);

}  // namespace graphdecode::testing
