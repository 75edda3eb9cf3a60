#include "fuzz.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <sstream>

#include "attention/reference.h"
#include "attention_stack.h"
#include "common/buffers.h"
#include "common/error.h"
#include "common/request_rules.h"
#include "common/stream.h"
#include "graphs/step_graphs.h"
#include "page_checksum.h"
#include "synthetic.h"

namespace graphdecode::fuzz {
namespace {

constexpr std::int32_t kSpecTokens = 4;  // N of the captured verify / draft-extend-v2 graphs
constexpr std::int32_t kMaxPrompt = 48;  // longest extend of one request in extend mode

struct Engine {
  StepContext step;
  AttentionStack stack;
  StepGraphs graphs;
  Engine(const AttentionStackConfig& c, const StepCapacity& cap, const StepGraphsConfig& g,
         cudaStream_t s)
      : step(cap, ledger_pools(cap, c.options)),
        stack(c, step, s),
        graphs(step.input(), stack, g) {}
};

struct Request {
  std::int32_t slot = 0;
  std::uint32_t id = 0;
  std::int32_t encoder_len = 0;
  std::vector<std::int32_t> history;  // token id at each cached position
};

std::int32_t uniform(std::mt19937_64& rng, std::int32_t lo, std::int32_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<std::int32_t>(lo, hi)(rng);
}

AttentionStackConfig draw_config(std::mt19937_64& rng, std::int32_t max_batch) {
  AttentionStackConfig c;
  AttentionLayout& l = c.layout;
  RuntimeOptions& o = c.options;
  o.page_size = std::array<std::int32_t, 3>{8, 16, 32}[uniform(rng, 0, 2)];
  const std::int32_t ps = o.page_size;
  // Windows at and around page boundaries.
  l.window_left = std::array<std::int32_t, 6>{ps - 1, ps,         2 * ps - 1,
                                              2 * ps, 2 * ps + 1, 3 * ps - 2}[uniform(rng, 0, 5)];
  l.layers = {AttentionKind::kFull, AttentionKind::kSliding, AttentionKind::kCross};
  const std::int32_t extra = uniform(rng, 0, 3);
  for (std::int32_t i = 0; i < extra; ++i)
    l.layers.push_back(static_cast<AttentionKind>(uniform(rng, 0, 2)));
  std::shuffle(l.layers.begin(), l.layers.end(), rng);
  l.num_q_heads = 4;
  l.num_kv_heads = uniform(rng, 0, 1) ? 2 : 1;
  l.head_dim = 64;
  l.dtype = uniform(rng, 0, 3) == 0 ? DType::kFP16 : DType::kBF16;
  o.max_batch = max_batch;
  o.max_tokens = max_batch * kSpecTokens + kMaxPrompt;
  o.max_new_tokens = kMaxPrompt;
  o.max_kv_len = 512;
  o.max_encoder_len = 192;
  c.seed = static_cast<std::uint32_t>(rng());
  return c;
}

std::string describe(const AttentionStackConfig& c) {
  std::ostringstream os;
  os << "layers=";
  for (AttentionKind k : c.layout.layers) os << "FSC"[static_cast<int>(k)];
  os << " page=" << c.options.page_size << " window_left=" << c.layout.window_left
     << " heads=" << c.layout.num_q_heads << "/" << c.layout.num_kv_heads
     << " dim=" << c.layout.head_dim << " " << dtype_name(c.layout.dtype)
     << " max_batch=" << c.options.max_batch << " max_tokens=" << c.options.max_tokens;
  return os.str();
}

// The host side of the fuzz: bookkeeping shared by both engines, and the checks.
class Fuzzer {
 public:
  Fuzzer(const FuzzOptions& o) : opt_(o), rng_(o.seed), config_(draw_config(rng_, o.max_batch)) {
    graphs_on_.modes = {GraphMode{StepMode::kDecode, 1},
                        GraphMode{StepMode::kTargetVerify, kSpecTokens},
                        GraphMode{StepMode::kDraftExtendV2, kSpecTokens}};
    StepGraphsConfig off;
    off.use_graphs = false;
    cap_ = stack_step_capacity(config_);
    a_ = std::make_unique<Engine>(config_, cap_, graphs_on_, stream_);
    b_ = std::make_unique<Engine>(config_, cap_, off, stream_);
    for (AttentionKind k : {AttentionKind::kFull, AttentionKind::kSliding, AttentionKind::kCross}) {
      const ModelRuntime& rt = a_->stack.runtime();
      if (!rt.has_pool(k)) continue;
      pool_[kind_index(k)] = rt.pool_index(k);
      checksum_dev_[kind_index(k)] =
          DeviceBuffer<std::uint64_t>(static_cast<std::size_t>(rt.pool(k).num_pages()));
      scramble(k);
    }
    residual_a_.resize(static_cast<std::size_t>(cap_.max_tokens) * a_->stack.row_elems());
    residual_b_ = residual_a_;
    a_->graphs.capture(stream_);
    result_.graph_memory_bytes = a_->graphs.graph_memory_bytes();
    result_.num_graphs = a_->graphs.num_graphs();
    result_.config = describe(config_);
  }

  FuzzResult run() {
    for (std::int64_t s = 0; s < opt_.steps; ++s) {
      step_ = s;
      failures_this_step_ = 0;
      one_step();
      ++result_.steps;
      if (failures_this_step_ > 0) ++result_.mismatches;
    }
    return result_;
  }

 private:
  void fail(const std::string& what) {
    ++failures_this_step_;
    if (opt_.log && failures_this_step_ <= 5) {
      *opt_.log << "MISMATCH seed=" << opt_.seed << " step=" << step_ << ": " << what << "\n";
    }
  }

  KvLedger& ledger() { return a_->step.ledger(); }
  // Index of the pool of `kind` in the step (-1 when the stack has none).
  std::int32_t pool(AttentionKind k) const { return pool_[kind_index(k)]; }

  // Shuffles the pool's free list: pages come out non-monotonic.
  void scramble(AttentionKind k) { ledger().shuffle_free_pages(pool(k), rng_()); }

  void finish(std::size_t i) {
    ledger().release(live_[i].slot);
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  // Arrivals and departures; encoder K/V of arrivals written on both engines.
  void churn() {
    for (std::size_t i = live_.size(); i-- > 0;) {
      const bool full =
          static_cast<std::int32_t>(live_[i].history.size()) > cap_.max_kv_len - kMaxPrompt;
      if (full || uniform(rng_, 0, 99) < 4) finish(i);
    }
    const std::int32_t room = cap_.max_slots - 1 - static_cast<std::int32_t>(live_.size());
    std::int32_t arrivals =
        live_.empty() ? uniform(rng_, 1, std::max(1, std::min(room, 8)))
                      : (uniform(rng_, 0, 2) == 0 ? uniform(rng_, 0, std::min(room, 4)) : 0);
    std::vector<std::size_t> fresh;
    for (std::int32_t i = 0; i < arrivals; ++i) {
      Request r;
      r.slot = ledger().acquire();
      r.id = next_id_++;
      // Every live request a different encoder length (0 included once).
      for (int attempt = 0; attempt < 64; ++attempt) {
        r.encoder_len = uniform(rng_, 0, cap_.max_encoder_len);
        if (std::none_of(live_.begin(), live_.end(),
                         [&](const Request& o) { return o.encoder_len == r.encoder_len; })) {
          break;
        }
      }
      if (r.encoder_len > 0) ledger().set_encoder(r.slot, r.encoder_len);
      live_.push_back(r);
      fresh.push_back(live_.size() - 1);
    }
    // The cross pool changes eagerly, at arrival and departure: its commands never ride in a step.
    const std::int32_t cross = pool(AttentionKind::kCross);
    for (Engine* e : {a_.get(), b_.get()}) {
      if (!ledger().commands(cross).empty())
        e->stack.apply_table(AttentionKind::kCross, ledger().commands(cross), stream_);
      for (std::size_t i : fresh) {
        const Request& r = live_[i];
        e->stack.encode(r.slot, r.id, r.encoder_len, stream_);
      }
    }
    ledger().clear_commands(cross);
    if (uniform(rng_, 0, 49) == 0) {
      for (AttentionKind k : {AttentionKind::kFull, AttentionKind::kSliding, AttentionKind::kCross})
        if (pool(k) >= 0) scramble(k);
    }
  }

  void checksums(std::array<std::vector<std::uint64_t>, kNumAttentionKinds>& out) {
    for (int k = 0; k < kNumAttentionKinds; ++k) {
      const auto kind = static_cast<AttentionKind>(k);
      if (pool(kind) < 0) continue;
      page_checksums(a_->stack.runtime().pool(kind), checksum_dev_[k].data(), out[k], stream_);
    }
  }

  void one_step() {
    churn();
    // Mode, N and the batch.
    const std::int32_t roll = uniform(rng_, 0, 99);
    const StepMode mode = roll < 35   ? StepMode::kDecode
                          : roll < 60 ? StepMode::kTargetVerify
                          : roll < 85 ? StepMode::kDraftExtendV2
                                      : StepMode::kExtend;
    std::int32_t n_key = mode == StepMode::kDecode   ? 1
                         : mode == StepMode::kExtend ? 0
                                                     : kSpecTokens;
    if (n_key > 1 && uniform(rng_, 0, 9) == 0)
      n_key = uniform(rng_, 1, kSpecTokens + 2);  // uncaptured N
    std::vector<std::size_t> order(live_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng_);
    const std::int32_t b_max = std::min({cap_.max_batch, static_cast<std::int32_t>(order.size()),
                                         cap_.max_tokens / std::max(n_key, 1)});
    const std::int32_t b = uniform(rng_, 1, b_max);
    order.resize(static_cast<std::size_t>(b));

    requests_.clear();
    tokens_.clear();
    prefix_.clear();
    std::int32_t budget = cap_.max_tokens;
    for (std::size_t j = 0; j < order.size(); ++j) {
      Request& r = live_[order[j]];
      const auto left = static_cast<std::int32_t>(order.size() - j - 1);
      std::int32_t ext = 1;
      if (mode == StepMode::kTargetVerify) ext = n_key;
      if (mode == StepMode::kDraftExtendV2) ext = uniform(rng_, 1, n_key);
      if (mode == StepMode::kExtend)
        ext = uniform(rng_, 1, std::max(1, std::min(kMaxPrompt, budget - left * kSpecTokens)));
      budget -= ext;
      StepRequest q{r.slot, static_cast<std::int32_t>(r.history.size()), ext, r.encoder_len};
      ledger().extend(r.slot, ext);
      prefix_.push_back(q.prefix_len);
      for (std::int32_t i = 0; i < ext; ++i) {
        const std::int32_t id = uniform(rng_, 0, 50000);
        r.history.push_back(id);
        tokens_.push_back(id);
      }
      requests_.push_back(q);
    }
    StepDesc d;
    d.mode = mode;
    d.tokens_per_request = n_key;
    d.requests = requests_;
    d.token_ids = tokens_;
    a_->step.attach_commands(d);

    checksums(before_);
    const StepPath path = a_->graphs.step(d, stream_);
    b_->graphs.step(d, stream_);
    const GraphKey* key = a_->graphs.find(mode, n_key, b);
    if (path == StepPath::kGraph) {
      ++result_.graph_steps;
      if (key && key->bucket > b) ++result_.padded_steps;
    } else {
      ++result_.eager_steps;
    }
    const auto n_tok = static_cast<std::size_t>(tokens_.size());
    const std::size_t row = static_cast<std::size_t>(a_->stack.row_elems());
    GD_CUDA(cudaMemcpyAsync(residual_a_.data(), a_->stack.residual(), n_tok * row * sizeof(float),
                            cudaMemcpyDeviceToHost, stream_));
    GD_CUDA(cudaMemcpyAsync(residual_b_.data(), b_->stack.residual(), n_tok * row * sizeof(float),
                            cudaMemcpyDeviceToHost, stream_));
    GD_CUDA(cudaStreamSynchronize(stream_));
    checksums(after_);

    std::ostringstream what;
    what << step_mode_name(mode) << " N=" << n_key << " batch=" << b << " tokens=" << n_tok
         << (path == StepPath::kGraph ? " graph bucket=" + std::to_string(key ? key->bucket : 0)
                                      : std::string(" eager"));
    if (opt_.verbose && opt_.log) *opt_.log << "step " << step_ << ": " << what.str() << "\n";
    if (std::memcmp(residual_a_.data(), residual_b_.data(), n_tok * row * sizeof(float)) != 0) {
      std::size_t first = 0;
      while (first < n_tok * row &&
             std::memcmp(&residual_a_[first], &residual_b_[first], sizeof(float)) == 0)
        ++first;
      fail(what.str() + ": graph replay != eager, first differing token " +
           std::to_string(first / row));
    }
    check_untouched(what.str());
    check_reference(what.str());

    ledger().clear_commands();
    // Speculative rollback after verify: keep prefix + accepted tokens.
    if (mode == StepMode::kTargetVerify) {
      for (std::size_t j = 0; j < order.size(); ++j) {
        Request& r = live_[order[j]];
        const std::int32_t keep = prefix_[j] + uniform(rng_, 1, n_key);
        ledger().truncate(r.slot, keep);
        r.history.resize(static_cast<std::size_t>(keep));
      }
    }
  }

  // Pages that must not change: the reserved page, every page of a live request outside the step,
  // pages of a request in the step that hold only cached tokens (below its prefix), and every
  // cross page.
  void check_untouched(const std::string& what) {
    for (int k = 0; k < kNumAttentionKinds; ++k) {
      const std::int32_t p = pool(static_cast<AttentionKind>(k));
      if (p < 0) continue;
      const std::int32_t ps = cap_.pools[p].geometry.page_size;
      const auto changed = [&](std::int32_t page) { return before_[k][page] != after_[k][page]; };
      if (changed(kReservedPage))
        fail(what + ": reserved page changed in pool " + std::to_string(k));
      for (const Request& r : live_) {
        std::int32_t protect_below = INT32_MAX;  // logical pages [0, protect_below) are protected
        if (k != kind_index(AttentionKind::kCross)) {
          for (std::size_t j = 0; j < requests_.size(); ++j) {
            if (requests_[j].slot == r.slot) protect_below = prefix_[j] / ps;
          }
        }
        const auto row = ledger().slots(p).row(r.slot);
        for (std::int32_t lp = 0; lp < static_cast<std::int32_t>(row.size()) && lp < protect_below;
             ++lp) {
          if (row[lp] != kInvalidPage && changed(row[lp])) {
            fail(what + ": pool " + std::to_string(k) + " slot " + std::to_string(r.slot) +
                 " logical page " + std::to_string(lp) + " (page " + std::to_string(row[lp]) +
                 ") changed");
          }
        }
      }
    }
  }

  // float64 reference of the whole stack for a few rows of the step.
  void check_reference(const std::string& what) {
    const std::int32_t total = static_cast<std::int32_t>(tokens_.size());
    const AttentionLayout& layout = config_.layout;
    const std::int32_t hq = layout.num_q_heads, hkv = layout.num_kv_heads, dim = layout.head_dim;
    const std::int32_t group = hq / hkv;
    const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    for (std::int32_t s = 0; s < opt_.ref_rows; ++s) {
      const std::int32_t t = uniform(rng_, 0, total - 1);
      std::int32_t j = 0, start = 0;
      while (start + requests_[j].extend_len <= t) start += requests_[j++].extend_len;
      const StepRequest& q = requests_[j];
      const Request* req = nullptr;
      for (const Request& r : live_)
        if (r.slot == q.slot) req = &r;
      const std::int32_t pos = q.prefix_len + (t - start);
      std::vector<double> residual(static_cast<std::size_t>(hq * dim), 0.0);
      std::vector<double> qv(static_cast<std::size_t>(dim)), acc(static_cast<std::size_t>(dim));
      for (std::int32_t l = 0; l < static_cast<std::int32_t>(layout.layers.size()); ++l) {
        const AttentionKind kind = layout.layers[l];
        std::vector<double> out(residual.size(), 0.0);
        for (std::int32_t h = 0; h < hq; ++h) {
          const std::int32_t kvh = h / group;
          for (std::int32_t d = 0; d < dim; ++d) {
            const float x = synthetic::value(
                config_.seed, synthetic::kQuery, static_cast<std::uint32_t>(req->history[pos]),
                static_cast<std::uint32_t>(pos), synthetic::element_id(l, h, d));
            const float v = x + config_.residual_gain * static_cast<float>(residual[h * dim + d]);
            qv[d] = reference::to_float(reference::from_float(v, layout.dtype), layout.dtype);
          }
          std::int32_t k_begin = 0, k_end = pos + 1;
          if (kind == AttentionKind::kSliding) k_begin = first_visible_key(pos, layout.window_left);
          if (kind == AttentionKind::kCross) k_end = req->encoder_len;
          if (k_end <= k_begin) continue;  // sees no key: output 0
          double m = -INFINITY, denom = 0.0;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (std::int32_t key = k_begin; key < k_end; ++key) {
            const bool cross = kind == AttentionKind::kCross;
            const std::uint32_t a = cross ? req->id : static_cast<std::uint32_t>(req->history[key]);
            const auto tk = cross ? synthetic::kEncoderKey : synthetic::kKey;
            const auto tv = cross ? synthetic::kEncoderValue : synthetic::kValue;
            double score = 0.0;
            for (std::int32_t d = 0; d < dim; ++d) {
              const float kf =
                  synthetic::value(config_.seed, tk, a, static_cast<std::uint32_t>(key),
                                   synthetic::element_id(l, kvh, d));
              score += qv[d] *
                       reference::to_float(reference::from_float(kf, layout.dtype), layout.dtype);
            }
            score *= scale;
            const double m_new = std::max(m, score);
            const double c = std::exp(m - m_new), p = std::exp(score - m_new);
            denom = denom * c + p;
            for (std::int32_t d = 0; d < dim; ++d) {
              const float vf =
                  synthetic::value(config_.seed, tv, a, static_cast<std::uint32_t>(key),
                                   synthetic::element_id(l, kvh, d));
              acc[d] = acc[d] * c + p * reference::to_float(reference::from_float(vf, layout.dtype),
                                                            layout.dtype);
            }
            m = m_new;
          }
          for (std::int32_t d = 0; d < dim; ++d) out[h * dim + d] = acc[d] / denom;
        }
        for (std::size_t i = 0; i < residual.size(); ++i) residual[i] += out[i];
      }
      ++result_.ref_rows;
      const float* got = &residual_a_[static_cast<std::size_t>(t) * residual.size()];
      double worst = 0.0;
      std::size_t worst_i = 0;
      for (std::size_t i = 0; i < residual.size(); ++i) {
        const double err = std::abs(got[i] - residual[i]) / (1.0 + std::abs(residual[i]));
        if (!(err <= worst)) {
          worst = err;
          worst_i = i;
        }
      }
      result_.max_ref_error = std::max(result_.max_ref_error, worst);
      const double tol = layout.dtype == DType::kBF16 ? 3e-2 : 1e-2;
      if (!(worst <= tol)) {
        fail(what + ": reference mismatch at token " + std::to_string(t) + " (slot " +
             std::to_string(q.slot) + ", position " + std::to_string(pos) + ") element " +
             std::to_string(worst_i) + ": got " + std::to_string(got[worst_i]) + " want " +
             std::to_string(residual[worst_i]));
      }
    }
  }

  FuzzOptions opt_;
  std::mt19937_64 rng_;
  AttentionStackConfig config_;
  StepGraphsConfig graphs_on_;
  Stream stream_;
  std::unique_ptr<Engine> a_, b_;
  StepCapacity cap_;
  std::array<std::int32_t, kNumAttentionKinds> pool_{-1, -1, -1};  // step pool index per kind
  std::array<DeviceBuffer<std::uint64_t>, kNumAttentionKinds> checksum_dev_;
  std::array<std::vector<std::uint64_t>, kNumAttentionKinds> before_, after_;
  std::vector<Request> live_;
  std::vector<StepRequest> requests_;
  std::vector<std::int32_t> tokens_, prefix_;
  std::vector<float> residual_a_, residual_b_;
  std::uint32_t next_id_ = 1;
  std::int64_t step_ = 0;
  std::int32_t failures_this_step_ = 0;
  FuzzResult result_;
};

}  // namespace

FuzzResult run_replay_fuzz(const FuzzOptions& options) {
  GD_REQUIRE(options.max_batch >= 1 && options.max_batch <= 512, "max_batch", options.max_batch,
             "in [1, 512]");
  GD_REQUIRE(options.steps >= 0, "steps", options.steps, "cannot be negative");
  Fuzzer f(options);
  return f.run();
}

}  // namespace graphdecode::fuzz
