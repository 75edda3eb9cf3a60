// CPU reference of sampled speculative acceptance. See accept_sampled_reference.h.
#include "accept_sampled_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>

#include "engine/kernels/sampling_math.h"
#include "engine/spec/accept_sampled_rules.h"

namespace graphdecode::testing {

using namespace graphdecode::sampling;

namespace {

// floor(exp(x) 2^40) in double: 0 exactly where the device's mass is 0 (up to ulps).
double ref_mass(float v, float top, float inv_t) {
  return std::floor(std::exp(static_cast<double>(scaled_logit(v, top, inv_t))) * 0x1p40);
}

int argmax(const float* l, int vocab) {
  int g = -1;
  for (int i = 0; i < vocab; ++i)
    if (l[i] == l[i] && (g < 0 || l[i] > l[g])) g = i;
  return g;
}

}  // namespace

bool reference_row_stats(const float* l, int vocab, const SampleParams& p, SamplingRowStats& out) {
  const Expected e = reference_sample(l, vocab, p);
  const int g = argmax(l, vocab);
  const float top = g >= 0 ? l[g] : 0.f;
  if (e.greedy) {
    out = SamplingRowStats{1, top, 0.f, key_of(top), g >= 0 ? g : 0};
    return true;
  }
  const float inv_t = 1.f / p.temperature;
  std::uint32_t keep = std::numeric_limits<std::uint32_t>::max();
  for (int i = 0; i < vocab; ++i) {
    if (e.verdict[i] == Verdict::kBoundary) return false;
    if (e.verdict[i] == Verdict::kIn) keep = std::min(keep, key_of(l[i]));
  }
  double z = 0.0;
  for (int i = 0; i < vocab; ++i)
    if (key_of(l[i]) >= keep) z += ref_mass(l[i], top, inv_t);
  out = SamplingRowStats{static_cast<std::uint64_t>(z), top, inv_t, keep, -1};
  return true;
}

std::vector<double> reference_distribution(const float* l, int vocab, const SamplingRowStats& s) {
  std::vector<double> p(static_cast<std::size_t>(vocab), 0.0);
  if (s.point_token >= 0) {
    if (s.point_token < vocab) p[static_cast<std::size_t>(s.point_token)] = 1.0;
    return p;
  }
  double z = 0.0;
  for (int i = 0; i < vocab; ++i)
    if (key_of(l[i]) >= s.keep_key) z += p[i] = ref_mass(l[i], s.max_logit, s.inv_temperature);
  if (z > 0.0)
    for (double& v : p) v /= z;
  return p;
}

AcceptOutcome reference_accept(const AcceptCase& c, const std::int32_t* device) {
  namespace rules = graphdecode::accept_rules;
  AcceptOutcome o;
  auto fail = [&](const std::string& why) {
    if (o.ok) o.ok = false, o.why = why;
  };
  const int cap = rules::accept_cap(c.k, c.limit);
  const int dev_a = device != nullptr ? device[0] - 1 : -1;
  auto valid = [&](int x) { return x >= 0 && x < c.vocab; };
  // q_i as the kernel judges it: a point mass at x without a distribution or without mass at x.
  auto draft_dist = [&](int i, int x) {
    std::vector<double> q;
    if (!c.point_drafts && valid(x)) {
      q = reference_distribution(c.draft_logits[i], c.vocab, c.draft_stats[i]);
      if (q[static_cast<std::size_t>(x)] > 0.0) return q;
    }
    q.assign(static_cast<std::size_t>(c.vocab), 0.0);
    if (valid(x)) q[static_cast<std::size_t>(x)] = 1.0;
    return q;
  };

  int i = 0;
  for (; i < cap; ++i) {
    const int x = c.drafts[i];
    if (!valid(x)) break;  // rejected, never read
    const std::vector<double> p =
        reference_distribution(c.target_logits[i], c.vocab, c.target_stats[i]);
    const std::vector<double> q = draft_dist(i, x);
    const double px = p[static_cast<std::size_t>(x)], qx = q[static_cast<std::size_t>(x)];
    if (px == 0.0) break;  // outside the kept set (exact: the stats decide it), or no mass
    const double u = rules::uniform_of(rules::accept_word(c.seed, c.first_position + i));
    const double ratio = px / qx;
    bool accept = u < ratio;
    if (std::fabs(u - ratio) <= kRatioRelTol * ratio + 0x1p-38 / qx) {
      ++o.ambiguous;
      if (device != nullptr) accept = dev_a > i;
    }
    if (!accept) break;
  }
  o.accepted = i;
  o.rejected = i < cap;

  std::vector<int> admissible;  // tokens the device may commit last
  if (!o.rejected) {
    admissible.push_back(c.target_tokens[cap]);
  } else if (c.target_stats[i].point_token >= 0) {
    admissible.push_back(c.target_stats[i].point_token);
  } else {
    const int x = c.drafts[i];
    const std::vector<double> p =
        reference_distribution(c.target_logits[i], c.vocab, c.target_stats[i]);
    const std::vector<double> q = draft_dist(i, x);
    std::vector<double> w(p.size());
    double total = 0.0;
    for (std::size_t y = 0; y < p.size(); ++y) total += w[y] = std::max(0.0, p[y] - q[y]);
    const rules::u128 r = rules::residual_random(c.seed, c.first_position + i);
    const double t = static_cast<double>(static_cast<std::uint64_t>(r >> 64)) * 0x1p-64 +
                     static_cast<double>(static_cast<std::uint64_t>(r)) * 0x1p-128;
    const double target = t * total;
    const double tol = kResidualTol + c.vocab * 0x1p-38;
    double before = 0.0;
    int own = -1;
    for (std::size_t y = 0; y < w.size(); ++y) {
      const double after = before + w[y];
      if (own < 0 && w[y] > 0.0 && target < after) own = static_cast<int>(y);
      if (before - tol <= target && target <= after + tol)
        admissible.push_back(static_cast<int>(y));
      before = after;
    }
    if (own < 0)  // rounding at the top end: the last token with weight
      for (std::size_t y = w.size(); y-- > 0;)
        if (w[y] > 0.0) {
          own = static_cast<int>(y);
          break;
        }
    if (total <= 2 * tol) {  // p ~ q: any token of either may come out
      admissible.clear();
      for (std::size_t y = 0; y < w.size(); ++y)
        if (p[y] > 0.0 || q[y] > 0.0) admissible.push_back(static_cast<int>(y));
    }
    if (admissible.size() > 1) ++o.ambiguous;
    // The reference's own choice leads the admissible list.
    if (own >= 0) {
      admissible.erase(std::remove(admissible.begin(), admissible.end(), own), admissible.end());
      admissible.insert(admissible.begin(), own);
    }
  }
  o.tokens.assign(c.drafts.begin(), c.drafts.begin() + o.accepted);
  o.tokens.push_back(admissible.empty() ? -1 : admissible.front());

  if (device != nullptr) {
    std::ostringstream why;
    if (device[0] != o.accepted + 1) {
      why << "committed " << device[0] << ", reference " << o.accepted + 1;
      fail(why.str());
      return o;
    }
    for (int j = 0; j < o.accepted; ++j)
      if (device[1 + j] != c.drafts[j]) {
        why << "token " << j << " is " << device[1 + j] << ", draft " << c.drafts[j];
        fail(why.str());
        return o;
      }
    const int last = device[1 + o.accepted];
    if (std::find(admissible.begin(), admissible.end(), last) == admissible.end()) {
      why << (o.rejected ? "residual" : "bonus") << " token " << last << ", reference "
          << o.tokens.back() << " (" << admissible.size() << " admissible)";
      fail(why.str());
    }
    o.tokens.back() = last;
  }
  return o;
}

std::string ChiSquare::describe() const {
  std::ostringstream s;
  s << "chi-square " << stat << " (df " << df << ", critical " << critical << " at 1e-5), " << total
    << " draws, " << impossible << " outside the support";
  return s.str();
}

double chi_square_critical(int df) {
  // Wilson-Hilferty: chi2_a(df) ~ df (1 - 2/(9 df) + z_a sqrt(2/(9 df)))^3, z for 1e-5 upper.
  const double z = 4.264890794;
  const double v = 2.0 / (9.0 * df);
  const double c = 1.0 - v + z * std::sqrt(v);
  return df * c * c * c;
}

ChiSquare chi_square(const std::vector<long>& observed, const std::vector<double>& p) {
  ChiSquare r;
  for (long o : observed) r.total += o;
  std::vector<double> e_bins, o_bins;
  double e_pool = 0.0, o_pool = 0.0;
  for (std::size_t y = 0; y < p.size(); ++y) {
    if (!(p[y] > 0.0)) {
      r.impossible += observed[y];
      continue;
    }
    const double e = static_cast<double>(r.total) * p[y];
    if (e >= 5.0) {
      e_bins.push_back(e);
      o_bins.push_back(static_cast<double>(observed[y]));
    } else {
      e_pool += e;
      o_pool += static_cast<double>(observed[y]);
    }
  }
  if (e_pool >= 5.0 || e_bins.empty()) {
    e_bins.push_back(e_pool);
    o_bins.push_back(o_pool);
  } else if (e_pool > 0.0 || o_pool > 0.0) {
    const auto m = std::min_element(e_bins.begin(), e_bins.end()) - e_bins.begin();
    e_bins[static_cast<std::size_t>(m)] += e_pool;
    o_bins[static_cast<std::size_t>(m)] += o_pool;
  }
  for (std::size_t b = 0; b < e_bins.size(); ++b)
    if (e_bins[b] > 0.0) r.stat += (o_bins[b] - e_bins[b]) * (o_bins[b] - e_bins[b]) / e_bins[b];
  r.df = static_cast<int>(e_bins.size()) - 1;
  r.critical = r.df >= 1 ? chi_square_critical(r.df) : 0.0;
  return r;
}

double chi_square_expected(const std::vector<double>& q, const std::vector<double>& p, long n) {
  double s = 0.0;
  int support = 0;
  for (std::size_t y = 0; y < p.size(); ++y) {
    if (!(p[y] > 0.0)) {
      if (q[y] > 0.0) return std::numeric_limits<double>::infinity();
      continue;
    }
    ++support;
    s += (q[y] - p[y]) * (q[y] - p[y]) / p[y];
  }
  return static_cast<double>(n) * s + (support - 1);
}

LosslessScenario make_lossless_scenario(std::mt19937_64& rng, int vocab, int k,
                                        const SampleParams& params, bool point_drafts, long n) {
  LosslessScenario s;
  s.vocab = vocab, s.k = k, s.params = params, s.point_drafts = point_drafts;
  // Point drafts need a likely token to propose: more peaked rows.
  std::normal_distribution<float> logit(0.f, point_drafts ? 2.5f : 1.5f), noise(0.f, 1.5f);
  for (int attempt = 0; attempt < 200; ++attempt) {
    s.target.assign(static_cast<std::size_t>(k + 1), std::vector<float>(vocab));
    s.draft.assign(static_cast<std::size_t>(k), std::vector<float>(vocab));
    s.target_stats.assign(static_cast<std::size_t>(k + 1), SamplingRowStats{});
    s.draft_stats.assign(static_cast<std::size_t>(k), SamplingRowStats{});
    s.p.assign(static_cast<std::size_t>(k + 1), {});
    s.point_tokens.assign(static_cast<std::size_t>(k), 0);
    bool ok = true;
    for (int i = 0; i <= k && ok; ++i) {
      for (float& v : s.target[i]) v = logit(rng);
      ok = reference_row_stats(s.target[i].data(), vocab, params, s.target_stats[i]);
      s.p[i] = reference_distribution(s.target[i].data(), vocab, s.target_stats[i]);
      if (i == k) break;
      for (int y = 0; y < vocab; ++y) s.draft[i][y] = s.target[i][y] + noise(rng);
      ok = ok && reference_row_stats(s.draft[i].data(), vocab, params, s.draft_stats[i]);
      std::vector<int> order(static_cast<std::size_t>(vocab));
      for (int y = 0; y < vocab; ++y) order[y] = y;
      std::sort(order.begin(), order.end(), [&](int a, int b) { return s.p[i][a] > s.p[i][b]; });
      s.point_tokens[i] = order[0];
    }
    if (!ok) continue;
    // Each draft accepted with probability sum_y min(p_i, q_i) >= 0.25: later tokens are reached.
    for (int i = 0; i < k && ok; ++i) {
      std::vector<double> qi(static_cast<std::size_t>(vocab), 0.0);
      if (point_drafts)
        qi[s.point_tokens[i]] = 1.0;
      else
        qi = reference_distribution(s.draft[i].data(), vocab, s.draft_stats[i]);
      double b = 0.0;
      for (int y = 0; y < vocab; ++y) b += std::min(s.p[i][y], qi[y]);
      ok = b >= 0.25;
    }
    if (!ok) continue;
    std::vector<double> q0(static_cast<std::size_t>(vocab), 0.0);
    if (point_drafts)
      q0[s.point_tokens[0]] = 1.0;
    else
      q0 = reference_distribution(s.draft[0].data(), vocab, s.draft_stats[0]);
    const std::vector<double>& p0 = s.p[0];
    double beta = 0.0;  // P(accept d_1) = sum min(p, q)
    for (int y = 0; y < vocab; ++y) beta += std::min(p0[y], q0[y]);
    s.accept_all = q0;
    s.residual_as_p.assign(static_cast<std::size_t>(vocab), 0.0);
    for (int y = 0; y < vocab; ++y)
      s.residual_as_p[y] = std::min(p0[y], q0[y]) + (1 - beta) * p0[y];
    const double crit = chi_square_critical(vocab - 1);
    if (chi_square_expected(s.accept_all, p0, n) >= 4 * crit &&
        chi_square_expected(s.residual_as_p, p0, n) >= 4 * crit)
      return s;
  }
  s.vocab = 0;  // no scenario found: the caller fails
  return s;
}

}  // namespace graphdecode::testing
