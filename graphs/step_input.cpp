#include "graphs/step_input.h"

#include <cstring>
#include <limits>
#include <string>

#include "common/error.h"
#include "common/request_rules.h"
#include "graphs/step_rules.h"

namespace graphdecode {
namespace {

constexpr std::size_t kCommandWords = sizeof(TableCommand) / sizeof(std::int32_t);

// Sections start on 16-word (64-byte) boundaries: aligned vector loads and readable offsets.
std::size_t align16(std::size_t words) {
  return (words + 15) / 16 * 16;
}

std::string req_field(std::int64_t r, const char* what) {
  return "requests[" + std::to_string(r) + "]." + what;
}

std::string pool_field(int k, const char* what) {
  return "pools[" + std::to_string(k) + "]." + what;
}

}  // namespace

void StepCapacity::validate() const {
  GD_REQUIRE(max_batch >= 1, "max_batch", max_batch, "a step holds at least one request");
  GD_REQUIRE(max_tokens >= max_batch, "max_tokens", max_tokens,
             "must be >= max_batch (every request adds at least one token)");
  GD_REQUIRE(max_slots >= 2, "max_slots", max_slots, "need the padding slot and one more");
  GD_REQUIRE(max_kv_len >= 1, "max_kv_len", max_kv_len, "must be positive");
  GD_REQUIRE(max_encoder_len >= 0, "max_encoder_len", max_encoder_len, "cannot be negative");
  GD_REQUIRE(aux_words >= 0 && aux_words <= 64, "aux_words", aux_words, "must be in [0, 64]");
  GD_REQUIRE(max_logit_rows == 0 || (max_logit_rows >= max_batch && max_logit_rows <= max_tokens),
             "max_logit_rows", max_logit_rows,
             "must be 0 (= max_batch) or in [max_batch, max_tokens]");
  for (int k = 0; k < kMaxStepPools; ++k) {
    const StepPoolCapacity& p = pools[k];
    if (!p.present) continue;
    GD_REQUIRE(k == 0 || pools[k - 1].present, pool_field(k, "present"), "after a gap",
               "present pools come first");
    GD_REQUIRE(k == 0 || p.model >= pools[k - 1].model, pool_field(k, "model"), p.model,
               "pools are listed in model order");
    GD_REQUIRE(p.model >= 0, pool_field(k, "model"), p.model, "cannot be negative");
    p.geometry.validate();
    GD_REQUIRE(p.geometry.max_slots == max_slots, pool_field(k, "geometry.max_slots"),
               p.geometry.max_slots, "every pool has the step's max_slots rows");
    GD_REQUIRE(p.max_commands >= 1, pool_field(k, "max_commands"), p.max_commands,
               "a present pool takes at least one command per step");
    GD_REQUIRE(p.max_page_ids >= 0, pool_field(k, "max_page_ids"), p.max_page_ids,
               "cannot be negative");
  }
}

std::int32_t StepCapacity::num_pools() const {
  std::int32_t n = 0;
  while (n < kMaxStepPools && pools[n].present) ++n;
  return n;
}

StepLayout StepLayout::compute(const StepCapacity& cap) {
  cap.validate();
  StepLayout l;
  std::size_t w = kHeaderWords;
  const auto take = [&w](std::size_t words) {
    const std::size_t at = w;
    w = align16(w + words);
    return at;
  };
  const auto b = static_cast<std::size_t>(cap.max_batch);
  l.slot = take(b);
  l.prefix_len = take(b);
  l.extend_len = take(b);
  l.encoder_len = take(b);
  l.token_ids = take(static_cast<std::size_t>(cap.max_tokens));
  l.aux = take(b * static_cast<std::size_t>(cap.aux_words));
  for (int k = 0; k < kMaxStepPools; ++k) {
    const StepPoolCapacity& p = cap.pools[k];
    l.commands[k] = take(p.present ? kCommandWords * static_cast<std::size_t>(p.max_commands) : 0);
    l.page_ids[k] = take(p.present ? static_cast<std::size_t>(p.max_page_ids) : 0);
  }
  l.total_words = w;
  return l;
}

StepInputView StepInputView::over(const std::int32_t* image, const StepLayout& l) {
  StepInputView v;
  v.header = image;
  v.slot = image + l.slot;
  v.prefix_len = image + l.prefix_len;
  v.extend_len = image + l.extend_len;
  v.encoder_len = image + l.encoder_len;
  v.token_ids = image + l.token_ids;
  v.aux = image + l.aux;
  for (int k = 0; k < kMaxStepPools; ++k) {
    v.commands[k] = reinterpret_cast<const TableCommand*>(image + l.commands[k]);
    v.page_ids[k] = image + l.page_ids[k];
  }
  return v;
}

StepImageWriter::StepImageWriter(const StepCapacity& cap)
    : cap_(cap), layout_(StepLayout::compute(cap)) {
  seen_.assign(static_cast<std::size_t>(cap_.max_slots), -1);
}

void StepImageWriter::validate(const StepDesc& d) const {
  const auto mode = static_cast<std::int32_t>(d.mode);
  GD_REQUIRE(mode >= 0 && mode < kNumStepModes, "mode", mode, "unknown step mode");
  std::int32_t n_key = d.tokens_per_request;
  if (d.mode == StepMode::kDecode) {
    GD_REQUIRE(n_key == 0 || n_key == 1, "tokens_per_request", n_key,
               "decode adds exactly one token per request");
    n_key = 1;
  } else if (d.mode == StepMode::kTargetVerify || d.mode == StepMode::kDraftExtendV2) {
    GD_REQUIRE(n_key >= 1 && n_key <= cap_.max_tokens, "tokens_per_request", n_key,
               "verify / draft-extend-v2 need N in [1, max_tokens]");
  } else if (d.mode == StepMode::kSpeculative) {
    GD_REQUIRE(cap_.max_draft_tokens >= 1, "mode", "speculative",
               "this step input has no speculative capacity (max_draft_tokens = 0)");
    GD_REQUIRE(n_key >= 0 && n_key <= cap_.max_draft_tokens, "tokens_per_request", n_key,
               "a speculative step drafts k in [0, max_draft_tokens = " +
                   std::to_string(cap_.max_draft_tokens) + "] tokens per request");
    GD_REQUIRE(d.logits == LogitRows::kLastPerRequest, "logits", logit_rows_name(d.logits),
               "a speculative step's rows (the draft-extend) take the last row per request");
  }
  const auto logits = static_cast<std::int32_t>(d.logits);
  GD_REQUIRE(logits >= 0 && logits < kNumLogitRows, "logits", logits, "unknown LogitRows");
  const auto n = static_cast<std::int64_t>(d.requests.size());
  GD_REQUIRE(
      n >= 1 && n <= cap_.max_batch, "num_requests", n,
      "requests per step must be in [1, max_batch = " + std::to_string(cap_.max_batch) + "]");
  // A speculative step's verify adds k rows past each request's last committed token.
  const bool speculative = d.mode == StepMode::kSpeculative;
  const std::int32_t verify_past = speculative ? n_key : 0;
  GD_REQUIRE(!speculative || n * (n_key + 1) <= cap_.max_tokens, "num_requests", n,
             "the verify of k + 1 = " + std::to_string(n_key + 1) +
                 " rows per request exceeds max_tokens = " + std::to_string(cap_.max_tokens));

  if (++epoch_ == std::numeric_limits<std::int32_t>::max()) {  // stamps wrap: clear them once
    seen_.assign(seen_.size(), -1);
    epoch_ = 0;
  }
  // Field names and messages are arguments of GD_REQUIRE, evaluated only when it fails: the
  // success path builds no string.
  std::int64_t tokens = 0;
  for (std::int64_t r = 0; r < n; ++r) {
    const StepRequest& q = d.requests[static_cast<std::size_t>(r)];
    GD_REQUIRE(q.slot != kPaddingSlot, req_field(r, "slot"), q.slot,
               "slot 0 is the padding slot and never holds a request");
    GD_REQUIRE(q.slot > 0 && q.slot < cap_.max_slots, req_field(r, "slot"), q.slot,
               "slot outside [1, max_slots = " + std::to_string(cap_.max_slots) + ")");
    GD_REQUIRE(seen_[static_cast<std::size_t>(q.slot)] != epoch_, req_field(r, "slot"), q.slot,
               "slot appears twice in one step");
    seen_[static_cast<std::size_t>(q.slot)] = epoch_;
    GD_REQUIRE(q.prefix_len >= 0, req_field(r, "prefix_len"), q.prefix_len, "cannot be negative");
    GD_REQUIRE(step_rules::extend_len_allowed(d.mode, n_key, q.extend_len),
               req_field(r, "extend_len"), q.extend_len,
               std::string("not allowed in ") + std::string(step_mode_name(d.mode)) +
                   " mode with tokens_per_request " + std::to_string(n_key) +
                   " (decode 1, verify N, draft-extend-v2 1..N, extend >= 1)");
    GD_REQUIRE(!speculative || q.extend_len <= cap_.max_draft_tokens + 1,
               req_field(r, "extend_len"), q.extend_len,
               "a speculative step's draft-extend commits at most max_draft_tokens + 1 = " +
                   std::to_string(cap_.max_draft_tokens + 1) + " tokens");
    const std::int64_t extent =
        static_cast<std::int64_t>(q.prefix_len) + q.extend_len + verify_past;
    GD_REQUIRE(extent <= cap_.max_kv_len, req_field(r, "prefix_len"), q.prefix_len,
               "prefix_len + extend_len" + std::string(speculative ? " + k" : "") + " = " +
                   std::to_string(extent) + " exceeds max_kv_len " +
                   std::to_string(cap_.max_kv_len));
    GD_REQUIRE(q.encoder_len >= 0 && q.encoder_len <= cap_.max_encoder_len,
               req_field(r, "encoder_len"), q.encoder_len,
               "encoder length outside [0, max_encoder_len = " +
                   std::to_string(cap_.max_encoder_len) + "]");
    tokens += q.extend_len;
    GD_REQUIRE(tokens <= cap_.max_tokens, req_field(r, "extend_len"), q.extend_len,
               "tokens of the step exceed max_tokens = " + std::to_string(cap_.max_tokens));
  }
  GD_REQUIRE(d.logits != LogitRows::kEveryRow || tokens <= cap_.resolved_max_logit_rows(), "logits",
             "every-row",
             "the step's " + std::to_string(tokens) + " tokens exceed max_logit_rows = " +
                 std::to_string(cap_.resolved_max_logit_rows()));
  GD_REQUIRE(static_cast<std::int64_t>(d.token_ids.size()) == tokens, "token_ids",
             d.token_ids.size(),
             "must hold exactly sum(extend_len) = " + std::to_string(tokens) + " ids");
  for (std::size_t t = 0; t < d.token_ids.size(); ++t) {
    const std::int32_t id = d.token_ids[t];
    GD_REQUIRE(id >= 0 || (cap_.token_feedback && id == step_rules::kTokenFromDevice),
               "token_ids[" + std::to_string(t) + "]", id,
               cap_.token_feedback ? "token ids are >= 0 or kTokenFromDevice (-1)"
                                   : "token ids cannot be negative");
  }
  const std::size_t aux_expected = d.requests.size() * static_cast<std::size_t>(cap_.aux_words);
  GD_REQUIRE(d.aux.size() == aux_expected, "aux", d.aux.size(),
             "must hold requests * aux_words = " + std::to_string(aux_expected) + " words");
  for (int k = 0; k < kMaxStepPools; ++k) {
    const TableCommandBatch* b = d.tables[k];
    if (b == nullptr || b->empty()) continue;
    const StepPoolCapacity& p = cap_.pools[k];
    GD_REQUIRE(p.present, pool_field(k, "commands"), b->size(), "this step input has no such pool");
    GD_REQUIRE(b->size() <= p.max_commands, pool_field(k, "commands"), b->size(),
               "more commands than max_commands = " + std::to_string(p.max_commands));
    GD_REQUIRE(b->page_id_count() <= p.max_page_ids, pool_field(k, "page_ids"), b->page_id_count(),
               "more page ids than max_page_ids = " + std::to_string(p.max_page_ids));
    validate_table_commands(b->commands(), b->page_ids(), p.geometry);
  }
}

void StepImageWriter::write(const StepDesc& d, std::span<std::int32_t> image) const {
  GD_REQUIRE(image.size() >= layout_.total_words, "image", image.size(),
             "smaller than the step layout (" + std::to_string(layout_.total_words) + " words)");
  validate(d);
  fill(d, image.data());
}

void StepImageWriter::fill(const StepDesc& d, std::int32_t* img) const {
  const auto n = static_cast<std::int32_t>(d.requests.size());
  const auto tokens = static_cast<std::int32_t>(d.token_ids.size());
  img[StepLayout::kMode] = static_cast<std::int32_t>(d.mode);
  img[StepLayout::kNumRequests] = n;
  img[StepLayout::kNumTokens] = tokens;
  img[StepLayout::kTokensPerRequest] = d.mode == StepMode::kDecode   ? 1
                                       : d.mode == StepMode::kExtend ? 0
                                                                     : d.tokens_per_request;
  img[StepLayout::kLogitRows] = static_cast<std::int32_t>(d.logits);
  for (std::int32_t r = 0; r < n; ++r) {
    const StepRequest& q = d.requests[static_cast<std::size_t>(r)];
    img[layout_.slot + r] = q.slot;
    img[layout_.prefix_len + r] = q.prefix_len;
    img[layout_.extend_len + r] = q.extend_len;
    img[layout_.encoder_len + r] = q.encoder_len;
  }
  if (tokens > 0)
    std::memcpy(img + layout_.token_ids, d.token_ids.data(), d.token_ids.size_bytes());
  if (!d.aux.empty()) std::memcpy(img + layout_.aux, d.aux.data(), d.aux.size_bytes());
  for (int k = 0; k < kMaxStepPools; ++k) {
    const TableCommandBatch* b = d.tables[k];
    const std::int32_t nc = b ? b->size() : 0;
    const std::int32_t np = b ? b->page_id_count() : 0;
    img[StepLayout::kNumCommands + k] = nc;
    img[StepLayout::kNumPageIds + k] = np;
    if (nc > 0) {
      std::memcpy(img + layout_.commands[k], b->commands().data(), b->commands().size_bytes());
    }
    if (np > 0) {
      std::memcpy(img + layout_.page_ids[k], b->page_ids().data(), b->page_ids().size_bytes());
    }
  }
}

StepInput::StepInput(const StepCapacity& cap) : writer_(cap), layout_(writer_.layout()) {
  for (auto& h : host_) {
    h = PinnedBuffer<std::int32_t>(layout_.total_words);
    std::memset(h.data(), 0, layout_.total_words * sizeof(std::int32_t));
  }
  device_ = DeviceBuffer<std::int32_t>(layout_.total_words);
  device_.fill_bytes(0, nullptr);
  // Start-up only: the zeroed image is in place before any stream (even a non-blocking one)
  // reads it. A sync of the legacy stream that did the fill, not of the whole device.
  GD_CUDA(cudaStreamSynchronize(nullptr));
}

void StepInput::write(const StepDesc& d) {
  writer_.validate(d);  // before waiting on anything: a bad step costs no sync
  const int w = next_;
  if (pending_[w]) {  // the copy out of this image (two uploads ago) may still be in flight
    copied_[w].synchronize();
    pending_[w] = false;
  }
  writer_.fill(d, host_[w].data());
  written_ = w;
  next_ = w ^ 1;
}

void StepInput::upload(cudaStream_t stream) {
  const int w = written_;
  GD_CUDA(
      cudaMemcpyAsync(device_.data(), host_[w].data(), bytes(), cudaMemcpyHostToDevice, stream));
  copied_[w].record(stream);
  pending_[w] = true;
}

StepMode StepInput::mode() const noexcept {
  return static_cast<StepMode>(host_[written_][StepLayout::kMode]);
}
std::int32_t StepInput::num_requests() const noexcept {
  return host_[written_][StepLayout::kNumRequests];
}
std::int32_t StepInput::num_tokens() const noexcept {
  return host_[written_][StepLayout::kNumTokens];
}
std::int32_t StepInput::tokens_per_request() const noexcept {
  return host_[written_][StepLayout::kTokensPerRequest];
}
LogitRows StepInput::logit_rows() const noexcept {
  return static_cast<LogitRows>(host_[written_][StepLayout::kLogitRows]);
}

}  // namespace graphdecode
