// GPU: device sampling token for token against the CPU reference (sampling_reference.h), across
// the chunked decomposition: vocab sizes that are not multiples of a chunk (1 .. 256000), both
// chunk sizes (max_rows <= 8 and > 8), batch 1 and 256, fp32 and bf16, aligned and unaligned
// rows; logits near-flat, peaked, narrow, with plateaus of ties at the k-th value spanning chunks,
// few distinct values and all equal; k = 1 and vocab - 1; top-p keeping one token and nearly all;
// greedy rows mixed with sampled ones. Every live row written, padding rows untouched; the fast
// path and the exact whole-row path give the same tokens; the token does not depend on the row's
// place, the batch size or the grid; graph replay == eager; workspace arguments checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/stream.h"
#include "engine/kernels/sampling.h"
#include "graphs/cuda_graph.h"
#include "sampling_batch.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;

class SamplingExact : public GpuTest {};

enum class Shape { kFlat, kPeaked, kNarrow, kPlateau, kFewValues, kAllEqual, kCount };

const char* shape_name(Shape s) {
  switch (s) {
    case Shape::kFlat:
      return "flat";
    case Shape::kPeaked:
      return "peaked";
    case Shape::kNarrow:
      return "narrow";
    case Shape::kPlateau:
      return "plateau";
    case Shape::kFewValues:
      return "few-values";
    case Shape::kAllEqual:
      return "all-equal";
    default:
      return "?";
  }
}

void fill_row(Rng& rng, float* row, int vocab, Shape s) {
  switch (s) {
    case Shape::kFlat:
      random_logits(rng, row, vocab, 1.f);
      break;
    case Shape::kPeaked:
      peaked_logits(rng, row, vocab);
      break;
    case Shape::kNarrow:
      random_logits(rng, row, vocab, 0.02f);
      break;
    case Shape::kPlateau: {  // ties at (near) the k-th value for k ~ 50, in every chunk
      random_logits(rng, row, vocab, 1.f);
      const int stride = std::max(1, vocab / 200);
      for (int i = stride / 2; i < vocab; i += stride) row[i] = 2.5f;
      break;
    }
    case Shape::kFewValues: {
      std::uniform_int_distribution<int> u(0, 3);
      for (int i = 0; i < vocab; ++i) row[i] = static_cast<float>(u(rng));
      break;
    }
    default:
      std::fill(row, row + vocab, 0.75f);
      break;
  }
}

// A parameter mix: greedy, temperature only, top-k (1, 5, 50, 256, 257, vocab - 1), top-p (one
// token .. nearly all), both.
std::vector<Params> param_mix(int vocab) {
  return {{0.f, 0, 1.f},
          {0.8f, 0, 1.f},
          {1.5f, 0, 1.f},
          {0.8f, 1, 1.f},
          {1.f, 5, 1.f},
          {0.8f, 50, 1.f},
          {1.f, vocab - 1, 1.f},
          {1.f, 0, 1e-6f},
          {0.8f, 0, 0.5f},
          {0.8f, 0, 0.95f},
          {1.2f, 0, 0.9999f},
          {0.8f, 50, 0.95f},
          {0.7f, vocab - 1, 0.9999f},
          {-1.f, 50, 0.9f},
          {0.3f, 200, 0.8f},
          {1.f, 256, 0.9f},  // the largest k whose scan histogram is bounded: top-p decided
                             // among the whole top-k set's candidates (p_in_candidates)
          {0.9f, 257, 1.f},
          {0.9f, 257, 0.9f}};  // top-p with the approximate masses' range again
}

struct Stats {
  int rows = 0, ambiguous = 0, sampled = 0, fast = 0, exact = 0;
};

// Checks every row: live rows against the reference (and their path), padding rows untouched.
void check_rows(Batch& b, int live, const std::vector<std::int32_t>& tok,
                const std::vector<std::int32_t>& path, const std::vector<Shape>& shapes, Stats& st,
                const std::string& what) {
  for (int r = 0; r < b.max_rows; ++r) {
    if (r >= live) {
      EXPECT_EQ(tok[r], kPoisonToken) << what << " padding row " << r << " written";
      EXPECT_EQ(path[r], kPoisonPath) << what << " padding row " << r << " path written";
      continue;
    }
    const Params& p = b.params[r];
    const Expected e = reference_sample(b.row(r), b.vocab, p);
    ++st.rows;
    st.ambiguous += e.ambiguous;
    EXPECT_TRUE(e.accepts(tok[r]))
        << what << " row " << r << " (" << shape_name(shapes[r]) << ") T " << p.temperature << " k "
        << p.top_k << " p " << p.top_p << ": device " << tok[r] << ", reference " << e.token
        << (e.ambiguous ? " (ambiguous)" : "") << ", kept " << e.kept;
    if (e.greedy) {
      EXPECT_EQ(path[r], static_cast<int>(SamplingPath::kGreedy)) << what << " row " << r;
      continue;
    }
    ++st.sampled;
    EXPECT_TRUE(path[r] >= 1 && path[r] <= 3) << what << " row " << r << " path " << path[r];
    st.fast += path[r] == static_cast<int>(SamplingPath::kFast);
    st.exact += path[r] != static_cast<int>(SamplingPath::kFast);
    // Near-flat and peaked rows with the benchmark's parameters (p <= 0.95) must take the fast
    // path (p = 0.9999 over a peaked row puts the threshold deep in the background: too many
    // candidates, the exact path by design).
    if ((shapes[r] == Shape::kFlat || shapes[r] == Shape::kPeaked) && !(p.top_p > 0.95f))
      EXPECT_EQ(path[r], static_cast<int>(SamplingPath::kFast))
          << what << " row " << r << " (" << shape_name(shapes[r]) << ") T " << p.temperature
          << " k " << p.top_k << " p " << p.top_p;
  }
}

// One batch of random shapes and the parameter mix; the last row is padding.
void run_case(Rng& rng, cudaStream_t s, int rows, int vocab, LogitsType type, Stats& st,
              std::int64_t stride = 0) {
  const std::string what = "vocab " + std::to_string(vocab) + " rows " + std::to_string(rows) +
                           (type == LogitsType::kBF16 ? " bf16" : " fp32") +
                           (stride ? " stride " + std::to_string(stride) : "");
  SCOPED_TRACE(what);
  Batch b(rows, vocab, type, stride);
  const std::vector<Params> mix = param_mix(vocab);
  std::vector<Shape> shapes(rows);
  std::uniform_int_distribution<std::uint64_t> u64;
  const int offset = std::uniform_int_distribution<int>(0, 1000)(rng);
  for (int r = 0; r < rows; ++r) {
    shapes[r] = static_cast<Shape>((r + offset) % static_cast<int>(Shape::kCount));
    // Mostly the benchmark's shapes; the others every few rows.
    if (r % 3 != 0) shapes[r] = r % 2 ? Shape::kFlat : Shape::kPeaked;
    fill_row(rng, b.row(r), vocab, shapes[r]);
    b.params[r] = mix[(r + offset) % mix.size()];
    b.params[r].seed = u64(rng);
    b.params[r].step = u64(rng) % 100000;
  }
  const int live = rows > 1 ? rows - 1 : 1;
  b.upload(live, s);
  sample(b.args(), s);
  check_rows(b, live, b.tokens(s), b.paths(s), shapes, st, what);
}

TEST_F(SamplingExact, TokensMatchTheReference) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  Stats st;
  const std::vector<int> vocabs = sanitize_mode()
                                      ? std::vector<int>{1, 7, 4095, 32000}
                                      : std::vector<int>{1, 7, 4095, 32000, 128256, 151936, 256000};
  for (LogitsType type : {LogitsType::kFloat32, LogitsType::kBF16})
    for (int vocab : vocabs) {
      const bool big = vocab > 32000;
      run_case(rng, s, big ? 6 : 8, vocab, type, st);  // small chunks (max_rows <= 8)
      if (!sanitize_mode())
        run_case(rng, s, big ? 12 : 40, vocab, type, st);  // large chunks
      else if (vocab == 32000)
        run_case(rng, s, 12, vocab, type, st);
    }
  // Ambiguity (host vs device rounding) must stay rare, or the test would check little.
  EXPECT_LE(st.ambiguous, st.rows / 50 + 1) << st.ambiguous << " of " << st.rows;
  EXPECT_GT(st.fast, st.sampled / 2) << "fast " << st.fast << " exact " << st.exact;
  std::printf("[ rows %d, sampled %d, fast path %d, exact path %d, ambiguous %d ]\n", st.rows,
              st.sampled, st.fast, st.exact, st.ambiguous);
}

TEST_F(SamplingExact, BatchOneAndBatch256) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  Stats st;
  run_case(rng, s, 1, sanitize_mode() ? 32000 : 128256, LogitsType::kFloat32, st);
  run_case(rng, s, 1, sanitize_mode() ? 32000 : 256000, LogitsType::kBF16, st);
  run_case(rng, s, sanitize_mode() ? 32 : 256, sanitize_mode() ? 4095 : 32000, LogitsType::kFloat32,
           st);
  EXPECT_LE(st.ambiguous, st.rows / 50 + 1);
}

TEST_F(SamplingExact, UnalignedRowsMatchTheReference) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  Stats st;
  for (LogitsType type : {LogitsType::kFloat32, LogitsType::kBF16}) {
    run_case(rng, s, 6, 4095, type, st, 4097);     // odd stride: scalar loads
    run_case(rng, s, 10, 32000, type, st, 32003);  // large chunks
    run_case(rng, s, 10, 32001, type, st, 32008);  // aligned rows, a ragged last vector
  }
}

// Forcing the exact whole-row path (candidate_limit = 1) changes no token.
TEST_F(SamplingExact, FastPathEqualsExactPath) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  for (int rows : {6, 20}) {
    const int vocab = sanitize_mode() ? 20000 : 128256;
    Batch b(rows, vocab, LogitsType::kFloat32);
    const std::vector<Params> mix = param_mix(vocab);
    std::uniform_int_distribution<std::uint64_t> u64;
    for (int r = 0; r < rows; ++r) {
      fill_row(rng, b.row(r), vocab,
               r % 4 == 3 ? Shape::kPlateau
               : r % 2    ? Shape::kFlat
                          : Shape::kPeaked);
      b.params[r] = mix[(r + 1) % mix.size()];
      b.params[r].seed = u64(rng);
      b.params[r].step = u64(rng);
    }
    b.upload(rows, s);
    sample(b.args(), s);
    const auto fast = b.tokens(s);
    const auto fast_path = b.paths(s);
    b.upload_params(rows, s);
    SamplingArgs a = b.args();
    a.candidate_limit = 1;
    sample(a, s);
    const auto exact = b.tokens(s);
    const auto exact_path = b.paths(s);
    int forced = 0;
    for (int r = 0; r < rows; ++r) {
      EXPECT_EQ(exact[r], fast[r])
          << "rows " << rows << " row " << r << " T " << b.params[r].temperature << " k "
          << b.params[r].top_k << " p " << b.params[r].top_p;
      forced += fast_path[r] == 1 && exact_path[r] == 2;
    }
    EXPECT_GT(forced, 0) << "no row was forced onto the exact path";
  }
}

// Draw rows (top-p >= kDrawMinTopP without top-k, no row stats) against the histogram plan,
// which the same rows take when the call asks for row stats: the same token on every row, on the
// fast path, and the reference's; p from 0.7 (picks rejected often) to 0.99, T from 0.5 to 2,
// near-flat rows and peaked ones, some with masked (-inf) tokens, fp32 and bf16, at the small
// chunk (1 and 5 rows) and the large one; a second call of the same rows draws the same tokens
// (the sums of the picks' masses are reset between calls), and a call on the rows shifted by +20
// before them leaves nothing behind (the chunks' log-sum-exp, RowState::draw_lse, is absolute:
// left set, it would lift the floor above every score and send the rows to the exact path).
TEST_F(SamplingExact, DrawRowsEqualThePlannedPath) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const int vocab = sanitize_mode() ? 20000 : 128256;
  // No row may overflow its list: that needs the draw floor (kDrawFloorMargin). Without it a
  // near-flat 128k row lists ~Z e^-G candidates (Z = sum exp((l - max) / T), G the top token's
  // noise), and at T 2 (Z ~ 1.6e4) the list overflows in about a third of the rows
  // (GRAPHDECODE_SAMPLING_DRAW_FLOOR=0 fails this test at full size; the sanitize mode's 20,000
  // logits are too few); with it, ~55 a chunk whatever T. A row whose 8 picks top-p all rejects
  // takes the exact path (kExactCheck, ~(1 - p)^8: 6.6e-5 a row at p 0.7): at most one a call.
  const float ps[] = {0.7f, 0.8f, 0.95f, 0.99f}, ts[] = {0.5f, 2.f, 0.8f, 1.2f};
  for (LogitsType type : {LogitsType::kFloat32, LogitsType::kBF16})
    for (int rows : {1, 5, 9, 40}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + (type == LogitsType::kBF16 ? " bf16" : ""));
      Batch b(rows, vocab, type);
      std::uniform_int_distribution<std::uint64_t> u64;
      for (int r = 0; r < rows; ++r) {
        fill_row(rng, b.row(r), vocab, r % 3 == 2 ? Shape::kPeaked : Shape::kFlat);
        if (r % 5 == 4)  // masked tokens: every 7th
          for (int i = r % 7; i < vocab; i += 7) b.row(r)[i] = -INFINITY;
        b.params[r] = {ts[r % 4], 0, ps[(r / 3) % 4], u64(rng), u64(rng) % 100000};
      }
      b.upload(rows, s);  // rounds bf16 rows in place: the copy below is what the kernel sees
      const std::vector<float> kept = b.logits;
      for (float& x : b.logits) x += 20.f;
      b.upload(rows, s);
      sample(b.args(), s);  // the shifted rows: their draw_lse must not outlive the call
      b.logits = kept;
      b.upload(rows, s);
      sample(b.args(), s);
      const auto drawn = b.tokens(s);
      const auto drawn_path = b.paths(s);
      sample(b.args(), s);
      EXPECT_EQ(b.tokens(s), drawn) << "a second call of the same rows";
      DeviceBuffer<SamplingRowStats> stats(static_cast<std::size_t>(rows));
      b.upload_params(rows, s);
      SamplingArgs a = b.args();
      a.row_stats = stats.data();
      sample(a, s);
      const auto planned = b.tokens(s);
      int exact = 0;
      for (int r = 0; r < rows; ++r) {
        const Params& p = b.params[r];
        EXPECT_EQ(drawn[r], planned[r])
            << "row " << r << " T " << p.temperature << " p " << p.top_p;
        EXPECT_TRUE(drawn_path[r] == static_cast<int>(SamplingPath::kFast) ||
                    drawn_path[r] == static_cast<int>(SamplingPath::kExactCheck))
            << "row " << r << " path " << drawn_path[r] << " T " << p.temperature;
        exact += drawn_path[r] != static_cast<int>(SamplingPath::kFast);
        const Expected e = reference_sample(b.row(r), vocab, p);
        EXPECT_TRUE(e.accepts(drawn[r])) << "row " << r << " device " << drawn[r] << " reference "
                                         << e.token << " T " << p.temperature << " p " << p.top_p;
      }
      EXPECT_LE(exact, 1) << "rows on the exact path: a floor too high, or one left from a call";
    }
}

// Ties at the k-th value spread over every chunk: all of them are kept, and draws reach many.
TEST_F(SamplingExact, TiesAtTheKthValueSpanChunks) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const int vocab = 32000, ties = 160, above = 20;
  for (int rows : {4, 16}) {  // small and large chunks
    Batch b(rows, vocab, LogitsType::kFloat32);
    std::uniform_int_distribution<std::uint64_t> u64;
    for (int r = 0; r < rows; ++r) {
      float* l = b.row(r);
      random_logits(rng, l, vocab, 1.f);
      for (int i = 0; i < vocab; ++i) l[i] = std::min(l[i], 5.f);
      for (int j = 0; j < ties; ++j) l[j * (vocab / ties) + r] = 6.f;  // every chunk
      for (int j = 0; j < above; ++j) l[j * (vocab / above) + 101] = 7.f + 0.1f * j;
      b.params[r] = {1.f, above + 1 + r, r % 2 ? 1.f : 0.999f, u64(rng), 0};
    }
    b.upload(rows, s);
    std::vector<int> tied_hits(rows, 0);
    for (int step = 0; step < (sanitize_mode() ? 2 : 24); ++step) {
      for (auto& p : b.params) p.step = static_cast<std::uint64_t>(step);
      b.upload_params(rows, s);
      sample(b.args(), s);
      const auto tok = b.tokens(s);
      for (int r = 0; r < rows; ++r) {
        const Expected e = reference_sample(b.row(r), vocab, b.params[r]);
        ASSERT_EQ(e.kept, above + ties) << "the test's tie plateau is not the k-th value";
        EXPECT_TRUE(e.accepts(tok[r])) << "row " << r << " step " << step << " token " << tok[r];
        tied_hits[r] += b.row(r)[tok[r]] == 6.f;
      }
    }
    if (!sanitize_mode())
      for (int r = 0; r < rows; ++r) EXPECT_GT(tied_hits[r], 0) << "row " << r;
  }
}

// The same request gives the same token alone, in a small batch (small chunks) and in a large
// one (large chunks), wherever it sits.
TEST_F(SamplingExact, TokenIndependentOfBatchAndGrid) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const int vocab = sanitize_mode() ? 20000 : 128256, n = 6;
  std::vector<std::vector<float>> rows(n, std::vector<float>(vocab));
  std::vector<Params> params(n);
  const std::vector<Params> mix = param_mix(vocab);
  std::uniform_int_distribution<std::uint64_t> u64;
  std::vector<int> alone(n);
  for (int r = 0; r < n; ++r) {
    fill_row(rng, rows[r].data(), vocab, r % 2 ? Shape::kFlat : Shape::kPeaked);
    params[r] = mix[1 + 2 * r];
    params[r].seed = u64(rng), params[r].step = u64(rng);
    Batch one(1, vocab, LogitsType::kFloat32);
    std::copy(rows[r].begin(), rows[r].end(), one.row(0));
    one.params[0] = params[r];
    one.upload(1, s);
    sample(one.args(), s);
    alone[r] = one.tokens(s)[0];
  }
  for (int batch : {8, sanitize_mode() ? 12 : 64}) {
    Batch b(batch, vocab, LogitsType::kFloat32);
    for (int r = 0; r < batch; ++r) {
      fill_row(rng, b.row(r), vocab, Shape::kFlat);
      b.params[r] = {0.9f, 0, 0.9f, u64(rng), u64(rng)};
    }
    std::vector<int> where(n);
    for (int r = 0; r < n; ++r) {
      where[r] = batch - 1 - r * (batch / n);  // distinct rows, in reverse order
      std::copy(rows[r].begin(), rows[r].end(), b.row(where[r]));
      b.params[where[r]] = params[r];
    }
    b.upload(batch, s);
    sample(b.args(), s);
    const auto tok = b.tokens(s);
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(tok[where[r]], alone[r]) << "batch " << batch << " request " << r;
  }
}

// Graph replay == eager, with live counts and parameters changing between replays, at large
// chunks; the workspace serves a smaller max_rows too (the engine's graph buckets).
TEST_F(SamplingExact, GraphReplayMatchesEagerAndReference) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const int max_rows = 24, vocab = sanitize_mode() ? 12000 : 32000;
  Batch b(max_rows, vocab, LogitsType::kFloat32);
  const std::vector<Params> mix = param_mix(vocab);
  std::uniform_int_distribution<std::uint64_t> u64;
  b.upload_params(max_rows, s);
  CudaGraph graph = CudaGraph::capture(s, [&] { sample(b.args(), s); });
  SamplingArgs small = b.args();
  small.max_rows = 8;  // small chunks on the same workspace
  CudaGraph graph_small = CudaGraph::capture(s, [&] { sample(small, s); });
  Stats st;
  for (int it = 0; it < (sanitize_mode() ? 2 : 6); ++it) {
    const bool use_small = it % 2 == 1;
    const int rows_cap = use_small ? 8 : max_rows;
    const int live = it == 0 ? max_rows : std::uniform_int_distribution<int>(1, rows_cap)(rng);
    std::vector<Shape> shapes(max_rows);
    for (int r = 0; r < max_rows; ++r) {
      shapes[r] = static_cast<Shape>(u64(rng) % static_cast<int>(Shape::kCount));
      fill_row(rng, b.row(r), vocab, shapes[r]);
      b.params[r] = mix[u64(rng) % mix.size()];
      b.params[r].seed = u64(rng), b.params[r].step = u64(rng);
    }
    b.upload(live, s);
    SamplingArgs eager_args = use_small ? small : b.args();
    sample(eager_args, s);
    const auto eager = b.tokens(s);
    b.upload_params(live, s);  // re-poisons the outputs
    (use_small ? graph_small : graph).launch(s);
    const auto replay = b.tokens(s);
    EXPECT_EQ(eager, replay) << "live " << live;
    check_rows(b, live, replay, b.paths(s), shapes, st, "replay " + std::to_string(it));
  }
}

TEST_F(SamplingExact, WorkspaceArgumentsNameTheField) {
  Stream s;
  Batch b(4, 1000, LogitsType::kFloat32);
  auto refused = [&](SamplingArgs a, const std::string& field) {
    try {
      sample(a, s);
    } catch (const Error& e) {
      return e.field() == field ? ::testing::AssertionSuccess()
                                : ::testing::AssertionFailure() << e.what();
    }
    return ::testing::AssertionFailure() << "accepted";
  };
  SamplingArgs a = b.args();
  a.workspace = nullptr;
  EXPECT_TRUE(refused(a, "workspace"));
  a = b.args();
  a.workspace_bytes = sampling_workspace_bytes(4, 1000) - 1;
  EXPECT_TRUE(refused(a, "workspace_bytes"));
  a = b.args();
  a.max_rows = 5;  // more rows than the workspace holds
  EXPECT_TRUE(refused(a, "workspace_bytes"));
  a = b.args();
  a.workspace = static_cast<std::uint8_t*>(a.workspace) + 4;
  EXPECT_TRUE(refused(a, "workspace"));
  a = b.args();
  a.candidate_limit = -1;
  EXPECT_TRUE(refused(a, "candidate_limit"));
  EXPECT_TRUE([&] {
    try {
      sampling_workspace_bytes(0, 1000);
    } catch (const Error& e) {
      return e.field() == "max_rows";
    }
    return false;
  }());
  EXPECT_GT(sampling_workspace_bytes(2, 128256), 2 * sampling_workspace_bytes(1, 1000));
}

}  // namespace
}  // namespace graphdecode
