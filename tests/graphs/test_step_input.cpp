// CPU: the step input layout and the host writer's validation. Every bad field throws an Error
// naming the field and value, and leaves the image exactly as it was.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "graphs/step_input.h"
#include "graphs/step_rules.h"
#include "step_gen.h"

namespace graphdecode {
namespace {

using testing::GeneratedStep;
using testing::random_step;
using testing::small_capacity;

// The target's three kinds of pool, then a draft model's full pool.
StepCapacity with_pools() {
  StepCapacity c = small_capacity();
  for (int k = 0; k < 4; ++k) {
    StepPoolCapacity& p = c.pools[k];
    p.present = true;
    p.model = k / 3;
    p.geometry.kind = static_cast<AttentionKind>(k % 3);
    p.geometry.page_size = 16;
    p.geometry.num_pages = 100;
    p.geometry.max_slots = c.max_slots;
    p.geometry.max_pages_per_slot = 256;
    p.geometry.window_left = k == 1 ? 63 : -1;
    p.max_commands = 8;
    p.max_page_ids = 32;
  }
  return c;
}

GeneratedStep good_step() {
  GeneratedStep s;
  s.mode = StepMode::kTargetVerify;
  s.tokens_per_request = 3;
  s.requests = {{5, 10, 3, 7}, {9, 0, 3, 0}};
  s.token_ids = {1, 2, 3, 4, 5, 6};
  return s;
}

// Expects write() to throw naming `field`, and the image to be unchanged.
void expect_rejected(const StepImageWriter& w, const StepDesc& d, const std::string& field,
                     const std::string& value) {
  std::vector<std::int32_t> image(w.layout().total_words, 77);
  const std::vector<std::int32_t> before = image;
  try {
    w.write(d, image);
    ADD_FAILURE() << "accepted a bad " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_EQ(e.value(), value) << e.what();
  }
  EXPECT_EQ(image, before) << "a rejected step changed the image";
}

TEST(StepLayout, SectionsAreDisjointAlignedAndInsideTheImage) {
  const StepCapacity cap = with_pools();
  const StepLayout l = StepLayout::compute(cap);
  std::vector<std::pair<std::size_t, std::size_t>> s = {
      {0, StepLayout::kHeaderWords}, {l.slot, 40},      {l.prefix_len, 40}, {l.extend_len, 40},
      {l.encoder_len, 40},           {l.token_ids, 300}};
  for (int k = 0; k < cap.num_pools(); ++k) {
    s.push_back({l.commands[k], 8 * 5});
    s.push_back({l.page_ids[k], 32});
  }
  std::sort(s.begin(), s.end());
  for (std::size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(s[i].first % 16, 0u);
    if (i + 1 < s.size()) EXPECT_LE(s[i].first + s[i].second, s[i + 1].first);
  }
  EXPECT_LE(s.back().first + s.back().second, l.total_words);
}

TEST(StepInputWriter, WritesEveryField) {
  const StepCapacity cap = with_pools();
  const StepImageWriter w(cap);
  TableCommandBatch full(8, 32);
  full.push_set(5, 0, std::vector<std::int32_t>{3, 4});
  GeneratedStep s = good_step();
  StepDesc d = s.desc();
  d.tables[0] = &full;
  std::vector<std::int32_t> image(w.layout().total_words, 0);
  w.write(d, image);
  const StepInputView v = StepInputView::over(image.data(), w.layout());
  EXPECT_EQ(v.header[StepLayout::kMode], 2);
  EXPECT_EQ(v.header[StepLayout::kNumRequests], 2);
  EXPECT_EQ(v.header[StepLayout::kNumTokens], 6);
  EXPECT_EQ(v.header[StepLayout::kTokensPerRequest], 3);
  EXPECT_EQ(v.header[StepLayout::kNumCommands + 0], 1);
  EXPECT_EQ(v.header[StepLayout::kNumCommands + 1], 0);
  EXPECT_EQ(v.header[StepLayout::kNumPageIds + 0], 2);
  EXPECT_EQ(v.slot[1], 9);
  EXPECT_EQ(v.prefix_len[0], 10);
  EXPECT_EQ(v.extend_len[1], 3);
  EXPECT_EQ(v.encoder_len[0], 7);
  EXPECT_EQ(v.token_ids[5], 6);
  EXPECT_EQ(v.commands[0][0].slot, 5);
  EXPECT_EQ(v.commands[0][0].count, 2);
  EXPECT_EQ(v.page_ids[0][1], 4);
}

TEST(StepInputWriter, ModesStoreTheirTokensPerRequest) {
  const StepImageWriter w(small_capacity());
  std::vector<std::int32_t> image(w.layout().total_words, 0);
  GeneratedStep s;
  s.mode = StepMode::kDecode;
  s.requests = {{3, 7, 1, 0}};
  s.token_ids = {42};
  w.write(s.desc(), image);
  EXPECT_EQ(image[StepLayout::kTokensPerRequest], 1);
  s.mode = StepMode::kExtend;
  s.tokens_per_request = 9;  // ignored
  w.write(s.desc(), image);
  EXPECT_EQ(image[StepLayout::kTokensPerRequest], 0);
}

TEST(StepInputWriter, RejectsBadFieldsNamingThemAndLeavesTheImage) {
  const StepCapacity cap = with_pools();
  const StepImageWriter w(cap);
  {
    GeneratedStep s = good_step();
    s.requests[1].slot = 0;
    expect_rejected(w, s.desc(), "requests[1].slot", "0");
  }
  {
    GeneratedStep s = good_step();
    s.requests[0].slot = 64;
    expect_rejected(w, s.desc(), "requests[0].slot", "64");
  }
  {
    GeneratedStep s = good_step();
    s.requests[1].slot = 5;
    expect_rejected(w, s.desc(), "requests[1].slot", "5");  // duplicate
  }
  {
    GeneratedStep s = good_step();
    s.requests[0].prefix_len = -1;
    expect_rejected(w, s.desc(), "requests[0].prefix_len", "-1");
  }
  {
    GeneratedStep s = good_step();
    s.requests[0].prefix_len = 4094;  // + 3 > max_kv_len 4096
    expect_rejected(w, s.desc(), "requests[0].prefix_len", "4094");
  }
  {
    GeneratedStep s = good_step();
    s.requests[1].encoder_len = 601;
    expect_rejected(w, s.desc(), "requests[1].encoder_len", "601");
  }
  {
    GeneratedStep s = good_step();
    s.requests[1].encoder_len = -2;
    expect_rejected(w, s.desc(), "requests[1].encoder_len", "-2");
  }
  {
    GeneratedStep s = good_step();  // verify needs extend_len == N
    s.requests[1].extend_len = 2;
    s.token_ids.pop_back();
    expect_rejected(w, s.desc(), "requests[1].extend_len", "2");
  }
  {
    GeneratedStep s = good_step();
    s.mode = StepMode::kDecode;
    s.tokens_per_request = 1;
    expect_rejected(w, s.desc(), "requests[0].extend_len", "3");
  }
  {
    GeneratedStep s = good_step();
    s.mode = StepMode::kDecode;
    s.tokens_per_request = 2;
    expect_rejected(w, s.desc(), "tokens_per_request", "2");
  }
  {
    GeneratedStep s = good_step();
    s.mode = StepMode::kDraftExtendV2;
    s.tokens_per_request = 2;  // extend 3 > N
    expect_rejected(w, s.desc(), "requests[0].extend_len", "3");
  }
  {
    GeneratedStep s = good_step();
    s.mode = StepMode::kTargetVerify;
    s.tokens_per_request = 0;
    expect_rejected(w, s.desc(), "tokens_per_request", "0");
  }
  {
    GeneratedStep s = good_step();
    s.token_ids.push_back(1);
    expect_rejected(w, s.desc(), "token_ids", "7");
  }
  {
    GeneratedStep s = good_step();
    s.token_ids[2] = -5;
    expect_rejected(w, s.desc(), "token_ids[2]", "-5");
  }
  {
    GeneratedStep s = good_step();
    s.requests.clear();
    s.token_ids.clear();
    expect_rejected(w, s.desc(), "num_requests", "0");
  }
  {
    GeneratedStep s = good_step();
    StepDesc d = s.desc();
    d.mode = static_cast<StepMode>(7);
    expect_rejected(w, d, "mode", "7");
  }
  {
    std::mt19937 rng(1);
    GeneratedStep s = random_step(rng, cap, StepMode::kDecode, 40);
    s.requests.push_back({63, 0, 1, 0});
    s.token_ids.push_back(0);
    expect_rejected(w, s.desc(), "num_requests", "41");
  }
  {
    GeneratedStep s;  // 40 requests of 8 tokens = 320 > max_tokens 300
    s.mode = StepMode::kTargetVerify;
    s.tokens_per_request = 8;
    for (int r = 0; r < 40; ++r) {
      s.requests.push_back({r + 1, 0, 8, 0});
      for (int i = 0; i < 8; ++i) s.token_ids.push_back(1);
    }
    expect_rejected(w, s.desc(), "requests[37].extend_len", "8");
  }
  {
    TableCommandBatch big(20, 40);
    for (int i = 0; i < 9; ++i) big.push_clear(1, i, 1);
    GeneratedStep s = good_step();
    StepDesc d = s.desc();
    d.tables[1] = &big;
    expect_rejected(w, d, "pools[1].commands", "9");
  }
  {
    TableCommandBatch bad(8, 32);
    bad.push_set(3, 0, std::vector<std::int32_t>{0});  // the reserved page is never handed out
    GeneratedStep s = good_step();
    StepDesc d = s.desc();
    d.tables[2] = &bad;
    std::vector<std::int32_t> image(w.layout().total_words, 77);
    EXPECT_THROW(w.write(d, image), Error);
    EXPECT_EQ(image, std::vector<std::int32_t>(w.layout().total_words, 77));
  }
}

TEST(StepInputWriter, AuxWordsTravelPerRequestAndAreSizeChecked) {
  StepCapacity cap = with_pools();
  cap.aux_words = 3;
  const StepImageWriter w(cap);
  GeneratedStep s = good_step();
  StepDesc d = s.desc();
  const std::vector<std::int32_t> aux = {10, 11, 12, 20, 21, 22};
  d.aux = aux;
  std::vector<std::int32_t> image(w.layout().total_words, 0);
  w.write(d, image);
  const StepInputView v = StepInputView::over(image.data(), w.layout());
  EXPECT_EQ(std::vector<std::int32_t>(v.aux, v.aux + 6), aux);
  EXPECT_GE(w.layout().aux, w.layout().token_ids + 300);  // after the token ids section
  const std::vector<std::int32_t> short_aux = {1, 2, 3};
  d.aux = short_aux;
  expect_rejected(w, d, "aux", "3");
  // Without aux words in the capacity, any aux data is refused.
  const StepImageWriter plain(with_pools());
  d.aux = aux;
  expect_rejected(plain, d, "aux", "6");
}

TEST(StepInputWriter, DeviceTokenSentinelOnlyWithFeedback) {
  GeneratedStep s;
  s.mode = StepMode::kDecode;
  s.requests = {{3, 7, 1, 0}, {4, 2, 1, 0}};
  s.token_ids = {step_rules::kTokenFromDevice, 5};
  expect_rejected(StepImageWriter(small_capacity()), s.desc(), "token_ids[0]", "-1");
  StepCapacity cap = small_capacity();
  cap.token_feedback = true;
  const StepImageWriter w(cap);
  std::vector<std::int32_t> image(w.layout().total_words, 0);
  w.write(s.desc(), image);
  EXPECT_EQ(image[w.layout().token_ids], step_rules::kTokenFromDevice);
  s.token_ids[1] = -2;  // only the sentinel is allowed
  expect_rejected(w, s.desc(), "token_ids[1]", "-2");
}

TEST(StepInputWriter, NoCrossCapacityMeansEncoderLengthZero) {
  StepCapacity cap = small_capacity();
  cap.max_encoder_len = 0;
  const StepImageWriter w(cap);
  GeneratedStep s = good_step();
  s.requests[1].encoder_len = 0;
  expect_rejected(w, s.desc(), "requests[0].encoder_len", "7");
}

TEST(StepCapacity, ValidatesFields) {
  StepCapacity c = small_capacity();
  c.max_tokens = 10;  // < max_batch
  try {
    c.validate();
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "max_tokens");
  }
  c = with_pools();
  c.pools[1].geometry.max_slots = 7;
  try {
    c.validate();
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "pools[1].geometry.max_slots");
  }
}

TEST(StepCapacity, PoolsComeFirstInModelOrder) {
  StepCapacity c = with_pools();
  c.pools[1].present = false;  // a gap before pools 2 and 3
  try {
    c.validate();
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "pools[2].present");
  }
  c = with_pools();
  c.pools[2].model = 2;  // after it, pool 3 of model 1
  try {
    c.validate();
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "pools[3].model");
  }
  EXPECT_EQ(with_pools().num_pools(), 4);
}

TEST(StepInputWriter, LogitRowsAreStoredAndBoundedByCapacity) {
  StepCapacity cap = with_pools();
  cap.max_batch = 4;
  cap.max_logit_rows = 5;  // fewer than the good step's 6 tokens
  const StepImageWriter w(cap);
  GeneratedStep s = good_step();
  s.logits = LogitRows::kChosenPerRequest;
  std::vector<std::int32_t> image(w.layout().total_words, 0);
  w.write(s.desc(), image);
  EXPECT_EQ(image[StepLayout::kLogitRows], static_cast<std::int32_t>(LogitRows::kChosenPerRequest));
  s.logits = LogitRows::kEveryRow;
  expect_rejected(w, s.desc(), "logits", "every-row");
  StepDesc d = s.desc();
  d.logits = static_cast<LogitRows>(5);
  expect_rejected(w, d, "logits", "5");
  cap.max_logit_rows = 6;
  const StepImageWriter wide(cap);
  s.logits = LogitRows::kEveryRow;
  wide.write(s.desc(), image);
  EXPECT_EQ(image[StepLayout::kLogitRows], static_cast<std::int32_t>(LogitRows::kEveryRow));
}

TEST(StepInputWriter, SpeculativeStepsAreBoundedByTheDraftCapacity) {
  GeneratedStep s;
  s.mode = StepMode::kSpeculative;
  s.tokens_per_request = 3;                        // k = 3 drafts, verify of 4 rows
  s.requests = {{5, 100, 4, 0}, {9, 4089, 1, 0}};  // 4089 + 1 + 3 = 4093 <= 4096
  s.token_ids = {1, 2, 3, 4, 5};
  StepCapacity cap = small_capacity();
  cap.max_draft_tokens = 0;
  expect_rejected(StepImageWriter(cap), s.desc(), "mode", "speculative");
  cap.max_draft_tokens = 3;
  const StepImageWriter w(cap);
  std::vector<std::int32_t> image(w.layout().total_words, 0);
  w.write(s.desc(), image);
  EXPECT_EQ(image[StepLayout::kTokensPerRequest], 3);
  {
    GeneratedStep bad = s;
    bad.tokens_per_request = 4;
    expect_rejected(w, bad.desc(), "tokens_per_request", "4");
  }
  {
    GeneratedStep bad = s;
    bad.requests[0].extend_len = 5;  // more than k_max + 1 = 4 committed tokens
    bad.token_ids.push_back(6);
    expect_rejected(w, bad.desc(), "requests[0].extend_len", "5");
  }
  {
    GeneratedStep bad = s;
    bad.requests[1].prefix_len = 4093;  // + 1 + 3 > max_kv_len 4096: the verify would not fit
    expect_rejected(w, bad.desc(), "requests[1].prefix_len", "4093");
  }
  {
    GeneratedStep bad = s;
    bad.logits = LogitRows::kEveryRow;
    expect_rejected(w, bad.desc(), "logits", "every-row");
  }
}

TEST(StepInputWriter, AcceptsRandomStepsOfEveryMode) {
  const StepCapacity cap = small_capacity();
  const StepImageWriter w(cap);
  std::mt19937 rng(7);
  std::vector<std::int32_t> image(w.layout().total_words, 0);
  for (int i = 0; i < 400; ++i) {
    const auto mode = static_cast<StepMode>(i % kNumStepModes);
    const std::int32_t n = 1 + static_cast<std::int32_t>(rng() % cap.max_batch);
    const GeneratedStep s = random_step(rng, cap, mode, n);
    ASSERT_NO_THROW(w.write(s.desc(), image)) << "step " << i;
  }
}

}  // namespace
}  // namespace graphdecode
