#include "fuzz_book.h"

#include <algorithm>

#include "common/error.h"
#include "engine/spec/spec_book.h"
#include "synthetic.h"

namespace graphdecode::fuzz {

FuzzBook::FuzzBook(KvLedger& ledger, const StepCapacity& cap, const SpecStackConfig& config,
                   std::int32_t spec_percent, std::mt19937_64& rng)
    : ledger_(ledger), cap_(cap), config_(config), spec_percent_(spec_percent), rng_(rng) {
  GD_REQUIRE(spec_percent >= 0 && spec_percent <= 100, "spec_percent", spec_percent,
             "a share in [0, 100]");
  GD_REQUIRE(
      cap.max_draft_tokens == config.max_draft_tokens && config.max_draft_tokens <= kMaxDrafts,
      "capacity.max_draft_tokens", cap.max_draft_tokens,
      "the book drafts up to the config's max_draft_tokens (at most kMaxDrafts)");
}

void FuzzBook::finish(std::size_t i) {
  ledger_.release(live_[i].slot);
  live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
}

std::vector<std::size_t> FuzzBook::churn() {
  for (std::size_t i = live_.size(); i-- > 0;) {
    const bool full =
        static_cast<std::int32_t>(live_[i].committed.size()) > cap_.max_kv_len - kMaxPrompt;
    if (full || uniform(rng_, 0, 99) < 4) finish(i);
  }
  const std::int32_t room = cap_.max_slots - 1 - static_cast<std::int32_t>(live_.size());
  const std::int32_t arrivals =
      live_.empty() ? uniform(rng_, 1, std::max(1, std::min(room, 8)))
                    : (uniform(rng_, 0, 2) == 0 ? uniform(rng_, 0, std::min(room, 4)) : 0);
  std::vector<std::size_t> fresh;
  for (std::int32_t i = 0; i < arrivals; ++i) {
    Request r;
    r.slot = ledger_.acquire();
    r.id = next_id_++;
    r.speculative = spec_percent_ > 0 && uniform(rng_, 0, 9) < 7;
    // Every live request a different encoder length (0 included once).
    for (int attempt = 0; attempt < 64; ++attempt) {
      r.encoder_len = uniform(rng_, 0, cap_.max_encoder_len);
      if (std::none_of(live_.begin(), live_.end(),
                       [&](const Request& o) { return o.encoder_len == r.encoder_len; })) {
        break;
      }
    }
    if (r.encoder_len > 0) ledger_.set_encoder(r.slot, r.encoder_len);
    live_.push_back(r);
    fresh.push_back(live_.size() - 1);
  }
  return fresh;
}

void FuzzBook::build_step() {
  std::vector<std::size_t> spec, plain;
  for (std::size_t i = 0; i < live_.size(); ++i) {
    if (live_[i].speculative) spec.push_back(i);
    if (live_[i].target_cached == live_[i].draft_cached) plain.push_back(i);
  }
  GD_REQUIRE(!spec.empty() || !plain.empty(), "live", live_.size(), "no request to step");
  rows_.clear();
  requests_.clear();
  tokens_.clear();
  // Every live request is a candidate of one kind at least.
  if (!spec.empty() && (plain.empty() || uniform(rng_, 0, 99) < spec_percent_)) {
    build_spec(std::move(spec));
  } else {
    build_plain(std::move(plain));
  }
}

StepDesc FuzzBook::desc() const {
  StepDesc d;
  d.mode = mode_;
  d.tokens_per_request = n_key_;
  d.requests = requests_;
  d.token_ids = tokens_;
  return d;
}

// A plain step over both stacks: decode, target-verify, draft-extend-v2 or extend.
void FuzzBook::build_plain(std::vector<std::size_t> order) {
  const std::int32_t roll = uniform(rng_, 0, 99);
  mode_ = roll < 35   ? StepMode::kDecode
          : roll < 60 ? StepMode::kTargetVerify
          : roll < 85 ? StepMode::kDraftExtendV2
                      : StepMode::kExtend;
  n_key_ = mode_ == StepMode::kDecode ? 1 : mode_ == StepMode::kExtend ? 0 : kVerifyTokens;
  if (n_key_ > 1 && uniform(rng_, 0, 9) == 0)
    n_key_ = uniform(rng_, 1, kVerifyTokens + 2);  // uncaptured N
  std::shuffle(order.begin(), order.end(), rng_);
  const std::int32_t b_max = std::min({cap_.max_batch, static_cast<std::int32_t>(order.size()),
                                       cap_.max_tokens / std::max(n_key_, 1)});
  order.resize(static_cast<std::size_t>(uniform(rng_, 1, b_max)));
  std::int32_t budget = cap_.max_tokens;
  for (std::size_t j = 0; j < order.size(); ++j) {
    Request& r = live_[order[j]];
    const auto left = static_cast<std::int32_t>(order.size() - j - 1);
    std::int32_t ext = 1;
    if (mode_ == StepMode::kTargetVerify) ext = n_key_;
    if (mode_ == StepMode::kDraftExtendV2) ext = uniform(rng_, 1, n_key_);
    if (mode_ == StepMode::kExtend)
      ext = uniform(rng_, 1, std::max(1, std::min(kMaxPrompt, budget - left * kVerifyTokens)));
    budget -= ext;
    const std::int32_t prefix = r.target_cached;
    GD_REQUIRE(
        r.draft_cached == prefix && r.committed.size() <= static_cast<std::size_t>(prefix) + 1,
        "fuzz request", r.slot, "a plain step needs both caches at the same length");
    StepRow row;
    row.live = order[j];
    row.q = StepRequest{r.slot, prefix, ext, r.encoder_len};
    row.first_written = {prefix, prefix};
    ledger_.extend(r.slot, ext);  // both models
    // The pending token (a speculative step's last commit) first, then fresh ones.
    while (static_cast<std::int32_t>(r.committed.size()) < prefix + ext)
      r.committed.push_back(fresh_token());
    tokens_.insert(tokens_.end(), r.committed.begin() + prefix, r.committed.end());
    r.target_cached = r.draft_cached = prefix + ext;
    rows_.push_back(row);
    requests_.push_back(row.q);
  }
}

// A speculative step of k drafts over speculative requests (engine/spec/spec_book.h).
void FuzzBook::build_spec(std::vector<std::size_t> order) {
  mode_ = StepMode::kSpeculative;
  const bool captured = uniform(rng_, 0, 99) < 85;
  n_key_ = captured ? kCapturedK[uniform(rng_, 0, std::size(kCapturedK) - 1)]
                    : kUncapturedK[uniform(rng_, 0, std::size(kUncapturedK) - 1)];
  const std::int32_t k = n_key_;
  std::shuffle(order.begin(), order.end(), rng_);
  const std::int32_t b_max = std::min(
      {cap_.max_batch, static_cast<std::int32_t>(order.size()), cap_.max_tokens / (k + 1)});
  order.resize(static_cast<std::size_t>(uniform(rng_, 1, b_max)));
  for (std::size_t idx : order) {
    Request& r = live_[idx];
    if (static_cast<std::int32_t>(r.committed.size()) == r.target_cached)
      r.committed.push_back(fresh_token());  // what the last plain step would have sampled
    const std::int32_t p = r.target_cached, d = r.draft_cached;
    GD_REQUIRE(static_cast<std::int32_t>(r.committed.size()) == p + 1 && d <= p, "fuzz request",
               r.slot, "a speculative step starts from one last committed token at P");
    const SpecRequestState s{p, d, {r.committed.begin() + d, r.committed.end()}};
    reserve_spec_step(ledger_, r.slot, s, k);
    StepRow row;
    row.live = idx;
    row.q = StepRequest{r.slot, d, p + 1 - d, r.encoder_len};
    row.first_written = {p, d};
    row.last = p;
    // The device's chain (SpecStack): d_1 from the draft-extend's last row (the last committed
    // token at P), d_{j+1} from draft decode j's row (d_j at P + j).
    std::int32_t prev = r.committed[static_cast<std::size_t>(p)];
    for (std::int32_t j = 0; j < std::max(k, 1); ++j) {
      prev = synthetic::draft_token(config_.draft_seed, r.slot, p + j, prev, config_.vocab);
      row.drafts[static_cast<std::size_t>(j)] = prev;
    }
    tokens_.insert(tokens_.end(), r.committed.begin() + d, r.committed.end());
    rows_.push_back(row);
    requests_.push_back(row.q);
  }
}

void FuzzBook::settle() {
  if (mode_ == StepMode::kTargetVerify) {
    // Rollback after a plain verify: keep the prefix and 1 .. N of its rows, in both models.
    for (const StepRow& row : rows_) {
      Request& r = live_[row.live];
      const std::int32_t keep = row.q.prefix_len + uniform(rng_, 1, n_key_);
      ledger_.truncate(r.slot, keep);
      r.committed.resize(static_cast<std::size_t>(keep));
      r.target_cached = r.draft_cached = keep;
    }
  }
  if (mode_ != StepMode::kSpeculative) return;
  // Acceptance: a in 0 .. k drafts, then a token of the target's (random here); the book rolls
  // the target back to P + a + 1 and the draft to P + 1, and the next speculative step's
  // draft-extend runs over the a + 1 committed tokens.
  const std::int32_t k = n_key_;
  std::vector<std::int32_t> commit;
  for (const StepRow& row : rows_) {
    Request& r = live_[row.live];
    const std::int32_t a = uniform(rng_, 0, k);
    commit.assign(row.drafts.begin(), row.drafts.begin() + a);
    commit.push_back(fresh_token());
    SpecRequestState s{
        r.target_cached, r.draft_cached, {r.committed.begin() + r.draft_cached, r.committed.end()}};
    commit_spec_step(ledger_, r.slot, s, commit);
    r.committed.insert(r.committed.end(), commit.begin(), commit.end());
    r.target_cached = s.target_cached;
    r.draft_cached = s.draft_cached;
    drafted_ += k;
    accepted_ += a;
  }
}

std::span<const std::int32_t> FuzzBook::image_tokens(std::int32_t t, std::size_t& j) const {
  GD_REQUIRE(t >= 0 && t < static_cast<std::int32_t>(tokens_.size()), "t", t,
             "not a token of the step's image");
  std::int32_t start = 0;
  j = 0;
  while (start + rows_[j].q.extend_len <= t) start += rows_[j++].q.extend_len;
  const Request& r = live_[rows_[j].live];
  const std::int32_t pos = rows_[j].q.prefix_len + (t - start);
  return {r.committed.data(), static_cast<std::size_t>(pos) + 1};
}

std::span<const std::int32_t> FuzzBook::drafted_tokens(const StepRow& row, std::int32_t i) {
  GD_REQUIRE(mode_ == StepMode::kSpeculative && i >= 0 && i <= std::max(n_key_, 1), "i", i,
             "a speculative step's row 0 .. k");
  const Request& r = live_[row.live];
  keys_.assign(r.committed.begin(), r.committed.begin() + row.last + 1);
  keys_.insert(keys_.end(), row.drafts.begin(), row.drafts.begin() + i);
  return keys_;
}

}  // namespace graphdecode::fuzz
