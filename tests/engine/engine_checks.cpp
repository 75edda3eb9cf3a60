#include "engine_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

#include "attention/reference.h"

namespace graphdecode::testing {

TokenCallback collect(Collected& c) {
  return [&c](const TokenEvent& e) {
    EXPECT_EQ(c.finished[e.id], 0) << "token after the finish event of request " << e.id;
    c.tokens[e.id].push_back(e.token);
    if (e.finished) ++c.finished[e.id];
  };
}

std::vector<std::int32_t> random_prompt(Rng& rng, std::int32_t len, std::int32_t vocab) {
  std::vector<std::int32_t> p(static_cast<std::size_t>(len));
  for (auto& t : p) t = std::uniform_int_distribution<std::int32_t>(0, vocab - 1)(rng);
  return p;
}

std::vector<std::uint16_t> random_encoder_states(Rng& rng, std::int32_t len, std::int32_t hidden) {
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<std::uint16_t> s(static_cast<std::size_t>(len) * hidden);
  for (auto& x : s) x = reference::float_to_bf16(n(rng));
  return s;
}

void zero_block_outputs(HostWeights& w) {
  for (auto& [name, t] : w.tensors)
    if (name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight"))
      std::fill(t.data.begin(), t.data.end(), std::uint16_t{0});
}

std::int32_t make_bigram_decisive(HostWeights& w, double min_gap) {
  const ModelConfig& c = w.config;
  if (c.tie_word_embeddings) throw std::invalid_argument("make_bigram_decisive: tied lm_head");
  const auto H = static_cast<std::size_t>(c.hidden_size);
  const auto V = static_cast<std::size_t>(c.vocab_size);
  std::vector<std::uint16_t>& embed = w.tensors.at("model.embed_tokens.weight").data;
  const std::vector<std::uint16_t>& lm_bits = w.tensors.at("lm_head.weight").data;
  std::vector<double> lm(lm_bits.size());
  for (std::size_t i = 0; i < lm.size(); ++i) lm[i] = reference::bf16_to_float(lm_bits[i]);
  std::int32_t moved = 0;
  std::vector<double> e(H), l(V);
  for (std::size_t t = 0; t < V; ++t) {
    std::uint16_t* row = embed.data() + t * H;
    for (int round = 0;; ++round) {
      double norm = 0;
      for (std::size_t i = 0; i < H; ++i) {
        e[i] = reference::bf16_to_float(row[i]);
        norm += e[i] * e[i];
      }
      double scale = 0;
      std::size_t best = 0;
      for (std::size_t v = 0; v < V; ++v) {
        double dot = 0;
        for (std::size_t i = 0; i < H; ++i) dot += lm[v * H + i] * e[i];
        l[v] = dot;
        scale = std::max(scale, std::abs(dot));
        if (dot > l[best]) best = v;
      }
      double second = -INFINITY;
      for (std::size_t v = 0; v < V; ++v)
        if (v != best) second = std::max(second, l[v]);
      if (l[best] - second >= min_gap * scale) break;
      if (round == 0) ++moved;
      if (round == 64) throw std::runtime_error("make_bigram_decisive: no decisive step");
      // A step of 1% of the embedding's length along the winner's (unit) lm_head row.
      double wn = 0;
      for (std::size_t i = 0; i < H; ++i) wn += lm[best * H + i] * lm[best * H + i];
      const double step = 0.01 * std::sqrt(norm / wn);
      for (std::size_t i = 0; i < H; ++i)
        row[i] = reference::float_to_bf16(static_cast<float>(e[i] + step * lm[best * H + i]));
    }
  }
  return moved;
}

void expect_greedy_confirmed(const HostWeights& w, const std::vector<std::int32_t>& prompt,
                             const std::vector<std::int32_t>& generated, const std::string& what,
                             const ReferenceEncoder& encoder) {
  ASSERT_FALSE(generated.empty()) << what;
  std::vector<std::int32_t> seq = prompt;
  seq.insert(seq.end(), generated.begin(), generated.end() - 1);
  const auto ref = reference_logits(w, seq, prompt.size() - 1, encoder);
  ASSERT_EQ(ref.size(), generated.size()) << what;
  for (std::size_t i = 0; i < generated.size(); ++i) {
    const std::vector<double>& l = ref[i];
    double scale = 0;
    for (double v : l) scale = std::max(scale, std::abs(v));
    const double tol = 0.03 * scale;
    const auto best = static_cast<std::int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    double second = -1e300;
    for (std::size_t j = 0; j < l.size(); ++j)
      if (static_cast<std::int32_t>(j) != best) second = std::max(second, l[j]);
    const double got = l[static_cast<std::size_t>(generated[i])];
    EXPECT_GE(got, l[static_cast<std::size_t>(best)] - tol)
        << what << " token " << i << ": picked " << generated[i] << " (ref " << got
        << "), reference argmax " << best << " (ref " << l[static_cast<std::size_t>(best)] << ")";
    if (l[static_cast<std::size_t>(best)] - second > tol) {
      EXPECT_EQ(generated[i], best) << what << " token " << i << " (clear reference argmax)";
    }
  }
}

int compare_with_plain(const HostWeights& w, const std::vector<std::vector<std::int32_t>>& prompts,
                       const std::vector<std::vector<std::int32_t>>& spec,
                       const std::vector<std::vector<std::int32_t>>& plain,
                       const std::string& what) {
  int near_ties = 0;
  for (std::size_t r = 0; r < prompts.size(); ++r) {
    const auto& a = spec[r];
    const auto& b = plain[r];
    const auto diff = std::mismatch(a.begin(), a.end(), b.begin());
    if (diff.first == a.end()) continue;
    const auto i = static_cast<std::size_t>(diff.first - a.begin());
    std::vector<std::int32_t> seq = prompts[r];
    seq.insert(seq.end(), a.begin(), a.begin() + static_cast<std::ptrdiff_t>(i));
    const std::vector<double> ref = reference_last_logits(w, seq);
    std::vector<double> sorted = ref;
    std::sort(sorted.rbegin(), sorted.rend());
    double scale = 0;
    for (double v : ref) scale = std::max(scale, std::abs(v));
    const double tol = 0.03 * scale;
    const double gap = sorted[0] - sorted[1];
    EXPECT_LT(gap, tol) << what << " request " << r << ": speculative and plain greedy differ at "
                        << "token " << i << " (" << a[i] << " vs " << b[i] << ") where the "
                        << "target's top-2 gap " << gap << " is not a near-tie (tol " << tol << ")";
    EXPECT_GE(ref[static_cast<std::size_t>(a[i])], sorted[0] - tol) << what << " request " << r;
    EXPECT_GE(ref[static_cast<std::size_t>(b[i])], sorted[0] - tol) << what << " request " << r;
    std::printf("[ near-tie ] %s request %zu token %zu: %d vs %d, top-2 gap %.4f (tol %.4f)\n",
                what.c_str(), r, i, a[i], b[i], gap, tol);
    ++near_ties;
  }
  return near_ties;
}

}  // namespace graphdecode::testing
