// The host side of a speculative request between steps (engine/spec/spec_rules.h): where its
// target and draft caches end, which committed tokens the draft has not extended over yet, and
// the page-ledger operations that give each speculative step exactly the pages it touches.
// Plain host code, tested on the CPU.
//
// Between steps: the target has cached P positions, the draft D <= P; `pending` holds the tokens
// committed since the draft's cache ends (positions D .. P), the last of which, the last committed
// token, sits at P and is in neither cache. A prefill leaves P = D = prompt length and pending =
// the token the prefill sampled.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "memory/kv_ledger.h"

namespace graphdecode {

struct SpecRequestState {
  std::int32_t target_cached = 0;     // P
  std::int32_t draft_cached = 0;      // D
  std::vector<std::int32_t> pending;  // positions D .. P; never empty between steps
};

// The ledger groups of a speculative step's two models.
inline constexpr std::int32_t kTargetGroup = 0;
inline constexpr std::int32_t kDraftGroup = 1;

// Before a speculative step of k drafts: the target's pages for the verify (positions P .. P + k)
// and the draft model's for its extend and decodes (D .. P + max(k, 1) - 1). All-or-nothing. A
// proposer without a model (prompt lookup) has no draft pages: its D is bookkeeping only.
void reserve_spec_step(KvLedger& ledger, std::int32_t slot, const SpecRequestState& state,
                       std::int32_t k);

// After the step committed `committed` (a + 1 tokens: a accepted drafts, then the target's
// token): the target keeps P + a + 1 positions (the last committed token and the accepted
// drafts), the draft P + 1 (its extend; its decodes are recomputed from the next extend on);
// P, D and pending move on.
void commit_spec_step(KvLedger& ledger, std::int32_t slot, SpecRequestState& state,
                      std::span<const std::int32_t> committed);

}  // namespace graphdecode
