#include "engine_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

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

}  // namespace graphdecode::testing
