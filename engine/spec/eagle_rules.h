// Where an EAGLE head's rows sit, written once as __host__ __device__ functions: the EAGLE prep
// kernel (eagle_prep.cu) and its CPU twin (eagle_prep_host.cpp) call these.
//
// The head's cache position j holds the pair (token_{j+1}, h_j), h_j the target's hidden state at
// position j (EAGLE: cat(embed(token_{t+1}), h_t) at position t). So the head runs over the rows
// of the step's block (the target's prefill chunk, or a speculative step's draft-extend over the
// pending tokens) one position earlier: a row of token position q becomes a head row at q - 1
// with hidden h_{q-1}, and every KV extent shrinks by one. The token at position 0 has no hidden
// state before it: a request whose rows start at position 0 (a first prefill chunk) loses that
// row (its later rows move up; a one-token first chunk leaves the request no rows and no keys).
// With the draft model's book (engine/spec/spec_book.h: the draft has cached D, pending tokens
// D .. P) the head has cached D - 1 positions and extends over D - 1 .. P - 1; its last row's
// output predicts token P + 1 (d_1). Head decode j (1 <= j < k): d_j at position P + j - 1.
//
// A prefix hit (memory/kv_ledger.h, LedgerPool::key_shift): the head's pool shares a page only
// when the token after it is equal too, so a request starting at a hit h already holds head
// position h - 1 (token h, state h - 1) in a shared page. Its first chunk's row 0 (position h,
// head row h - 1) is dropped like a position-0 row: the head never writes a page it shares, and
// no hidden state from before the hit is needed. The step marks such requests
// (ShiftShape::starts_at_hit, a word of the step's per-request aux).
//
// Hidden states of the extend's rows: row i of request r (i counted in the step's rows) reads
// slot carry row i when i < carry_rows (states kept per slot between steps: the previous chunk's
// last row, or the previous verify's rows), else the target's hidden state of the step row
// before it (a prefill chunk's own rows). Encoded per head row: >= 0 a target row, < 0 a carry
// row (carry_code).
#pragma once

#include <cstdint>

#include "common/request_rules.h"
#include "graphs/step_mode.h"
#include "graphs/step_prep.h"
#include "graphs/step_rules.h"

namespace graphdecode::eagle_rules {

struct ShiftShape {
  std::int32_t max_batch = 0, max_tokens = 0, max_logit_rows = 0;
  std::int32_t carry_rows = 0;    // step rows per request whose hidden state comes from the carry
  std::int32_t carry_stride = 0;  // carry rows per slot
  // Request r's extend starts at its prefix hit when starts_at_hit[r * starts_at_hit_stride] != 0
  // (device or host memory as the caller runs); nullptr: no request does.
  const std::int32_t* starts_at_hit = nullptr;
  std::int32_t starts_at_hit_stride = 0;
};

GD_HD std::int32_t carry_code(std::int32_t slot, std::int32_t i, std::int32_t carry_stride) {
  return -1 - (slot * carry_stride + i);
}
GD_HD std::int32_t carry_index(std::int32_t code) {
  return -1 - code;
}

// Rows of live request r that the head drops: 1 when its rows start at position 0 (no state
// before them) or at its prefix hit (the head holds that row's position already).
GD_HD std::int32_t skipped_rows(const StepMetaView& x, const ShiftShape& s, std::int32_t r) {
  const std::int32_t q_len = x.q_start[r + 1] - x.q_start[r];
  const bool at_hit =
      s.starts_at_hit != nullptr && s.starts_at_hit[r * s.starts_at_hit_stride] != 0;
  return q_len > 0 && (x.kv_len[r] == q_len || at_hit) ? 1 : 0;
}

// z[r] = rows dropped by the live requests before r, for r in [0, max_batch] (constant past the
// live ones); returns the longest head extend of a live request. One thread (or the host).
GD_HD std::int32_t skip_scan(const StepMetaView& x, const ShiftShape& shape, std::int32_t* z) {
  const std::int32_t max_batch = shape.max_batch;
  const std::int32_t n = x.scalars[StepMetaLayout::kNumRequests];
  std::int32_t acc = 0, max_q = 0;
  for (std::int32_t r = 0; r <= max_batch; ++r) {
    z[r] = acc;
    if (r < n && r < max_batch) {
      const std::int32_t s = skipped_rows(x, shape, r);
      const std::int32_t q = x.q_start[r + 1] - x.q_start[r] - s;
      max_q = q > max_q ? q : max_q;
      acc += s;
    }
  }
  return max_q;
}

// The head's block `out` (and hid_src [max_tokens]) from the step's block `x`; z and max_q from
// skip_scan. Reads only x and z, writes only out and hid_src: a thread's share of the rows
// (first, stride) needs no synchronisation.
GD_HD void fill_shifted(const StepMetaView& x, const StepMetaView& out, std::int32_t* hid_src,
                        const std::int32_t* z, std::int32_t max_q, const ShiftShape& s,
                        std::int32_t first, std::int32_t stride) {
  const std::int32_t n = x.scalars[StepMetaLayout::kNumRequests];
  const std::int32_t tokens = x.scalars[StepMetaLayout::kNumTokens] - z[n];
  const std::int32_t logits = n < s.max_logit_rows ? n : s.max_logit_rows;
  if (first == 0) {
    std::int32_t* o = out.scalars;
    const std::int32_t* i = x.scalars;
    o[StepMetaLayout::kNumRequests] = n;
    o[StepMetaLayout::kNumTokens] = tokens;
    o[StepMetaLayout::kMaxQLen] = max_q;
    o[StepMetaLayout::kMaxKvLen] = n > 0 ? i[StepMetaLayout::kMaxKvLen] - 1 : 0;
    o[StepMetaLayout::kMaxEncoderLen] = i[StepMetaLayout::kMaxEncoderLen];
    o[StepMetaLayout::kMode] = i[StepMetaLayout::kMode];
    o[StepMetaLayout::kTokensPerRequest] = i[StepMetaLayout::kTokensPerRequest];
    o[StepMetaLayout::kTotalKv] = i[StepMetaLayout::kTotalKv] - n;
    o[StepMetaLayout::kNumLogitRows] = logits;
    o[StepMetaLayout::kLogitRows] = static_cast<std::int32_t>(LogitRows::kLastPerRequest);
    out.q_start[s.max_batch] = tokens;
    out.cu_seqlens_k[s.max_batch] = x.cu_seqlens_k[s.max_batch] - n;
    out.cu_encoder[s.max_batch] = x.cu_encoder[s.max_batch];
  }
  for (std::int32_t r = first; r < s.max_batch; r += stride) {
    const bool live = r < n;
    out.slot[r] = x.slot[r];
    out.q_start[r] = x.q_start[r] - z[r];
    out.kv_len[r] = live ? x.kv_len[r] - 1 : 0;
    out.encoder_len[r] = x.encoder_len[r];
    out.cu_seqlens_k[r] = x.cu_seqlens_k[r] - (live ? r : n);
    out.cu_encoder[r] = x.cu_encoder[r];
  }
  const std::int32_t x_tokens = x.scalars[StepMetaLayout::kNumTokens];
  for (std::int32_t t = first; t < s.max_tokens; t += stride) {
    if (t < x_tokens) {
      const std::int32_t r = x.token_request[t];
      const std::int32_t i = t - x.q_start[r];
      const std::int32_t skip = skipped_rows(x, s, r);
      if (i >= skip) {
        const std::int32_t h = t - z[r] - skip;  // the head's row
        out.token_request[h] = r;
        out.token_slot[h] = x.token_slot[t];
        out.token_position[h] = x.token_position[t] - 1;
        out.token_id[h] = x.token_id[t];
        hid_src[h] = i < s.carry_rows ? carry_code(x.slot[r], i, s.carry_stride) : t - 1;
      }
    }
    if (t >= tokens) {  // rows the head does not use: inert
      out.token_request[t] = step_rules::kPaddingTokenRequest;
      out.token_slot[t] = kPaddingSlot;
      out.token_position[t] = step_rules::kPaddingTokenPosition;
      out.token_id[t] = step_rules::kPaddingTokenId;
      hid_src[t] = 0;
    }
  }
  for (std::int32_t i = first; i < s.max_logit_rows; i += stride) {
    const std::int32_t last = x.q_start[i + 1 <= s.max_batch ? i + 1 : s.max_batch] -
                              z[i + 1 <= s.max_batch ? i + 1 : s.max_batch] - 1;
    out.logit_row[i] = i < logits && last >= 0 ? last : step_rules::kPaddingLogitRow;
  }
}

}  // namespace graphdecode::eagle_rules
