// The rules of a speculative step, written once as __host__ __device__ functions: the spec prep
// kernel, its CPU twin (tests) and the acceptance kernel call these.
//
// A speculative step of k draft tokens (DESIGN.md "Speculative step"), per request r, from the
// step prep's metadata of the draft-extend (the image's rows: the c tokens committed since r's
// last speculative step, ending with its last committed token at position P = kv_len_x - 1):
//   draft-extend   the image's rows; its last row's logits give the first draft token d_1;
//   draft decode j (1 <= j < k): input d_j at position P + j, KV extent P + j + 1, gives d_{j+1};
//   verify         the target over [t_P, d_1 .. d_k] at positions P .. P + k, KV extent P + k + 1,
//                  logits for every row;
//   accept         greedy: a = the longest prefix of drafts equal to the target's picks; the step
//                  commits d_1 .. d_a and the target's pick y_a after them (a + 1 tokens).
// A derived phase is (width w, offset o): request r has w new rows at positions P + o .. P + o +
// w - 1 and KV extent P + o + w (verify: w = k + 1, o = 0; draft decode j: w = 1, o = j).
#pragma once

#include <cstdint>

#include "common/request_rules.h"

namespace graphdecode::spec_rules {

// Position of new row i of request r in a phase (w, o), from the draft-extend's KV extent.
GD_HD std::int32_t phase_position(std::int32_t draft_extend_kv_len, std::int32_t offset,
                                  std::int32_t i) {
  return draft_extend_kv_len - 1 + offset + i;
}

// KV extent of a request in a phase (w, o): its last new row's position + 1.
GD_HD std::int32_t phase_kv_len(std::int32_t draft_extend_kv_len, std::int32_t width,
                                std::int32_t offset) {
  return draft_extend_kv_len + offset + width - 1;
}

// Greedy acceptance: drafts[i] = d_{i+1} (i < k), picks[i] = y_i, the target's token after row i
// (i <= k). Returns a, the accepted draft count (at most max_accept; < 0 = no cap).
GD_HD std::int32_t greedy_accepted(const std::int32_t* drafts, const std::int32_t* picks,
                                   std::int32_t k, std::int32_t max_accept) {
  const std::int32_t cap = max_accept < 0 || max_accept > k ? k : max_accept;
  std::int32_t a = 0;
  while (a < cap && drafts[a] == picks[a]) ++a;
  return a;
}

}  // namespace graphdecode::spec_rules
