// The float64 references' shared arithmetic (llama_reference.cpp, eagle_reference.cpp,
// eagle3_reference.cpp): bf16 weights read as doubles, a dense layer, RMSNorm, RoPE, causal
// grouped-query attention, the SwiGLU MLP block and an EAGLE head's decoder layer, nothing
// rounded on the way.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/weights.h"

namespace graphdecode::testing::refmath {

using Vec = std::vector<double>;

inline double bf16(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline Vec vec(const HostTensor& t) {
  Vec v(t.data.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = bf16(t.data[i]);
  return v;
}

// y[o] = sum_i W[o][i] x[i] (+ b[o])
inline Vec linear(const Vec& w, const Vec& x, std::size_t out, const Vec* b = nullptr) {
  const std::size_t in = x.size();
  Vec y(out, 0.0);
  for (std::size_t o = 0; o < out; ++o) {
    double s = 0;
    for (std::size_t i = 0; i < in; ++i) s += w[o * in + i] * x[i];
    y[o] = s + (b ? (*b)[o] : 0.0);
  }
  return y;
}

// x[0..n) * rsqrt(mean(x^2) + eps) * w
inline Vec rmsnormed(const double* x, std::size_t n, const Vec& w, double eps) {
  double ss = 0;
  for (std::size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  Vec y(n);
  for (std::size_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
  return y;
}
inline Vec rmsnormed(const Vec& x, const Vec& w, double eps) {
  return rmsnormed(x.data(), x.size(), w, eps);
}

// Rotary embedding of `heads` heads of dimension d at position pos (halves rotated, as Llama).
inline void rope(Vec& x, std::size_t heads, std::size_t d, std::int64_t pos, const Vec& inv_freq) {
  const std::size_t h2 = d / 2;
  for (std::size_t h = 0; h < heads; ++h) {
    double* p = x.data() + h * d;
    for (std::size_t i = 0; i < h2; ++i) {
      // The device's table holds float inverse frequencies: the reference uses the same values.
      const double a = static_cast<double>(static_cast<float>(inv_freq[i])) * pos;
      const double c = std::cos(a), s = std::sin(a);
      const double x0 = p[i], x1 = p[i + h2];
      p[i] = x0 * c - x1 * s;
      p[i + h2] = x1 * c + x0 * s;
    }
  }
}

// Row j of causal attention over rows 0..j: q[j] [hq * d], k[m] / v[m] [hkv * d], query head h
// reading kv head h / (hq / hkv), softmax(q.k / sqrt(d)). Returns [hq * d].
inline Vec causal_gqa_attention(const std::vector<Vec>& q, const std::vector<Vec>& k,
                                const std::vector<Vec>& v, std::size_t j, std::size_t hq,
                                std::size_t hkv, std::size_t d) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Vec attn(hq * d, 0.0);
  for (std::size_t h = 0; h < hq; ++h) {
    const std::size_t g = h / (hq / hkv);
    Vec s(j + 1);
    double mx = -1e300;
    for (std::size_t m = 0; m <= j; ++m) {
      double dot = 0;
      for (std::size_t i = 0; i < d; ++i) dot += q[j][h * d + i] * k[m][g * d + i];
      s[m] = dot * scale;
      mx = std::max(mx, s[m]);
    }
    double den = 0;
    for (double& e : s) den += (e = std::exp(e - mx));
    for (std::size_t m = 0; m <= j; ++m)
      for (std::size_t i = 0; i < d; ++i) attn[h * d + i] += s[m] / den * v[m][g * d + i];
  }
  return attn;
}

// x + down(silu(gate(n)) * up(n)) with n = RMSNorm(x) * norm: a Llama MLP block and its residual.
inline Vec swiglu_block(const Vec& x, const Vec& norm, const Vec& wg, const Vec& wu, const Vec& wd,
                        std::size_t inter, double eps) {
  const Vec n = rmsnormed(x, norm, eps);
  const Vec gate = linear(wg, n, inter);
  const Vec up = linear(wu, n, inter);
  Vec act(inter);
  for (std::size_t i = 0; i < inter; ++i) act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
  const Vec m = linear(wd, act, x.size());
  Vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] + m[i];
  return y;
}

// The weights of one Llama decoder layer named `prefix` + "self_attn.q_proj.weight" etc. (W: any
// weights type with at(name), e.g. HostWeights or EagleWeights).
struct DecoderLayer {
  Vec wq, wk, wv, wo, post, wg, wu, wd;
};
template <typename W>
DecoderLayer decoder_layer(const W& w, const std::string& prefix) {
  return {vec(w.at(prefix + "self_attn.q_proj.weight")),
          vec(w.at(prefix + "self_attn.k_proj.weight")),
          vec(w.at(prefix + "self_attn.v_proj.weight")),
          vec(w.at(prefix + "self_attn.o_proj.weight")),
          vec(w.at(prefix + "post_attention_layernorm.weight")),
          vec(w.at(prefix + "mlp.gate_proj.weight")),
          vec(w.at(prefix + "mlp.up_proj.weight")),
          vec(w.at(prefix + "mlp.down_proj.weight"))};
}

// An EAGLE head's layer over rows 0 .. n - 1 at positions 0 .. n - 1: q/k/v from the attention
// input a[j] (RoPE at j), causal attention, o_proj onto the residual x[j] [hidden], then the
// SwiGLU block. Returns the layer output of rows first .. n - 1. c: the layer's shape.
inline std::vector<Vec> decoder_layer_rows(const DecoderLayer& w, const ModelConfig& c,
                                           const Vec& inv_freq, const std::vector<Vec>& a,
                                           const std::vector<Vec>& x, std::size_t first) {
  const auto hq = static_cast<std::size_t>(c.num_attention_heads);
  const auto hkv = static_cast<std::size_t>(c.num_key_value_heads);
  const auto d = static_cast<std::size_t>(c.head_dim);
  const std::size_t n = a.size();
  std::vector<Vec> q(n), k(n), v(n);
  for (std::size_t j = 0; j < n; ++j) {
    q[j] = linear(w.wq, a[j], hq * d);
    k[j] = linear(w.wk, a[j], hkv * d);
    v[j] = linear(w.wv, a[j], hkv * d);
    rope(q[j], hq, d, static_cast<std::int64_t>(j), inv_freq);
    rope(k[j], hkv, d, static_cast<std::int64_t>(j), inv_freq);
  }
  std::vector<Vec> y;
  for (std::size_t j = first; j < n; ++j) {
    const Vec o = linear(w.wo, causal_gqa_attention(q, k, v, j, hq, hkv, d), x[j].size());
    Vec r(x[j].size());
    for (std::size_t i = 0; i < r.size(); ++i) r[i] = x[j][i] + o[i];
    y.push_back(swiglu_block(r, w.post, w.wg, w.wu, w.wd,
                             static_cast<std::size_t>(c.intermediate_size), c.rms_norm_eps));
  }
  return y;
}

}  // namespace graphdecode::testing::refmath
