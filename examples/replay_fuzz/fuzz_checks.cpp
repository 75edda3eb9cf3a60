// The replay fuzzer's checks of one step: graph replay == eager bitwise on every phase's output,
// the device's draft tokens == the host's, pages that must not change, and sampled rows of every
// phase against the float64 reference.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "fuzzer.h"
#include "memory/pool_config.h"
#include "page_checksum.h"

namespace graphdecode::fuzz {
namespace {

// Index of the first element where a and b differ bitwise (a.size() when none).
std::size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  std::size_t i = 0;
  while (i < a.size() && std::memcmp(&a[i], &b[i], sizeof(float)) == 0) ++i;
  return i;
}

}  // namespace

void Fuzzer::fail(const std::string& what) {
  ++failures_this_step_;
  if (opt_.log && failures_this_step_ <= 5) {
    *opt_.log << "MISMATCH seed=" << opt_.seed << " step=" << step_ << ": " << what << "\n";
  }
}

void Fuzzer::download(const Engine& e, Outputs& out) {
  const SpecStack& p = e.program;
  const auto rt = static_cast<std::size_t>(p.target().row_elems());
  const auto rd = static_cast<std::size_t>(p.draft().row_elems());
  const std::size_t b = book_->rows().size(), n = book_->tokens().size();
  const auto copy = [&](void* dst, const void* src, std::size_t bytes) {
    if (bytes > 0) GD_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  };
  if (book_->mode() != StepMode::kSpeculative) {
    out.target.resize(n * rt);
    out.draft.resize(n * rd);
    out.decodes.clear();
    out.drafts.clear();
    copy(out.target.data(), p.target_residual(), out.target.size() * sizeof(float));
    copy(out.draft.data(), p.draft_residual(), out.draft.size() * sizeof(float));
  } else {
    const std::int32_t k = book_->n_key();
    out.target.resize(b * static_cast<std::size_t>(k + 1) * rt);
    out.draft.resize(n * rd);
    out.decodes.resize(static_cast<std::size_t>(std::max(0, k - 1)) * b * rd);
    out.drafts.resize(static_cast<std::size_t>(std::max(1, k)) * p.max_batch());
    copy(out.target.data(), p.target_residual(), out.target.size() * sizeof(float));
    copy(out.draft.data(), p.draft_residual(), out.draft.size() * sizeof(float));
    for (std::int32_t j = 1; j < k; ++j) {
      copy(out.decodes.data() + static_cast<std::size_t>(j - 1) * b * rd,
           p.draft_decode_residual(j), b * rd * sizeof(float));
    }
    copy(out.drafts.data(), p.drafts(), out.drafts.size() * sizeof(std::int32_t));
  }
  GD_CUDA(cudaStreamSynchronize(stream_));
}

void Fuzzer::compare_engines(const std::string& what) {
  const auto rt = static_cast<std::size_t>(a_->program.target().row_elems());
  const auto rd = static_cast<std::size_t>(a_->program.draft().row_elems());
  const auto compare = [&](const std::vector<float>& a, const std::vector<float>& b,
                           std::size_t row_elems, const std::string& phase) {
    const std::size_t i = first_difference(a, b);
    if (i < a.size()) {
      fail(what + ": graph replay != eager in " + phase + ", first differing row " +
           std::to_string(i / row_elems) + " element " + std::to_string(i % row_elems));
    }
  };
  const bool spec = book_->mode() == StepMode::kSpeculative;
  compare(out_a_.target, out_b_.target, rt, spec ? "the verify" : "the target's rows");
  compare(out_a_.draft, out_b_.draft, rd, spec ? "the draft-extend" : "the draft's rows");
  compare(out_a_.decodes, out_b_.decodes, rd, "the draft decodes (rows [j - 1][batch])");
}

void Fuzzer::check_drafts(const Outputs& out, const std::string& what) {
  const std::vector<StepRow>& rows = book_->rows();
  const std::int32_t phases = std::max(1, book_->n_key());
  const auto stride = static_cast<std::size_t>(a_->program.max_batch());
  for (std::size_t r = 0; r < rows.size(); ++r) {
    for (std::int32_t j = 0; j < phases; ++j) {
      const std::int32_t got = out.drafts[static_cast<std::size_t>(j) * stride + r];
      const std::int32_t want = rows[r].drafts[static_cast<std::size_t>(j)];
      if (&out == &out_a_) ++result_.spec.drafts_checked;
      if (got != want) {
        fail(what + ": draft token d_" + std::to_string(j + 1) + " of request row " +
             std::to_string(r) + " (slot " + std::to_string(rows[r].q.slot) + ", P " +
             std::to_string(rows[r].last) + ") is " + std::to_string(got) + ", want " +
             std::to_string(want));
        return;
      }
    }
  }
}

void Fuzzer::checksums(const Engine& e, std::vector<std::vector<std::uint64_t>>& out) {
  out.resize(pools_.size());
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    const StepPool& p = pools_[i];
    const AttentionStack& s = p.model == 0 ? e.program.target() : e.program.draft();
    page_checksums(s.runtime().pool(p.kind), checksum_dev_[i].data(), out[i], stream_);
  }
}

// Pages that must not change: the reserved page of every pool, every page of a live request
// outside the step, a request's pages below the first position the step writes in that model
// (the target's P or the draft's D in a speculative step, the prefix in a plain one), and every
// cross page.
void Fuzzer::check_untouched(const std::vector<std::vector<std::uint64_t>>& before,
                             const std::vector<std::vector<std::uint64_t>>& after,
                             const std::string& what) {
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    const StepPool& p = pools_[i];
    const std::string pool = "pool " + std::to_string(i) + " (" +
                             (p.model == 0 ? "target " : "draft ") +
                             std::string(attention_kind_name(p.kind)) + ")";
    const auto changed = [&](std::int32_t page) {
      return before[i][static_cast<std::size_t>(page)] != after[i][static_cast<std::size_t>(page)];
    };
    if (changed(kReservedPage)) fail(what + ": reserved page changed in " + pool);
    const std::vector<Request>& live = book_->live();
    for (std::size_t li = 0; li < live.size(); ++li) {
      const Request& r = live[li];
      std::int32_t protect_below = INT32_MAX;  // logical pages [0, protect_below) are protected
      if (p.kind != AttentionKind::kCross) {
        for (const StepRow& row : book_->rows()) {
          if (row.live == li)
            protect_below = row.first_written[static_cast<std::size_t>(p.model)] / p.page_size;
        }
      }
      const auto table = ledger().slots(static_cast<std::int32_t>(i)).row(r.slot);
      const auto n = static_cast<std::int32_t>(table.size());
      for (std::int32_t lp = 0; lp < n && lp < protect_below; ++lp) {
        if (table[lp] != kInvalidPage && changed(table[lp])) {
          fail(what + ": " + pool + " slot " + std::to_string(r.slot) + " logical page " +
               std::to_string(lp) + " (page " + std::to_string(table[lp]) + ") changed");
        }
      }
    }
  }
}

void Fuzzer::reference_row(std::int32_t model, std::span<const std::int32_t> tokens,
                           const Request& r, const float* got, const std::string& what,
                           std::int64_t* phase_rows) {
  const AttentionStackConfig& c = model == 0 ? config_.target : config_.draft;
  const std::vector<double>& want = reference_.row(c, tokens, r.encoder_len, r.id);
  ModeCounts& m = result_.modes[static_cast<std::size_t>(book_->mode())];
  ++m.ref_rows;
  if (phase_rows) ++*phase_rows;
  const RowError e = row_error(got, want);
  m.max_ref_error = std::max(m.max_ref_error, e.worst);
  if (!(e.worst <= row_tolerance(c.layout.dtype))) {
    fail(what + ": reference mismatch (slot " + std::to_string(r.slot) + ", position " +
         std::to_string(tokens.size() - 1) + ") element " + std::to_string(e.element) + ": got " +
         std::to_string(got[e.element]) + " want " + std::to_string(want[e.element]));
  }
}

// float64 reference of sampled rows: plain steps ref_rows rows of the target and one of the
// draft; speculative steps ref_rows rows of the verify, one of the draft-extend and one of a
// draft decode (k >= 2).
void Fuzzer::check_reference(const std::string& what) {
  if (opt_.ref_rows == 0) return;
  FuzzBook& book = *book_;
  const auto rt = static_cast<std::size_t>(a_->program.target().row_elems());
  const auto rd = static_cast<std::size_t>(a_->program.draft().row_elems());
  const auto total = static_cast<std::int32_t>(book.tokens().size());
  const std::vector<StepRow>& rows = book.rows();
  const std::vector<Request>& live = book.live();
  const auto b = static_cast<std::int32_t>(rows.size());
  std::size_t j = 0;
  if (book.mode() != StepMode::kSpeculative) {
    for (std::int32_t s = 0; s <= opt_.ref_rows; ++s) {
      const std::int32_t model = s < opt_.ref_rows ? 0 : 1;  // the last one: the draft
      const std::int32_t t = uniform(rng_, 0, total - 1);
      const auto tokens = book.image_tokens(t, j);
      const float* got = model == 0 ? &out_a_.target[static_cast<std::size_t>(t) * rt]
                                    : &out_a_.draft[static_cast<std::size_t>(t) * rd];
      reference_row(model, tokens, live[rows[j].live], got,
                    what + (model == 0 ? " target row " : " draft row ") + std::to_string(t),
                    nullptr);
    }
    return;
  }
  const std::int32_t k = book.n_key();
  SpecCounts& sc = result_.spec;
  for (std::int32_t s = 0; s < opt_.ref_rows; ++s) {
    const std::int32_t t = uniform(rng_, 0, b * (k + 1) - 1);
    const StepRow& row = rows[static_cast<std::size_t>(t / (k + 1))];
    reference_row(0, book.drafted_tokens(row, t % (k + 1)), live[row.live],
                  &out_a_.target[static_cast<std::size_t>(t) * rt],
                  what + " verify row " + std::to_string(t), &sc.verify_rows);
  }
  {
    const std::int32_t t = uniform(rng_, 0, total - 1);
    const auto tokens = book.image_tokens(t, j);
    reference_row(1, tokens, live[rows[j].live], &out_a_.draft[static_cast<std::size_t>(t) * rd],
                  what + " draft-extend row " + std::to_string(t), &sc.draft_extend_rows);
  }
  if (k >= 2) {
    const std::int32_t d = uniform(rng_, 1, k - 1), r = uniform(rng_, 0, b - 1);
    const StepRow& row = rows[static_cast<std::size_t>(r)];
    const float* got = &out_a_.decodes[(static_cast<std::size_t>(d - 1) * b + r) * rd];
    reference_row(1, book.drafted_tokens(row, d), live[row.live], got,
                  what + " draft decode " + std::to_string(d) + " row " + std::to_string(r),
                  &sc.draft_decode_rows);
  }
}

}  // namespace graphdecode::fuzz
