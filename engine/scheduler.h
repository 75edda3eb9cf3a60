// Continuous-batching scheduler: host-side policy only (no CUDA), so every rule is tested on a CPU.
//
// Each call to next_step() admits waiting requests (FIFO) while the page ledger (memory/
// kv_ledger.h) can reserve a slot and every pool's pages for them, then plans one step:
//   * an extend step when some admitted request still has prompt tokens to prefill: prompts are
//     cut into chunks so the step holds at most max_step_tokens new tokens (chunked prefill);
//   * otherwise a decode step with every decoding request (one new token each).
// After the device ran the step, on_step_done() takes the tokens each request committed (one
// sampled token for decode rows and extend rows that finished their prompt; several for a
// speculative step), applies stop tokens and max_new_tokens token by token (tokens past a stop or
// the limit are dropped, never delivered), and releases finished requests' slots and pages in the
// ledger (their table commands ride in the next step's image).
//
// KV admission is by reservation, read from the ledger (no second count): a request is admitted
// only when every pool of the model can reserve the most pages its whole extent (prompt +
// max_new_tokens) will hold there, and keeps them until it finishes. So a running request never
// meets a full pool; when a pool is full, new requests wait (never an error, never dropped). A
// request that could never fit is refused at submit(). A request with encoder states reserves its
// encoder's pages in the cross pools too, and returns them when it finishes.
//
// Prefix cache (when every self-attention pool of the ledger caches prefixes): at admission the
// prompt is matched page by page (chained keys, memory/prefix_cache.h), never the whole prompt:
// the hit stops before the page holding the last prompt token, which must be computed for the
// request's first logits. The request starts as if its first hit tokens were an already
// prefilled chunk on the shared pages (prefill is extend with prefix from there). After each step
// the request's full pages of committed tokens are published, so later requests (and requests
// admitted while this one still runs) share them; on finish or cancel its pages go back to the
// cache, not to the free list. Shared pages are full pages strictly inside the committed prefix,
// so a speculative rollback never touches one. Admission counts the hit (KvLedger::try_admit with
// the matched keys): in full pools a shared page is counted once, so requests on one system
// prompt do not each pay for its pages; cached unreferenced pages count as available.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "memory/kv_ledger.h"

namespace graphdecode {

using RequestId = std::int64_t;

struct SamplingParams {
  float temperature = 0.f;  // 0 = greedy
  std::int32_t top_k = 0;   // 0 = off
  float top_p = 1.f;        // 1 = off
  std::uint64_t seed = 0;
};

// A request's encoder states: the output of a vision or audio encoder the caller runs (projected
// to the text model's width), which a cross-attention model's cross layers attend to. The cross
// K/V are computed from them once, when the request is admitted (LlamaModel::encode).
// Lifetime: host memory is copied by submit() (the caller may free it once submit returns);
// device memory is read on the engine's stream during the step that admits the request, so it
// must stay valid and unchanged until the request's first TokenEvent (a token or its
// cancellation) has been delivered, and be complete before submit() (synchronize the stream that
// wrote it).
struct EncoderStates {
  const std::uint16_t* data = nullptr;  // bf16 bits, [length][width] row-major
  std::int32_t length = 0;              // encoder_len: 0 = a text-only request
  std::int32_t width = 0;               // columns: must be the model's hidden size
  bool on_device = false;               // data is CUDA device memory (else host memory)
  // The prompt position of the request's first <|image|> token: rows before it have no image to
  // attend (transformers' cross_attention_mask), so the cross layers' MLP output is not added to
  // them (their gated attention output is, as in transformers). 0: every row sees the states.
  std::int32_t first_position = 0;
};

struct RequestSpec {
  std::vector<std::int32_t> prompt;       // token ids, non-empty
  std::int32_t max_new_tokens = 16;       // >= 1
  std::vector<std::int32_t> stop_tokens;  // generation ends after emitting one of these
  SamplingParams sampling;
  bool speculate = true;  // in an engine with speculative decoding: draft for this request
  EncoderStates encoder;  // cross-attention models only; length 0 = text only
  // Prefix cache: names the encoder states (e.g. an image hash). Requests with equal nonzero ids
  // must have identical encoder states; they then share the text prefix's pages (the cross K/V
  // are still projected per request). 0 with encoder states: this request shares nothing.
  std::uint64_t encoder_id = 0;
};

struct SchedulerConfig {
  std::int32_t max_batch = 32;          // requests in one step, and admitted at once
  std::int32_t max_step_tokens = 2048;  // new tokens in one extend step (prefill chunk budget)
  std::int32_t max_context = 4096;      // prompt + generated tokens of one request
  std::int32_t vocab_size = 0;
  // Positions a request may hold past prompt + max_new_tokens (a speculative step verifies k
  // drafts past its last committed token): part of every reservation.
  std::int32_t reserve_slack = 0;
  // Prompt token ids are in [0, input_vocab_size) (Mllama: the image token and reserved ids past
  // vocab_size); 0 = vocab_size. Stop and sampled tokens stay in [0, vocab_size).
  std::int32_t input_vocab_size = 0;
  // Cross-attention models: the longest encoder input and its width (the hidden size). 0: the
  // model has no cross layers and refuses encoder states.
  std::int32_t max_encoder_len = 0;
  std::int32_t encoder_width = 0;
  // Prefix cache (when the ledger caches prefixes): also share pages of generated tokens, not only
  // the prompt's. Off for engines with a draft model, whose KV of generated positions is written
  // by speculative steps on a schedule of its own (engine/spec/); prompts are shared there too.
  bool share_generated = true;

  void validate() const;  // Error names the bad field
};

enum class StepKind : std::uint8_t { kExtend = 0, kDecode = 1 };

struct PlannedRequest {
  RequestId id = 0;
  std::int32_t slot = 0;        // the request's slot in every pool of the ledger
  std::int32_t prefix_len = 0;  // tokens already in the KV cache
  std::int32_t extend_len = 0;  // tokens this step adds
  // The extend_len token ids of this step; empty in a plan made ahead (StepPlan::ahead), whose
  // decode rows take their input token from the device.
  std::span<const std::int32_t> tokens;
  bool samples = false;  // the step's last token is a sampling position (prompt done / decode)
  std::int32_t encoder_len = 0;  // the request's encoder keys in the cross pools (0 = none)
};

struct StepPlan {
  StepKind kind = StepKind::kDecode;
  std::vector<PlannedRequest> requests;  // empty: nothing to run
  std::vector<RequestId> admitted;       // admitted by this call (slots reserved in the ledger)
  // Planned by next_step_ahead(), before the previous step's tokens were known: a row whose
  // request ended in that step (stop token, cancel) computes a token that is discarded.
  bool ahead = false;
  bool empty() const { return requests.empty(); }
};

// Prefix cache counters (memory/prefix_cache.h): prompt tokens matched at admission and the
// tokens found cached there (their prefill is skipped).
struct PrefixCacheCounters {
  std::int64_t lookup_tokens = 0;  // prompt tokens of requests admitted with sharing on
  std::int64_t hit_tokens = 0;     // of those, tokens whose K/V came from the cache
};

struct TokenEvent {
  RequestId id = 0;
  std::int32_t token = 0;  // kNoToken on a cancellation event
  bool finished = false;   // the request's last event
  bool cancelled = false;  // finished by cancel(), not by a stop token or max_new_tokens
};
inline constexpr std::int32_t kNoToken = -1;

class Scheduler {
 public:
  // `ledger` holds the model's pools and must outlive the scheduler; the scheduler admits into
  // it and releases from it, the caller extends the planned requests in it.
  Scheduler(const SchedulerConfig& config, KvLedger& ledger);

  // Validates and queues a request. Error names the field (prompt, token id, max_new_tokens,
  // context length, pages) and changes nothing; other requests are unaffected.
  RequestId submit(RequestSpec spec);

  // Admits what fits, then plans the next step. The plan's spans stay valid until on_step_done.
  StepPlan next_step();
  // The same into `plan` (cleared first), reusing its storage.
  void next_step(StepPlan& plan);

  // Pipelining (docs/serving_loop.md): plans the decode step after `inflight`, a decode step
  // already launched whose tokens are not known yet, as if every row of it committed one token.
  // Rows: every running request of `inflight` except those that finish there by max_new_tokens
  // (known in advance); prefix_len one past the in-flight row; tokens empty (the input token is
  // on the device). A row whose request then ends in `inflight` by a stop token or a cancel is
  // skipped by on_step_done: its token is discarded, never delivered; its KV row lies inside the
  // request's reservation and goes back with its pages. Returns false, leaving `plan` empty, when
  // the next step depends on the in-flight step's outcome or is not a plain decode step: the
  // in-flight step is not a decode step, a waiting request could be admitted now (admission
  // waits for the synchronous plan after it, which prefills), a running request is not in
  // `inflight`, or no row is left. Admits nothing; changes nothing in the ledger.
  bool next_step_ahead(const StepPlan& inflight, StepPlan& plan);

  // `sampled[i]` is the token sampled for plan.requests[i] (ignored where samples is false).
  // Returns one event per emitted token; finished requests release their slot and pages in the
  // ledger. In a plan made ahead, rows of requests that ended since (stop token or cancel in the
  // step before) are skipped: their tokens are discarded.
  std::vector<TokenEvent> on_step_done(const StepPlan& plan, std::span<const std::int32_t> sampled);
  // The same into `events` (cleared first), reusing its storage.
  void on_step_done(const StepPlan& plan, std::span<const std::int32_t> sampled,
                    std::vector<TokenEvent>& events);
  // Cancels a waiting or running request between steps: a waiting one leaves the queue, a
  // running one releases its slot and pages in the ledger now (their commands ride in the next
  // step's image). Returns its final event (finished and cancelled, token kNoToken). Error
  // "request" for an id that is unknown or already finished (nothing changes).
  TokenEvent cancel(RequestId id);
  // Several tokens per request: plan.requests[i] committed counts[i] tokens (>= 1 where samples,
  // else ignored), stored one request after the other in `tokens`.
  void on_step_done(const StepPlan& plan, std::span<const std::int32_t> counts,
                    std::span<const std::int32_t> tokens, std::vector<TokenEvent>& events);

  std::int32_t waiting() const noexcept { return static_cast<std::int32_t>(queue_.size()); }
  std::int32_t running() const noexcept { return static_cast<std::int32_t>(running_.size()); }
  bool idle() const noexcept { return queue_.empty() && running_.empty(); }
  // Tokens of a request so far (prompt + generated), while it is known to the scheduler.
  std::span<const std::int32_t> tokens(RequestId id) const;
  std::int32_t generated(RequestId id) const;
  const SamplingParams& sampling(RequestId id) const;
  bool speculates(RequestId id) const;
  std::int32_t slot(RequestId id) const;  // admitted requests: the slot in every pool
  // Tokens of the request whose K/V came from the prefix cache at admission.
  std::int32_t prefix_hit(RequestId id) const;
  const PrefixCacheCounters& prefix_counters() const noexcept { return prefix_; }
  // The request's encoder states (data: the submit-time copy for host memory, else the caller's
  // device pointer; nullptr once dropped). length 0: none.
  EncoderStates encoder(RequestId id) const;
  // Frees the host copy of the request's encoder states once the runner has projected them.
  void drop_encoder_states(RequestId id);

 private:
  struct Request {
    RequestSpec spec;
    std::vector<std::int32_t> tokens;  // prompt, then generated tokens
    std::int32_t cached = 0;           // tokens in the KV cache
    std::int32_t generated = 0;
    std::int32_t slot = 0;  // while admitted
    bool admitted = false;
    std::vector<std::uint16_t> encoder_copy;  // host encoder states until projected
    // Prefix cache: chain keys of the full pages known so far (capacity for the whole extent,
    // reserved at submit), the pages published, the tokens found cached at admission.
    bool shares = false;
    std::vector<PageKey> keys;
    std::int32_t published = 0;
    std::int32_t hit = 0;
  };
  KvReservation reservation(const RequestSpec& s) const;
  // The keys a prompt is matched by: its full pages but the one of its last token.
  std::span<const PageKey> prefix_lookup(const Request& r) const;
  // Admission on a hit of `pages` pages (adopted by the ledger's try_admit): the request starts
  // there, and the stats count it.
  void count_prefix_hit(Request& r, std::int32_t pages);
  // After a step: names the request's full, final pages in the cache.
  void publish_pages(Request& r);
  const Request& find(RequestId id) const;

  SchedulerConfig config_;
  KvLedger& ledger_;
  RequestId next_id_ = 1;
  std::deque<RequestId> queue_;     // waiting, FIFO
  std::vector<RequestId> running_;  // admitted, in admission order
  std::unordered_map<RequestId, Request> requests_;
  std::vector<std::int32_t> ones_;  // on_step_done of one token per request
  PrefixCacheCounters prefix_;
};

}  // namespace graphdecode
