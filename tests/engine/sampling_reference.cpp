// CPU reference of device sampling. See sampling_reference.h.
#include "sampling_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "engine/kernels/philox.h"
#include "engine/kernels/sampling_math.h"

namespace graphdecode::testing {

using namespace graphdecode::sampling;

bool Expected::accepts(int device_token) const {
  if (!ambiguous) return device_token == token;
  if (device_token < 0 || device_token >= static_cast<int>(verdict.size())) return false;
  return verdict[device_token] != Verdict::kOut;
}

namespace {

// Mass bounds of scaled logit x: the device's floor(expf(x) 2^40) lies inside.
void mass_bounds(float x, std::uint64_t& lo, std::uint64_t& hi) {
  const double e = std::exp(static_cast<double>(x));  // within 1 ulp of any float expf
  const double scale = 1099511627776.0;
  const double l = std::floor(e * (1.0 - kMassUlpSlack) * scale);
  const double h = std::floor(e * (1.0 + kMassUlpSlack) * scale);
  lo = std::isfinite(l) && l > 0 ? static_cast<std::uint64_t>(l) : 0;
  hi = std::isfinite(h) && h > 0 ? static_cast<std::uint64_t>(h) : 0;
  if (hi > (std::uint64_t{1} << 40)) hi = std::uint64_t{1} << 40;
  if (lo > hi) lo = hi;
}

}  // namespace

Expected reference_sample(const float* l, int vocab, const SampleParams& p) {
  Expected out;
  int greedy = -1;
  for (int i = 0; i < vocab; ++i)
    if (l[i] == l[i] && (greedy < 0 || l[i] > l[greedy])) greedy = i;
  out.token = greedy < 0 ? 0 : greedy;
  const float inv_t = 1.f / p.temperature;
  if (!(p.temperature > 0.f) || greedy < 0 || !std::isfinite(l[greedy]) || !std::isfinite(inv_t)) {
    out.greedy = true;
    return out;
  }
  const float top = l[greedy];

  // Tokens by key, largest first.
  std::vector<std::uint64_t> order(vocab);
  for (int i = 0; i < vocab; ++i)
    order[i] = (static_cast<std::uint64_t>(key_of(l[i])) << 32) | static_cast<std::uint32_t>(i);
  std::sort(order.begin(), order.end(), [](std::uint64_t a, std::uint64_t b) { return a > b; });
  auto key_at = [&](int pos) { return static_cast<std::uint32_t>(order[pos] >> 32); };
  auto index_at = [&](int pos) { return static_cast<int>(static_cast<std::uint32_t>(order[pos])); };

  const std::uint32_t thr_k = top_k_on(p.top_k, vocab) ? key_at(p.top_k - 1) : 0u;
  int in_top_k = 0;
  while (in_top_k < vocab && key_at(in_top_k) >= thr_k) ++in_top_k;

  out.verdict.assign(vocab, Verdict::kOut);
  if (!top_p_on(p.top_p)) {
    for (int pos = 0; pos < in_top_k; ++pos) out.verdict[index_at(pos)] = Verdict::kIn;
  } else {
    std::vector<std::uint64_t> mlo(in_top_k), mhi(in_top_k);
    std::uint64_t z_lo = 0, z_hi = 0;
    for (int pos = 0; pos < in_top_k; ++pos) {
      mass_bounds(scaled_logit(l[index_at(pos)], top, inv_t), mlo[pos], mhi[pos]);
      z_lo += mlo[pos];
      z_hi += mhi[pos];
    }
    const std::uint64_t rem_lo = top_p_target(p.top_p, z_lo), rem_hi = top_p_target(p.top_p, z_hi);
    std::uint64_t above_lo = 0, above_hi = 0;  // mass of strictly larger keys
    for (int a = 0; a < in_top_k;) {
      int b = a;
      std::uint64_t g_lo = 0, g_hi = 0;
      while (b < in_top_k && key_at(b) == key_at(a)) g_lo += mlo[b], g_hi += mhi[b], ++b;
      const Verdict v = above_hi < rem_lo    ? Verdict::kIn
                        : above_lo >= rem_hi ? Verdict::kOut
                                             : Verdict::kBoundary;
      for (int pos = a; pos < b; ++pos) out.verdict[index_at(pos)] = v;
      above_lo += g_lo;
      above_hi += g_hi;
      a = b;
    }
  }

  // Gumbel-max over the kIn tokens; kBoundary tokens only matter if they could win.
  int best = -1;
  float best_s = 0.f, boundary_s = -INFINITY;
  std::vector<float> in_scores;
  for (int pos = 0; pos < in_top_k; ++pos) {
    const int i = index_at(pos);
    if (out.verdict[i] == Verdict::kOut) continue;
    const std::uint32_t g = static_cast<std::uint32_t>(i) / 4;
    const float s = score_of(l[i], top, inv_t, sampling_random(p.seed, p.step, g).v[i % 4]);
    if (!(s == s)) continue;
    if (out.verdict[i] == Verdict::kBoundary) {
      boundary_s = std::max(boundary_s, s);
      continue;
    }
    ++out.kept;
    in_scores.push_back(s);
    if (best < 0 || s > best_s || (s == best_s && i < best)) best = i, best_s = s;
  }
  if (best < 0) {  // nothing scores (cannot happen with a finite top and 1 / T)
    out.ambiguous = true;
    return out;
  }
  out.token = best;
  int close = 0;
  for (float s : in_scores)
    if (std::fabs(s - best_s) <= kScoreTolerance) ++close;
  out.ambiguous = close > 1 || boundary_s >= best_s - kScoreTolerance;
  return out;
}

}  // namespace graphdecode::testing
