#include "fuzz.h"

#include <algorithm>
#include <ostream>
#include <sstream>

#include "common/error.h"
#include "fuzzer.h"

namespace graphdecode::fuzz {

Fuzzer::Fuzzer(const FuzzOptions& o)
    : opt_(o), rng_(o.seed), config_(draw_config(rng_, o.max_batch)) {
  graphs_on_.modes = {GraphMode{StepMode::kDecode, 1},
                      GraphMode{StepMode::kTargetVerify, kVerifyTokens},
                      GraphMode{StepMode::kDraftExtendV2, kVerifyTokens}};
  if (opt_.spec_percent > 0) {
    for (std::int32_t k : kCapturedK) graphs_on_.modes.push_back({StepMode::kSpeculative, k});
  }
  StepGraphsConfig off;
  off.use_graphs = false;
  cap_ = spec_step_capacity(config_);
  a_ = std::make_unique<Engine>(config_, cap_, graphs_on_, stream_);
  b_ = std::make_unique<Engine>(config_, cap_, off, stream_);
  book_ = std::make_unique<FuzzBook>(ledger(), cap_, config_, opt_.spec_percent, rng_);
  for (std::int32_t i = 0; i < cap_.num_pools(); ++i) {
    const StepPoolCapacity& p = cap_.pools[i];
    pools_.push_back(StepPool{p.model, p.geometry.kind, p.geometry.page_size});
    checksum_dev_.emplace_back(static_cast<std::size_t>(p.geometry.num_pages));
    ledger().shuffle_free_pages(i, rng_());  // pages come out non-monotonic
  }
  a_->graphs.capture(stream_);
  result_.graph_memory_bytes = a_->graphs.graph_memory_bytes();
  result_.num_graphs = a_->graphs.num_graphs();
  result_.config = describe(config_);
}

FuzzResult Fuzzer::run() {
  for (std::int64_t s = 0; s < opt_.steps; ++s) {
    step_ = s;
    failures_this_step_ = 0;
    one_step();
    ModeCounts& m = result_.modes[static_cast<std::size_t>(book_->mode())];
    ++m.steps;
    ++result_.steps;
    if (failures_this_step_ > 0) {
      ++m.mismatches;
      ++result_.mismatches;
    }
  }
  for (const ModeCounts& m : result_.modes) {
    result_.graph_steps += m.graph_steps;
    result_.eager_steps += m.eager_steps;
    result_.padded_steps += m.padded_steps;
    result_.ref_rows += m.ref_rows;
    result_.max_ref_error = std::max(result_.max_ref_error, m.max_ref_error);
  }
  result_.spec.drafted = book_->drafted();
  result_.spec.accepted = book_->accepted();
  return result_;
}

// The book's arrivals and departures; encoder K/V of arrivals written into every cross pool of
// both engines.
void Fuzzer::churn() {
  const std::vector<std::size_t> fresh = book_->churn();
  const std::vector<Request>& live = book_->live();
  // Cross pools change eagerly, at arrival and departure: their commands never ride in a step.
  for (std::int32_t p = 0; p < static_cast<std::int32_t>(pools_.size()); ++p) {
    if (pools_[static_cast<std::size_t>(p)].kind != AttentionKind::kCross) continue;
    const std::int32_t model = pools_[static_cast<std::size_t>(p)].model;
    for (Engine* e : {a_.get(), b_.get()}) {
      if (!ledger().commands(p).empty())
        stack(*e, model).apply_table(AttentionKind::kCross, ledger().commands(p), stream_);
      for (std::size_t i : fresh)
        stack(*e, model).encode(live[i].slot, live[i].id, live[i].encoder_len, stream_);
    }
    ledger().clear_commands(p);
  }
  if (uniform(rng_, 0, 49) == 0) {
    for (std::int32_t p = 0; p < static_cast<std::int32_t>(pools_.size()); ++p)
      ledger().shuffle_free_pages(p, rng_());
  }
}

void Fuzzer::one_step() {
  churn();
  book_->build_step();
  run_engines();
  const StepMode mode = book_->mode();
  std::ostringstream what;
  what << step_mode_name(mode) << (mode == StepMode::kSpeculative ? " k=" : " N=") << book_->n_key()
       << " batch=" << book_->rows().size() << " tokens=" << book_->tokens().size()
       << (path_ == StepPath::kGraph ? " graph bucket=" + std::to_string(bucket_)
                                     : std::string(" eager"));
  if (opt_.verbose && opt_.log) *opt_.log << "step " << step_ << ": " << what.str() << "\n";
  compare_engines(what.str());
  if (mode == StepMode::kSpeculative) {
    check_drafts(out_a_, what.str() + " (graph engine)");
    check_drafts(out_b_, what.str() + " (eager engine)");
  }
  check_untouched(before_a_, after_a_, what.str() + " (graph engine)");
  check_untouched(before_b_, after_b_, what.str() + " (eager engine)");
  check_reference(what.str());
  ledger().clear_commands();  // the step carried them
  book_->settle();
}

void Fuzzer::run_engines() {
  StepDesc d = book_->desc();
  a_->step.attach_commands(d);  // one ledger (A's) drives both engines' identical pools
  checksums(*a_, before_a_);
  checksums(*b_, before_b_);
  path_ = a_->graphs.step(d, stream_);
  b_->graphs.step(d, stream_);
  const StepMode mode = book_->mode();
  const std::int32_t n_key = book_->n_key();
  const auto b = static_cast<std::int32_t>(book_->rows().size());
  const GraphKey* key = a_->graphs.find(mode, n_key, b);
  ModeCounts& m = result_.modes[static_cast<std::size_t>(mode)];
  bucket_ = 0;
  if (path_ == StepPath::kGraph) {
    ++m.graph_steps;
    bucket_ = key ? key->bucket : 0;
    if (bucket_ > b) ++m.padded_steps;
  } else {
    ++m.eager_steps;
  }
  if (mode == StepMode::kSpeculative) {
    result_.spec.requests += b;
    result_.spec.k0_steps += n_key == 0;
    result_.spec.draft_decodes += std::max(0, n_key - 1);
  }
  download(*a_, out_a_);
  download(*b_, out_b_);
  checksums(*a_, after_a_);
  checksums(*b_, after_b_);
}

FuzzResult run_replay_fuzz(const FuzzOptions& options) {
  GD_REQUIRE(options.max_batch >= 1 && options.max_batch <= 512, "max_batch", options.max_batch,
             "in [1, 512]");
  GD_REQUIRE(options.steps >= 0, "steps", options.steps, "cannot be negative");
  GD_REQUIRE(options.ref_rows >= 0, "ref_rows", options.ref_rows, "cannot be negative");
  GD_REQUIRE(options.spec_percent >= 0 && options.spec_percent <= 100, "spec_percent",
             options.spec_percent, "a share in [0, 100]");
  Fuzzer f(options);
  return f.run();
}

}  // namespace graphdecode::fuzz
