#include "eagle_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

const HostTensor* maybe(const EagleWeights& w, const char* name) {
  return w.find(name);
}

}  // namespace

std::vector<EagleReferenceRow> reference_eagle(const EagleWeights& head, const HostWeights& target,
                                               std::span<const std::int32_t> tokens,
                                               const std::vector<std::vector<double>>& hidden,
                                               std::size_t first) {
  const ModelConfig& c = head.config.layer;
  const auto H = static_cast<std::size_t>(c.hidden_size);
  const auto V = static_cast<std::size_t>(c.vocab_size);
  const double eps = c.rms_norm_eps;
  const HostTensor& embed = head.config.own_embedding ? head.at("embed_tokens.weight")
                                                      : target.at("model.embed_tokens.weight");
  const HostTensor& lm = target.config.tie_word_embeddings ? target.at("model.embed_tokens.weight")
                                                           : target.at("lm_head.weight");
  const Vec fc = vec(head.at("fc.weight"));
  const Vec fc_b = head.config.fc_bias ? vec(head.at("fc.bias")) : Vec(H, 0.0);
  const HostTensor* in_norm = maybe(head, "layers.0.input_layernorm.weight");
  const refmath::DecoderLayer layer = refmath::decoder_layer(head, "layers.0.");
  const Vec lm_w = vec(lm);
  const Vec inv_freq = rope_inv_freq(llama_rope_config(c));
  const std::size_t n = tokens.size();
  std::vector<Vec> x(n), a(n);
  for (std::size_t j = 0; j < n; ++j) {
    Vec cat(2 * H);
    const auto t = static_cast<std::size_t>(tokens[j]);
    for (std::size_t i = 0; i < H; ++i) cat[i] = bf16(embed.data[t * H + i]);
    for (std::size_t i = 0; i < H; ++i) cat[H + i] = hidden[j][i];
    x[j] = linear(fc, cat, H, &fc_b);
    a[j] = in_norm ? rmsnormed(x[j], vec(*in_norm), eps) : x[j];
  }
  std::vector<EagleReferenceRow> out;
  for (Vec& y : refmath::decoder_layer_rows(layer, c, inv_freq, a, x, first)) {
    EagleReferenceRow row;
    row.y = std::move(y);
    row.logits = linear(lm_w, row.y, V);
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace graphdecode::testing
