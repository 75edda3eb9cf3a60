// cross_fuzz: the graph-replay check of a real cross-attention model. Random step sequences of an
// Mllama text decoder (requests arrive with encoder lengths from 0 to the maximum, are prefilled in
// chunks, decode, and leave; the batch size changes every few steps so padded buckets occur) run
// on two identical model stacks, one by graph replay and one eagerly, and every step's logits are
// compared bitwise; with --shape small, sampled rows are also checked against the float64
// reference on the request's own encoder states. examples/replay_fuzz does the same for a
// synthetic attention stack; this one runs the model's own layers (q norm, cross attention over
// the pool written by encode(), gated residuals) at the shape of Llama-3.2-11B-Vision's cross
// layers.
//
//   cross_fuzz [--shape 11b|small] [--seed S] [--steps N] [--max-batch B] [--verbose]
//
// --shape 11b (default): one self and one cross layer of the 11B text decoder (hidden 4096, 32 q /
// 8 kv heads of 128, SwiGLU 14336), vocab 32000 + 8, encoder lengths up to 6400. --shape small:
// small_cross_test_config (6 layers, cross at 1 and 4), lengths up to 1100, reference checks.
// Prints the seed and step of any mismatch; exits 1 on one. Needs a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention/reference.h"
#include "common/cuda_check.h"
#include "common/device.h"
#include "common/error.h"
#include "common/stream.h"
#include "engine/llama_model.h"
#include "engine/model_config.h"
#include "engine/model_step.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/step_context.h"
#include "engine/weights.h"
#include "graphs/step_graphs.h"
#include "llama_reference.h"

namespace {

using namespace graphdecode;

struct Options {
  std::string shape = "11b";
  std::uint64_t seed = 1;
  std::int64_t steps = 300;
  std::int32_t max_batch = 12;
  bool verbose = false;
};

ModelConfig fuzz_config(const std::string& shape) {
  if (shape == "small") return small_cross_test_config();
  ModelConfig c = mllama_11b_text_config();
  c.vocab_size = 32000;
  c.num_hidden_layers = 2;
  c.layers = {LayerAttention{}, LayerAttention{AttentionKind::kCross, -1}};
  c.validate();
  return c;
}

// One model stack: step context, runtime, model, program, graphs.
struct Side {
  std::unique_ptr<StepContext> step;
  std::unique_ptr<ModelRuntime> runtime;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<ModelStep> program;
  std::unique_ptr<StepGraphs> graphs;
  std::vector<float> logits;

  Side(const HostWeights& w, const RuntimeOptions& o, bool use_graphs, cudaStream_t s) {
    const AttentionLayout layout = llama_attention_layout(w.config);
    const StepCapacity cap = step_capacity(o, std::span<const AttentionLayout>(&layout, 1));
    step = std::make_unique<StepContext>(cap, ledger_pools(cap, o));
    runtime = std::make_unique<ModelRuntime>(layout, o, *step, 0, s);
    model = std::make_unique<LlamaModel>(w, o, s);
    program = std::make_unique<ModelStep>(*runtime, *model);
    StepGraphsConfig gc;
    gc.use_graphs = use_graphs;
    graphs = std::make_unique<StepGraphs>(step->input(), *program, gc);
    graphs->capture(s);
  }
};

struct Request {
  std::int32_t slot = 0;
  std::int32_t encoder_len = 0;
  std::vector<std::uint16_t> states;  // [encoder_len][hidden]
  std::vector<std::int32_t> tokens;   // prompt, then generated
  std::int32_t prompt_len = 0, cached = 0, remaining = 0;
};

class Fuzzer {
 public:
  Fuzzer(const Options& o)
      : opt_(o),
        rng_(o.seed),
        config_(fuzz_config(o.shape)),
        weights_(synthetic_weights(config_, o.seed)) {
    max_encoder_ = o.shape == "small" ? 1100 : 6400;
    options_.max_batch = o.max_batch;
    options_.max_tokens = std::max(o.max_batch, 96);
    options_.max_new_tokens = options_.max_tokens;
    options_.max_kv_len = 160;
    options_.max_encoder_len = max_encoder_;
    options_.page_size = 16;
    a_ = std::make_unique<Side>(weights_, options_, true, stream_);
    b_ = std::make_unique<Side>(weights_, options_, false, stream_);
  }

  int run() {
    std::int64_t mismatches = 0, graph_steps = 0, ref_rows = 0;
    double worst_ref = 0;
    for (std::int64_t step = 0; step < opt_.steps; ++step) {
      arrivals();
      if (live_.empty()) continue;
      const bool ok = one_step(step, graph_steps, ref_rows, worst_ref);
      mismatches += ok ? 0 : 1;
      if (!ok)
        std::printf("MISMATCH: seed %llu step %lld\n", static_cast<unsigned long long>(opt_.seed),
                    static_cast<long long>(step));
    }
    std::printf(
        "cross_fuzz: shape %s, seed %llu: %lld steps (%lld by graph replay), %lld "
        "requests, %lld mismatches; %lld rows vs float64 (worst rel %.4f)\n",
        opt_.shape.c_str(), static_cast<unsigned long long>(opt_.seed),
        static_cast<long long>(opt_.steps), static_cast<long long>(graph_steps),
        static_cast<long long>(arrived_), static_cast<long long>(mismatches),
        static_cast<long long>(ref_rows), worst_ref);
    return mismatches == 0 ? 0 : 1;
  }

 private:
  std::int32_t uniform(std::int32_t lo, std::int32_t hi) {
    return std::uniform_int_distribution<std::int32_t>(lo, hi)(rng_);
  }

  std::int32_t draw_encoder_len() {
    switch (uniform(0, 6)) {
      case 0:
      case 1:
        return 0;  // text only
      case 2:
        return 1;
      case 3:
        return 16 * uniform(1, 8);  // page multiples
      case 4:
        return max_encoder_;
      default:
        return uniform(1, max_encoder_);
    }
  }

  // Arrivals while there is room: the same slot, pages and projected states on both sides.
  void arrivals() {
    const std::int32_t want = uniform(0, 2);
    for (std::int32_t i = 0; i < want && static_cast<std::int32_t>(live_.size()) < opt_.max_batch;
         ++i) {
      Request r;
      r.encoder_len = draw_encoder_len();
      std::normal_distribution<float> n(0.f, 1.f);
      r.states.resize(static_cast<std::size_t>(r.encoder_len) * config_.hidden_size);
      for (auto& x : r.states) x = reference::float_to_bf16(n(rng_));
      r.prompt_len = uniform(1, 60);
      for (std::int32_t t = 0; t < r.prompt_len; ++t)
        r.tokens.push_back(uniform(0, config_.input_vocab_size() - 1));
      r.remaining = uniform(1, 40);
      for (Side* s : {a_.get(), b_.get()}) {
        KvLedger& ledger = s->step->ledger();
        const std::int32_t slot = ledger.acquire();
        GD_REQUIRE(r.slot == 0 || slot == r.slot, "slot", slot, "the two sides diverged");
        r.slot = slot;
        if (r.encoder_len > 0) ledger.set_encoder(slot, r.encoder_len);
        LlamaModel::apply_cross_table(*s->runtime, stream_);
        s->model->encode(*s->runtime, slot, {r.states.data(), r.encoder_len, false}, stream_);
      }
      ++arrived_;
      live_.push_back(std::move(r));
    }
  }

  bool one_step(std::int64_t step, std::int64_t& graph_steps, std::int64_t& ref_rows,
                double& worst_ref) {
    // Prefill chunks first (extend step), else one decode step of every live request.
    std::vector<std::size_t> rows;
    std::vector<StepRequest> reqs;
    std::vector<std::int32_t> ids;
    const bool prefill = std::any_of(live_.begin(), live_.end(),
                                     [](const Request& r) { return r.cached < r.prompt_len; });
    std::int32_t budget = options_.max_tokens;
    for (std::size_t i = 0; i < live_.size(); ++i) {
      Request& r = live_[i];
      std::int32_t n = 1;
      if (prefill) {
        if (r.cached >= r.prompt_len) continue;
        n = std::min({r.prompt_len - r.cached, budget, uniform(1, 48)});
        if (n == 0) break;
        budget -= n;
      }
      rows.push_back(i);
      reqs.push_back({r.slot, r.cached, n, r.encoder_len});
      ids.insert(ids.end(), r.tokens.begin() + r.cached, r.tokens.begin() + r.cached + n);
    }
    for (Side* s : {a_.get(), b_.get()}) {
      for (const StepRequest& q : reqs) s->step->ledger().extend(q.slot, q.extend_len);
      StepDesc d;
      d.mode = prefill ? StepMode::kExtend : StepMode::kDecode;
      d.tokens_per_request = prefill ? 0 : 1;
      d.requests = reqs;
      d.token_ids = ids;
      s->step->attach_commands(d);
      const StepPath path = s->graphs->step(d, stream_);
      if (s == a_.get() && path == StepPath::kGraph) ++graph_steps;
      s->step->ledger().clear_commands();
      s->logits.resize(reqs.size() * static_cast<std::size_t>(config_.vocab_size));
      GD_CUDA(cudaMemcpyAsync(s->logits.data(), s->model->logits(),
                              s->logits.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
    GD_CUDA(cudaStreamSynchronize(stream_));
    const bool same =
        std::memcmp(a_->logits.data(), b_->logits.data(), a_->logits.size() * sizeof(float)) == 0;
    if (opt_.verbose || !same)
      std::printf("step %lld: %s, %zu requests, graph %s eager logits\n",
                  static_cast<long long>(step), prefill ? "extend" : "decode", reqs.size(),
                  same ? "==" : "!=");
    const auto V = static_cast<std::size_t>(config_.vocab_size);
    // Sampled rows of finished prompts against the float64 reference (small shape).
    std::vector<bool> finished(live_.size(), false);
    for (std::size_t k = 0; k < rows.size(); ++k) {
      Request& r = live_[rows[k]];
      r.cached += reqs[k].extend_len;
      if (r.cached < r.prompt_len) continue;
      const float* row = &a_->logits[k * V];
      if (opt_.shape == "small" && uniform(0, 7) == 0) {
        std::vector<double> ref = reference_row(r);
        double err = 0, top = 0;
        for (std::size_t v = 0; v < V; ++v) {
          top = std::max(top, std::abs(ref[v]));
          err = std::max(err, std::abs(row[v] - ref[v]));
        }
        const double rel = err / std::max(top, 1e-12);
        worst_ref = std::max(worst_ref, rel);
        ++ref_rows;
        if (rel > 0.05) {
          std::printf("step %lld: request in slot %d (encoder_len %d): rel %.4f vs float64\n",
                      static_cast<long long>(step), r.slot, r.encoder_len, rel);
          return false;
        }
      }
      const std::int32_t next = static_cast<std::int32_t>(std::max_element(row, row + V) - row);
      r.tokens.push_back(next);
      if (--r.remaining == 0 || r.cached + 1 >= options_.max_kv_len) finished[rows[k]] = true;
    }
    for (std::size_t i = live_.size(); i-- > 0;) {
      if (!finished[i]) continue;
      for (Side* s : {a_.get(), b_.get()}) s->step->ledger().release(live_[i].slot);
      live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    return same;
  }

  // The float64 reference (tests/engine/llama_reference.h) of the request's last cached token.
  std::vector<double> reference_row(const Request& r) const {
    return testing::reference_last_logits(
        weights_,
        std::span<const std::int32_t>(r.tokens.data(), static_cast<std::size_t>(r.cached)),
        {r.states, r.encoder_len});
  }

  Options opt_;
  std::mt19937_64 rng_;
  ModelConfig config_;
  HostWeights weights_;
  std::int32_t max_encoder_ = 0;
  RuntimeOptions options_;
  Stream stream_;
  std::unique_ptr<Side> a_, b_;
  std::vector<Request> live_;
  std::int64_t arrived_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    try {
      if (a == "--shape") {
        o.shape = next();
      } else if (a == "--seed") {
        o.seed = std::stoull(next());
      } else if (a == "--steps") {
        o.steps = std::stoll(next());
      } else if (a == "--max-batch") {
        o.max_batch = std::stoi(next());
      } else if (a == "--verbose") {
        o.verbose = true;
      } else {
        throw std::invalid_argument(a);
      }
    } catch (const std::exception&) {
      std::fprintf(stderr,
                   "usage: cross_fuzz [--shape 11b|small] [--seed S] [--steps N] [--max-batch B] "
                   "[--verbose]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if ((o.shape != "11b" && o.shape != "small") || o.max_batch < 1 || o.steps < 1) {
    std::fprintf(stderr, "cross_fuzz: --shape 11b|small, --max-batch >= 1, --steps >= 1\n");
    return 2;
  }
  if (!cuda_device_available()) {
    std::fprintf(stderr, "cross_fuzz: no CUDA device; this check needs a GPU\n");
    return 1;
  }
  try {
    Fuzzer f(o);
    return f.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cross_fuzz: %s\n", e.what());
    return 1;
  }
}
