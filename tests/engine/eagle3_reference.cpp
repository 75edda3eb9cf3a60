#include "eagle3_reference.h"

#include <algorithm>
#include <cmath>

#include "engine/kernels/rope_freqs.h"
#include "engine/llama_model.h"
#include "reference_math.h"

namespace graphdecode::testing {
namespace {

using refmath::bf16;
using refmath::linear;
using refmath::rmsnormed;
using refmath::Vec;
using refmath::vec;

}  // namespace

std::vector<Eagle3ReferenceRow> reference_eagle3(const EagleWeights& head,
                                                 const HostWeights& target,
                                                 std::span<const std::int32_t> tokens,
                                                 const std::vector<Eagle3Input>& in,
                                                 std::size_t first) {
  const EagleConfig& hc = head.config;
  const ModelConfig& c = hc.layer;
  const auto H = static_cast<std::size_t>(c.hidden_size);
  const auto S = static_cast<std::size_t>(hc.state_width());
  const auto DV = static_cast<std::size_t>(hc.draft_vocab_size);
  const double eps = c.rms_norm_eps;
  const HostTensor& embed =
      hc.own_embedding ? head.at("embed_tokens.weight") : target.at("model.embed_tokens.weight");
  const Vec fc = vec(head.at("fc.weight"));
  const Vec fc_b = hc.fc_bias ? vec(head.at("fc.bias")) : Vec(H, 0.0);
  const Vec in_norm = vec(head.at("midlayer.input_layernorm.weight"));
  const Vec hid_norm = vec(head.at("midlayer.hidden_norm.weight"));
  const refmath::DecoderLayer layer = refmath::decoder_layer(head, "midlayer.");
  const Vec fnorm = vec(head.at("norm.weight"));
  const Vec lm = vec(head.at("lm_head.weight"));
  const Vec inv_freq = rope_inv_freq(llama_rope_config(c));
  const std::size_t n = tokens.size();
  std::vector<Vec> x(n), cat(n);
  for (std::size_t j = 0; j < n; ++j) {
    if (in[j].own) {
      x[j] = in[j].state;
      x[j].resize(H);
    } else {
      Vec a = in[j].state;
      a.resize(S);
      x[j] = linear(fc, a, H, &fc_b);
    }
    Vec e(H);
    const auto t = static_cast<std::size_t>(tokens[j]);
    for (std::size_t i = 0; i < H; ++i) e[i] = bf16(embed.data[t * H + i]);
    const Vec en = rmsnormed(e.data(), H, in_norm, eps);
    const Vec xn = rmsnormed(x[j].data(), H, hid_norm, eps);
    cat[j].resize(2 * H);
    std::copy(en.begin(), en.end(), cat[j].begin());
    std::copy(xn.begin(), xn.end(), cat[j].begin() + static_cast<std::ptrdiff_t>(H));
  }
  std::vector<Eagle3ReferenceRow> out;
  for (Vec& y : refmath::decoder_layer_rows(layer, c, inv_freq, cat, x, first)) {
    Eagle3ReferenceRow row;
    row.y = std::move(y);
    row.draft_logits = linear(lm, rmsnormed(row.y.data(), H, fnorm, eps), DV);
    row.draft_id = static_cast<std::int32_t>(
        std::max_element(row.draft_logits.begin(), row.draft_logits.end()) -
        row.draft_logits.begin());
    row.token = head.draft_to_target[static_cast<std::size_t>(row.draft_id)];
    out.push_back(std::move(row));
  }
  return out;
}

std::vector<double> scatter_draft_logits(const EagleWeights& head,
                                         const std::vector<double>& draft_logits,
                                         std::int32_t vocab) {
  std::vector<double> out(static_cast<std::size_t>(vocab),
                          -std::numeric_limits<double>::infinity());
  for (std::size_t i = 0; i < draft_logits.size(); ++i)
    out[static_cast<std::size_t>(head.draft_to_target[i])] = draft_logits[i];
  return out;
}

}  // namespace graphdecode::testing
