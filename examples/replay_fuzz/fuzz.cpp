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
#include "common/buffers.h"
#include "common/error.h"
#include "common/request_rules.h"
#include "common/stream.h"
#include "graphs/attention_stack.h"
#include "graphs/step_graphs.h"
#include "graphs/synthetic.h"
#include "memory/page_allocator.h"
#include "memory/request_slots.h"
#include "page_checksum.h"

namespace graphdecode::fuzz {
namespace {

constexpr std::int32_t kSpecTokens = 4;  // N of the captured verify / draft-extend-v2 graphs
constexpr std::int32_t kMaxPrompt = 48;  // longest extend of one request in extend mode

struct Engine {
  StepInput input;
  AttentionStack stack;
  StepGraphs graphs;
  Engine(const AttentionStackConfig& c, const StepGraphsConfig& g, cudaStream_t s)
      : input(stack_step_capacity(c)), stack(c, input, s), graphs(input, stack, g) {}
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
  c.page_size = std::array<std::int32_t, 3>{8, 16, 32}[uniform(rng, 0, 2)];
  const std::int32_t ps = c.page_size;
  // Windows at and around page boundaries.
  c.window_left = std::array<std::int32_t, 6>{ps - 1, ps,         2 * ps - 1,
                                              2 * ps, 2 * ps + 1, 3 * ps - 2}[uniform(rng, 0, 5)];
  c.layers = {AttentionKind::kFull, AttentionKind::kSliding, AttentionKind::kCross};
  const std::int32_t extra = uniform(rng, 0, 3);
  for (std::int32_t i = 0; i < extra; ++i)
    c.layers.push_back(static_cast<AttentionKind>(uniform(rng, 0, 2)));
  std::shuffle(c.layers.begin(), c.layers.end(), rng);
  c.num_q_heads = 4;
  c.num_kv_heads = uniform(rng, 0, 1) ? 2 : 1;
  c.head_dim = 64;
  c.dtype = uniform(rng, 0, 3) == 0 ? DType::kFP16 : DType::kBF16;
  c.max_batch = max_batch;
  c.max_tokens = max_batch * kSpecTokens + kMaxPrompt;
  c.max_new_tokens = kMaxPrompt;
  c.max_kv_len = 512;
  c.max_encoder_len = 192;
  c.seed = static_cast<std::uint32_t>(rng());
  return c;
}

std::string describe(const AttentionStackConfig& c) {
  std::ostringstream os;
  os << "layers=";
  for (AttentionKind k : c.layers) os << "FSC"[static_cast<int>(k)];
  os << " page=" << c.page_size << " window_left=" << c.window_left << " heads=" << c.num_q_heads
     << "/" << c.num_kv_heads << " dim=" << c.head_dim << " " << dtype_name(c.dtype)
     << " max_batch=" << c.max_batch << " max_tokens=" << c.max_tokens;
  return os.str();
}

// The host side of the fuzz: bookkeeping shared by both engines, and the checks.
class Fuzzer {
 public:
  Fuzzer(const FuzzOptions& o) : opt_(o), rng_(o.seed), config_(draw_config(rng_, o.max_batch)) {
    graphs_on_.modes = {{StepMode::kDecode, 1},
                        {StepMode::kTargetVerify, kSpecTokens},
                        {StepMode::kDraftExtendV2, kSpecTokens}};
    StepGraphsConfig off;
    off.use_graphs = false;
    a_ = std::make_unique<Engine>(config_, graphs_on_, stream_);
    b_ = std::make_unique<Engine>(config_, off, stream_);
    cap_ = a_->input.capacity();
    for (int k = 0; k < kNumPoolKinds; ++k) {
      if (!cap_.pools[k].present) continue;
      const PoolGeometry& g = cap_.pools[k].geometry;
      alloc_[k] = std::make_unique<PageAllocator>(g.num_pages);
      slots_[k] = std::make_unique<RequestSlots>(g, *alloc_[k]);
      batches_[k] = std::make_unique<TableCommandBatch>(cap_.pools[k].max_commands,
                                                        cap_.pools[k].max_page_ids);
      checksum_dev_[k] = DeviceBuffer<std::uint64_t>(static_cast<std::size_t>(g.num_pages));
      scramble(k);
    }
    cross_batch_ =
        std::make_unique<TableCommandBatch>(a_->stack.pool(AttentionKind::kCross).make_batch());
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

  // Shuffles the allocator's free list: pages come out non-monotonic.
  void scramble(int k) {
    PageAllocator& a = *alloc_[k];
    std::vector<std::int32_t> pages = a.allocate(a.free_pages());
    std::shuffle(pages.begin(), pages.end(), rng_);
    a.release(pages);
  }

  bool pool(AttentionKind k) const { return cap_.pools[pool_index(k)].present; }
  RequestSlots& slots(AttentionKind k) { return *slots_[pool_index(k)]; }
  TableCommandBatch& batch(AttentionKind k) { return *batches_[pool_index(k)]; }

  void finish(std::size_t i) {
    const Request& r = live_[i];
    for (AttentionKind k : {AttentionKind::kFull, AttentionKind::kSliding}) {
      if (pool(k)) slots(k).release(r.slot, batch(k));
    }
    slots(AttentionKind::kCross).release(r.slot, *cross_batch_);
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
      r.slot = slots(AttentionKind::kCross).acquire();
      for (AttentionKind k : {AttentionKind::kFull, AttentionKind::kSliding}) {
        if (!pool(k)) continue;
        const std::int32_t s = slots(k).acquire();
        GD_REQUIRE(s == r.slot, "slot", s, "pools handed out different slots (bookkeeping bug)");
      }
      r.id = next_id_++;
      // Every live request a different encoder length (0 included once).
      for (int attempt = 0; attempt < 64; ++attempt) {
        r.encoder_len = uniform(rng_, 0, cap_.max_encoder_len);
        if (std::none_of(live_.begin(), live_.end(),
                         [&](const Request& o) { return o.encoder_len == r.encoder_len; })) {
          break;
        }
      }
      if (r.encoder_len > 0)
        slots(AttentionKind::kCross).extend(r.slot, r.encoder_len, *cross_batch_);
      live_.push_back(r);
      fresh.push_back(live_.size() - 1);
    }
    for (Engine* e : {a_.get(), b_.get()}) {
      const TableCommandBatch* cmds = cross_batch_.get();
      if (fresh.empty() && !cross_batch_->empty())
        e->stack.apply_table(AttentionKind::kCross, *cross_batch_, stream_);
      for (std::size_t i : fresh) {
        const Request& r = live_[i];
        e->stack.encode(r.slot, r.id, r.encoder_len, cmds, stream_);
        cmds = nullptr;
      }
    }
    cross_batch_->clear();
    if (uniform(rng_, 0, 49) == 0) {
      for (int k = 0; k < kNumPoolKinds; ++k) {
        if (cap_.pools[k].present) scramble(k);
      }
    }
  }

  void checksums(std::array<std::vector<std::uint64_t>, kNumPoolKinds>& out) {
    for (int k = 0; k < kNumPoolKinds; ++k) {
      if (!cap_.pools[k].present) continue;
      page_checksums(a_->stack.pool(static_cast<AttentionKind>(k)), checksum_dev_[k].data(), out[k],
                     stream_);
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
      for (AttentionKind k : {AttentionKind::kFull, AttentionKind::kSliding}) {
        if (pool(k)) slots(k).extend(r.slot, ext, batch(k));
      }
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
    for (int k = 0; k < 2; ++k) d.tables[k] = batches_[k] ? batches_[k].get() : nullptr;

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

    for (int k = 0; k < kNumPoolKinds; ++k) {
      if (batches_[k]) batches_[k]->clear();
    }
    // Speculative rollback after verify: keep prefix + accepted tokens.
    if (mode == StepMode::kTargetVerify) {
      for (std::size_t j = 0; j < order.size(); ++j) {
        Request& r = live_[order[j]];
        const std::int32_t keep = prefix_[j] + uniform(rng_, 1, n_key);
        for (AttentionKind k : {AttentionKind::kFull, AttentionKind::kSliding}) {
          if (pool(k)) slots(k).truncate(r.slot, keep, batch(k));
        }
        r.history.resize(static_cast<std::size_t>(keep));
      }
    }
  }

  // Pages that must not change: the reserved page, every page of a live request outside the step,
  // pages of a request in the step that hold only cached tokens (below its prefix), and every
  // cross page.
  void check_untouched(const std::string& what) {
    for (int k = 0; k < kNumPoolKinds; ++k) {
      if (!cap_.pools[k].present) continue;
      const std::int32_t ps = cap_.pools[k].geometry.page_size;
      const auto changed = [&](std::int32_t page) { return before_[k][page] != after_[k][page]; };
      if (changed(kReservedPage))
        fail(what + ": reserved page changed in pool " + std::to_string(k));
      for (const Request& r : live_) {
        std::int32_t protect_below = INT32_MAX;  // logical pages [0, protect_below) are protected
        if (k != pool_index(AttentionKind::kCross)) {
          for (std::size_t j = 0; j < requests_.size(); ++j) {
            if (requests_[j].slot == r.slot) protect_below = prefix_[j] / ps;
          }
        }
        const auto row = slots_[k]->row(r.slot);
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
    const std::int32_t hq = config_.num_q_heads, hkv = config_.num_kv_heads, dim = config_.head_dim;
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
      for (std::int32_t l = 0; l < static_cast<std::int32_t>(config_.layers.size()); ++l) {
        const AttentionKind kind = config_.layers[l];
        std::vector<double> out(residual.size(), 0.0);
        for (std::int32_t h = 0; h < hq; ++h) {
          const std::int32_t kvh = h / group;
          for (std::int32_t d = 0; d < dim; ++d) {
            const float x = synthetic::value(
                config_.seed, synthetic::kQuery, static_cast<std::uint32_t>(req->history[pos]),
                static_cast<std::uint32_t>(pos), synthetic::element_id(l, h, d));
            const float v = x + config_.residual_gain * static_cast<float>(residual[h * dim + d]);
            qv[d] = reference::to_float(reference::from_float(v, config_.dtype), config_.dtype);
          }
          std::int32_t k_begin = 0, k_end = pos + 1;
          if (kind == AttentionKind::kSliding)
            k_begin = first_visible_key(pos, config_.window_left);
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
                       reference::to_float(reference::from_float(kf, config_.dtype), config_.dtype);
            }
            score *= scale;
            const double m_new = std::max(m, score);
            const double c = std::exp(m - m_new), p = std::exp(score - m_new);
            denom = denom * c + p;
            for (std::int32_t d = 0; d < dim; ++d) {
              const float vf =
                  synthetic::value(config_.seed, tv, a, static_cast<std::uint32_t>(key),
                                   synthetic::element_id(l, kvh, d));
              acc[d] =
                  acc[d] * c +
                  p * reference::to_float(reference::from_float(vf, config_.dtype), config_.dtype);
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
      const double tol = config_.dtype == DType::kBF16 ? 3e-2 : 1e-2;
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
  std::array<std::unique_ptr<PageAllocator>, kNumPoolKinds> alloc_;
  std::array<std::unique_ptr<RequestSlots>, kNumPoolKinds> slots_;
  std::array<std::unique_ptr<TableCommandBatch>, kNumPoolKinds> batches_;
  std::unique_ptr<TableCommandBatch> cross_batch_;
  std::array<DeviceBuffer<std::uint64_t>, kNumPoolKinds> checksum_dev_;
  std::array<std::vector<std::uint64_t>, kNumPoolKinds> before_, after_;
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
