#include "llama_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/kernels/rope_freqs.h"
#include "engine/llama_model.h"
#include "reference_math.h"

namespace graphdecode::testing {
namespace {

using refmath::bf16;
using refmath::linear;
using refmath::rope;
using refmath::Vec;
using refmath::vec;

void rmsnorm(Vec& x, std::size_t off, std::size_t n, const Vec& w, double eps) {
  double ss = 0;
  for (std::size_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (std::size_t i = 0; i < n; ++i) x[off + i] = x[off + i] * inv * w[i];
}

std::string ln(std::int32_t l, const char* s) {
  return "model.layers." + std::to_string(l) + "." + s;
}

// softmax(q K^T / sqrt(d)) V for one head's query over keys [0, n) (GQA head g of K and V).
void attend_head(const double* q, const std::vector<Vec>& k, const std::vector<Vec>& v,
                 std::size_t first, std::size_t end, std::size_t g, std::size_t d, double* out) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Vec s(end - first);
  double mx = -1e300;
  for (std::size_t j = first; j < end; ++j) {
    double dot = 0;
    for (std::size_t i = 0; i < d; ++i) dot += q[i] * k[j][g * d + i];
    s[j - first] = dot * scale;
    mx = std::max(mx, s[j - first]);
  }
  double den = 0;
  for (double& e : s) den += (e = std::exp(e - mx));
  for (std::size_t j = first; j < end; ++j)
    for (std::size_t i = 0; i < d; ++i) out[i] += s[j - first] / den * v[j][g * d + i];
}

Vec mlp(const HostWeights& w, std::int32_t l, const Vec& h) {
  const auto H = static_cast<std::size_t>(w.config.hidden_size);
  const auto inter = static_cast<std::size_t>(w.config.intermediate_size);
  const Vec gt = linear(vec(w.at(ln(l, "mlp.gate_proj.weight"))), h, inter);
  const Vec up = linear(vec(w.at(ln(l, "mlp.up_proj.weight"))), h, inter);
  Vec act(inter);
  for (std::size_t i = 0; i < inter; ++i) act[i] = gt[i] / (1.0 + std::exp(-gt[i])) * up[i];
  return linear(vec(w.at(ln(l, "mlp.down_proj.weight"))), act, H);
}

// Mllama's MllamaCrossAttentionDecoderLayer on every token:
//   x += tanh(attn_gate) * o_proj(attention(q_norm(q_proj(norm1(x))), K, V))   (non-causal)
//   x += tanh(mlp_gate) * mlp(norm2(x))        (only at positions >= enc.first_position)
// with K = k_norm(k_proj(states)), V = v_proj(states) per head, no RoPE. Positions before the
// first image token keep the attention term and lose the MLP term: transformers' vision flow
// (its full_text_row_masked_out_mask multiplies the MLP output; the rows' all-masked attention
// mask becomes all-zero, so they attend every key).
void cross_layer(const HostWeights& w, std::int32_t l, const ReferenceEncoder& enc,
                 std::vector<Vec>& x) {
  const ModelConfig& c = w.config;
  const auto H = static_cast<std::size_t>(c.hidden_size);
  const auto hq = static_cast<std::size_t>(c.num_attention_heads);
  const auto hkv = static_cast<std::size_t>(c.num_key_value_heads);
  const auto d = static_cast<std::size_t>(c.head_dim);
  const auto n = static_cast<std::size_t>(enc.length);
  const Vec wq = vec(w.at(ln(l, "cross_attn.q_proj.weight")));
  const Vec wk = vec(w.at(ln(l, "cross_attn.k_proj.weight")));
  const Vec wv = vec(w.at(ln(l, "cross_attn.v_proj.weight")));
  const Vec wo = vec(w.at(ln(l, "cross_attn.o_proj.weight")));
  const Vec qn = vec(w.at(ln(l, "cross_attn.q_norm.weight")));
  const Vec kn = vec(w.at(ln(l, "cross_attn.k_norm.weight")));
  const double attn_gate = std::tanh(vec(w.at(ln(l, "cross_attn_attn_gate")))[0]);
  const double mlp_gate = std::tanh(vec(w.at(ln(l, "cross_attn_mlp_gate")))[0]);
  const Vec n1 = vec(w.at(ln(l, "input_layernorm.weight")));
  const Vec n2 = vec(w.at(ln(l, "post_attention_layernorm.weight")));
  std::vector<Vec> k(n), v(n);
  for (std::size_t j = 0; j < n; ++j) {
    Vec s(H);
    for (std::size_t i = 0; i < H; ++i) s[i] = bf16(enc.states[j * H + i]);
    k[j] = linear(wk, s, hkv * d);
    v[j] = linear(wv, s, hkv * d);
    for (std::size_t hh = 0; hh < hkv; ++hh) rmsnorm(k[j], hh * d, d, kn, c.rms_norm_eps);
  }
  for (std::size_t t = 0; t < x.size(); ++t) {
    Vec& xt = x[t];
    Vec h = xt;
    rmsnorm(h, 0, H, n1, c.rms_norm_eps);
    Vec q = linear(wq, h, hq * d);
    Vec o(hq * d, 0.0);
    for (std::size_t hh = 0; hh < hq; ++hh) {
      rmsnorm(q, hh * d, d, qn, c.rms_norm_eps);
      attend_head(q.data() + hh * d, k, v, 0, n, hh / (hq / hkv), d, o.data() + hh * d);
    }
    const Vec a = linear(wo, o, H);
    for (std::size_t i = 0; i < H; ++i) xt[i] += attn_gate * a[i];
    h = xt;
    rmsnorm(h, 0, H, n2, c.rms_norm_eps);
    if (t < static_cast<std::size_t>(enc.first_position)) continue;
    const Vec m = mlp(w, l, h);
    for (std::size_t i = 0; i < H; ++i) xt[i] += mlp_gate * m[i];
  }
}

// The forward of reference_logits; with `streams`, block i gets the stream entering layers[i].
std::vector<std::vector<double>> forward(const HostWeights& w, std::span<const std::int32_t> tokens,
                                         std::size_t first, const ReferenceEncoder& enc,
                                         std::span<const std::int32_t> layers,
                                         std::vector<std::vector<Vec>>* streams) {
  const ModelConfig& c = w.config;
  const auto H = static_cast<std::size_t>(c.hidden_size);
  const auto hq = static_cast<std::size_t>(c.num_attention_heads);
  const auto hkv = static_cast<std::size_t>(c.num_key_value_heads);
  const auto d = static_cast<std::size_t>(c.head_dim);
  const auto inter = static_cast<std::size_t>(c.intermediate_size);
  const auto V = static_cast<std::size_t>(c.vocab_size);
  const std::size_t L = tokens.size();
  const Vec inv_freq = rope_inv_freq(llama_rope_config(c));
  const Vec embed = vec(w.at("model.embed_tokens.weight"));

  std::vector<Vec> x(L, Vec(H));
  for (std::size_t t = 0; t < L; ++t)
    for (std::size_t i = 0; i < H; ++i)
      x[t][i] = embed[static_cast<std::size_t>(tokens[t]) * H + i];

  for (std::int32_t l = 0; l < c.num_hidden_layers; ++l) {
    for (std::size_t i = 0; streams != nullptr && i < layers.size(); ++i)
      if (layers[i] == l) (*streams)[i] = x;
    if (c.layers[static_cast<std::size_t>(l)].kind == AttentionKind::kCross) {
      // HF runs no cross layer for a request without encoder states.
      if (enc.length > 0) cross_layer(w, l, enc, x);
      continue;
    }
    const Vec wq = vec(w.at(ln(l, "self_attn.q_proj.weight")));
    const Vec wk = vec(w.at(ln(l, "self_attn.k_proj.weight")));
    const Vec wv = vec(w.at(ln(l, "self_attn.v_proj.weight")));
    const Vec wo = vec(w.at(ln(l, "self_attn.o_proj.weight")));
    Vec bq, bk, bv, bo;
    if (c.qkv_bias) {
      bq = vec(w.at(ln(l, "self_attn.q_proj.bias")));
      bk = vec(w.at(ln(l, "self_attn.k_proj.bias")));
      bv = vec(w.at(ln(l, "self_attn.v_proj.bias")));
    }
    if (c.o_bias) bo = vec(w.at(ln(l, "self_attn.o_proj.bias")));
    const Vec n1 = vec(w.at(ln(l, "input_layernorm.weight")));
    const Vec n2 = vec(w.at(ln(l, "post_attention_layernorm.weight")));
    const Vec wg = vec(w.at(ln(l, "mlp.gate_proj.weight")));
    const Vec wu = vec(w.at(ln(l, "mlp.up_proj.weight")));
    const Vec wd = vec(w.at(ln(l, "mlp.down_proj.weight")));
    std::vector<Vec> q(L), k(L), v(L);
    for (std::size_t t = 0; t < L; ++t) {
      Vec h = x[t];
      rmsnorm(h, 0, H, n1, c.rms_norm_eps);
      q[t] = linear(wq, h, hq * d, c.qkv_bias ? &bq : nullptr);
      k[t] = linear(wk, h, hkv * d, c.qkv_bias ? &bk : nullptr);
      v[t] = linear(wv, h, hkv * d, c.qkv_bias ? &bv : nullptr);
      if (c.qk_norm) {
        const Vec qn = vec(w.at(ln(l, "self_attn.q_norm.weight")));
        const Vec kn = vec(w.at(ln(l, "self_attn.k_norm.weight")));
        for (std::size_t hh = 0; hh < hq; ++hh) rmsnorm(q[t], hh * d, d, qn, c.rms_norm_eps);
        for (std::size_t hh = 0; hh < hkv; ++hh) rmsnorm(k[t], hh * d, d, kn, c.rms_norm_eps);
      }
      rope(q[t], hq, d, static_cast<std::int32_t>(t), inv_freq);
      rope(k[t], hkv, d, static_cast<std::int32_t>(t), inv_freq);
    }
    const LayerAttention& la = c.layers[static_cast<std::size_t>(l)];
    const std::int64_t win = la.kind == AttentionKind::kSliding ? la.window_left : -1;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    for (std::size_t t = 0; t < L; ++t) {
      Vec o(hq * d, 0.0);
      const std::size_t first =
          win >= 0 && static_cast<std::int64_t>(t) > win ? t - static_cast<std::size_t>(win) : 0;
      for (std::size_t hh = 0; hh < hq; ++hh) {
        const std::size_t g = hh / (hq / hkv);
        Vec s(t + 1 - first);
        double mx = -1e300;
        for (std::size_t j = first; j <= t; ++j) {
          double dot = 0;
          for (std::size_t i = 0; i < d; ++i) dot += q[t][hh * d + i] * k[j][g * d + i];
          s[j - first] = dot * scale;
          mx = std::max(mx, s[j - first]);
        }
        double den = 0;
        for (double& e : s) den += (e = std::exp(e - mx));
        for (std::size_t j = first; j <= t; ++j)
          for (std::size_t i = 0; i < d; ++i) o[hh * d + i] += s[j - first] / den * v[j][g * d + i];
      }
      const Vec a = linear(wo, o, H, c.o_bias ? &bo : nullptr);
      for (std::size_t i = 0; i < H; ++i) x[t][i] += a[i];
      Vec h = x[t];
      rmsnorm(h, 0, H, n2, c.rms_norm_eps);
      const Vec gt = linear(wg, h, inter), up = linear(wu, h, inter);
      Vec act(inter);
      for (std::size_t i = 0; i < inter; ++i) act[i] = gt[i] / (1.0 + std::exp(-gt[i])) * up[i];
      const Vec m = linear(wd, act, H);
      // x[t] must keep its pre-MLP value until every later token used this layer's K/V: it does,
      // since K/V were computed above for all tokens.
      for (std::size_t i = 0; i < H; ++i) x[t][i] += m[i];
    }
  }
  const Vec final_norm = vec(w.at("model.norm.weight"));
  const Vec head = c.tie_word_embeddings ? embed : vec(w.at("lm_head.weight"));
  std::vector<Vec> out;
  for (std::size_t t = std::min(first, L - 1); t < L; ++t) {
    Vec h = x[t];
    rmsnorm(h, 0, H, final_norm, c.rms_norm_eps);
    out.push_back(linear(head, h, V));
  }
  return out;
}

}  // namespace

std::vector<std::vector<double>> reference_logits(const HostWeights& w,
                                                  std::span<const std::int32_t> tokens,
                                                  std::size_t first, const ReferenceEncoder& enc) {
  return forward(w, tokens, first, enc, {}, nullptr);
}

std::vector<std::vector<std::vector<double>>> reference_residual_streams(
    const HostWeights& w, std::span<const std::int32_t> tokens,
    std::span<const std::int32_t> layers) {
  std::vector<std::vector<Vec>> streams(layers.size());
  static_cast<void>(forward(w, tokens, tokens.size() - 1, {}, layers, &streams));
  return streams;
}

std::vector<double> reference_last_logits(const HostWeights& w,
                                          std::span<const std::int32_t> tokens,
                                          const ReferenceEncoder& enc) {
  return reference_logits(w, tokens, tokens.size() - 1, enc).back();
}

}  // namespace graphdecode::testing
