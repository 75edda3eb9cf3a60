// CPU: the replay fuzzer's host book (examples/replay_fuzz/fuzz_book.h) driven through the CPU
// twins of the step path, so what the GPU fuzz assumes is checked without a device:
//   every step's image validates (StepImageWriter), the page tables follow the ledger's commands
//   (apply_table_commands_host), the metadata comes from prep_step_host and, for a speculative
//   step, spec_prep_host with the synthetic draft tokens made and scattered on the host as the
//   device does; the KV of every self pool of both models is emulated token by token.
// Checks: each phase's rows hold the (position, token id) the float64 reference assumes; every key
// a row of any phase reads holds the token the reference rebuilds it from (its page present, not
// returned by the window, not overwritten by a rollback); the draft chain equals the book's
// drafts; writes land at or above the first position the book protects; no page is held twice.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/request_rules.h"
#include "engine/spec/spec_prep.h"
#include "fuzz_book.h"
#include "fuzz_config.h"
#include "graphs/step_prep.h"
#include "memory/table_commands.h"
#include "synthetic.h"

namespace graphdecode::fuzz {
namespace {

struct Cell {
  std::int32_t token = -1;
  std::int32_t position = -1;
};

// One self pool's page table and token-level contents.
struct PoolEmu {
  PoolGeometry geometry;
  std::int32_t model = 0;
  std::vector<std::int32_t> table;  // [max_slots][max_pages_per_slot]
  std::vector<Cell> cells;          // [num_pages][page_size]

  std::int32_t page(std::int32_t slot, std::int32_t position) const {
    return table[static_cast<std::size_t>(slot) * geometry.max_pages_per_slot +
                 position / geometry.page_size];
  }
  Cell& cell(std::int32_t page, std::int32_t position) {
    return cells[static_cast<std::size_t>(page) * geometry.page_size +
                 position % geometry.page_size];
  }
};

struct Counts {
  std::int64_t steps[kNumStepModes] = {};
  std::int64_t k0 = 0, drafts = 0, rows_read = 0;
};

class BookEmulation {
 public:
  BookEmulation(std::uint64_t seed, std::int32_t max_batch, std::int32_t spec_percent)
      : rng_(seed),
        config_(draw_config(rng_, max_batch)),
        cap_(spec_step_capacity(config_)),
        ledger_(ledger_pools(cap_, config_.target.options)),
        writer_(cap_),
        meta_(StepMetaLayout::compute(cap_)),
        book_(ledger_, cap_, config_, spec_percent, rng_) {
    for (std::int32_t i = 0; i < cap_.num_pools(); ++i) {
      PoolEmu p;
      p.geometry = cap_.pools[i].geometry;
      p.model = cap_.pools[i].model;
      p.table.resize(static_cast<std::size_t>(p.geometry.max_slots) *
                     p.geometry.max_pages_per_slot);
      init_page_table_host(p.geometry, p.table);
      p.cells.resize(static_cast<std::size_t>(p.geometry.num_pages) * p.geometry.page_size);
      pools_.push_back(std::move(p));
      ledger_.shuffle_free_pages(i, rng_());
    }
    image_.resize(writer_.layout().total_words);
    blocks_.assign(static_cast<std::size_t>(kMaxDrafts + 1),
                   std::vector<std::int32_t>(meta_.total_words, 0));
  }

  const SpecStackConfig& config() const { return config_; }
  const Counts& counts() const { return counts_; }

  void step() {
    book_.churn();
    for (std::int32_t i = 0; i < cap_.num_pools(); ++i) {  // cross pools: eagerly, as the fuzz
      if (pools_[static_cast<std::size_t>(i)].geometry.kind != AttentionKind::kCross) continue;
      apply(i);
      ledger_.clear_commands(i);
    }
    book_.build_step();
    StepDesc d = book_.desc();
    for (std::int32_t i = 0; i < cap_.num_pools(); ++i) d.tables[i] = &ledger_.commands(i);
    writer_.write(d, image_);
    for (std::int32_t i = 0; i < cap_.num_pools(); ++i) apply(i);
    ledger_.clear_commands();
    check_pages_unique();
    prep_step_host(StepInputView::over(image_.data(), writer_.layout()), cap_, blocks_[0]);
    ++counts_.steps[static_cast<int>(book_.mode())];
    if (book_.mode() == StepMode::kSpeculative) {
      speculative();
    } else {
      plain();
    }
    book_.settle();
  }

 private:
  StepMetaView view(std::size_t b) { return StepMetaView::over(blocks_[b].data(), meta_); }

  void apply(std::int32_t i) {
    const TableCommandBatch& c = ledger_.commands(i);
    PoolEmu& p = pools_[static_cast<std::size_t>(i)];
    apply_table_commands_host(c.commands(), c.page_ids(), p.geometry, p.table);
  }

  // Every page of a self pool is held by one live request at most, never the reserved page.
  void check_pages_unique() {
    for (std::int32_t i = 0; i < cap_.num_pools(); ++i) {
      std::set<std::int32_t> seen;
      const PoolEmu& p = pools_[static_cast<std::size_t>(i)];
      for (const Request& r : book_.live()) {
        const auto row = ledger_.slots(i).row(r.slot);
        for (std::size_t lp = 0; lp < row.size(); ++lp) {
          ASSERT_EQ(row[lp],
                    p.table[static_cast<std::size_t>(r.slot) * p.geometry.max_pages_per_slot + lp])
              << "pool " << i << ": the emulated table differs from the ledger's";
          if (row[lp] == kInvalidPage) continue;
          ASSERT_NE(row[lp], kReservedPage) << "pool " << i << " slot " << r.slot;
          ASSERT_TRUE(seen.insert(row[lp]).second) << "pool " << i << " page " << row[lp];
        }
      }
    }
  }

  const StepRow& row_of(std::int32_t slot) const {
    for (const StepRow& r : book_.rows())
      if (r.q.slot == slot) return r;
    ADD_FAILURE() << "slot " << slot << " is not in the step";
    return book_.rows().front();
  }

  // A phase's K/V writes into `model`'s self pools: the rows of `m`, as write_new_kv does.
  void write(const StepMetaView& m, std::int32_t model) {
    const std::int32_t n = m.scalars[StepMetaLayout::kNumTokens];
    for (std::int32_t t = 0; t < n; ++t) {
      const std::int32_t slot = m.token_slot[t], pos = m.token_position[t];
      ASSERT_GE(pos, row_of(slot).first_written[static_cast<std::size_t>(model)])
          << "a write below the position the fuzz protects (model " << model << ")";
      for (PoolEmu& p : pools_) {
        if (p.model != model || p.geometry.kind == AttentionKind::kCross) continue;
        const std::int32_t page = p.page(slot, pos);
        ASSERT_TRUE(page != kInvalidPage && page != kReservedPage)
            << "slot " << slot << " position " << pos << " has no page";
        p.cell(page, pos) = Cell{m.token_id[t], pos};
      }
    }
  }

  // Row t of phase `m`: its (position, token id) are the last of `tokens`, and every key it reads
  // in `model`'s self pools holds tokens[key].
  void check_row(const StepMetaView& m, std::int32_t t, std::int32_t model,
                 std::span<const std::int32_t> tokens, const std::string& what) {
    const std::int32_t pos = m.token_position[t], slot = m.token_slot[t];
    ASSERT_EQ(pos + 1, static_cast<std::int32_t>(tokens.size())) << what << " row " << t;
    ASSERT_EQ(m.token_id[t], tokens.back()) << what << " row " << t;
    for (PoolEmu& p : pools_) {
      if (p.model != model || p.geometry.kind == AttentionKind::kCross) continue;
      const std::int32_t first = p.geometry.kind == AttentionKind::kSliding
                                     ? first_visible_key(pos, p.geometry.window_left)
                                     : 0;
      for (std::int32_t key = first; key <= pos; ++key) {
        const std::int32_t page = p.page(slot, key);
        ASSERT_TRUE(page != kInvalidPage && page != kReservedPage)
            << what << " row " << t << " key " << key << ": page gone";
        const Cell c = p.cell(page, key);
        ASSERT_TRUE(c.position == key && c.token == tokens[static_cast<std::size_t>(key)])
            << what << " row " << t << " (slot " << slot << ", position " << pos << ") key " << key
            << " holds token " << c.token << " at " << c.position << ", the reference assumes "
            << tokens[static_cast<std::size_t>(key)];
      }
    }
    ++counts_.rows_read;
  }

  void plain() {
    const StepMetaView x = view(0);
    write(x, 0);
    write(x, 1);
    std::size_t j = 0;
    for (std::int32_t t = 0; t < x.scalars[StepMetaLayout::kNumTokens]; ++t) {
      const auto tokens = book_.image_tokens(t, j);
      check_row(x, t, 0, tokens, "plain target");
      check_row(x, t, 1, tokens, "plain draft");
    }
  }

  // The device's draft sampler and scatter (SpecStack, scatter_draft_tokens) after phase j.
  void sample(const StepMetaView& m, std::int32_t j, std::int32_t k) {
    const std::int32_t n = m.scalars[StepMetaLayout::kNumRequests];
    const StepMetaView v = view(1);
    for (std::int32_t r = 0; r < n; ++r) {
      const std::int32_t row = m.q_start[r + 1] - 1;
      const std::int32_t d = synthetic::draft_token(
          config_.draft_seed, m.slot[r], m.token_position[row], m.token_id[row], config_.vocab);
      ASSERT_EQ(d, book_.rows()[static_cast<std::size_t>(r)].drafts[static_cast<std::size_t>(j)])
          << "d_" << j + 1 << " of request row " << r;
      ++counts_.drafts;
      if (j >= k) continue;  // k = 0: d_1 is made, never scattered
      v.token_id[r * (k + 1) + j + 1] = d;
      if (j + 1 < k) view(static_cast<std::size_t>(j + 2)).token_id[r] = d;
    }
  }

  void speculative() {
    const std::int32_t k = book_.n_key();
    counts_.k0 += k == 0;
    const StepMetaView x = view(0);
    std::vector<StepMetaView> decodes;
    for (std::int32_t j = 1; j < k; ++j) decodes.push_back(view(static_cast<std::size_t>(j + 1)));
    spec_prep_host(x, cap_, k, view(1), decodes);
    // Draft-extend over the committed tokens, then d_1.
    write(x, 1);
    std::size_t j = 0;
    for (std::int32_t t = 0; t < x.scalars[StepMetaLayout::kNumTokens]; ++t)
      check_row(x, t, 1, book_.image_tokens(t, j), "draft-extend");
    sample(x, 0, k);
    const auto b = static_cast<std::int32_t>(book_.rows().size());
    for (std::int32_t d = 1; d < k; ++d) {
      const StepMetaView m = decodes[static_cast<std::size_t>(d - 1)];
      write(m, 1);
      for (std::int32_t r = 0; r < b; ++r) {
        check_row(m, r, 1, book_.drafted_tokens(book_.rows()[static_cast<std::size_t>(r)], d),
                  "draft decode " + std::to_string(d));
      }
      sample(m, d, k);
    }
    const StepMetaView v = view(1);
    write(v, 0);
    for (std::int32_t t = 0; t < b * (k + 1); ++t) {
      check_row(
          v, t, 0,
          book_.drafted_tokens(book_.rows()[static_cast<std::size_t>(t / (k + 1))], t % (k + 1)),
          "verify");
    }
  }

  std::mt19937_64 rng_;
  SpecStackConfig config_;
  StepCapacity cap_;
  KvLedger ledger_;
  StepImageWriter writer_;
  StepMetaLayout meta_;
  FuzzBook book_;
  std::vector<PoolEmu> pools_;
  std::vector<std::int32_t> image_;
  std::vector<std::vector<std::int32_t>> blocks_;  // [0] prep, [1] verify, [1 + j] draft decode j
  Counts counts_;
};

TEST(ReplayFuzzBook, EveryPhaseReadsTheCacheTheReferenceAssumes) {
  for (std::uint64_t seed : {1ull, 2ull, 3ull, 4ull}) {
    BookEmulation e(seed, seed % 2 ? 16 : 32, 40);
    SCOPED_TRACE("seed " + std::to_string(seed) + ": " + describe(e.config()));
    for (int s = 0; s < 400; ++s) {
      ASSERT_NO_FATAL_FAILURE(e.step()) << "step " << s;
    }
    const Counts& c = e.counts();
    for (int m = 0; m < kNumStepModes; ++m) EXPECT_GT(c.steps[m], 0) << "mode " << m;
    EXPECT_GT(c.k0, 0);
    EXPECT_GT(c.drafts, 0);
    std::printf("seed %llu: %lld speculative steps (%lld of k = 0), %lld draft tokens, %lld rows\n",
                static_cast<unsigned long long>(seed),
                static_cast<long long>(c.steps[static_cast<int>(StepMode::kSpeculative)]),
                static_cast<long long>(c.k0), static_cast<long long>(c.drafts),
                static_cast<long long>(c.rows_read));
  }
}

TEST(ReplayFuzzBook, NoSpeculationWhenSpecPercentIsZero) {
  BookEmulation e(7, 16, 0);
  for (int s = 0; s < 200; ++s) ASSERT_NO_FATAL_FAILURE(e.step()) << "step " << s;
  EXPECT_EQ(e.counts().steps[static_cast<int>(StepMode::kSpeculative)], 0);
}

}  // namespace
}  // namespace graphdecode::fuzz
