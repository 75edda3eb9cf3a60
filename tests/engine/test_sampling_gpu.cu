// GPU: device sampling — greedy against the CPU argmax (ties to the lowest index, fp32 and bf16
// logits, vocab 1 .. 256k); temperature/top-k/top-p tokens always inside the allowed set computed
// on the CPU from the same logits; the same (seed, step) gives the same token wherever the row sits
// in the batch; a chi-square check over many seeds that the frequencies follow the renormalized
// softmax; bad arguments; and graph replay with different live counts and steps == eager.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "common/stream.h"
#include "engine/kernels/sampling.h"
#include "graphs/cuda_graph.h"
#include "sampling_batch.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;

class Sampling : public GpuTest {};

// CPU allowed set: 1 = inside, 0 = outside, 2 = within 1e-4 of the top-p boundary (either is fine).
std::vector<int> allowed_set(const float* l, int vocab, const Params& p) {
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  const bool k_on = p.top_k > 0 && p.top_k < vocab;
  const double kth = k_on ? l[order[p.top_k - 1]] : -INFINITY;
  const double lmax = l[order[0]];
  double z = 0;
  for (int i = 0; i < vocab; ++i)
    if (l[i] >= kth) z += std::exp((l[i] - lmax) / p.temperature);
  std::vector<int> out(vocab, 0);
  double above = 0;  // mass of strictly larger logits
  for (int a = 0; a < vocab;) {
    int b = a;
    double group = 0;
    while (b < vocab && l[order[b]] == l[order[a]])
      group += std::exp((l[order[b++]] - lmax) / p.temperature);
    if (l[order[a]] < kth) break;
    const double m = above / z;
    const int verdict = p.top_p >= 1.f || m < p.top_p - 1e-4 ? 1 : m < p.top_p + 1e-4 ? 2 : 0;
    for (int j = a; j < b; ++j) out[order[j]] = verdict;
    above += group;
    a = b;
  }
  return out;
}

TEST_F(Sampling, GreedyIsCpuArgmaxLowestIndexOnTies) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const std::vector<int> vocabs = sanitize_mode()
                                      ? std::vector<int>{1, 7, 1000, 32000}
                                      : std::vector<int>{1, 7, 1000, 32000, 128256, 262144};
  for (LogitsType type : {LogitsType::kFloat32, LogitsType::kBF16})
    for (int vocab : vocabs) {
      SCOPED_TRACE("vocab " + std::to_string(vocab));
      Batch b(8, vocab, type);
      for (int r = 0; r < 8; ++r) {
        random_logits(rng, b.row(r), vocab, 4.f);
        if (r % 2 == 1 && vocab > 3) {  // ties at the maximum
          const float top = *std::max_element(b.row(r), b.row(r) + vocab) + 1.f;
          b.row(r)[vocab - 1] = b.row(r)[vocab / 2] = b.row(r)[vocab / 3] = top;
        }
        if (r == 2) std::fill(b.row(r), b.row(r) + vocab, -INFINITY);
        if (r == 4) std::fill(b.row(r), b.row(r) + vocab, 1.5f);
        b.params[r].temperature = r == 6 ? -1.f : 0.f;  // <= 0 is greedy
      }
      const int live = 7;
      b.upload(live, s);
      sample(b.args(), s);
      const auto tok = b.tokens(s);
      for (int r = 0; r < 8; ++r) {
        const float* l = b.row(r);
        const int want =
            r >= live ? kPoisonToken : static_cast<int>(std::max_element(l, l + vocab) - l);
        EXPECT_EQ(tok[r], want) << "row " << r;
      }
    }
}

TEST_F(Sampling, TokensStayInsideTheAllowedSet) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const Params cases[] = {{1.f, 0, 1.f},   {0.7f, 1, 1.f},     {1.f, 5, 1.f},    {1.3f, 50, 1.f},
                          {1.f, 0, 0.5f},  {0.5f, 0, 0.9f},    {1.f, 20, 0.8f},  {2.f, 3, 0.3f},
                          {1.f, 0, 1e-6f}, {0.8f, 100, 0.95f}, {1.f, 40, 0.05f}, {5.f, 0, 0.99f}};
  const std::vector<int> vocabs =
      sanitize_mode() ? std::vector<int>{50, 3000} : std::vector<int>{50, 3000, 32000, 151936};
  for (LogitsType type : {LogitsType::kFloat32, LogitsType::kBF16})
    for (int vocab : vocabs) {
      const int rows = 48;
      Batch b(rows, vocab, type);
      std::uniform_int_distribution<std::uint64_t> u64;
      for (int r = 0; r < rows; ++r) {
        random_logits(rng, b.row(r), vocab, r % 3 == 0 ? 0.5f : 3.f);
        if (r % 5 == 0)  // a plateau of ties around the top-k boundary
          for (int i = 0; i < vocab; i += 7) b.row(r)[i] = 2.f;
        b.params[r] = cases[r % std::size(cases)];
        b.params[r].seed = u64(rng);
        b.params[r].step = u64(rng) % 1000;
      }
      b.upload(rows, s);
      for (int rep = 0; rep < 4; ++rep) {
        for (auto& p : b.params) p.step += 1;
        b.upload_params(rows, s);
        sample(b.args(), s);
        const auto tok = b.tokens(s);
        for (int r = 0; r < rows; ++r) {
          ASSERT_GE(tok[r], 0);
          ASSERT_LT(tok[r], vocab);
          const auto ok = allowed_set(b.row(r), vocab, b.params[r]);
          EXPECT_NE(ok[tok[r]], 0)
              << "vocab " << vocab << " row " << r << " T " << b.params[r].temperature << " k "
              << b.params[r].top_k << " p " << b.params[r].top_p << " token " << tok[r];
        }
      }
    }
}

TEST_F(Sampling, SameSeedAndStepSameTokenAnywhereInTheBatch) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const int n = 16, vocab = 5000, big = 40;
  Batch a(n, vocab, LogitsType::kFloat32);
  std::uniform_int_distribution<std::uint64_t> u64;
  for (int r = 0; r < n; ++r) {
    random_logits(rng, a.row(r), vocab, 1.f);
    a.params[r] = {1.f, r % 2 == 0 ? 0 : 200, r % 3 == 0 ? 1.f : 0.9f, u64(rng), u64(rng)};
  }
  a.upload(n, s);
  sample(a.args(), s);
  const auto first = a.tokens(s);
  sample(a.args(), s);
  EXPECT_EQ(a.tokens(s), first) << "run to run";

  // The same rows scattered in reverse order among other rows of a larger batch.
  Batch b(big, vocab, LogitsType::kFloat32);
  for (int r = 0; r < big; ++r) {
    random_logits(rng, b.row(r), vocab, 2.f);
    b.params[r] = {0.5f, 0, 1.f, u64(rng), u64(rng)};
  }
  std::vector<int> where(n);
  for (int r = 0; r < n; ++r) {
    where[r] = big - 2 - 2 * r;
    std::copy(a.row(r), a.row(r) + vocab, b.row(where[r]));
    b.params[where[r]] = a.params[r];
  }
  b.upload(big, s);
  sample(b.args(), s);
  const auto second = b.tokens(s);
  for (int r = 0; r < n; ++r) EXPECT_EQ(second[where[r]], first[r]) << "row " << r;

  // The step moves the stream: a flat distribution gives many different tokens over 32 steps.
  Batch c(1, 1000, LogitsType::kFloat32);
  std::fill(c.row(0), c.row(0) + 1000, 0.f);
  c.params[0] = {1.f, 0, 1.f, 12345, 0};
  c.upload(1, s);
  std::vector<int> seen;
  for (std::uint64_t step = 0; step < 32; ++step) {
    c.params[0].step = step;
    c.upload_params(1, s);
    sample(c.args(), s);
    seen.push_back(c.tokens(s)[0]);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_GE(std::unique(seen.begin(), seen.end()) - seen.begin(), 20);
}

// Chi-square: the same logits on every row, seed = row, step = launch: the token frequencies
// against softmax(l / T) renormalized over the CPU's allowed set, df = |set| - 1, rejected only
// beyond z = 5 (Wilson-Hilferty), and never a token outside the set.
void frequency_case(Rng& rng, cudaStream_t s, LogitsType type, std::vector<float> logits,
                    Params p) {
  const int vocab = static_cast<int>(logits.size());
  const int rows = sanitize_mode() ? 1024 : 4096, launches = sanitize_mode() ? 2 : 16;
  Batch b(rows, vocab, type);
  const std::uint64_t base = std::uniform_int_distribution<std::uint64_t>()(rng);
  for (int r = 0; r < rows; ++r) {
    std::copy(logits.begin(), logits.end(), b.row(r));
    b.params[r] = p;
    b.params[r].seed = base + static_cast<std::uint64_t>(r) * 0x9E3779B97F4A7C15ull;
  }
  b.upload(rows, s);
  std::vector<double> counts(vocab, 0);
  for (int l = 0; l < launches; ++l) {
    for (auto& q : b.params) q.step = static_cast<std::uint64_t>(l);
    b.upload_params(rows, s);
    sample(b.args(), s);
    for (int t : b.tokens(s)) {
      ASSERT_TRUE(t >= 0 && t < vocab) << t;
      counts[t] += 1;
    }
  }
  const auto ok = allowed_set(b.row(0), vocab, p);
  const double lmax = *std::max_element(b.row(0), b.row(0) + vocab);
  std::vector<double> prob(vocab, 0);
  double z = 0;
  int kept = 0;
  for (int i = 0; i < vocab; ++i) {
    ASSERT_NE(ok[i], 2) << "test logits sit on the top-p boundary";
    if (ok[i] == 1) prob[i] = std::exp((b.row(0)[i] - lmax) / p.temperature), z += prob[i], ++kept;
  }
  const double total = static_cast<double>(rows) * launches;
  double chi2 = 0;
  for (int i = 0; i < vocab; ++i) {
    if (ok[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " is outside the allowed set";
      continue;
    }
    const double e = total * prob[i] / z;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  const double df = kept - 1;
  if (df < 1) {
    EXPECT_EQ(chi2, 0);
    return;
  }
  const double c = 2.0 / (9.0 * df);
  const double critical = df * std::pow(1.0 - c + 5.0 * std::sqrt(c), 3.0);
  EXPECT_LT(chi2, critical) << "df " << df << " T " << p.temperature << " k " << p.top_k << " p "
                            << p.top_p;
}

TEST_F(Sampling, FrequenciesFollowTheRenormalizedSoftmax) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  std::vector<float> l16(16);
  for (int i = 0; i < 16; ++i) l16[i] = 0.37f * static_cast<float>((i * 7) % 16) - 2.f;
  frequency_case(rng, s, LogitsType::kFloat32, l16, {1.f, 0, 1.f});
  frequency_case(rng, s, LogitsType::kFloat32, l16, {0.8f, 10, 1.f});
  frequency_case(rng, s, LogitsType::kFloat32, l16, {1.2f, 0, 0.83f});
  frequency_case(rng, s, LogitsType::kFloat32, l16, {0.9f, 12, 0.9f});
  frequency_case(rng, s, LogitsType::kBF16, {0.f, 1.f, -1.f, 2.f, 0.5f, -3.f, 1.5f, 0.25f},
                 {1.f, 0, 1.f});
  frequency_case(rng, s, LogitsType::kBF16, {0.f, 1.f, 1.f, 2.f, 0.5f, 1.f, 1.5f, 1.f},
                 {2.f, 3, 1.f});  // ties at the k-th value: all four 1.0s stay in
}

TEST_F(Sampling, BadArgumentsNameTheField) {
  Stream s;
  Batch b(4, 100, LogitsType::kFloat32);
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
  a.vocab = 0;
  EXPECT_TRUE(refused(a, "vocab"));
  a = b.args();
  a.vocab = kMaxSamplingVocab + 1;
  a.row_stride = a.vocab;
  EXPECT_TRUE(refused(a, "vocab"));
  a = b.args();
  a.row_stride = 50;
  EXPECT_TRUE(refused(a, "row_stride"));
  a = b.args();
  a.top_p = nullptr;
  EXPECT_TRUE(refused(a, "top_p"));
  a = b.args();
  a.num_rows = nullptr;
  EXPECT_TRUE(refused(a, "num_rows"));
  a = b.args();
  a.logits_type = static_cast<LogitsType>(9);
  EXPECT_TRUE(refused(a, "logits_type"));
}

TEST_F(Sampling, GraphReplayMatchesEager) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  const int max_rows = 32, vocab = 32000;
  Batch b(max_rows, vocab, LogitsType::kBF16);
  std::uniform_int_distribution<std::uint64_t> u64;
  b.upload_params(max_rows, s);
  CudaGraph graph = CudaGraph::capture(s, [&] { sample(b.args(), s); });
  for (int it = 0; it < (sanitize_mode() ? 2 : 6); ++it) {
    const int live = it == 0 ? max_rows : std::uniform_int_distribution<int>(1, max_rows)(rng);
    for (int r = 0; r < max_rows; ++r) {
      random_logits(rng, b.row(r), vocab, 2.f);
      b.params[r] = {r % 4 == 0 ? 0.f : 0.9f, r % 3 == 0 ? 50 : 0, r % 2 == 0 ? 0.9f : 1.f,
                     u64(rng), u64(rng)};
    }
    b.upload(live, s);
    sample(b.args(), s);
    const auto eager = b.tokens(s);
    b.upload_params(live, s);  // re-poisons the tokens
    graph.launch(s);
    const auto replay = b.tokens(s);
    EXPECT_EQ(eager, replay) << "live " << live;
    for (int r = live; r < max_rows; ++r) EXPECT_EQ(replay[r], kPoisonToken);
  }
}

}  // namespace
}  // namespace graphdecode
