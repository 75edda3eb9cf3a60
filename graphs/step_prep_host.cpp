// The CPU path of step preparation: the same derivations as prep_metadata_kernel, in plain C++,
// through the same GD_HD rules. Tests compare its block with the GPU's word for word.
#include <algorithm>
#include <string>

#include "common/error.h"
#include "graphs/step_prep.h"
#include "graphs/step_rules.h"

namespace graphdecode {
namespace {
std::size_t align16(std::size_t words) {
  return (words + 15) / 16 * 16;
}
}  // namespace

StepMetaLayout StepMetaLayout::compute(std::int32_t max_batch, std::int32_t max_tokens,
                                       std::int32_t max_logit_rows) {
  GD_REQUIRE(max_batch >= 1, "max_batch", max_batch, "must be positive");
  GD_REQUIRE(max_tokens >= 1, "max_tokens", max_tokens, "must be positive");
  GD_REQUIRE(max_logit_rows >= 1, "max_logit_rows", max_logit_rows, "must be positive");
  StepMetaLayout l;
  std::size_t w = kScalarWords;
  const auto take = [&w](std::size_t words) {
    const std::size_t at = w;
    w = align16(w + words);
    return at;
  };
  const auto b = static_cast<std::size_t>(max_batch);
  const auto t = static_cast<std::size_t>(max_tokens);
  l.slot = take(b);
  l.q_start = take(b + 1);
  l.kv_len = take(b);
  l.encoder_len = take(b);
  l.cu_seqlens_k = take(b + 1);
  l.cu_encoder = take(b + 1);
  l.token_request = take(t);
  l.token_slot = take(t);
  l.token_position = take(t);
  l.token_id = take(t);
  l.logit_row = take(static_cast<std::size_t>(max_logit_rows));
  l.total_words = w;
  return l;
}

StepMetaView StepMetaView::over(std::int32_t* block, const StepMetaLayout& l) {
  StepMetaView v;
  v.scalars = block;
  v.slot = block + l.slot;
  v.q_start = block + l.q_start;
  v.kv_len = block + l.kv_len;
  v.encoder_len = block + l.encoder_len;
  v.cu_seqlens_k = block + l.cu_seqlens_k;
  v.cu_encoder = block + l.cu_encoder;
  v.token_request = block + l.token_request;
  v.token_slot = block + l.token_slot;
  v.token_position = block + l.token_position;
  v.token_id = block + l.token_id;
  v.logit_row = block + l.logit_row;
  return v;
}

void prep_step_host(const StepInputView& in, const StepCapacity& cap,
                    std::span<std::int32_t> out_block, const std::int32_t* feedback,
                    const std::int32_t* chosen) {
  const std::int32_t max_batch = cap.max_batch, max_tokens = cap.max_tokens;
  const std::int32_t max_logit_rows = cap.resolved_max_logit_rows();
  const StepMetaLayout layout = StepMetaLayout::compute(cap);
  GD_REQUIRE(out_block.size() >= layout.total_words, "out", out_block.size(),
             "smaller than the metadata layout");
  const StepMetaView out = StepMetaView::over(out_block.data(), layout);
  const std::int32_t n = std::min(std::max(in.header[StepLayout::kNumRequests], 0), max_batch);

  std::int32_t run_q = 0, run_k = 0, run_e = 0, max_q = 0, max_k = 0, max_e = 0;
  for (std::int32_t r = 0; r < max_batch; ++r) {
    const bool live = step_rules::row_live(r, n);
    const std::int32_t q = step_rules::row_q_len(live, live ? in.extend_len[r] : 0);
    const std::int32_t k =
        step_rules::row_self_kv_len(live, live ? in.prefix_len[r] : 0, live ? in.extend_len[r] : 0);
    const std::int32_t e = step_rules::row_cross_kv_len(live, live ? in.encoder_len[r] : 0);
    out.slot[r] = step_rules::row_slot(live, live ? in.slot[r] : 0);
    out.q_start[r] = run_q;
    out.kv_len[r] = k;
    out.encoder_len[r] = e;
    out.cu_seqlens_k[r] = run_k;
    out.cu_encoder[r] = run_e;
    run_q += q;
    run_k += k;
    run_e += e;
    max_q = std::max(max_q, q);
    max_k = std::max(max_k, k);
    max_e = std::max(max_e, e);
  }
  out.q_start[max_batch] = run_q;
  out.cu_seqlens_k[max_batch] = run_k;
  out.cu_encoder[max_batch] = run_e;
  const std::int32_t total_tokens = std::min(run_q, max_tokens);
  std::int32_t* s = out.scalars;
  s[StepMetaLayout::kNumRequests] = n;
  s[StepMetaLayout::kNumTokens] = total_tokens;
  s[StepMetaLayout::kMaxQLen] = max_q;
  s[StepMetaLayout::kMaxKvLen] = max_k;
  s[StepMetaLayout::kMaxEncoderLen] = max_e;
  s[StepMetaLayout::kMode] = in.header[StepLayout::kMode];
  s[StepMetaLayout::kTokensPerRequest] = in.header[StepLayout::kTokensPerRequest];
  s[StepMetaLayout::kTotalKv] = run_k;
  const auto rows = static_cast<LogitRows>(in.header[StepLayout::kLogitRows]);
  const std::int32_t num_logits = step_rules::num_logit_rows(rows, n, total_tokens, max_logit_rows);
  s[StepMetaLayout::kNumLogitRows] = num_logits;
  s[StepMetaLayout::kLogitRows] = static_cast<std::int32_t>(rows);
  for (std::int32_t i = 0; i < max_logit_rows; ++i) {
    out.logit_row[i] = i < num_logits ? step_rules::logit_token_row(rows, i, out.q_start, chosen)
                                      : step_rules::kPaddingLogitRow;
  }

  for (std::int32_t t = 0; t < max_tokens; ++t) {
    const bool live = t < total_tokens;
    std::int32_t r = step_rules::kPaddingTokenRequest;
    std::int32_t slot = kPaddingSlot;
    std::int32_t pos = step_rules::kPaddingTokenPosition;
    std::int32_t id = step_rules::kPaddingTokenId;
    if (live) {
      r = step_rules::request_of_token(out.q_start, n, t);
      slot = out.slot[r];
      pos = new_token_position(in.prefix_len[r], t - out.q_start[r]);
      id = step_rules::resolve_token_id(in.token_ids[t], slot, feedback);
    }
    out.token_request[t] = r;
    out.token_slot[t] = slot;
    out.token_position[t] = pos;
    out.token_id[t] = id;
  }
}

}  // namespace graphdecode
