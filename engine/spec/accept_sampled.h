// Sampled acceptance of a speculative step on the device: standard speculative rejection sampling
// (Leviathan et al. 2023, Chen et al. 2023) over the filtered distributions of the sampler
// (engine/kernels/sampling.h), so every committed token has the target's distribution.
//
// Per live request r (verify rows r(k+1) .. r(k+1) + k, drafts d_1 .. d_k in the verify block's
// token ids of rows r(k+1) + 1 ..), with c = its accept cap (accept_rules::accept_cap of its limit
// word), for i = 0 .. c - 1 and x = d_{i+1}:
//   p_i = the target's filtered distribution of verify row r(k+1) + i (its SamplingRowStats and
//         logits: p_i(x) = mass(x) / Z over the kept set, 0 outside it; a point mass for greedy);
//   q_i = the draft's distribution of draft row i (its stats and logits), or a point mass at x
//         when the proposer has none (DraftKind::kPointMass: prompt lookup) or gives x no mass;
//   accept x with probability min(1, p_i(x) / q_i(x)) (accept_rules::accept_draft, the uniform of
//   the token's position); on the first rejection commit a token drawn from
//   normalize(max(0, p_i - q_i)) (exact integer weights, inverse CDF in index order with a 128-bit
//   uniform; a point-mass p_i commits its token) and stop.
// If all c drafts are accepted, the last token is the target's own sample of row r(k+1) + c, an
// exact draw from p_c: the sampler's Gumbel noise of that position is shared only by draft d_{c+1}
// (the engine's draft and target samplers use the same seed and position), which is then not
// committed, and the accept / residual words come from other Philox streams
// (accept_sampled_rules.h). A greedy request (point masses on both sides) commits exactly what
// the greedy rule commits (the longest prefix of drafts equal to the target's argmax, then its
// argmax).
// Output: out[r * stride] = a + 1, then d_1 .. d_a and the last token.
// The decisions take one warp and two loads per draft (the sampler's row stats carry each row's
// exact Z); a rejection costs one pass over the two rows of the rejected position.
//
// One CTA per request, grid sized for max_rows; the live count is read on the device; no
// allocation, no host sync, no workspace: capture-safe. Drafts outside [0, vocab) are rejected
// (never read); the models' flags report them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/kernels/sampling.h"
#include "graphs/step_prep.h"

namespace graphdecode {

enum class DraftKind : std::int32_t {
  kDistribution = 0,  // a draft model: q_i from draft_logits / draft_stats
  kPointMass = 1,     // no distribution (prompt lookup): q_i = a point mass at the draft
};

struct AcceptSampledArgs {
  // The verify phase's block: scalars[kNumRequests] = live requests; token_id rows r(k+1) + 1 ..
  // r(k+1) + k = the drafts; token_position[r(k+1) + i] + 1 = the position of the token decided
  // after verify row i (the sampler's step of that row).
  StepMetaView verify;
  std::int32_t k = 0;      // drafts per request, in [0, kMaxAcceptSampledDrafts]
  std::int32_t vocab = 0;  // of the target and the draft
  LogitsType logits_type = LogitsType::kFloat32;  // of target_logits and draft_logits

  // The target over the verify rows: logits row j = verify row j.
  const void* target_logits = nullptr;             // [live * (k + 1)][target_stride]
  std::int64_t target_stride = 0;                  // 0 = vocab
  const SamplingRowStats* target_stats = nullptr;  // [live * (k + 1)] the sampler's row_stats
  const std::int32_t* target_tokens = nullptr;     // [live * (k + 1)] the sampler's tokens

  // The draft: row i of request r (the distribution d_{i+1} was drawn from) is row
  // i * draft_rows + r. Unused with DraftKind::kPointMass.
  DraftKind draft_kind = DraftKind::kDistribution;
  const void* draft_logits = nullptr;             // [k][draft_rows][draft_stride]
  std::int64_t draft_stride = 0;                  // 0 = vocab
  const SamplingRowStats* draft_stats = nullptr;  // [k][draft_rows]
  std::int32_t draft_rows = 0;                    // >= live requests

  // Per request: the seed (two words, low then high) and the accept limit (< 0 = all k; 0 for a
  // request that does not speculate), SamplingWords in the step image's aux section.
  const std::int32_t* aux = nullptr;  // [max_rows][aux_words]
  std::int32_t aux_words = 0;
  std::int32_t seed_lo_word = 0, seed_hi_word = 0, accept_limit_word = 0;

  // [max_rows][stride] out: word 0 = committed count a + 1, words 1 .. a + 1 = the tokens; rows
  // of requests that are not live are not written.
  std::int32_t* out = nullptr;
  std::int32_t stride = 0;    // >= k + 2
  std::int32_t max_rows = 0;  // grid rows (>= live requests)
  // Optional: sticky error flags of the models (bad token ids), OR-ed into out[max_rows * stride].
  const std::int32_t* flag_a = nullptr;
  const std::int32_t* flag_b = nullptr;
};

// The decisions of one request take one warp lane per draft, in rounds of 32; the cap keeps the
// check of a launch's arguments meaningful (a speculative step proposes a handful).
constexpr std::int32_t kMaxAcceptSampledDrafts = 64;

// Checks the arguments (graphdecode::Error naming the field) and launches.
void accept_sampled(const AcceptSampledArgs& args, cudaStream_t stream);

// A step without drafts (a prefill chunk): request r commits the token of its logits row r,
// published in the same layout (out[r * stride] = 1, out[r * stride + 1] = tokens[r]), flags
// OR-ed into out[max_rows * stride].
void publish_last_tokens(const StepMetaView& meta, const std::int32_t* tokens,
                         std::int32_t max_rows, std::int32_t* out, std::int32_t stride,
                         const std::int32_t* flag_a, const std::int32_t* flag_b,
                         cudaStream_t stream);

}  // namespace graphdecode
