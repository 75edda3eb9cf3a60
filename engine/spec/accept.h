// Acceptance of a speculative step on the device (spec_rules.h). Greedy: per live request r the
// drafts d_1 .. d_k are the verify block's token ids of rows r(k+1) + 1 .. r(k+1) + k, the
// target's picks y_0 .. y_k its tokens for rows r(k+1) .. r(k+1) + k (argmax for greedy
// requests), a = the longest prefix of drafts equal to the picks; the step commits d_1 .. d_a and
// y_a; at most the request's accept limit (its SamplingWords::kAcceptLimit aux word: 0 for a
// request that does not speculate, or whose sampling a greedy acceptance would not preserve).
// One thread per request; graph-safe (live count read on the device).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "graphs/step_prep.h"

namespace graphdecode {

struct AcceptArgs {
  StepMetaView verify;                  // the verify phase's block
  const std::int32_t* picks = nullptr;  // [num_requests * (k + 1)] the target's tokens
  std::int32_t k = 0;                   // draft tokens per request
  const std::int32_t* aux = nullptr;    // [num_requests][aux_words] the image's aux, or nullptr
  std::int32_t aux_words = 0;
  std::int32_t accept_limit_word = 0;  // the aux word that caps a request's acceptance
  // [max_rows][stride] out: word 0 = committed count a + 1, words 1 .. a + 1 = the tokens.
  std::int32_t* out = nullptr;
  std::int32_t stride = 0;    // >= k + 2
  std::int32_t max_rows = 0;  // grid rows (>= live requests)
  // Optional: sticky error flags of the models (bad token ids), OR-ed into out[max_rows * stride].
  const std::int32_t* flag_a = nullptr;
  const std::int32_t* flag_b = nullptr;
};

void accept_greedy(const AcceptArgs& args, cudaStream_t stream);

// A step without drafts (a prefill chunk): request r commits the token of its logits row r,
// published in the same layout (out[r * stride] = 1, out[r * stride + 1] = tokens[r]), flags
// OR-ed into out[max_rows * stride].
void publish_last_tokens(const StepMetaView& meta, const std::int32_t* tokens,
                         std::int32_t max_rows, std::int32_t* out, std::int32_t stride,
                         const std::int32_t* flag_a, const std::int32_t* flag_b,
                         cudaStream_t stream);

}  // namespace graphdecode
