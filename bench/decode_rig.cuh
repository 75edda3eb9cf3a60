// The decode-step rig bench_decode and bench_cross share: one model on its runtime with StepGraphs
// captured for one bucket, B requests whose L + 1 KV positions (and encoder keys, for a cross
// model) are reserved through the step's page ledger and filled with random bf16 (not prefilled),
// the step's timing (device time by events around StepGraphs::step after an L2 flush, host time
// with the device drained). Header-only: each bench is one TU.
// With RigSteps::kWithSampling the rig also captures the engine's step (engine/sampling_step.h:
// the same forward, then device sampling and the token publish) over the same runtime, model and
// step input: greedy and sampled rows differ only in the step image's aux words, so one captured
// graph replays both.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "common/buffers.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "common/request_rules.h"
#include "common/stream.h"
#include "engine/llama_model.h"
#include "engine/model_step.h"
#include "engine/row_sampler.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/step_context.h"
#include "engine/sampling_step.h"
#include "engine/scheduler.h"
#include "engine/weights.h"
#include "graphs/step_graphs.h"

namespace graphdecode::bench {
namespace {

// What the rig captures: the forward alone (ModelStep: prep, plans, layers, logits), or that and
// the engine's step with device sampling (SamplingStep) as a second StepGraphs.
enum class RigSteps : std::uint8_t { kForward, kWithSampling };

// Members are destroyed in reverse order: graphs, program, model, runtime, then the step.
struct DecodeRig {
  std::unique_ptr<StepContext> step;
  std::unique_ptr<ModelRuntime> runtime;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<ModelStep> program;
  std::unique_ptr<SamplingStep> sampling;  // kWithSampling only
  std::unique_ptr<StepGraphs> graphs;
  std::unique_ptr<StepGraphs> sampling_graphs;  // kWithSampling only
  std::vector<StepRequest> requests;            // [B] decode rows: prefix L, extend 1, encoder_len
  std::vector<std::int32_t> tokens;             // [B]
  std::vector<std::int32_t> aux;  // [B][SamplingWords::kCount] with kWithSampling, else empty
  std::int32_t encode_slot = 0;   // with encode_keys > 0: a slot holding that many cross keys

  // `o` sizes the runtime (decode only: o.max_tokens >= b, o.max_kv_len >= l + 1, slots for b
  // requests and the encode slot). `encoder_lens`: [b] keys per request, or empty (no cross).
  DecodeRig(const HostWeights& w, const RuntimeOptions& o, std::int32_t b, std::int32_t l,
            const std::vector<std::int32_t>& encoder_lens, std::int32_t encode_keys,
            std::uint64_t seed, cudaStream_t s, RigSteps steps = RigSteps::kForward) {
    const AttentionLayout layout = llama_attention_layout(w.config);
    StepCapacity cap = step_capacity(o, std::span<const AttentionLayout>(&layout, 1));
    if (steps == RigSteps::kWithSampling) {  // what the engine's DecodeRunner asks for
      cap.aux_words = SamplingWords::kCount;
      cap.token_feedback = true;
    }
    step = std::make_unique<StepContext>(cap, ledger_pools(cap, o));
    runtime = std::make_unique<ModelRuntime>(layout, o, *step, 0, s);
    model = std::make_unique<LlamaModel>(w, o, s);
    program = std::make_unique<ModelStep>(*runtime, *model);
    // Before any capture: SamplingStep points the prep at its token feedback buffer.
    if (steps == RigSteps::kWithSampling)
      sampling = std::make_unique<SamplingStep>(*runtime, *model, s);
    StepGraphsConfig gc;
    gc.buckets = {b};
    graphs = std::make_unique<StepGraphs>(step->input(), *program, gc);
    if (sampling) sampling_graphs = std::make_unique<StepGraphs>(step->input(), *sampling, gc);
    KvLedger& ledger = step->ledger();
    std::vector<std::int32_t> slots(static_cast<std::size_t>(b));
    for (auto& slot : slots) slot = ledger.acquire();
    // L + 1 positions per request, a page at a time round-robin over requests (pages interleave
    // as they would in a running engine), applied whenever the step-sized batches fill up.
    for (std::int32_t done = 0; done < l + 1; done += o.page_size) {
      for (std::int32_t slot : slots) {
        if (!has_room()) apply_commands(s);
        ledger.extend(slot, std::min(o.page_size, l + 1 - done));
      }
    }
    apply_commands(s);
    for (std::size_t r = 0; r < encoder_lens.size(); ++r) {
      if (encoder_lens[r] == 0) continue;
      ledger.set_encoder(slots[r], encoder_lens[r]);
      apply_commands(s);
    }
    if (encode_keys > 0) {
      encode_slot = ledger.acquire();
      ledger.set_encoder(encode_slot, encode_keys);
      apply_commands(s);
    }
    for (AttentionKind kind :
         {AttentionKind::kFull, AttentionKind::kSliding, AttentionKind::kCross}) {
      if (!runtime->has_pool(kind)) continue;
      const KvPool& pool = runtime->pool(kind);
      const KvPoolConfig& pc = pool.config();
      const std::size_t elems = static_cast<std::size_t>(pc.geometry.num_pages) *
                                pc.shape.num_kv_heads * pc.geometry.page_size * pc.shape.head_dim;
      for (std::int32_t layer = 0; layer < pc.shape.num_layers; ++layer) {
        const PagedKvView v = pool.view(layer);
        for (void* p : {v.k, v.v})
          fill_random(static_cast<std::uint16_t*>(p), elems,
                      seed + static_cast<std::uint64_t>(layer) * 7 + kind_index(kind), s);
      }
    }
    GD_CUDA(cudaStreamSynchronize(s));
    for (std::int32_t r = 0; r < b; ++r) {
      const auto i = static_cast<std::size_t>(r);
      requests.push_back({slots[i], l, 1, encoder_lens.empty() ? 0 : encoder_lens[i]});
      tokens.push_back((r * 7919 + 11) % w.config.vocab_size);
    }
    if (sampling) set_sampling(SamplingParams{});  // greedy
    graphs->capture(s);
    if (sampling_graphs) sampling_graphs->capture(s);
  }

  // kWithSampling: every row samples with `p`, row r with seed p.seed + r (rows differ, as
  // requests of a batch would).
  void set_sampling(const SamplingParams& p) {
    GD_REQUIRE(sampling != nullptr, "set_sampling", "RigSteps::kForward",
               "the rig was built without the sampling step");
    aux.assign(requests.size() * SamplingWords::kCount, 0);
    for (std::size_t r = 0; r < requests.size(); ++r) {
      SamplingParams row = p;
      row.seed = p.seed + r;
      SamplingWords::write(
          row, 0,
          std::span<std::int32_t>(aux).subspan(r * SamplingWords::kCount, SamplingWords::kCount));
    }
  }

  StepDesc desc() const {
    StepDesc d;
    d.mode = StepMode::kDecode;
    d.tokens_per_request = 1;
    d.requests = requests;
    d.token_ids = tokens;
    d.aux = aux;  // the forward's graphs ignore the words (the prep does not read them)
    return d;     // no table commands: the pages were applied at setup
  }

 private:
  bool has_room() const {
    // One extend of <= one page: 2 commands, 2 page ids.
    const KvLedger& ledger = step->ledger();
    for (std::int32_t i = 0; i < ledger.num_pools(); ++i)
      if (!ledger.commands(i).has_room(RequestSlots::kMaxCommandsPerOp, 2)) return false;
    return true;
  }
  void apply_commands(cudaStream_t s) {
    KvLedger& ledger = step->ledger();
    for (std::int32_t i = 0; i < ledger.num_pools(); ++i) {
      const TableCommandBatch& c = ledger.commands(i);
      if (!c.empty()) runtime->pool(ledger.config(i).geometry.kind).table().apply(c, s);
    }
    ledger.clear_commands();
  }
};

// Decode only: B rows, KV extent L + 1, one slot per request (plus the padding slot).
RuntimeOptions decode_only_options(std::int32_t b, std::int32_t l, std::int32_t page) {
  RuntimeOptions o;
  o.max_batch = b;
  o.max_tokens = b;
  o.max_new_tokens = 1;
  o.max_kv_len = l + 1;
  o.page_size = page;
  o.max_slots = b + 1;
  // Exactly the B requests' pages (+1: page 0 is the reserved padding page), not every slot at
  // max_kv_len: 8B at B = 128, L = 4096 then needs 68.7 GB of K/V instead of 69.2.
  o.full_pages = b * pages_for_tokens(l + 1, page) + 1;
  return o;
}

// L2 flush buffer and per-rep events, made once (nothing is allocated in the timed loops).
struct Timer {
  Timer(int reps, bool flush_on, std::size_t l2_bytes, cudaStream_t s)
      : flush_l2(flush_on),
        flush(std::max<std::size_t>(4 * l2_bytes, 64 << 20) / sizeof(int4)),
        start(static_cast<std::size_t>(reps)),
        stop(static_cast<std::size_t>(reps)),
        us(static_cast<std::size_t>(reps)) {
    flush.fill_bytes(0, s);
  }
  void flush_now(cudaStream_t s) {
    if (!flush_l2) return;
    l2_flush_read<<<1024, 256, 0, s>>>(flush.data(), flush.size(), sink.data());
    GD_CHECK_LAUNCH();
  }
  bool flush_l2;
  DeviceBuffer<int4> flush;  // [4 x L2 bytes / 16]
  DeviceBuffer<int> sink{1};
  std::vector<Event> start, stop;  // [reps]
  std::vector<double> us;          // [reps]
};

struct StepTimes {
  double device_us = 0, host_us = 0;
};

// `graphs`' step of `d`, by graph replay or eagerly (see the file comment for the two times).
StepTimes time_steps(StepGraphs& graphs, const StepDesc& d, bool use_graphs, int warmup, int reps,
                     Timer& t, cudaStream_t s) {
  graphs.set_use_graphs(use_graphs);
  const StepPath want = use_graphs ? StepPath::kGraph : StepPath::kEager;
  for (int i = 0; i < warmup; ++i) {
    const StepPath p = graphs.step(d, s);
    GD_REQUIRE(p == want, "path", static_cast<int>(p), "the step did not take the expected path");
  }
  GD_CUDA(cudaStreamSynchronize(s));
  StepTimes r;
  // Device time: the host runs ahead (bounded by StepInput's ring of two images).
  for (int i = 0; i < reps; ++i) {
    t.flush_now(s);
    t.start[static_cast<std::size_t>(i)].record(s);
    graphs.step(d, s);
    t.stop[static_cast<std::size_t>(i)].record(s);
  }
  GD_CUDA(cudaStreamSynchronize(s));
  for (int i = 0; i < reps; ++i) {
    const auto u = static_cast<std::size_t>(i);
    t.us[u] = 1e3 * t.stop[u].elapsed_ms_since(t.start[u]);
  }
  r.device_us = median(t.us);
  // Host time: device drained first, so no back-pressure from the pinned ring is counted.
  for (int i = 0; i < reps; ++i) {
    GD_CUDA(cudaStreamSynchronize(s));
    const auto t0 = std::chrono::steady_clock::now();
    graphs.step(d, s);
    const auto t1 = std::chrono::steady_clock::now();
    t.us[static_cast<std::size_t>(i)] = std::chrono::duration<double, std::micro>(t1 - t0).count();
  }
  GD_CUDA(cudaStreamSynchronize(s));
  r.host_us = median(t.us);
  return r;
}

// The rig's forward (ModelStep graphs).
StepTimes time_steps(DecodeRig& rig, bool use_graphs, int warmup, int reps, Timer& t,
                     cudaStream_t s) {
  return time_steps(*rig.graphs, rig.desc(), use_graphs, warmup, reps, t, s);
}

// The rig's step timed by graph replay, then eagerly, with a sanity check of the logits each path
// left: finite, not all zero (rms > 1e-3), no bad token id seen, and how far graph and eager
// differ.
struct GraphEagerRun {
  StepTimes graph, eager;
  double logit_max_abs = 0, logit_rms = 0, graph_eager_max_diff = 0;
  bool sane = false;
};

GraphEagerRun time_graph_and_eager(DecodeRig& rig, std::int32_t vocab, int warmup, int reps,
                                   Timer& t, cudaStream_t s) {
  const std::size_t n = rig.requests.size() * static_cast<std::size_t>(vocab);
  std::vector<float> graph_logits(n), eager_logits(n);
  GraphEagerRun r;
  r.graph = time_steps(rig, true, warmup, reps, t, s);
  GD_CUDA(cudaMemcpyAsync(graph_logits.data(), rig.model->logits(), n * sizeof(float),
                          cudaMemcpyDeviceToHost, s));
  r.eager = time_steps(rig, false, warmup, reps, t, s);
  GD_CUDA(cudaMemcpyAsync(eager_logits.data(), rig.model->logits(), n * sizeof(float),
                          cudaMemcpyDeviceToHost, s));
  std::int32_t bad = 0;
  GD_CUDA(
      cudaMemcpyAsync(&bad, rig.model->bad_token_flag(), sizeof(bad), cudaMemcpyDeviceToHost, s));
  GD_CUDA(cudaStreamSynchronize(s));
  double sq = 0;
  bool finite = bad == 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double g = graph_logits[i];
    finite = finite && std::isfinite(g) && std::isfinite(eager_logits[i]);
    r.logit_max_abs = std::max(r.logit_max_abs, std::abs(g));
    r.graph_eager_max_diff = std::max(r.graph_eager_max_diff, std::abs(g - eager_logits[i]));
    sq += g * g;
  }
  r.logit_rms = std::sqrt(sq / static_cast<double>(n));
  r.sane = finite && r.logit_rms > 1e-3;
  return r;
}

}  // namespace
}  // namespace graphdecode::bench
