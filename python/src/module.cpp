// graphdecode._graphdecode: the nanobind extension under the `graphdecode` Python package.
//
// Thin by design: the package's Python layer (python/graphdecode/) shapes the API (Request
// iterators, dataclasses, callbacks); this module converts arguments (convert.h), maps
// graphdecode::Error to graphdecode.Error, and runs the engine with the GIL released.
//
// Token delivery never calls Python from inside Engine::step(): each request's C++ callback
// appends its TokenEvent to a buffer, and the Python layer takes the buffer after the step
// (take_events) and runs user callbacks with the GIL held. So step() can drop the GIL for its
// whole duration (host scheduling, launch, the device wait) and other Python threads run.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/cuda_check.h"
#include "common/device.h"
#include "common/error.h"
#include "common/request_rules.h"
#include "common/version.h"
#include "convert.h"
#include "engine/engine.h"
#include "engine/model_config.h"
#include "engine/scheduler.h"
#include "engine/spec/eagle_weights.h"
#include "engine/weights.h"
#include "memory/kv_ledger.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace graphdecode::py {
namespace {

// The Python class graphdecode._errors.Error, looked up once. Deliberately never released: it
// lives as long as the interpreter, and a static nb::object would be torn down after it.
PyObject* error_class() {
  static PyObject* cls = [] {
    PyObject* mod = PyImport_ImportModule("graphdecode._errors");
    if (mod == nullptr) {
      PyErr_Clear();
      return PyExc_ValueError;
    }
    PyObject* c = PyObject_GetAttrString(mod, "Error");
    Py_DECREF(mod);
    if (c == nullptr) {
      PyErr_Clear();
      return PyExc_ValueError;
    }
    return c;
  }();
  return cls;
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    nb::handle cls(error_class());
    // Error(message, field, value, where): str() of it is the library's full text.
    nb::object exc = cls(nb::str(e.message().c_str()), nb::str(e.field().c_str()),
                         nb::str(e.value().c_str()), nb::str(e.where().c_str()));
    PyErr_SetObject(cls.ptr(), exc.ptr());
  }
}

// One pool sized to hold one request of max_context tokens: enough for the scheduler's request
// rules (prompt, ids, lengths, sampling); the engine's real pools are checked by Engine.submit.
LedgerPool check_pool(std::int32_t max_context, std::int32_t page_size) {
  LedgerPool p;
  const std::int32_t pages = pages_for_tokens(max_context, page_size);
  p.geometry.kind = AttentionKind::kFull;
  p.geometry.page_size = page_size;
  p.geometry.num_pages = pages + 1;
  p.geometry.max_slots = 2;  // the padding slot and one request
  p.geometry.max_pages_per_slot = pages;
  p.max_commands = pages + 8;
  p.max_page_ids = pages + 8;
  p.max_step_tokens = max_context;
  return p;
}

// The engine plus the events its callbacks produced since the Python layer last took them.
class PyEngine {
 public:
  // The engine first: it checks the config on the host before touching the device, so a bad
  // option names its field even without a GPU.
  PyEngine(const HostWeights& weights, const EngineConfig& config, const HostWeights* draft,
           const EagleWeights* eagle)
      : engine_(std::make_unique<Engine>(weights, config, draft, eagle)) {
    GD_CUDA(cudaGetDevice(&device_));
  }

  RequestId submit(RequestSpec spec) {
    const std::lock_guard lock(mutex_);
    return engine_->submit(std::move(spec), [this](const TokenEvent& e) { events_.push_back(e); });
  }

  bool step() {
    const std::lock_guard lock(mutex_);
    return engine_->step();
  }

  // Its final event (cancelled, no token) lands in the buffer at once.
  void cancel(RequestId id) {
    const std::lock_guard lock(mutex_);
    engine_->cancel(id);
  }

  // Events since the last call: (request id, token, finished, cancelled), in delivery order.
  std::vector<std::tuple<std::int64_t, std::int32_t, bool, bool>> take_events() {
    const std::lock_guard lock(mutex_);
    std::vector<std::tuple<std::int64_t, std::int32_t, bool, bool>> out;
    out.reserve(events_.size());
    for (const TokenEvent& e : events_) out.emplace_back(e.id, e.token, e.finished, e.cancelled);
    events_.clear();
    return out;
  }

  nb::dict stats() {
    EngineStats s;
    {
      const std::lock_guard lock(mutex_);
      s = engine_->stats();
    }
    nb::dict d;
    d["steps"] = s.steps;
    d["prefill_steps"] = s.prefill_steps;
    d["decode_steps"] = s.decode_steps;
    d["graph_steps"] = s.graph_steps;
    d["eager_steps"] = s.eager_steps;
    d["prompt_tokens"] = s.prompt_tokens;
    d["generated_tokens"] = s.generated_tokens;
    d["finished"] = s.finished;
    d["cancelled"] = s.cancelled;
    d["busy_s"] = s.busy_s;
    d["tokens_per_s"] = s.tokens_per_s();
    d["decode_p50_us"] = s.decode_p50_us;
    d["decode_p90_us"] = s.decode_p90_us;
    d["decode_p99_us"] = s.decode_p99_us;
    d["spec_rows"] = s.spec_rows;
    d["drafted_tokens"] = s.drafted_tokens;
    d["accepted_tokens"] = s.accepted_tokens;
    d["tokens_per_spec_row"] = s.tokens_per_spec_row();
    d["drafted_at"] = s.drafted_at;
    d["accepted_at"] = s.accepted_at;
    d["spec_steps"] = s.spec_steps;
    d["spec_phase_us"] = std::vector<double>(s.spec_phase_us.begin(), s.spec_phase_us.end());
    d["prefix_lookup_tokens"] = s.prefix_lookup_tokens;
    d["prefix_hit_tokens"] = s.prefix_hit_tokens;
    d["prefix_cached_pages"] = s.prefix_cached_pages;
    d["prefix_unreferenced_pages"] = s.prefix_unreferenced_pages;
    d["prefix_evictions"] = s.prefix_evictions;
    d["pipelined_steps"] = s.pipelined_steps;
    d["sync_steps"] = s.sync_steps;
    d["discarded_rows"] = s.discarded_rows;
    d["device_p50_us"] = s.device_p50_us;
    d["device_p90_us"] = s.device_p90_us;
    d["device_p99_us"] = s.device_p99_us;
    d["prefill_wall_us"] = s.prefill_wall_us;
    d["prefill_device_us"] = s.prefill_device_us;
    return d;
  }

  // The last step's logits, [rows, vocab] float32 on the device, row i = the request
  // last_step_ids()[i]: a view (no copy) of the model's buffer, rewritten by the next step.
  nb::ndarray<float, nb::ndim<2>, nb::device::cuda> last_logits(nb::handle owner) {
    const std::lock_guard lock(mutex_);
    GD_REQUIRE(!engine_->speculative(), "speculative.max_draft_tokens",
               engine_->config().speculative.max_draft_tokens,
               "the logits view is for plain decoding (a speculative step's rows are verify "
               "positions)");
    GD_REQUIRE(!engine_->config().pipeline, "pipeline", "on",
               "the logits buffer already belongs to the step in flight: turn pipelining off "
               "for the logits view");
    const std::size_t rows = engine_->last_plan().requests.size();
    const auto vocab = static_cast<std::size_t>(engine_->model().config().vocab_size);
    auto* data = const_cast<float*>(engine_->model().logits());
    return nb::ndarray<float, nb::ndim<2>, nb::device::cuda>(
        data, {rows, vocab}, owner, {}, nb::dtype<float>(), nb::device::cuda::value, device_);
  }

  std::vector<std::int64_t> last_step_ids() {
    const std::lock_guard lock(mutex_);
    std::vector<std::int64_t> ids;
    for (const PlannedRequest& p : engine_->last_plan().requests) ids.push_back(p.id);
    return ids;
  }

  std::string last_step_kind() {
    const std::lock_guard lock(mutex_);
    if (engine_->last_plan().requests.empty()) return "none";
    if (engine_->last_plan().kind == StepKind::kExtend) return "prefill";
    return engine_->speculative() ? "speculative" : "decode";
  }

  bool idle() {
    const std::lock_guard lock(mutex_);
    return engine_->idle();
  }
  std::int32_t waiting() {
    const std::lock_guard lock(mutex_);
    return engine_->waiting();
  }
  std::int32_t running() {
    const std::lock_guard lock(mutex_);
    return engine_->running();
  }
  const Engine& engine() const { return *engine_; }
  int device() const { return device_; }
  void close() {
    const std::lock_guard lock(mutex_);
    engine_.reset();
  }
  bool closed() const { return engine_ == nullptr; }

 private:
  std::mutex mutex_;  // one thread in the engine at a time (the GIL is released inside)
  std::unique_ptr<Engine> engine_;
  int device_ = 0;
  std::vector<TokenEvent> events_;
};

PyEngine& open(PyEngine& e) {
  GD_REQUIRE(!e.closed(), "engine", "closed", "the engine was closed");
  return e;
}

}  // namespace
}  // namespace graphdecode::py

NB_MODULE(_graphdecode, m) {
  using namespace graphdecode;
  using graphdecode::py::PyEngine;
  m.doc() = "graphdecode's C++ engine (nanobind). Use the `graphdecode` package, not this module.";
  nb::register_exception_translator(&graphdecode::py::translate);

  m.def(
      "version", [] { return std::string(graphdecode::version()); },
      "The linked library's version, \"MAJOR.MINOR.PATCH\".");
  m.def("cuda_device_available", &cuda_device_available,
        "True when a usable CUDA device is present (never raises).");

  nb::class_<ModelConfig>(m, "ModelConfig", "A Llama-family model configuration (config.json).")
      .def_static("from_json", &ModelConfig::from_json_text, "text"_a, "source"_a = "config.json",
                  "Parses a Hugging Face config.json text; Error names a bad or unsupported field.")
      .def_static("from_file", &ModelConfig::from_file, "path"_a, "Reads and parses config.json.")
      .def_static("small_test", &small_test_config, "A tiny 4-layer config for tests.")
      .def_static("llama_1b", &llama_1b_config, "The Llama-3.2-1B shape.")
      .def_static("small_cross_test", &small_cross_test_config,
                  "A tiny Mllama text decoder (6 layers, cross-attention at 1 and 4) for tests.")
      .def_prop_ro("num_cross_layers", &ModelConfig::num_cross_layers)
      .def_ro("extra_input_tokens", &ModelConfig::extra_input_tokens)
      .def_prop_ro("family",
                   [](const ModelConfig& c) { return std::string(model_family_name(c.family)); })
      .def_ro("architecture", &ModelConfig::architecture)
      .def_ro("vocab_size", &ModelConfig::vocab_size)
      .def_ro("hidden_size", &ModelConfig::hidden_size)
      .def_ro("intermediate_size", &ModelConfig::intermediate_size)
      .def_ro("num_hidden_layers", &ModelConfig::num_hidden_layers)
      .def_ro("num_attention_heads", &ModelConfig::num_attention_heads)
      .def_ro("num_key_value_heads", &ModelConfig::num_key_value_heads)
      .def_ro("head_dim", &ModelConfig::head_dim)
      .def_ro("rms_norm_eps", &ModelConfig::rms_norm_eps)
      .def_ro("rope_theta", &ModelConfig::rope_theta)
      .def_ro("max_position_embeddings", &ModelConfig::max_position_embeddings)
      .def_ro("tie_word_embeddings", &ModelConfig::tie_word_embeddings)
      .def_prop_ro(
          "layer_windows",
          [](const ModelConfig& c) {
            std::vector<std::int32_t> w;
            for (const LayerAttention& l : c.layers) w.push_back(l.window_left);
            return w;
          },
          "Per layer: keys left of the query it may see (-1 = full attention).")
      .def("validate", &ModelConfig::validate)
      .def("__repr__", [](const ModelConfig& c) {
        return "ModelConfig(" + std::string(model_family_name(c.family)) +
               ", layers=" + std::to_string(c.num_hidden_layers) +
               ", hidden=" + std::to_string(c.hidden_size) +
               ", heads=" + std::to_string(c.num_attention_heads) + "/" +
               std::to_string(c.num_key_value_heads) + "x" + std::to_string(c.head_dim) +
               ", vocab=" + std::to_string(c.vocab_size) + ")";
      });

  nb::class_<HostWeights>(m, "Weights", "A model's weights in host memory (bf16).")
      .def_static(
          "load",
          [](const std::string& dir) {
            nb::gil_scoped_release release;
            return load_checkpoint(dir);
          },
          "dir"_a, "Reads config.json and the safetensors checkpoint of a Hugging Face directory.")
      .def_static(
          "synthetic",
          [](const ModelConfig& config, std::uint64_t seed) {
            nb::gil_scoped_release release;
            return synthetic_weights(config, seed);
          },
          "config"_a, "seed"_a = 1, "Seeded random weights for `config`.")
      .def_ro("config", &HostWeights::config)
      .def_prop_ro("total_bytes", &HostWeights::total_bytes)
      .def_prop_ro("tensor_names", [](const HostWeights& w) {
        std::vector<std::string> names;
        for (const auto& [name, t] : w.tensors) names.push_back(name);
        return names;
      });

  nb::class_<EagleWeights>(m, "EagleHead",
                           "An EAGLE draft head in host memory (bf16). EAGLE-1/2: fc over the "
                           "token embedding and the target's hidden state, one decoder layer, the "
                           "target's lm_head. EAGLE-3: fc over three of the target's layers, one "
                           "decoder layer over (embedding, state), its own lm_head over a draft "
                           "vocabulary mapped to target ids by d2t.")
      .def_static(
          "load",
          [](const std::string& dir) {
            nb::gil_scoped_release release;
            return load_eagle_head(dir);
          },
          "dir"_a, "Reads an EAGLE head directory (config.json + safetensors, EAGLE's names).")
      .def_static(
          "synthetic",
          [](const ModelConfig& target, std::uint64_t seed) {
            nb::gil_scoped_release release;
            return synthetic_eagle_weights(target, seed);
          },
          "target"_a, "seed"_a = 1, "A seeded random EAGLE-1/2 head for a target of this config.")
      .def_static(
          "synthetic3",
          [](const ModelConfig& target, std::uint64_t seed, std::int32_t draft_vocab_size) {
            nb::gil_scoped_release release;
            return synthetic_eagle3_weights(target, seed, draft_vocab_size);
          },
          "target"_a, "seed"_a = 1, "draft_vocab_size"_a = 0,
          "A seeded random EAGLE-3 head for a target of this config (draft vocabulary: "
          "draft_vocab_size ids, 0 = half the target's).")
      .def_prop_ro("version", [](const EagleWeights& w) { return w.config.eagle3() ? 3 : 1; })
      .def_prop_ro("draft_vocab_size",
                   [](const EagleWeights& w) {
                     return w.config.eagle3() ? w.config.draft_vocab_size
                                              : w.config.layer.vocab_size;
                   })
      .def_prop_ro("hidden_size", [](const EagleWeights& w) { return w.config.layer.hidden_size; })
      .def_prop_ro("vocab_size", [](const EagleWeights& w) { return w.config.layer.vocab_size; })
      .def_prop_ro("fc_bias", [](const EagleWeights& w) { return w.config.fc_bias; })
      .def_prop_ro("input_norm", [](const EagleWeights& w) { return w.config.input_norm; })
      .def_prop_ro("own_embedding", [](const EagleWeights& w) { return w.config.own_embedding; })
      .def_prop_ro("tensor_names", [](const EagleWeights& w) {
        std::vector<std::string> names;
        for (const auto& [name, t] : w.tensors) names.push_back(name);
        return names;
      });

  m.def(
      "check_request",
      [](std::int32_t vocab_size, std::int32_t max_context, nb::handle prompt,
         nb::handle max_new_tokens, nb::handle stop_tokens, nb::dict sampling, nb::handle speculate,
         nb::handle encoder_states, std::int32_t max_encoder_len, std::int32_t hidden_size,
         std::int32_t extra_input_tokens, nb::handle encoder_first_position) {
        RequestSpec spec =
            py::request_spec(prompt, max_new_tokens, stop_tokens, sampling, speculate);
        int device_id = -1;
        spec.encoder = py::encoder_states(encoder_states, "encoder_states", device_id);
        if (!encoder_first_position.is_none())
          spec.encoder.first_position =
              py::to_i32(encoder_first_position, "encoder_first_position");
        SchedulerConfig sc;
        sc.max_batch = 1;
        sc.max_context = max_context;
        sc.vocab_size = vocab_size;
        sc.input_vocab_size = extra_input_tokens > 0 ? vocab_size + extra_input_tokens : 0;
        sc.max_encoder_len = max_encoder_len;
        sc.encoder_width = max_encoder_len > 0 ? hidden_size : 0;
        const LedgerPool pool = py::check_pool(std::max(max_context, 1), 16);
        KvLedger ledger(std::span<const LedgerPool>(&pool, 1));
        Scheduler scheduler(sc, ledger);
        scheduler.submit(std::move(spec));
      },
      "vocab_size"_a, "max_context"_a, "prompt"_a, "max_new_tokens"_a, "stop_tokens"_a,
      "sampling"_a, "speculate"_a, "encoder_states"_a = nb::none(), "max_encoder_len"_a = 0,
      "hidden_size"_a = 0, "extra_input_tokens"_a = 0, "encoder_first_position"_a = nb::none(),
      "Applies Engine.submit's conversions and the scheduler's request rules on the host.");

  m.def(
      "engine_config_check", [](nb::dict options) { py::engine_config(options); }, "options"_a,
      "Converts engine options as Engine() does (types, names); raises Error.");

  nb::class_<PyEngine>(m, "Engine", "The decode engine (use graphdecode.Engine).")
      .def(
          "__init__",
          [](PyEngine* self, const HostWeights& weights, nb::dict options, const HostWeights* draft,
             const EagleWeights* eagle) {
            const EngineConfig config = py::engine_config(options);
            nb::gil_scoped_release release;  // upload, allocation, graph capture
            new (self) PyEngine(weights, config, draft, eagle);
          },
          "weights"_a, "options"_a, "draft"_a = nb::none(), "eagle"_a = nb::none())
      .def(
          "submit",
          [](PyEngine& e, nb::handle prompt, nb::handle max_new_tokens, nb::handle stop_tokens,
             nb::dict sampling, nb::handle speculate, nb::handle encoder_states,
             nb::handle encoder_id, nb::handle encoder_first_position) {
            RequestSpec spec =
                py::request_spec(prompt, max_new_tokens, stop_tokens, sampling, speculate);
            PyEngine& engine = py::open(e);
            int device_id = -1;
            spec.encoder = py::encoder_states(encoder_states, "encoder_states", device_id);
            if (!encoder_id.is_none()) spec.encoder_id = py::to_u64(encoder_id, "encoder_id");
            if (!encoder_first_position.is_none())
              spec.encoder.first_position =
                  py::to_i32(encoder_first_position, "encoder_first_position");
            GD_REQUIRE(device_id < 0 || device_id == engine.device(), "encoder_states",
                       "cuda:" + std::to_string(device_id),
                       "must be on the engine's device (cuda:" + std::to_string(engine.device()) +
                           ") or in host memory");
            // Host states are copied by submit; device states are read at admission (the
            // Python layer keeps the array alive until the request finishes).
            nb::gil_scoped_release release;
            return engine.submit(std::move(spec));
          },
          "prompt"_a, "max_new_tokens"_a, "stop_tokens"_a, "sampling"_a, "speculate"_a,
          "encoder_states"_a = nb::none(), "encoder_id"_a = nb::none(),
          "encoder_first_position"_a = nb::none())
      .def(
          "step",
          [](PyEngine& e) {
            PyEngine& engine = py::open(e);
            nb::gil_scoped_release release;
            return engine.step();
          },
          "Runs one step with the GIL released; False when there was nothing to do.")
      .def(
          "cancel",
          [](PyEngine& e, std::int64_t id) {
            PyEngine& engine = py::open(e);
            nb::gil_scoped_release release;
            engine.cancel(id);
          },
          "request_id"_a)
      .def("take_events", [](PyEngine& e) { return py::open(e).take_events(); })
      .def("stats", [](PyEngine& e) { return py::open(e).stats(); })
      .def("last_logits",
           [](nb::handle self) {
             PyEngine& e = py::open(nb::cast<PyEngine&>(self));
             return e.last_logits(self);
           })
      .def("last_step_ids", [](PyEngine& e) { return py::open(e).last_step_ids(); })
      .def("last_step_kind", [](PyEngine& e) { return py::open(e).last_step_kind(); })
      .def_prop_ro("idle", [](PyEngine& e) { return py::open(e).idle(); })
      .def_prop_ro("waiting", [](PyEngine& e) { return py::open(e).waiting(); })
      .def_prop_ro("running", [](PyEngine& e) { return py::open(e).running(); })
      .def_prop_ro("device", [](PyEngine& e) { return e.device(); })
      .def_prop_ro("model_config",
                   [](PyEngine& e) { return py::open(e).engine().model().config(); })
      .def_prop_ro("max_context",
                   [](PyEngine& e) { return py::open(e).engine().config().max_context; })
      .def_prop_ro("speculative", [](PyEngine& e) { return py::open(e).engine().speculative(); })
      .def("close",
           [](PyEngine& e) {
             nb::gil_scoped_release release;
             e.close();
           })
      .def_prop_ro("closed", &PyEngine::closed);
}
