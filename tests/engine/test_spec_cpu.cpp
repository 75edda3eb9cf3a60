// Speculative decoding on the CPU: the phases derived from a draft-extend (spec_prep_host, the
// twin of the device kernel), the prompt-lookup rule, and the host book of a speculative request
// (reserve before a step, commit after it) against the page ledger.
#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"
#include "engine/spec/spec_book.h"
#include "engine/spec/spec_prep.h"
#include "engine/spec/spec_rules.h"
#include "graphs/step_prep.h"

namespace graphdecode {
namespace {

StepCapacity capacity() {
  StepCapacity c;
  c.max_batch = 4;
  c.max_tokens = 16;
  c.max_slots = 9;
  c.max_kv_len = 256;
  c.max_encoder_len = 0;
  c.max_logit_rows = 16;
  c.max_draft_tokens = 3;
  return c;
}

// The draft-extend of a speculative step: requests in slots 7 and 2 committed 2 and 1 tokens
// since their last step; their last committed tokens (12 and 21) sit at positions 11 and 4.
struct Prepared {
  StepCapacity cap = capacity();
  StepMetaLayout layout = StepMetaLayout::compute(cap);
  std::vector<std::int32_t> x, v, d1, d2;
  StepMetaView xv, vv, d1v, d2v;
  explicit Prepared(std::int32_t k) {
    const StepImageWriter w(cap);
    std::vector<std::int32_t> image(w.layout().total_words, 0);
    const std::vector<StepRequest> req = {{7, 10, 2, 0}, {2, 4, 1, 0}};
    const std::vector<std::int32_t> ids = {11, 12, 21};
    StepDesc d;
    d.mode = StepMode::kSpeculative;
    d.tokens_per_request = k;
    d.requests = req;
    d.token_ids = ids;
    w.write(d, image);
    for (auto* b : {&x, &v, &d1, &d2}) b->assign(layout.total_words, -99);
    prep_step_host(StepInputView::over(image.data(), w.layout()), cap, x);
    xv = StepMetaView::over(x.data(), layout);
    vv = StepMetaView::over(v.data(), layout);
    d1v = StepMetaView::over(d1.data(), layout);
    d2v = StepMetaView::over(d2.data(), layout);
    const StepMetaView decodes[] = {d1v, d2v};
    spec_prep_host(xv, cap, k, vv, decodes);
  }
};

std::vector<int> range(const std::int32_t* p, int n) {
  return std::vector<int>(p, p + n);
}

TEST(SpecPrep, VerifyAndDraftDecodesHandChecked) {
  const Prepared p(3);  // k = 3: verify of 4 rows, draft decodes 1 and 2
  // Draft-extend (the prep's block): 2 + 1 rows, extents 12 and 5, last row per request.
  EXPECT_EQ(range(p.xv.kv_len, 4), (std::vector<int>{12, 5, 0, 0}));
  EXPECT_EQ(range(p.xv.logit_row, 2), (std::vector<int>{1, 2}));
  // Verify: positions 11..14 and 4..7, extents 15 and 8, row 0 = the last committed token.
  const StepMetaView& v = p.vv;
  EXPECT_EQ(v.scalars[StepMetaLayout::kNumRequests], 2);
  EXPECT_EQ(v.scalars[StepMetaLayout::kNumTokens], 8);
  EXPECT_EQ(v.scalars[StepMetaLayout::kMaxQLen], 4);
  EXPECT_EQ(v.scalars[StepMetaLayout::kMaxKvLen], 15);
  EXPECT_EQ(v.scalars[StepMetaLayout::kMode], static_cast<int>(StepMode::kTargetVerify));
  EXPECT_EQ(v.scalars[StepMetaLayout::kTotalKv], 23);
  EXPECT_EQ(v.scalars[StepMetaLayout::kNumLogitRows], 8);
  EXPECT_EQ(range(v.slot, 4), (std::vector<int>{7, 2, 0, 0}));
  EXPECT_EQ(range(v.q_start, 5), (std::vector<int>{0, 4, 8, 8, 8}));
  EXPECT_EQ(range(v.kv_len, 4), (std::vector<int>{15, 8, 0, 0}));
  EXPECT_EQ(range(v.cu_seqlens_k, 5), (std::vector<int>{0, 15, 23, 23, 23}));
  EXPECT_EQ(range(v.token_position, 10), (std::vector<int>{11, 12, 13, 14, 4, 5, 6, 7, 0, 0}));
  EXPECT_EQ(range(v.token_request, 10), (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1, -1, -1}));
  EXPECT_EQ(range(v.token_slot, 10), (std::vector<int>{7, 7, 7, 7, 2, 2, 2, 2, 0, 0}));
  EXPECT_EQ(range(v.token_id, 9), (std::vector<int>{12, 0, 0, 0, 21, 0, 0, 0, 0}));
  EXPECT_EQ(range(v.logit_row, 10), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 0, 0}));
  // Draft decode 2: input d_2 at positions 13 and 6, extents 14 and 7.
  const StepMetaView& d = p.d2v;
  EXPECT_EQ(d.scalars[StepMetaLayout::kNumTokens], 2);
  EXPECT_EQ(d.scalars[StepMetaLayout::kMaxKvLen], 14);
  EXPECT_EQ(d.scalars[StepMetaLayout::kMode], static_cast<int>(StepMode::kDecode));
  EXPECT_EQ(range(d.kv_len, 3), (std::vector<int>{14, 7, 0}));
  EXPECT_EQ(range(d.q_start, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(range(d.token_position, 3), (std::vector<int>{13, 6, 0}));
  EXPECT_EQ(range(d.cu_seqlens_k, 3), (std::vector<int>{0, 14, 21}));
  EXPECT_EQ(range(d.logit_row, 3), (std::vector<int>{0, 1, 0}));
  EXPECT_EQ(range(p.d1v.token_position, 2), (std::vector<int>{12, 5}));
}

TEST(SpecPrep, NoDraftsVerifiesTheLastCommittedTokenAlone) {
  const Prepared p(0);  // k = 0: a decode of the target, the draft kept current
  EXPECT_EQ(range(p.vv.kv_len, 3), (std::vector<int>{12, 5, 0}));
  EXPECT_EQ(range(p.vv.token_position, 3), (std::vector<int>{11, 4, 0}));
  EXPECT_EQ(range(p.vv.token_id, 3), (std::vector<int>{12, 21, 0}));
  EXPECT_EQ(p.vv.scalars[StepMetaLayout::kNumLogitRows], 2);
}

TEST(SpecRules, PromptLookupProposesWhatFollowedTheLatestLongestSuffix) {
  std::int32_t out[8];
  // ... 7 8 9 | 1 2 3 4 | 7 8 9: the suffix "7 8 9" occurred at 0; what followed was 1 2 3 4.
  const std::vector<std::int32_t> a = {7, 8, 9, 1, 2, 3, 4, 7, 8, 9};
  EXPECT_EQ(spec_rules::ngram_propose(a.data(), 9, 4, 1, 4, out), 3);
  EXPECT_EQ(std::vector<int>(out, out + 4), (std::vector<int>{1, 2, 3, 4}));
  // The latest occurrence wins; a continuation that reaches the end repeats its last token.
  const std::vector<std::int32_t> b = {5, 6, 1, 5, 6, 2, 3, 5, 6};
  EXPECT_EQ(spec_rules::ngram_propose(b.data(), 8, 2, 1, 4, out), 5);
  EXPECT_EQ(std::vector<int>(out, out + 4), (std::vector<int>{2, 3, 5, 6}));
  EXPECT_EQ(spec_rules::ngram_propose(b.data(), 8, 2, 1, 5, out), 5);
  EXPECT_EQ(std::vector<int>(out, out + 5), (std::vector<int>{2, 3, 5, 6, 6}));
  // No earlier occurrence of any suffix (min_ngram 2): every draft is the last token.
  const std::vector<std::int32_t> c = {1, 2, 3, 4};
  EXPECT_EQ(spec_rules::ngram_propose(c.data(), 3, 3, 2, 3, out), -1);
  EXPECT_EQ(std::vector<int>(out, out + 3), (std::vector<int>{4, 4, 4}));
  // A one-token history proposes itself.
  EXPECT_EQ(spec_rules::ngram_propose(c.data(), 0, 3, 1, 2, out), -1);
  EXPECT_EQ(std::vector<int>(out, out + 2), (std::vector<int>{1, 1}));
}

LedgerPool pool(AttentionKind kind, std::int32_t group) {
  LedgerPool p;
  p.geometry.kind = kind;
  p.geometry.page_size = 4;
  p.geometry.num_pages = 40;
  p.geometry.max_slots = 3;
  p.geometry.max_pages_per_slot = 16;
  p.geometry.window_left = kind == AttentionKind::kSliding ? 6 : -1;
  p.max_commands = 16;
  p.max_page_ids = 32;
  p.group = group;
  p.max_step_tokens = 8;
  return p;
}

TEST(SpecBook, ReserveAndCommitGiveEachStepItsPages) {
  // Target: full + sliding (window 6) pools; draft: a full pool.
  const std::vector<LedgerPool> pools = {pool(AttentionKind::kFull, kTargetGroup),
                                         pool(AttentionKind::kSliding, kTargetGroup),
                                         pool(AttentionKind::kFull, kDraftGroup)};
  KvLedger ledger(pools);
  const std::int32_t slot = ledger.acquire();
  ledger.extend(slot, 10);  // a prefill of 10 prompt tokens in both models
  SpecRequestState s{10, 10, {42}};
  reserve_spec_step(ledger, slot, s, 3);
  EXPECT_EQ(ledger.tokens(slot, kTargetGroup), 14);       // verify positions 10 .. 13
  EXPECT_EQ(ledger.tokens(slot, kDraftGroup), 13);        // extend 10, decodes 11 .. 12
  const std::vector<std::int32_t> committed = {5, 6, 9};  // two drafts accepted, then the target's
  commit_spec_step(ledger, slot, s, committed);
  EXPECT_EQ(s.target_cached, 13);  // 42, 5, 6 cached; 9 is the last committed token
  EXPECT_EQ(s.draft_cached, 11);   // 42 cached; 5, 6, 9 pending
  EXPECT_EQ(s.pending, committed);
  EXPECT_EQ(ledger.tokens(slot, kTargetGroup), 13);
  EXPECT_EQ(ledger.tokens(slot, kDraftGroup), 11);
  reserve_spec_step(ledger, slot, s, 0);  // k = 0: the draft's extend of 3, the target's 1
  EXPECT_EQ(ledger.tokens(slot, kTargetGroup), 14);
  EXPECT_EQ(ledger.tokens(slot, kDraftGroup), 14);
  commit_spec_step(ledger, slot, s, std::vector<std::int32_t>{7});
  EXPECT_EQ(s.target_cached, 14);
  EXPECT_EQ(s.draft_cached, 14);
  // A step that cannot get its pages changes nothing in either model.
  SpecRequestState big = s;
  big.pending.assign(1, 7);
  const std::int32_t free0 = ledger.free_pages(0), free2 = ledger.free_pages(2);
  EXPECT_THROW(reserve_spec_step(ledger, slot, big, 60), Error);  // past max_pages_per_slot
  EXPECT_EQ(ledger.free_pages(0), free0);
  EXPECT_EQ(ledger.free_pages(2), free2);
  EXPECT_EQ(ledger.tokens(slot, kDraftGroup), 14);
  SpecRequestState bad = s;
  bad.draft_cached = 3;  // pending would not end at the target's cache end
  EXPECT_THROW(reserve_spec_step(ledger, slot, bad, 1), Error);
}

}  // namespace
}  // namespace graphdecode
