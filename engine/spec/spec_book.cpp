#include "engine/spec/spec_book.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace graphdecode {

void reserve_spec_step(KvLedger& ledger, std::int32_t slot, const SpecRequestState& s,
                       std::int32_t k) {
  const auto c = static_cast<std::int32_t>(s.pending.size());
  GD_REQUIRE(c >= 1, "pending", c, "a speculative step starts from the last committed token");
  GD_REQUIRE(k >= 0, "k", k, "cannot be negative");
  const std::int32_t p = s.draft_cached + c - 1;
  GD_REQUIRE(
      p == s.target_cached, "draft_cached", s.draft_cached,
      "the pending tokens must end at the target's cache end " + std::to_string(s.target_cached));
  GD_REQUIRE(ledger.tokens(slot, kTargetGroup) == s.target_cached, "slot", slot,
             "the target's pages do not end at its cache end");
  GD_REQUIRE(!ledger.has_group(kDraftGroup) || ledger.tokens(slot, kDraftGroup) == s.draft_cached,
             "slot", slot, "the draft's pages do not end at its cache end");
  const std::int32_t grow[2] = {k + 1, c + std::max(k, 1) - 1};  // [target, draft]
  ledger.extend_groups(slot, grow);
}

void commit_spec_step(KvLedger& ledger, std::int32_t slot, SpecRequestState& s,
                      std::span<const std::int32_t> committed) {
  const auto n = static_cast<std::int32_t>(committed.size());
  GD_REQUIRE(n >= 1, "committed", n, "a step commits at least the target's token");
  const std::int32_t p = s.target_cached;
  GD_REQUIRE(ledger.tokens(slot, kTargetGroup) >= p + n, "committed", n,
             "more tokens than the step verified");
  ledger.truncate(slot, p + n, kTargetGroup);
  if (ledger.has_group(kDraftGroup)) ledger.truncate(slot, p + 1, kDraftGroup);
  s.target_cached = p + n;
  s.draft_cached = p + 1;
  s.pending.assign(committed.begin(), committed.end());
}

}  // namespace graphdecode
