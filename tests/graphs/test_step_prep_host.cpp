// CPU: the CPU prep path (prep_step_host) on hand-checked steps and its invariants on random
// steps of every mode: cu_seqlens are scans of the lengths, KV extent = prefix + extend, padding
// rows and padding tokens are inert.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "graphs/step_prep.h"
#include "graphs/step_rules.h"
#include "step_gen.h"

namespace graphdecode {
namespace {

using testing::GeneratedStep;
using testing::random_step;
using testing::small_capacity;

struct Prepared {
  StepMetaLayout layout;
  std::vector<std::int32_t> block;
  StepMetaView view;
};

Prepared prepare(const StepCapacity& cap, const GeneratedStep& s) {
  const StepImageWriter w(cap);
  std::vector<std::int32_t> image(w.layout().total_words, 0);
  w.write(s.desc(), image);
  Prepared p;
  p.layout = StepMetaLayout::compute(cap);
  p.block.assign(p.layout.total_words, -99);
  prep_step_host(StepInputView::over(image.data(), w.layout()), cap, p.block);
  p.view = StepMetaView::over(p.block.data(), p.layout);
  return p;
}

TEST(StepPrepHost, DeviceTokenSentinelReadsTheSlotsFeedbackToken) {
  StepCapacity cap = small_capacity();
  cap.token_feedback = true;
  const StepImageWriter w(cap);
  GeneratedStep s;
  s.mode = StepMode::kDecode;
  s.requests = {{7, 10, 1, 0}, {2, 4, 1, 0}, {9, 0, 1, 0}};
  s.token_ids = {step_rules::kTokenFromDevice, 33, step_rules::kTokenFromDevice};
  std::vector<std::int32_t> image(w.layout().total_words, 0);
  w.write(s.desc(), image);
  const StepMetaLayout layout = StepMetaLayout::compute(cap);
  std::vector<std::int32_t> block(layout.total_words, -99);
  std::vector<std::int32_t> feedback(static_cast<std::size_t>(cap.max_slots));
  for (std::size_t i = 0; i < feedback.size(); ++i) feedback[i] = 1000 + static_cast<int>(i);
  prep_step_host(StepInputView::over(image.data(), w.layout()), cap, block, feedback.data());
  const StepMetaView m = StepMetaView::over(block.data(), layout);
  EXPECT_EQ(std::vector<int>(m.token_id, m.token_id + 4), (std::vector<int>{1007, 33, 1009, 0}));
  // No feedback buffer: the sentinel becomes the padding token, never a negative id.
  prep_step_host(StepInputView::over(image.data(), w.layout()), cap, block);
  EXPECT_EQ(m.token_id[0], step_rules::kPaddingTokenId);
}

TEST(StepPrepHost, DraftExtendV2HandChecked) {
  StepCapacity cap = small_capacity();
  cap.max_batch = 4;
  cap.max_tokens = 8;
  cap.max_logit_rows = 0;  // one per request
  GeneratedStep s;
  s.mode = StepMode::kDraftExtendV2;
  s.tokens_per_request = 3;
  s.requests = {{7, 10, 3, 5}, {2, 0, 1, 0}};  // prefix 10 + 3 new; prefix 0 + 1 new
  s.token_ids = {11, 12, 13, 21};
  const Prepared p = prepare(cap, s);
  const StepMetaView& m = p.view;
  EXPECT_EQ(m.scalars[StepMetaLayout::kNumRequests], 2);
  EXPECT_EQ(m.scalars[StepMetaLayout::kNumTokens], 4);
  EXPECT_EQ(m.scalars[StepMetaLayout::kMaxQLen], 3);
  EXPECT_EQ(m.scalars[StepMetaLayout::kMaxKvLen], 13);  // prefix + extend, not the prefix
  EXPECT_EQ(m.scalars[StepMetaLayout::kMaxEncoderLen], 5);
  EXPECT_EQ(m.scalars[StepMetaLayout::kMode], 3);
  EXPECT_EQ(m.scalars[StepMetaLayout::kTokensPerRequest], 3);
  EXPECT_EQ(m.scalars[StepMetaLayout::kTotalKv], 14);
  EXPECT_EQ(std::vector<int>(m.slot, m.slot + 4), (std::vector<int>{7, 2, 0, 0}));
  EXPECT_EQ(std::vector<int>(m.q_start, m.q_start + 5), (std::vector<int>{0, 3, 4, 4, 4}));
  EXPECT_EQ(std::vector<int>(m.kv_len, m.kv_len + 4), (std::vector<int>{13, 1, 0, 0}));
  EXPECT_EQ(std::vector<int>(m.encoder_len, m.encoder_len + 4), (std::vector<int>{5, 0, 0, 0}));
  EXPECT_EQ(std::vector<int>(m.cu_seqlens_k, m.cu_seqlens_k + 5),
            (std::vector<int>{0, 13, 14, 14, 14}));
  EXPECT_EQ(std::vector<int>(m.cu_encoder, m.cu_encoder + 5), (std::vector<int>{0, 5, 5, 5, 5}));
  EXPECT_EQ(std::vector<int>(m.token_request, m.token_request + 8),
            (std::vector<int>{0, 0, 0, 1, -1, -1, -1, -1}));
  EXPECT_EQ(std::vector<int>(m.token_slot, m.token_slot + 8),
            (std::vector<int>{7, 7, 7, 2, 0, 0, 0, 0}));
  EXPECT_EQ(std::vector<int>(m.token_position, m.token_position + 8),
            (std::vector<int>{10, 11, 12, 0, 0, 0, 0, 0}));
  EXPECT_EQ(std::vector<int>(m.token_id, m.token_id + 8),
            (std::vector<int>{11, 12, 13, 21, 0, 0, 0, 0}));
  // Logits rows: the last new row of each request, padding rows at kPaddingLogitRow.
  EXPECT_EQ(m.scalars[StepMetaLayout::kNumLogitRows], 2);
  EXPECT_EQ(m.scalars[StepMetaLayout::kLogitRows], 0);
  EXPECT_EQ(std::vector<int>(m.logit_row, m.logit_row + 4), (std::vector<int>{2, 3, 0, 0}));
}

TEST(StepPrepHost, LogitRowsEveryRowAndChosenHandChecked) {
  StepCapacity cap = small_capacity();
  cap.max_batch = 4;
  cap.max_tokens = 12;
  cap.max_logit_rows = 12;
  GeneratedStep s;
  s.mode = StepMode::kTargetVerify;
  s.tokens_per_request = 3;
  s.requests = {{7, 10, 3, 0}, {2, 0, 3, 0}, {5, 4, 3, 0}};
  s.token_ids = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  s.logits = LogitRows::kEveryRow;
  const Prepared every = prepare(cap, s);
  EXPECT_EQ(every.view.scalars[StepMetaLayout::kNumLogitRows], 9);
  EXPECT_EQ(std::vector<int>(every.view.logit_row, every.view.logit_row + 12),
            (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0}));

  // Chosen: offsets 0, 7 (clamped to the request's last row 2) and -1 (clamped to 0).
  s.logits = LogitRows::kChosenPerRequest;
  const StepImageWriter w(cap);
  std::vector<std::int32_t> image(w.layout().total_words, 0);
  w.write(s.desc(), image);
  const StepMetaLayout layout = StepMetaLayout::compute(cap);
  std::vector<std::int32_t> block(layout.total_words, -99);
  const std::int32_t chosen[4] = {0, 7, -1, 2};
  prep_step_host(StepInputView::over(image.data(), w.layout()), cap, block, nullptr, chosen);
  const StepMetaView m = StepMetaView::over(block.data(), layout);
  EXPECT_EQ(m.scalars[StepMetaLayout::kNumLogitRows], 3);
  EXPECT_EQ(std::vector<int>(m.logit_row, m.logit_row + 4), (std::vector<int>{0, 5, 6, 0}));
  // Without a chosen array, the last row of each request.
  prep_step_host(StepInputView::over(image.data(), w.layout()), cap, block);
  EXPECT_EQ(std::vector<int>(m.logit_row, m.logit_row + 4), (std::vector<int>{2, 5, 8, 0}));
}

TEST(StepPrepHost, InvariantsOnRandomStepsOfEveryMode) {
  const StepCapacity cap = small_capacity();
  std::mt19937 rng(11);
  for (int i = 0; i < 300; ++i) {
    const auto mode = static_cast<StepMode>(i % kNumStepModes);
    const std::int32_t n = 1 + static_cast<std::int32_t>(rng() % cap.max_batch);
    const GeneratedStep s = random_step(rng, cap, mode, n);
    const Prepared p = prepare(cap, s);
    const StepMetaView& m = p.view;
    SCOPED_TRACE(::testing::Message() << "step " << i << " mode " << step_mode_name(mode));
    ASSERT_EQ(m.scalars[StepMetaLayout::kNumRequests], n);
    ASSERT_EQ(m.scalars[StepMetaLayout::kNumTokens], static_cast<int>(s.token_ids.size()));
    std::int32_t t = 0;
    for (std::int32_t r = 0; r < cap.max_batch; ++r) {
      const bool live = r < n;
      const StepRequest q = live ? s.requests[r] : StepRequest{};
      ASSERT_EQ(m.slot[r], live ? q.slot : kPaddingSlot);
      ASSERT_EQ(m.kv_len[r], live ? q.prefix_len + q.extend_len : 0);
      ASSERT_EQ(m.encoder_len[r], live ? q.encoder_len : 0);
      ASSERT_EQ(m.q_start[r + 1] - m.q_start[r], live ? q.extend_len : 0);
      ASSERT_EQ(m.cu_seqlens_k[r + 1] - m.cu_seqlens_k[r], m.kv_len[r]);
      ASSERT_EQ(m.cu_encoder[r + 1] - m.cu_encoder[r], m.encoder_len[r]);
      for (std::int32_t i2 = 0; live && i2 < q.extend_len; ++i2, ++t) {
        ASSERT_EQ(m.token_request[t], r);
        ASSERT_EQ(m.token_slot[t], q.slot);
        ASSERT_EQ(m.token_position[t], q.prefix_len + i2);
        ASSERT_EQ(m.token_id[t], s.token_ids[t]);
      }
    }
    for (; t < cap.max_tokens; ++t) {
      ASSERT_EQ(m.token_request[t], -1);
      ASSERT_EQ(m.token_slot[t], kPaddingSlot);
      ASSERT_EQ(m.token_position[t], 0);
      ASSERT_EQ(m.token_id[t], 0);
    }
    const int max_kv = *std::max_element(m.kv_len, m.kv_len + cap.max_batch);
    ASSERT_EQ(m.scalars[StepMetaLayout::kMaxKvLen], max_kv);
    const auto tokens = static_cast<std::int32_t>(s.token_ids.size());
    const std::int32_t logits = s.logits == LogitRows::kEveryRow ? tokens : n;
    ASSERT_EQ(m.scalars[StepMetaLayout::kNumLogitRows], logits);
    for (std::int32_t i = 0; i < cap.resolved_max_logit_rows(); ++i) {
      const std::int32_t want = i >= logits                        ? step_rules::kPaddingLogitRow
                                : s.logits == LogitRows::kEveryRow ? i
                                                                   : m.q_start[i + 1] - 1;
      ASSERT_EQ(m.logit_row[i], want) << "logits row " << i;
    }
  }
}

TEST(StepRules, RequestOfTokenFindsTheOwner) {
  const std::int32_t q_start[] = {0, 1, 4, 5, 9};
  const std::int32_t want[] = {0, 1, 1, 1, 2, 3, 3, 3, 3};
  for (std::int32_t t = 0; t < 9; ++t)
    EXPECT_EQ(step_rules::request_of_token(q_start, 4, t), want[t]);
  EXPECT_EQ(step_rules::request_of_token(q_start, 1, 0), 0);
}

TEST(StepRules, ExtendLengthPerMode) {
  using namespace step_rules;
  EXPECT_TRUE(extend_len_allowed(StepMode::kDecode, 1, 1));
  EXPECT_FALSE(extend_len_allowed(StepMode::kDecode, 1, 2));
  EXPECT_TRUE(extend_len_allowed(StepMode::kTargetVerify, 4, 4));
  EXPECT_FALSE(extend_len_allowed(StepMode::kTargetVerify, 4, 3));
  EXPECT_TRUE(extend_len_allowed(StepMode::kDraftExtendV2, 4, 1));
  EXPECT_TRUE(extend_len_allowed(StepMode::kDraftExtendV2, 4, 4));
  EXPECT_FALSE(extend_len_allowed(StepMode::kDraftExtendV2, 4, 5));
  EXPECT_FALSE(extend_len_allowed(StepMode::kDraftExtendV2, 4, 0));
  EXPECT_TRUE(extend_len_allowed(StepMode::kExtend, 0, 300));
  EXPECT_FALSE(extend_len_allowed(StepMode::kExtend, 0, 0));
  EXPECT_FALSE(extend_len_allowed(static_cast<StepMode>(9), 1, 1));
}

}  // namespace
}  // namespace graphdecode
