// What the Engine's GPU tests share: token collection with the one-finish-event check, random
// prompts, the float64 confirmation of greedy tokens, and speculative tokens against plain ones.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "attention_check.h"  // Rng
#include "engine/engine.h"
#include "engine/weights.h"
#include "llama_reference.h"
#include "support/scoped_env.h"

namespace graphdecode::testing {

// GRAPHDECODE_GEMV=off and GRAPHDECODE_WGMMA_GEMM=off while it lives (engine/gemm.h): the Gemms
// made meanwhile run cuBLAS or the skinny kernel at every row count (so their models fold no norm
// into a GEMV; the warpgroup GEMM, at 9-64 rows, would likewise split a verify's rows from a
// plain step's: 4 near-ties in SpecGreedy, bench/NOTES.md 103). For
// the tests that compare speculative tokens with plain decoding: a plain decode step at rows <= 8
// would take the stream GEMV, which a verify step of more rows does not; the two then round
// differently and near-tie divergences stop being rare (H200: 11 and 15 of 16 request runs in
// SpecGreedy on random weights, each a float64-confirmed near-tie). The stream GEMV has its own
// tests (test_skinny_gemm_gpu) and runs in the other engine tests.
class ScopedGemvOff {
 public:
  ScopedGemvOff() : gemv_("GRAPHDECODE_GEMV", "off"), wgmma_("GRAPHDECODE_WGMMA_GEMM", "off") {}

 private:
  ScopedEnv gemv_, wgmma_;  // the stream GEMV and the warpgroup GEMM (engine/gemm.h)
};

// Every request's tokens and finish events; collect() fails the test on a token after a finish.
struct Collected {
  std::map<RequestId, std::vector<std::int32_t>> tokens;
  std::map<RequestId, int> finished;  // finish events per request
};
TokenCallback collect(Collected& c);

// `len` ids uniform in [0, vocab).
std::vector<std::int32_t> random_prompt(Rng& rng, std::int32_t len, std::int32_t vocab);

// Encoder states [len][hidden] bf16 ~ N(0, 1): a vision encoder's output scale after its projector.
std::vector<std::uint16_t> random_encoder_states(Rng& rng, std::int32_t len, std::int32_t hidden);

// Zeroes every layer's o_proj and down_proj: attention and MLP add nothing to the residual
// stream, which stays the token's embedding, so the next token depends on the current one alone
// (a bigram model; tests build predictable drafts on it).
void zero_block_outputs(HostWeights& w);

// For a bigram model (zero_block_outputs, RMSNorm weights 1, lm_head not tied): moves the
// embedding of every token whose next-token argmax leads the runner-up by less than `min_gap` of
// the logits' largest magnitude toward its argmax's lm_head row until it leads by `min_gap`
// (float64 logits of the bf16 rows; the norm only scales them). Every bigram step is then decisive:
// bf16 roundings that differ between two correct runs (a norm fused or not, a GEMM's row bucket)
// cannot flip it. Returns the number of tokens moved.
std::int32_t make_bigram_decisive(HostWeights& w, double min_gap = 0.01);

// Every generated token against the float64 reference run on the same sequence (teacher forcing
// on the engine's own tokens, with the request's encoder states if any): within 3% of the
// reference maximum of the reference's best, and exactly its argmax wherever the reference's
// top-2 gap exceeds that (no near-tie to excuse a different pick).
void expect_greedy_confirmed(const HostWeights& w, const std::vector<std::int32_t>& prompt,
                             const std::vector<std::int32_t>& generated, const std::string& what,
                             const ReferenceEncoder& encoder = {});

// Speculative tokens against plain greedy tokens, request by request. A request whose tokens
// differ from position i on passes only if the float64 reference at i has a top-2 gap within bf16
// noise (3% of its largest logit) and both picks lie within that tolerance of its maximum: two
// correct runs may then pick differently. Returns the number of such near-tie divergences.
int compare_with_plain(const HostWeights& w, const std::vector<std::vector<std::int32_t>>& prompts,
                       const std::vector<std::vector<std::int32_t>>& spec,
                       const std::vector<std::vector<std::int32_t>>& plain,
                       const std::string& what);

}  // namespace graphdecode::testing
