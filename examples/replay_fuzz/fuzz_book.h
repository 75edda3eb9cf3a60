// The replay fuzzer's host book (plain C++, no CUDA call; tested on the CPU): the live requests
// both engines share, their tokens and cache lengths, and the step being built from them, over
// the page ledger of the step's pools (both models'; groups 0 = target, 1 = draft).
//
// A request's tokens: committed[p] is the token at position p. The target's cache holds positions
// [0, target_cached), the draft's [0, draft_cached); committed tokens past a cache are pending.
//   plain request: joins plain steps only; both caches always end at committed.size().
//   speculative request: joins speculative steps, and plain steps whenever both caches agree
//     (then at most one token, the last one a speculative step committed, is pending: the plain
//     step's first new token). A speculative step first commits one fresh token when nothing is
//     pending (the token a plain step or prefill would have sampled), so at a speculative step
//     target_cached = P, the last committed token's position, and draft_cached = D <= P
//     (engine/spec/spec_book.h).
#pragma once

#include <array>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "fuzz_config.h"
#include "graphs/step_input.h"
#include "memory/kv_ledger.h"

namespace graphdecode::fuzz {

struct Request {
  std::int32_t slot = 0;
  std::uint32_t id = 0;
  std::int32_t encoder_len = 0;
  bool speculative = false;
  std::vector<std::int32_t> committed;  // token id at each position
  std::int32_t target_cached = 0, draft_cached = 0;
};

// One request of the step being built.
struct StepRow {
  std::size_t live = 0;  // index in live()
  StepRequest q;         // the image's row
  // Per model (0 target, 1 draft): the first position the step writes; pages below stay.
  std::array<std::int32_t, 2> first_written{};
  std::int32_t last = 0;                          // speculative: P
  std::array<std::int32_t, kMaxDrafts> drafts{};  // speculative: d_1 .. d_max(k, 1)
};

class FuzzBook {
 public:
  // `ledger` (of `cap`'s pools) and `rng` must outlive the book. spec_percent: the share of
  // speculative steps; 0 = no request speculates.
  FuzzBook(KvLedger& ledger, const StepCapacity& cap, const SpecStackConfig& config,
           std::int32_t spec_percent, std::mt19937_64& rng);

  // Departures (the ledger releases them) and arrivals (slots, encoder pages); returns the
  // arrivals' indices in live(), whose encoder K/V the engines write.
  std::vector<std::size_t> churn();
  // Draws the next step (mode, N or k, batch, rows) and extends / reserves its pages.
  void build_step();
  // The step's image description (tables not attached).
  StepDesc desc() const;
  // After the step: rollback of a plain verify (keep 1 .. N of its rows), or a speculative step's
  // acceptance (a in 0 .. k drafts, then a fresh token) and commit (spec_book.h).
  void settle();

  const std::vector<Request>& live() const noexcept { return live_; }
  StepMode mode() const noexcept { return mode_; }
  std::int32_t n_key() const noexcept { return n_key_; }  // plain: N of the key; speculative: k
  const std::vector<StepRow>& rows() const noexcept { return rows_; }
  const std::vector<std::int32_t>& tokens() const noexcept { return tokens_; }
  std::int64_t drafted() const noexcept { return drafted_; }
  std::int64_t accepted() const noexcept { return accepted_; }

  // The cache a row of the step reads, as token ids at positions 0 .. its own (the last):
  //   image_tokens: token t of the image's rows (a plain step's rows, or the draft-extend's);
  //     `row` gets its request row;
  //   drafted_tokens: speculative row i of `row`'s verify (or draft decode i): committed
  //     tokens 0 .. P, then d_1 .. d_i.
  // Valid until the next call or change of the book.
  std::span<const std::int32_t> image_tokens(std::int32_t t, std::size_t& row) const;
  std::span<const std::int32_t> drafted_tokens(const StepRow& row, std::int32_t i);

 private:
  void finish(std::size_t i);
  void build_plain(std::vector<std::size_t> candidates);
  void build_spec(std::vector<std::size_t> candidates);
  std::int32_t fresh_token() { return uniform(rng_, 0, config_.vocab - 1); }

  KvLedger& ledger_;
  StepCapacity cap_;
  SpecStackConfig config_;
  std::int32_t spec_percent_ = 0;
  std::mt19937_64& rng_;
  std::vector<Request> live_;
  std::uint32_t next_id_ = 1;
  StepMode mode_ = StepMode::kDecode;
  std::int32_t n_key_ = 1;
  std::vector<StepRow> rows_;
  std::vector<StepRequest> requests_;
  std::vector<std::int32_t> tokens_;
  std::vector<std::int32_t> keys_;  // drafted_tokens' scratch
  std::int64_t drafted_ = 0, accepted_ = 0;
};

}  // namespace graphdecode::fuzz
