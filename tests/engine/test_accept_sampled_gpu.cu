// GPU: sampled speculative acceptance (engine/spec/accept_sampled.h) and the sampler's row stats
// it reads (SamplingArgs::row_stats).
//   RowStats*: every live row's stats describe exactly the CPU sampling reference's kept set
//     (kIn tokens kept, kOut not), its max, 1 / T and Z (within the host / device expf error);
//     greedy rows are point masses at the reference's argmax; asking for stats changes no token;
//     the fast and the exact whole-row path give bit-identical stats; padding rows are untouched.
//   MatchesTheReference: random steps (vocab 1 .. 1000, k 0 .. 7, temperature / top-k / top-p /
//     mixes / greedy requests, accept limits, draft-model and point-mass drafts incl. invalid ids,
//     fp32 and bf16, padded rows) token for token against the CPU reference; drafts and the
//     target's tokens come from the real sampler with the engine's counters.
//   LosslessByChiSquare: 20,000 requests of one batched launch per configuration: the first
//     committed token ~ p_0, the second given a >= 1 ~ p_1, the third given a = 2 ~ p_2 (chi-square
//     at 1e-5, df = bins - 1 after pooling expected counts < 5); the controls (accept every draft;
//     residual drawn from p instead of max(0, p - q)) fail the same test.
//   GraphReplayMatchesEager: live count and data changing between replays.
// Argument checks are CPU tests (test_accept_sampled_cpu.cpp). Fresh random inputs every run
// (GRAPHDECODE_SEED reproduces one).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "accept_sampled_reference.h"
#include "common/stream.h"
#include "engine/kernels/sampling.h"
#include "engine/kernels/sampling_math.h"
#include "engine/row_sampler.h"  // SamplingWords: the aux layout the engine uses
#include "engine/spec/accept_sampled.h"
#include "graphs/cuda_graph.h"
#include "sampling_batch.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;
using sampling::key_of;

class AcceptSampledGpu : public GpuTest {};

constexpr std::int32_t kPoison = -5;

void fill_poison(SamplingRowStats* s, std::size_t n) {
  std::memset(static_cast<void*>(s), 0xab, n * sizeof(SamplingRowStats));
}
bool is_poison(const SamplingRowStats& s) {
  SamplingRowStats p;
  fill_poison(&p, 1);
  return std::memcmp(&s, &p, sizeof p) == 0;
}

// Runs the real sampler over a batch (its live rows) with row stats; returns tokens and stats.
void sample_with_stats(Batch& b, int live, DeviceBuffer<SamplingRowStats>& stats,
                       std::vector<std::int32_t>& tokens, std::vector<SamplingRowStats>& h_stats,
                       cudaStream_t s, int candidate_limit = 0) {
  h_stats.resize(stats.size());
  fill_poison(h_stats.data(), h_stats.size());
  stats.upload(h_stats.data(), h_stats.size(), s);
  b.upload(live, s);
  SamplingArgs a = b.args();
  a.row_stats = stats.data();
  a.candidate_limit = candidate_limit;
  sample(a, s);
  tokens = b.tokens(s);
  stats.download(h_stats.data(), h_stats.size(), s);
  GD_CUDA(cudaStreamSynchronize(s));
}

// ---- row stats against the sampling reference ---------------------------------------------------

std::vector<Params> param_mix(int vocab) {
  return {{0.f, 0, 1.f},    {0.8f, 0, 1.f},    {1.5f, 0, 1.f},        {0.8f, 1, 1.f},
          {1.f, 5, 1.f},    {0.8f, 50, 1.f},   {1.f, vocab - 1, 1.f}, {1.f, 0, 1e-6f},
          {0.8f, 0, 0.5f},  {0.8f, 0, 0.95f},  {1.2f, 0, 0.9999f},    {0.8f, 50, 0.95f},
          {-1.f, 50, 0.9f}, {0.3f, 200, 0.8f}, {1.f, 256, 0.9f},      {0.9f, 257, 1.f}};
}

void fill_shape(Rng& rng, float* row, int vocab, int shape) {
  switch (shape % 6) {
    case 0:
      random_logits(rng, row, vocab, 1.f);
      break;
    case 1:
      peaked_logits(rng, row, vocab);
      break;
    case 2:
      random_logits(rng, row, vocab, 0.02f);
      break;
    case 3: {  // ties near the k-th value
      random_logits(rng, row, vocab, 1.f);
      for (int i = 0; i < vocab; i += std::max(1, vocab / 200)) row[i] = 2.5f;
      break;
    }
    case 4: {
      std::uniform_int_distribution<int> u(0, 3);
      for (int i = 0; i < vocab; ++i) row[i] = static_cast<float>(u(rng));
      break;
    }
    default:
      std::fill(row, row + vocab, 0.75f);
  }
}

// Whether `st` describes the reference's distribution of row l (message on failure).
::testing::AssertionResult stats_match(const float* l, int vocab, const Params& p,
                                       const SamplingRowStats& st, int token) {
  const Expected e = reference_sample(l, vocab, p);
  if (e.greedy) {
    if (st.point_token != e.token || st.inv_temperature != 0.f || st.total_mass != 1)
      return ::testing::AssertionFailure()
             << "greedy row: point " << st.point_token << " (want " << e.token << "), inv_t "
             << st.inv_temperature << ", Z " << st.total_mass;
    return ::testing::AssertionSuccess();
  }
  int g = 0;
  for (int i = 1; i < vocab; ++i)
    if (l[i] > l[g]) g = i;
  if (st.point_token != -1 || st.max_logit != l[g] || st.inv_temperature != 1.f / p.temperature)
    return ::testing::AssertionFailure()
           << "sampled row: point " << st.point_token << ", max " << st.max_logit << " (want "
           << l[g] << "), inv_t " << st.inv_temperature;
  double z = 0.0;
  int kept = 0;
  for (int i = 0; i < vocab; ++i) {
    const bool in = key_of(l[i]) >= st.keep_key;
    if ((e.verdict[i] == Verdict::kIn && !in) || (e.verdict[i] == Verdict::kOut && in))
      return ::testing::AssertionFailure()
             << "token " << i << " kept " << in << ", reference verdict "
             << static_cast<int>(e.verdict[i]);
    if (in) {
      ++kept;
      z += std::exp(static_cast<double>(
               sampling::scaled_logit(l[i], st.max_logit, st.inv_temperature))) *
           0x1p40;
    }
  }
  if (token < 0 || token >= vocab || key_of(l[token]) < st.keep_key)
    return ::testing::AssertionFailure() << "the row's token " << token << " is not kept";
  if (std::fabs(static_cast<double>(st.total_mass) - z) > 1e-6 * z + kept)
    return ::testing::AssertionFailure() << "Z " << st.total_mass << ", reference " << z;
  return ::testing::AssertionSuccess();
}

TEST_F(AcceptSampledGpu, RowStatsDescribeTheKeptSetAndMasses) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const std::vector<int> vocabs =
      sanitize_mode() ? std::vector<int>{1, 7, 4095} : std::vector<int>{1, 7, 1000, 32000, 128256};
  std::uniform_int_distribution<std::uint64_t> u64;
  int forced = 0;
  for (LogitsType type : {LogitsType::kFloat32, LogitsType::kBF16})
    for (int vocab : vocabs)
      for (int rows : {6, 20}) {  // small and large chunks
        const std::string what = "vocab " + std::to_string(vocab) + " rows " +
                                 std::to_string(rows) + (type == LogitsType::kBF16 ? " bf16" : "");
        SCOPED_TRACE(what);
        Batch b(rows, vocab, type);
        const std::vector<Params> mix = param_mix(vocab);
        const int offset = static_cast<int>(u64(rng) % 1000);
        for (int r = 0; r < rows; ++r) {
          fill_shape(rng, b.row(r), vocab, r % 3 ? r % 2 : r + offset);
          b.params[r] = mix[(r + offset) % mix.size()];
          b.params[r].seed = u64(rng), b.params[r].step = u64(rng) % 100000;
        }
        const int live = rows - 1;
        DeviceBuffer<SamplingRowStats> stats(static_cast<std::size_t>(rows));
        std::vector<std::int32_t> tok, tok_exact;
        std::vector<SamplingRowStats> st, st_exact;
        sample_with_stats(b, live, stats, tok, st, s);
        b.upload_params(live, s);
        sample(b.args(), s);  // no stats: the same tokens
        EXPECT_EQ(b.tokens(s), tok) << "asking for row stats changed a token";
        const std::vector<std::int32_t> fast_path = b.paths(s);
        sample_with_stats(b, live, stats, tok_exact, st_exact, s, 1);  // the exact whole-row path
        const std::vector<std::int32_t> exact_path = b.paths(s);
        EXPECT_EQ(tok_exact, tok);
        for (int r = 0; r < rows; ++r) {
          if (r >= live) {
            EXPECT_TRUE(is_poison(st[r])) << "padding row " << r << " written";
            continue;
          }
          EXPECT_TRUE(stats_match(b.row(r), vocab, b.params[r], st[r], tok[r]))
              << "row " << r << " T " << b.params[r].temperature << " k " << b.params[r].top_k
              << " p " << b.params[r].top_p;
          EXPECT_EQ(std::memcmp(&st[r], &st_exact[r], sizeof st[r]), 0)
              << "row " << r << ": the exact path's stats differ (Z " << st[r].total_mass << " vs "
              << st_exact[r].total_mass << ", keep " << st[r].keep_key << " vs "
              << st_exact[r].keep_key << ")";
          forced += fast_path[r] == 1 && exact_path[r] != 1;
        }
      }
  EXPECT_GT(forced, 0) << "no row took the exact path";
}

// ---- a speculative step's acceptance on random rows ---------------------------------------------

struct Tally {
  int rows = 0, ambiguous = 0, rejected = 0, all_accepted = 0, partial = 0;
};

// Buffers and host copies of one speculative step of up to max_rows requests with k drafts.
struct Step {
  int vocab, k, max_rows, live = 0;
  LogitsType type;
  DraftKind kind;
  std::unique_ptr<Batch> target, draft;  // the real sampler over the verify and draft rows
  DeviceBuffer<SamplingRowStats> tstats, dstats;
  DeviceBuffer<std::int32_t> scalars, ids, pos, aux, out, flag;
  std::vector<std::uint64_t> seeds, first_pos;
  std::vector<int> limits, drafts;  // drafts [max_rows][k]
  std::vector<std::int32_t> ttokens, dtokens;
  std::vector<SamplingRowStats> h_tstats, h_dstats;
  int flag_value = 0;

  Step(int v, int kk, int rows, LogitsType t, DraftKind dk, std::int64_t stride = 0)
      : vocab(v), k(kk), max_rows(rows), type(t), kind(dk) {
    const int vr = rows * (k + 1);
    target = std::make_unique<Batch>(vr, v, t, stride);
    if (k > 0 && kind == DraftKind::kDistribution)
      draft = std::make_unique<Batch>(k * rows, v, t, stride ? stride + 5 : 0);
    tstats = DeviceBuffer<SamplingRowStats>(static_cast<std::size_t>(vr));
    dstats = DeviceBuffer<SamplingRowStats>(static_cast<std::size_t>(std::max(1, k * rows)));
    scalars = DeviceBuffer<std::int32_t>(StepMetaLayout::kScalarWords);
    ids = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(vr));
    pos = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(vr));
    aux = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(rows) * SamplingWords::kCount);
    out = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(rows) * stride_words() + 1);
    flag = DeviceBuffer<std::int32_t>(1);
  }
  int stride_words() const { return k + 2; }
  int vrow(int r, int i) const { return r * (k + 1) + i; }
  int drow(int r, int i) const { return i * max_rows + r; }

  // Random requests (or a losslessness scenario for every request), both samplers run, the
  // verify block and the aux words uploaded, the output poisoned.
  void fill(Rng& rng, int n_live, cudaStream_t s, const LosslessScenario* sc = nullptr) {
    live = n_live;
    std::uniform_int_distribution<std::uint64_t> u64;
    std::normal_distribution<float> nd(0.f, 1.f);
    const std::vector<Params> mix = {
        {0.f, 0, 1.f},  {1.f, 0, 1.f},    {0.7f, 0, 1.f},           {0.8f, 5, 1.f},
        {1.f, 50, 1.f}, {1.f, 0, 0.5f},   {0.9f, 0, 0.9f},          {0.8f, 20, 0.9f},
        {0.6f, 1, 1.f}, {-1.f, 50, 0.9f}, {1.2f, vocab - 1, 0.99f}, {2.f, 0, 1.f}};
    seeds.assign(max_rows, 0), first_pos.assign(max_rows, 0), limits.assign(max_rows, -1);
    drafts.assign(static_cast<std::size_t>(max_rows) * k, 0);
    std::vector<float> base(vocab);
    for (int r = 0; r < max_rows; ++r) {
      Params p = sc ? sc->params : r < live ? mix[u64(rng) % mix.size()] : Params{};
      seeds[r] = u64(rng);
      first_pos[r] = 1 + u64(rng) % 100000;
      if (!sc && r < live && u64(rng) % 4 == 0) limits[r] = static_cast<int>(u64(rng) % (k + 1));
      const float spread = std::array<float, 3>{0.3f, 1.f, 3.f}[u64(rng) % 3];
      const float noise = std::array<float, 3>{0.3f, 1.f, 2.f}[u64(rng) % 3];
      for (int i = 0; i <= k; ++i) {
        if (sc)
          base = sc->target[i];
        else if (u64(rng) % 4 == 0)
          peaked_logits(rng, base.data(), vocab);
        else
          random_logits(rng, base.data(), vocab, spread);
        std::copy(base.begin(), base.end(), target->row(vrow(r, i)));
        Params tp = p;
        tp.seed = seeds[r], tp.step = first_pos[r] + i;
        target->params[vrow(r, i)] = tp;
        if (i == k || !draft) continue;
        float* d = draft->row(drow(r, i));
        for (int y = 0; y < vocab; ++y) d[y] = sc ? sc->draft[i][y] : base[y] + noise * nd(rng);
        draft->params[drow(r, i)] = tp;  // the engine's counters: same seed and position
      }
    }
    sample_with_stats(*target, live * (k + 1), tstats, ttokens, h_tstats, s);
    if (draft) {
      sample_with_stats(*draft, k * max_rows, dstats, dtokens, h_dstats, s);
    } else {
      h_dstats.assign(static_cast<std::size_t>(std::max(1, k * max_rows)), SamplingRowStats{});
    }
    for (int r = 0; r < max_rows; ++r)
      for (int i = 0; i < k; ++i) {
        int& x = drafts[static_cast<std::size_t>(r) * k + i];
        if (draft) {
          x = dtokens[drow(r, i)];
        } else if (sc) {
          x = sc->point_tokens[i];
        } else {  // prompt-lookup-like: the target's argmax, a random token, or a bad id
          const int c = static_cast<int>(u64(rng) % 20);
          const float* t = target->row(vrow(r, i));
          x = static_cast<int>(std::max_element(t, t + vocab) - t);
          if (c >= 10) x = static_cast<int>(u64(rng) % vocab);
          if (c == 19) x = u64(rng) % 2 ? -1 : vocab;
        }
      }
    std::vector<std::int32_t> h_ids(target->max_rows, 0), h_pos(target->max_rows, 0);
    std::vector<std::int32_t> h_aux(static_cast<std::size_t>(max_rows) * SamplingWords::kCount, 0);
    for (int r = 0; r < live; ++r) {
      h_ids[vrow(r, 0)] = static_cast<std::int32_t>(u64(rng) % vocab);
      for (int i = 0; i <= k; ++i) {
        if (i < k) h_ids[vrow(r, i + 1)] = drafts[static_cast<std::size_t>(r) * k + i];
        h_pos[vrow(r, i)] = static_cast<std::int32_t>(first_pos[r] - 1 + i);
      }
      std::int32_t* w = h_aux.data() + static_cast<std::size_t>(r) * SamplingWords::kCount;
      w[SamplingWords::kSeedLo] = static_cast<std::int32_t>(static_cast<std::uint32_t>(seeds[r]));
      w[SamplingWords::kSeedHi] = static_cast<std::int32_t>(seeds[r] >> 32);
      w[SamplingWords::kAcceptLimit] = limits[r];
    }
    std::vector<std::int32_t> h_scalars(StepMetaLayout::kScalarWords, 0);
    h_scalars[StepMetaLayout::kNumRequests] = live;
    flag_value = u64(rng) % 2 ? 0 : 4;
    scalars.upload(h_scalars.data(), h_scalars.size(), s);
    ids.upload(h_ids.data(), h_ids.size(), s);
    pos.upload(h_pos.data(), h_pos.size(), s);
    aux.upload(h_aux.data(), h_aux.size(), s);
    flag.upload(&flag_value, 1, s);
    poison(s);
  }
  void poison(cudaStream_t s) {
    const std::vector<std::int32_t> p(out.size(), kPoison);
    out.upload(p.data(), p.size(), s);
    GD_CUDA(cudaStreamSynchronize(s));
  }
  AcceptSampledArgs args() const {
    AcceptSampledArgs a;
    a.verify.scalars = scalars.data();
    a.verify.token_id = ids.data();
    a.verify.token_position = pos.data();
    a.k = k;
    a.vocab = vocab;
    a.logits_type = type;
    const SamplingArgs t = target->args();
    a.target_logits = t.logits;
    a.target_stride = t.row_stride;
    a.target_stats = tstats.data();
    a.target_tokens = t.tokens;
    a.draft_kind = kind;
    if (draft) {
      const SamplingArgs d = draft->args();
      a.draft_logits = d.logits;
      a.draft_stride = d.row_stride;
      a.draft_stats = dstats.data();
      a.draft_rows = max_rows;
    }
    a.aux = aux.data();
    a.aux_words = SamplingWords::kCount;
    a.seed_lo_word = SamplingWords::kSeedLo;
    a.seed_hi_word = SamplingWords::kSeedHi;
    a.accept_limit_word = SamplingWords::kAcceptLimit;
    a.out = out.data();
    a.stride = stride_words();
    a.max_rows = max_rows;
    a.flag_a = flag.data();
    return a;
  }
  std::vector<std::int32_t> result(cudaStream_t s) const {
    std::vector<std::int32_t> h(out.size());
    out.download(h.data(), h.size(), s);
    GD_CUDA(cudaStreamSynchronize(s));
    return h;
  }
  AcceptCase request(int r) {
    AcceptCase c;
    c.vocab = vocab, c.k = k, c.limit = limits[r], c.seed = seeds[r];
    c.first_position = first_pos[r];
    c.point_drafts = kind == DraftKind::kPointMass;
    for (int i = 0; i <= k; ++i) {
      c.target_logits.push_back(target->row(vrow(r, i)));
      c.target_stats.push_back(h_tstats[vrow(r, i)]);
      c.target_tokens.push_back(ttokens[vrow(r, i)]);
      if (i == k) break;
      c.drafts.push_back(drafts[static_cast<std::size_t>(r) * k + i]);
      c.draft_logits.push_back(draft ? draft->row(drow(r, i)) : nullptr);
      c.draft_stats.push_back(h_dstats[draft ? drow(r, i) : 0]);
    }
    return c;
  }
  // Every live row against the reference, padding rows untouched, the flags word.
  void check(const std::vector<std::int32_t>& h, Tally& t, const std::string& what) {
    const int w = stride_words();
    EXPECT_EQ(h[static_cast<std::size_t>(max_rows) * w], flag_value) << what << " flags word";
    for (int r = 0; r < max_rows; ++r) {
      const std::int32_t* row = h.data() + static_cast<std::size_t>(r) * w;
      if (r >= live) {
        for (int j = 0; j < w; ++j)
          EXPECT_EQ(row[j], kPoison) << what << " padding request " << r << " written";
        continue;
      }
      const int cap = limits[r] < 0 || limits[r] > k ? k : limits[r];
      ASSERT_TRUE(row[0] >= 1 && row[0] <= cap + 1)
          << what << " request " << r << " count " << row[0] << " (cap " << cap << ")";
      const AcceptOutcome o = reference_accept(request(r), row);
      EXPECT_TRUE(o.ok) << what << " request " << r << " (T "
                        << target->params[vrow(r, 0)].temperature << " k "
                        << target->params[vrow(r, 0)].top_k << " p "
                        << target->params[vrow(r, 0)].top_p << ", limit " << limits[r]
                        << "): " << o.why;
      ++t.rows;
      t.ambiguous += o.ambiguous;
      t.rejected += o.rejected;
      t.all_accepted += !o.rejected && cap > 0;
      t.partial += o.rejected && o.accepted > 0;
    }
  }
};

TEST_F(AcceptSampledGpu, MatchesTheReferenceTokenForToken) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  Tally t;
  const int vocabs[] = {1, 2, 7, 40, 100, 257, 1000};
  std::uniform_int_distribution<int> u(0, 1 << 20);
  for (int it = 0; it < (sanitize_mode() ? 6 : 40); ++it) {
    const int vocab = vocabs[u(rng) % 7], k = u(rng) % 8, live = 1 + u(rng) % 24;
    const LogitsType type = it % 4 == 3 ? LogitsType::kBF16 : LogitsType::kFloat32;
    const DraftKind kind = it % 3 == 2 ? DraftKind::kPointMass : DraftKind::kDistribution;
    const std::int64_t stride = it % 5 == 4 ? vocab + 3 : 0;
    const std::string what =
        "vocab " + std::to_string(vocab) + " k " + std::to_string(k) + " live " +
        std::to_string(live) + (type == LogitsType::kBF16 ? " bf16" : "") +
        (kind == DraftKind::kPointMass ? " point drafts" : "") + (stride ? " strided" : "");
    SCOPED_TRACE(what);
    Step step(vocab, k, live + u(rng) % 3, type, kind, stride);
    step.fill(rng, live, s);
    accept_sampled(step.args(), s);
    step.check(step.result(s), t, what);
  }
  std::printf(
      "[ requests %d, rejected %d (after accepting some %d), all accepted %d, ambiguous %d ]\n",
      t.rows, t.rejected, t.partial, t.all_accepted, t.ambiguous);
  EXPECT_LE(t.ambiguous, t.rows / 50 + 2);
  EXPECT_GT(t.rejected, 0);
  EXPECT_GT(t.partial, 0);
  EXPECT_GT(t.all_accepted, 0);
  // Model-sized vocabularies: the residual walk crosses several 32-token chunks of a segment.
  // Their residual CDF has many small steps, so a draw within the host / device tolerance of one
  // is common there: only membership in the tolerance window is checked, not how often.
  Tally big;
  for (int vocab : sanitize_mode() ? std::vector<int>{32000} : std::vector<int>{32000, 128256})
    for (int it = 0; it < 3; ++it) {
      const int k = 1 + u(rng) % 3, live = 1 + u(rng) % 4;
      const DraftKind kind = it == 2 ? DraftKind::kPointMass : DraftKind::kDistribution;
      const LogitsType type = it == 1 ? LogitsType::kBF16 : LogitsType::kFloat32;
      const std::string what = "vocab " + std::to_string(vocab) + " k " + std::to_string(k);
      SCOPED_TRACE(what);
      Step step(vocab, k, live, type, kind);
      step.fill(rng, live, s);
      accept_sampled(step.args(), s);
      step.check(step.result(s), big, what);
    }
  std::printf("[ large vocabularies: requests %d, rejected %d, ambiguous %d ]\n", big.rows,
              big.rejected, big.ambiguous);
}

// ---- losslessness
// ----------------------------------------------------------------------------------

struct Config {
  const char* name;
  Params params;
  bool point_drafts;
};

TEST_F(AcceptSampledGpu, LosslessByChiSquare) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const int vocab = 40, k = 2;
  const int n = sanitize_mode() ? 2000 : 20000;
  const Config configs[] = {
      {"temperature", {1.f, 0, 1.f}, false},    {"top-k", {0.8f, 12, 1.f}, false},
      {"top-p", {1.f, 0, 0.8f}, false},         {"top-k+top-p", {0.7f, 15, 0.9f}, false},
      {"point drafts", {0.9f, 0, 0.95f}, true},
  };
  for (const Config& cfg : configs) {
    SCOPED_TRACE(cfg.name);
    const LosslessScenario sc =
        make_lossless_scenario(rng, vocab, k, cfg.params, cfg.point_drafts, n);
    ASSERT_EQ(sc.vocab, vocab) << "no scenario whose controls fail clearly";
    Step step(vocab, k, n, LogitsType::kFloat32,
              cfg.point_drafts ? DraftKind::kPointMass : DraftKind::kDistribution);
    step.fill(rng, n, s, &sc);
    accept_sampled(step.args(), s);
    const std::vector<std::int32_t> h = step.result(s);
    Tally t;
    step.check(h, t, cfg.name);  // token for token as well
    EXPECT_LE(t.ambiguous, n / 50);
    // The device's stats of every request's row i are the same, and describe the reference's
    // distribution (its kept set: the scenario has no boundary token).
    for (int i = 0; i <= k; ++i) {
      EXPECT_TRUE(stats_match(sc.target[i].data(), vocab, cfg.params,
                              step.h_tstats[step.vrow(0, i)], step.ttokens[step.vrow(0, i)]))
          << "target row " << i;
      if (i < k && step.draft)
        EXPECT_TRUE(stats_match(sc.draft[i].data(), vocab, cfg.params,
                                step.h_dstats[step.drow(0, i)], step.dtokens[step.drow(0, i)]))
            << "draft row " << i;
    }
    for (int i = 0; i <= k; ++i)
      for (int r = 0; r < n; ++r)
        ASSERT_EQ(std::memcmp(&step.h_tstats[step.vrow(r, i)], &step.h_tstats[step.vrow(0, i)],
                              sizeof(SamplingRowStats)),
                  0)
            << "row " << i << " of request " << r;
    // An independent draw from p_0 per request (another seed): the residual-as-p control.
    for (int r = 0; r < n; ++r) step.target->params[step.vrow(r, 0)].seed ^= 0x9e3779b97f4a7c15ull;
    step.target->upload_params(n * (k + 1), s);
    sample(step.target->args(), s);
    const std::vector<std::int32_t> indep = step.target->tokens(s);

    std::vector<std::vector<long>> hist(k + 1, std::vector<long>(vocab, 0));
    std::vector<long> all(vocab, 0), as_p(vocab, 0);
    for (int r = 0; r < n; ++r) {
      const std::int32_t* row = h.data() + static_cast<std::size_t>(r) * step.stride_words();
      for (int j = 0; j < row[0] && j <= k; ++j)  // check() has failed any bad token already
        if (row[1 + j] >= 0 && row[1 + j] < vocab) ++hist[j][row[1 + j]];
      const int d1 = step.drafts[static_cast<std::size_t>(r) * k];
      ++all[d1];
      ++as_p[row[0] >= 2 ? d1 : indep[step.vrow(r, 0)]];
    }
    for (int j = 0; j <= k; ++j) {
      const std::vector<double> p =
          reference_distribution(sc.target[j].data(), vocab, step.h_tstats[step.vrow(0, j)]);
      const ChiSquare c = chi_square(hist[j], p);
      EXPECT_TRUE(c.passes()) << "token " << j << ": " << c.describe();
      EXPECT_GT(c.total, j == 0 ? n - 1 : n / 50) << "token " << j << " was rarely reached";
      std::printf("[ %s token %d: %s ]\n", cfg.name, j, c.describe().c_str());
    }
    const ChiSquare c1 = chi_square(all, sc.p[0]), c2 = chi_square(as_p, sc.p[0]);
    EXPECT_FALSE(c1.passes()) << "accept-all control: " << c1.describe();
    EXPECT_FALSE(c2.passes()) << "residual-as-p control: " << c2.describe();
    std::printf("[ %s controls: accept-all %.1f, residual-as-p %.1f (critical %.1f) ]\n", cfg.name,
                c1.stat, c2.stat, c1.critical);
  }
}

// ---- graph replay
// ----------------------------------------------------------------------------------

TEST_F(AcceptSampledGpu, GraphReplayMatchesEager) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const int max_rows = 20, vocab = 1000, k = 4;
  for (DraftKind kind : {DraftKind::kDistribution, DraftKind::kPointMass}) {
    Step step(vocab, k, max_rows, LogitsType::kFloat32, kind);
    step.fill(rng, max_rows, s);
    const AcceptSampledArgs args = step.args();
    CudaGraph graph = CudaGraph::capture(s, [&] { accept_sampled(args, s); });
    Tally t;
    for (int it = 0; it < (sanitize_mode() ? 2 : 5); ++it) {
      const int live = it == 0 ? max_rows : 1 + static_cast<int>(rng() % max_rows);
      step.fill(rng, live, s);  // the same buffers: what the graph reads
      accept_sampled(args, s);
      const std::vector<std::int32_t> eager = step.result(s);
      step.poison(s);
      graph.launch(s);
      const std::vector<std::int32_t> replay = step.result(s);
      EXPECT_EQ(eager, replay) << "live " << live;
      step.check(replay, t, "replay " + std::to_string(it));
    }
  }
}

}  // namespace
}  // namespace graphdecode
