// The decode engine: what a program embeds.
//
//   graphdecode::Engine engine(weights, {.max_batch = 32, .max_context = 4096});
//   engine.submit({.prompt = ids, .max_new_tokens = 64},
//                 [](const graphdecode::TokenEvent& e) { /* stream e.token */ });
//   engine.run_until_idle();            // or call step() from your own loop
//   std::printf("%.1f tok/s\n", engine.stats().tokens_per_s());
//
// One step: Scheduler (admission by reservation in the page ledger, chunked prefill, decode) ->
// the step runner (engine/step_runner.h): the ledger extends the planned requests (page-table
// commands across the models' pools), the host writes the step image (requests, token ids, table
// commands, sampling parameters; ONE copy), ONE graph launch or the eager fallback (prep, model,
// device sampling; with a draft model a whole speculative step: draft, verify, accept), ONE D2H
// copy of the committed tokens -> Scheduler::on_step_done (stop tokens, max_new_tokens token by
// token; finished requests' slots and pages released in the ledger) -> callbacks.
// With EngineConfig::pipeline, decode step t + 1 is planned, written and launched before the
// wait for step t (docs/serving_loop.md "Pipelined steps"): stop tokens and cancels are then
// seen one step late, and the extra token of a request that ended is discarded. The rule: only
// a plain decode step following a plain decode step is planned ahead; prefill chunks,
// speculative steps, and plans that could admit a waiting request (they depend on the pages
// step t frees) are synchronous.
//
// Speculative decoding (engine/spec/): set speculative.max_draft_tokens and pass a draft model of
// the target's vocabulary (or choose prompt lookup, SpecProposer::kNgram, or pass an EAGLE head
// with SpecProposer::kEagle). Decode steps then
// draft k tokens per request (k from the batch size), verify them with the target in one pass
// and commit the accepted prefix and the target's next token. Greedy requests get exactly the
// target's greedy tokens; sampled requests (and those with RequestSpec::speculate false) commit the
// target's sample, one token per step.
//
// Cross-attention models (Mllama's text decoder): set max_encoder_len, and give a request its
// encoder states (RequestSpec::encoder, bf16 [encoder_len][hidden], host or device memory; see
// EncoderStates for the lifetime). Their cross K/V are projected once, when the request is
// admitted, into cross pages reserved with its other pages and returned when it finishes; every
// step then attends over each request's own encoder length (0 = a text-only request, for which
// the cross layers are an exact identity), in the same captured graphs for any mix.
//
// Prefix caching (docs/prefix_cache.md; EngineConfig::prefix_cache, on by default): requests
// that start with the same tokens share the KV pages of that prefix, page by page; a request's
// prefill starts after the longest cached prefix every pool can serve (never its last prompt
// token), and pages stay cached after their requests finish until a pool needs room (LRU).
//
// Bad input (empty prompt, unknown token id, prompt + max_new_tokens beyond max_context, a request
// that could never fit the KV pool, bad sampling parameters; encoder states of the wrong width,
// longer than max_encoder_len, not device memory when on_device says so, or given to a model
// without cross layers) is refused by submit() with an Error naming the field; nothing already
// submitted is affected. When the KV pool is full, requests wait in FIFO order; none is dropped.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/buffers.h"
#include "common/stream.h"
#include "engine/llama_model.h"
#include "engine/scheduler.h"
#include "engine/spec/spec_runner.h"
#include "engine/step_runner.h"
#include "engine/weights.h"
#include "graphs/step_graphs.h"

namespace graphdecode {

struct EngineConfig {
  std::int32_t max_batch = 32;  // requests running at once (one step holds them all)
  // New tokens per prefill step (the chunked-prefill budget). 2048: on the H200 the 1B shape
  // prefills a 2048-token prompt at 51% of the bf16 peak in one step against 38% in four of 512,
  // and the 8B shape at 57% against 54%; larger budgets gain little more (bench_prefill,
  // bench/results/h200_prefill_chunks_2026-11-27.txt). The price: a prefill step of 2048 tokens
  // holds the running requests' next token for ~8 ms (1B) / ~53 ms (8B) instead of ~3 / ~14.
  std::int32_t max_step_tokens = 2048;
  std::int32_t max_context = 4096;  // prompt + generated tokens of one request
  std::int32_t kv_pages = 0;  // full-attention pool pages; 0: max_batch * (max_context + k drafts)
  std::int32_t sliding_pages = 0;  // sliding-window pool pages; 0: max_batch at the window
  // Cross-attention models: the longest encoder input of a request (required, >= 1) and the
  // cross pool's pages (0: max_batch requests at max_encoder_len). Ignored by other models.
  std::int32_t max_encoder_len = 0;
  std::int32_t cross_pages = 0;
  std::int32_t page_size = 16;
  bool use_graphs = true;  // decode steps by graph replay (false: eager, same kernels)
  // Pipelined decode (docs/serving_loop.md "Pipelined steps"): while the device runs decode step
  // t, step() plans step t + 1, writes its image and enqueues its copy and launch, and only then
  // waits for step t's tokens. A request that ends at step t by a stop token or a cancel has one
  // more token computed at t + 1, which is discarded, never delivered. Falls back to the
  // synchronous step for prefill chunks, speculative steps, and whenever the next plan depends on
  // this step's outcome (a waiting request that could be admitted now). Tokens, events and the
  // ledger's books between steps are those of the synchronous engine, except that requests of the
  // step in flight (pending_plan()) hold one more KV row. Off by default because the model's
  // logits and last_plan() after step() then belong to the step in flight, which callers that
  // read them (tests, the Python logits view) do not expect. On the H200 (2026-11-27): its GPU
  // tests pass, a 30,000-request pipelined soak has 0 errors, and decode_loop's host-to-host step
  // is 1.001x the device's (1.011x synchronous).
  bool pipeline = false;
  bool deterministic = false;  // batch-invariant attention split-KV
  // Prefix caching across requests (docs/prefix_cache.md): full pages of equal token prefixes are
  // shared, kept after their requests finish, evicted least recently used when room is needed.
  // Ignored (off) with speculative prompt lookup on a target without full-attention layers (the
  // tokens of a hit are kept beside the full pool's pages; NgramProposer).
  bool prefix_cache = true;
  // Speculative decoding: most draft tokens per step (0 = off), k by batch size (empty:
  // default_k_rules), the proposer (a draft model passed to the Engine, or prompt lookup).
  struct Speculative {
    std::int32_t max_draft_tokens = 0;
    std::vector<SpecKRule> k_by_batch;
    SpecProposer proposer = SpecProposer::kDraftModel;
    NgramConfig ngram;
  } speculative;
};

using TokenCallback = std::function<void(const TokenEvent&)>;

struct EngineStats {
  std::int64_t steps = 0, prefill_steps = 0, decode_steps = 0;
  std::int64_t graph_steps = 0, eager_steps = 0;
  // Pipelining: steps planned and launched while the step before still ran, steps planned after
  // the step before was delivered (synchronous), and rows computed for requests that had ended
  // in the step before (their tokens discarded).
  std::int64_t pipelined_steps = 0, sync_steps = 0, discarded_rows = 0;
  std::int64_t prompt_tokens = 0;     // prefilled
  std::int64_t generated_tokens = 0;  // sampled and delivered
  std::int64_t finished = 0;          // including cancelled
  std::int64_t cancelled = 0;
  double busy_s = 0;  // wall time inside step(), host + device
  // Prefill steps (every step that is not a plain decode step): wall time inside step() and
  // device time (the runner's timing events, from before the image copy to the tokens' read-back;
  // 0 where a runner does not time its steps), summed, microseconds. Their difference is what the
  // host adds to a prompt's time to first token.
  double prefill_wall_us = 0, prefill_device_us = 0;
  // Prefix cache: prompt tokens looked up at admission and those found cached (not prefilled;
  // prompt_tokens counts only the prefilled ones), pages cached now (every caching pool, held or
  // not), pages of them no request holds, cached pages evicted for room.
  std::int64_t prefix_lookup_tokens = 0, prefix_hit_tokens = 0;
  std::int64_t prefix_cached_pages = 0, prefix_unreferenced_pages = 0, prefix_evictions = 0;
  double prefix_hit_rate() const {
    return prefix_lookup_tokens > 0 ? static_cast<double>(prefix_hit_tokens) / prefix_lookup_tokens
                                    : 0.0;
  }
  // Speculative decoding: request-steps of speculative steps, drafts proposed and accepted, and
  // per draft position j (0-based) how often a draft was proposed and accepted there.
  std::int64_t spec_rows = 0, drafted_tokens = 0, accepted_tokens = 0;
  std::vector<std::int64_t> drafted_at, accepted_at;
  // Device microseconds per speculative step in each phase (prep, propose, verify, accept),
  // summed over the spec_steps speculative steps.
  std::int64_t spec_steps = 0;
  std::array<double, 4> spec_phase_us{};
  // Tokens a request commits per speculative step (accepted drafts + the target's token).
  double tokens_per_spec_row() const {
    return spec_rows > 0 ? static_cast<double>(accepted_tokens + spec_rows) / spec_rows : 0.0;
  }
  // Wall time of decode steps (host write + copy + launch + device + token read), microseconds,
  // over the last kLatencyWindow decode steps.
  double decode_p50_us = 0, decode_p90_us = 0, decode_p99_us = 0;
  // Device time of the same decode steps (timing events from before the image copy to the
  // tokens' read-back; plain decoding only, else 0), microseconds. Pipelined, step() returns
  // once per device step, so decode_p50_us against device_p50_us shows what the host adds.
  double device_p50_us = 0, device_p90_us = 0, device_p99_us = 0;
  double tokens_per_s() const { return busy_s > 0 ? generated_tokens / busy_s : 0.0; }
};

class Engine {
 public:
  static constexpr std::size_t kLatencyWindow = 4096;

  // Uploads the weights, allocates every buffer, captures the decode graphs. Throws Error for an
  // unsupported model config or engine config (naming the field), or on a CUDA failure. `draft`
  // (with config.speculative.max_draft_tokens >= 1): the draft model of speculative decoding;
  // `eagle` (with speculative.proposer = SpecProposer::kEagle): an EAGLE-1/2 or EAGLE-3 head
  // (load_eagle_head, which tells them apart by config.json; synthetic_eagle_weights /
  // synthetic_eagle3_weights) drafting from the target's hidden states.
  Engine(const HostWeights& weights, const EngineConfig& config, const HostWeights* draft = nullptr,
         const EagleWeights* eagle = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request; `on_token` is called from step() for each generated token (the last one
  // with finished = true). Throws Error (changing nothing) on bad input. A callback that throws
  // does not stop the step's other events: step() rethrows its exception after delivering them.
  RequestId submit(RequestSpec spec, TokenCallback on_token = {});
  // Cancels a waiting or running request; safe to call from any token callback. The request
  // leaves the queue or the batch at once (its slot and pages go back, its tokens stop); its
  // callback gets a final event (finished, cancelled, token kNoToken): at once when called
  // outside step(), after the step's other callbacks when called from one. Throws Error
  // ("request") for an id that is unknown or already finished, changing nothing; a request whose
  // last token came out of the current step is finished (its final event is still delivered).
  void cancel(RequestId id);
  // Runs one step: delivers the tokens of one device step. With config.pipeline, the next decode
  // step is launched before this one's tokens are waited for (it stays in flight when step()
  // returns: pending_plan()). Returns false when there was nothing to do. A failure inside the
  // step (a CUDA
  // error, a device-side check) throws Error naming the step ("step": its number, kind, size);
  // the engine is then failed: every later step() and submit() throws Error ("engine"), and the
  // only thing left to do is to destroy it, which releases everything without throwing.
  bool step();
  void run_until_idle();

  // No request waiting or running, and no step in flight.
  bool idle() const noexcept { return scheduler_->idle() && !inflight_; }
  bool failed() const noexcept { return !failure_.empty(); }
  std::int32_t waiting() const noexcept { return scheduler_->waiting(); }
  std::int32_t running() const noexcept { return scheduler_->running(); }
  EngineStats stats() const;
  const EngineConfig& config() const noexcept { return config_; }
  const LlamaModel& model() const noexcept { return runner_->model(); }
  const StepGraphs& graphs() const noexcept { return runner_->graphs(); }
  const KvLedger& ledger() const noexcept { return runner_->ledger(); }
  // The device pool behind the ledger's pool `pool` (tests read its pages).
  const KvPool& kv_pool(std::int32_t pool) const {
    const LedgerPool& c = runner_->ledger().config(pool);
    return runner_->runtime(c.group).pool(c.geometry.kind);
  }
  bool speculative() const noexcept { return config_.speculative.max_draft_tokens > 0; }
  cudaStream_t stream() const noexcept { return stream_; }
  // The plan of the step whose tokens step() delivered last: its kind and request ids in the
  // order of the model's logits rows (the Python binding's logits view reads it; with pipelining
  // the logits buffer already belongs to the step in flight). Its token spans are stale once
  // step() returned.
  const StepPlan& last_plan() const noexcept { return plans_[done_]; }
  // The plan of the step launched and not yet delivered (pipelining), or nullptr. Its requests
  // hold one KV row more in the ledger than their delivered tokens account for.
  const StepPlan* pending_plan() const noexcept { return inflight_ ? &plans_[done_ ^ 1] : nullptr; }

 private:
  void require_healthy() const;
  void record(double us, const StepPlan& plan, const StepResult& result, std::int64_t delivered);
  void count_step(const StepPlan& plan, const StepResult& result);
  void deliver(const TokenEvent& e);
  // The failure of the step being delivered (`plan`): marks the engine failed, returns the Error.
  Error step_failure(const StepPlan& plan, const std::exception& e);
  // Collects the step in flight whose rows all belong to requests that ended (no running
  // request left): its tokens are discarded.
  void drain();

  EngineConfig config_;
  Stream stream_;
  std::unique_ptr<StepRunner> runner_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unordered_map<RequestId, TokenCallback> callbacks_;

  // Per-step host staging, sized at start-up. Two plans: the step being delivered (done_) and,
  // pipelined, the one in flight after it (done_ ^ 1).
  std::array<StepPlan, 2> plans_;
  int done_ = 0;
  bool inflight_ = false;  // plans_[done_ ^ 1] is launched and not collected
  StepResult result_;
  std::vector<TokenEvent> events_;
  bool in_callbacks_ = false;              // step() is delivering events_
  std::vector<TokenEvent> cancel_events_;  // cancellations made from a callback, delivered next

  std::string failure_;  // what failed the engine (empty: healthy)
  EngineStats stats_;
  std::vector<double> decode_us_;  // ring of kLatencyWindow
  std::vector<double> device_us_;  // ring of kLatencyWindow, beside decode_us_
  std::size_t decode_next_ = 0;
};

}  // namespace graphdecode
