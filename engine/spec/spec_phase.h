// Derivation of one phase block of a speculative step (spec_rules.h: width w, offset o) from the
// draft-extend's block: the body shared by the device kernel (spec_prep.cu, a thread's share of
// the rows: first = threadIdx.x, stride = blockDim.x) and its CPU twin (first 0, stride 1). It
// reads only the draft-extend block and writes only `out`, so threads need no synchronisation.
#pragma once

#include <cstdint>

#include "common/request_rules.h"
#include "engine/spec/spec_rules.h"
#include "graphs/step_mode.h"
#include "graphs/step_prep.h"
#include "graphs/step_rules.h"

namespace graphdecode::spec_rules {

struct PhaseShape {
  std::int32_t width = 1;   // new rows per request
  std::int32_t offset = 0;  // first row's position past the last committed token
  StepMode mode = StepMode::kDecode;
  std::int32_t max_batch = 0, max_tokens = 0, max_logit_rows = 0;
};

GD_HD void fill_phase(const StepMetaView& x, const StepMetaView& out, const PhaseShape& s,
                      std::int32_t first, std::int32_t stride) {
  const std::int32_t n = x.scalars[StepMetaLayout::kNumRequests];
  const std::int32_t w = s.width, grow = s.offset + s.width - 1;  // kv_len_out - kv_len_x
  const std::int32_t tokens = n * w;
  const std::int32_t logits = tokens < s.max_logit_rows ? tokens : s.max_logit_rows;
  if (first == 0) {
    std::int32_t* o = out.scalars;
    const std::int32_t* i = x.scalars;
    o[StepMetaLayout::kNumRequests] = n;
    o[StepMetaLayout::kNumTokens] = tokens;
    o[StepMetaLayout::kMaxQLen] = n > 0 ? w : 0;
    o[StepMetaLayout::kMaxKvLen] = n > 0 ? i[StepMetaLayout::kMaxKvLen] + grow : 0;
    o[StepMetaLayout::kMaxEncoderLen] = i[StepMetaLayout::kMaxEncoderLen];
    o[StepMetaLayout::kMode] = static_cast<std::int32_t>(s.mode);
    o[StepMetaLayout::kTokensPerRequest] = w;
    o[StepMetaLayout::kTotalKv] = i[StepMetaLayout::kTotalKv] + n * grow;
    o[StepMetaLayout::kNumLogitRows] = logits;
    o[StepMetaLayout::kLogitRows] = static_cast<std::int32_t>(LogitRows::kEveryRow);
    out.q_start[s.max_batch] = tokens;
    out.cu_seqlens_k[s.max_batch] = x.cu_seqlens_k[s.max_batch] + n * grow;
    out.cu_encoder[s.max_batch] = x.cu_encoder[s.max_batch];
  }
  for (std::int32_t r = first; r < s.max_batch; r += stride) {
    const bool live = r < n;
    const std::int32_t before = live ? r : n;  // live rows before r
    out.slot[r] = x.slot[r];
    out.q_start[r] = before * w;
    out.kv_len[r] = live ? phase_kv_len(x.kv_len[r], w, s.offset) : 0;
    out.encoder_len[r] = x.encoder_len[r];
    out.cu_seqlens_k[r] = x.cu_seqlens_k[r] + before * grow;
    out.cu_encoder[r] = x.cu_encoder[r];
  }
  for (std::int32_t t = first; t < s.max_tokens; t += stride) {
    std::int32_t req = step_rules::kPaddingTokenRequest, slot = kPaddingSlot;
    std::int32_t pos = step_rules::kPaddingTokenPosition, id = step_rules::kPaddingTokenId;
    if (t < tokens) {
      req = t / w;
      const std::int32_t i = t - req * w;
      slot = x.slot[req];
      pos = phase_position(x.kv_len[req], s.offset, i);
      // Row 0 of the verify is the last committed token (the draft-extend's last row); the
      // draft rows are written by the draft sampler of the phase before.
      if (s.offset == 0 && i == 0) id = x.token_id[x.q_start[req + 1] - 1];
    }
    out.token_request[t] = req;
    out.token_slot[t] = slot;
    out.token_position[t] = pos;
    out.token_id[t] = id;
  }
  for (std::int32_t i = first; i < s.max_logit_rows; i += stride)
    out.logit_row[i] = i < logits ? i : step_rules::kPaddingLogitRow;
}

}  // namespace graphdecode::spec_rules
