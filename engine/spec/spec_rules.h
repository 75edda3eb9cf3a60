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
//   accept         speculative rejection sampling (accept_sampled.h; for a greedy request: a = the
//                  longest prefix of drafts equal to the target's argmax); the step commits
//                  d_1 .. d_a and one token of the target's after them (a + 1 tokens).
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

// Prompt lookup (n-gram) drafts from a request's own tokens h[0 .. p] (p = the last committed
// token's position): the longest suffix h[p - n + 1 .. p], max_n >= n >= min_n, that also ends
// earlier, at its latest such occurrence h[s .. s + n - 1] (s + n - 1 < p), proposes what followed
// it, h[s + n ..], up to k tokens and never past p; a proposal shorter than k repeats its last
// token, and with no occurrence every draft is h[p] (drafts only cost a verify row; a wrong one
// is rejected).
GD_HD bool ngram_occurs_at(const std::int32_t* h, std::int32_t p, std::int32_t n, std::int32_t s) {
  for (std::int32_t i = 0; i < n; ++i)
    if (h[s + i] != h[p - n + 1 + i]) return false;
  return true;
}
GD_HD void ngram_fill(const std::int32_t* h, std::int32_t p, std::int32_t from, std::int32_t k,
                      std::int32_t* out) {
  std::int32_t last = h[p];
  for (std::int32_t i = 0; i < k; ++i) {
    if (from >= 0 && from + i <= p) last = h[from + i];
    out[i] = last;
  }
}
// CPU form (tests): returns the start of the continuation (s + n), or -1.
inline std::int32_t ngram_propose(const std::int32_t* h, std::int32_t p, std::int32_t max_n,
                                  std::int32_t min_n, std::int32_t k, std::int32_t* out) {
  for (std::int32_t n = max_n < p ? max_n : p; n >= min_n && n >= 1; --n) {
    for (std::int32_t s = p - n; s >= 0; --s) {
      if (ngram_occurs_at(h, p, n, s)) {
        ngram_fill(h, p, s + n, k, out);
        return s + n;
      }
    }
  }
  ngram_fill(h, p, -1, k, out);
  return -1;
}

}  // namespace graphdecode::spec_rules
