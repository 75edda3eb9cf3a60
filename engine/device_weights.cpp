#include "engine/device_weights.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"

namespace graphdecode {
namespace {

std::string layer_name(std::int32_t l, const char* suffix) {
  return "model.layers." + std::to_string(l) + "." + suffix;
}

struct Cursor {
  std::size_t next = 0;
  std::size_t take(std::size_t elems) {
    const std::size_t a = WeightArenaLayout::kAlignElems;
    const std::size_t off = next;
    next = (next + elems + a - 1) / a * a;
    return off;
  }
};

// Copies `name` (expected numel) into the image at `off` (+ `within` elements).
void put(const HostWeights& w, const std::string& name, std::int64_t numel,
         std::vector<std::uint16_t>& img, std::size_t off, std::size_t within = 0) {
  const HostTensor& t = w.at(name);
  GD_REQUIRE(t.numel() == numel && static_cast<std::int64_t>(t.data.size()) == numel, name,
             t.numel(), "tensor size does not match the config");
  std::memcpy(img.data() + off + within, t.data.data(),
              static_cast<std::size_t>(numel) * sizeof(std::uint16_t));
}

}  // namespace

WeightArenaLayout WeightArenaLayout::compute(const ModelConfig& c) {
  c.validate();
  const auto h = static_cast<std::size_t>(c.hidden_size);
  const auto q = static_cast<std::size_t>(c.q_size());
  const auto kv = static_cast<std::size_t>(c.kv_size());
  const auto inter = static_cast<std::size_t>(c.intermediate_size);
  const auto v = static_cast<std::size_t>(c.vocab_size);
  const auto d = static_cast<std::size_t>(c.head_dim);
  WeightArenaLayout out;
  Cursor cur;
  out.embed = cur.take(static_cast<std::size_t>(c.input_vocab_size()) * h);
  for (std::int32_t l = 0; l < c.num_hidden_layers; ++l) {
    Layer L;
    L.input_norm = cur.take(h);
    if (c.layers[static_cast<std::size_t>(l)].kind == AttentionKind::kCross) {
      L.qkv = cur.take(q * h);
      L.cross_kv = cur.take(2 * kv * h);
      L.q_norm = cur.take(d);
      L.k_norm = cur.take(d);
      L.attn_gate = cur.take(1);
      L.mlp_gate = cur.take(1);
      L.o = cur.take(h * q);
      L.post_norm = cur.take(h);
      L.gate_up = cur.take(2 * inter * h);
      L.down = cur.take(h * inter);
      out.layers.push_back(L);
      continue;
    }
    L.qkv = cur.take((q + 2 * kv) * h);
    if (c.qkv_bias) L.qkv_bias = cur.take(q + 2 * kv);
    if (c.qk_norm) {
      L.q_norm = cur.take(d);
      L.k_norm = cur.take(d);
    }
    L.o = cur.take(h * q);
    if (c.o_bias) L.o_bias = cur.take(h);
    L.post_norm = cur.take(h);
    L.gate_up = cur.take(2 * inter * h);
    L.down = cur.take(h * inter);
    out.layers.push_back(L);
  }
  out.final_norm = cur.take(h);
  out.lm_head = c.tie_word_embeddings ? out.embed : cur.take(v * h);
  out.total_elems = cur.next;
  return out;
}

std::vector<std::uint16_t> pack_weight_arena(const HostWeights& w, const WeightArenaLayout& a) {
  const ModelConfig& c = w.config;
  const std::int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size();
  const std::int64_t inter = c.intermediate_size, v = c.vocab_size, d = c.head_dim;
  GD_REQUIRE(a.layers.size() == static_cast<std::size_t>(c.num_hidden_layers), "layers",
             a.layers.size(), "arena layout computed for another config");
  std::vector<std::uint16_t> img(a.total_elems, 0);
  put(w, "model.embed_tokens.weight", static_cast<std::int64_t>(c.input_vocab_size()) * h, img,
      a.embed);
  for (std::int32_t l = 0; l < c.num_hidden_layers; ++l) {
    const WeightArenaLayout::Layer& L = a.layers[static_cast<std::size_t>(l)];
    put(w, layer_name(l, "input_layernorm.weight"), h, img, L.input_norm);
    if (c.layers[static_cast<std::size_t>(l)].kind == AttentionKind::kCross) {
      put(w, layer_name(l, "cross_attn.q_proj.weight"), q * h, img, L.qkv);
      put(w, layer_name(l, "cross_attn.k_proj.weight"), kv * h, img, L.cross_kv);
      put(w, layer_name(l, "cross_attn.v_proj.weight"), kv * h, img, L.cross_kv, kv * h);
      put(w, layer_name(l, "cross_attn.q_norm.weight"), d, img, L.q_norm);
      put(w, layer_name(l, "cross_attn.k_norm.weight"), d, img, L.k_norm);
      put(w, layer_name(l, "cross_attn_attn_gate"), 1, img, L.attn_gate);
      put(w, layer_name(l, "cross_attn_mlp_gate"), 1, img, L.mlp_gate);
      put(w, layer_name(l, "cross_attn.o_proj.weight"), h * q, img, L.o);
      put(w, layer_name(l, "post_attention_layernorm.weight"), h, img, L.post_norm);
      put(w, layer_name(l, "mlp.gate_proj.weight"), inter * h, img, L.gate_up);
      put(w, layer_name(l, "mlp.up_proj.weight"), inter * h, img, L.gate_up, inter * h);
      put(w, layer_name(l, "mlp.down_proj.weight"), h * inter, img, L.down);
      continue;
    }
    put(w, layer_name(l, "self_attn.q_proj.weight"), q * h, img, L.qkv);
    put(w, layer_name(l, "self_attn.k_proj.weight"), kv * h, img, L.qkv, q * h);
    put(w, layer_name(l, "self_attn.v_proj.weight"), kv * h, img, L.qkv, (q + kv) * h);
    if (c.qkv_bias) {
      put(w, layer_name(l, "self_attn.q_proj.bias"), q, img, L.qkv_bias);
      put(w, layer_name(l, "self_attn.k_proj.bias"), kv, img, L.qkv_bias, q);
      put(w, layer_name(l, "self_attn.v_proj.bias"), kv, img, L.qkv_bias, q + kv);
    }
    if (c.qk_norm) {
      put(w, layer_name(l, "self_attn.q_norm.weight"), d, img, L.q_norm);
      put(w, layer_name(l, "self_attn.k_norm.weight"), d, img, L.k_norm);
    }
    put(w, layer_name(l, "self_attn.o_proj.weight"), h * q, img, L.o);
    if (c.o_bias) put(w, layer_name(l, "self_attn.o_proj.bias"), h, img, L.o_bias);
    put(w, layer_name(l, "post_attention_layernorm.weight"), h, img, L.post_norm);
    put(w, layer_name(l, "mlp.gate_proj.weight"), inter * h, img, L.gate_up);
    put(w, layer_name(l, "mlp.up_proj.weight"), inter * h, img, L.gate_up, inter * h);
    put(w, layer_name(l, "mlp.down_proj.weight"), h * inter, img, L.down);
  }
  put(w, "model.norm.weight", h, img, a.final_norm);
  if (!c.tie_word_embeddings) put(w, "lm_head.weight", v * h, img, a.lm_head);
  return img;
}

DeviceWeights::DeviceWeights(const HostWeights& weights, cudaStream_t stream)
    : config_(weights.config), layout_(WeightArenaLayout::compute(weights.config)) {
  const std::vector<std::uint16_t> img = pack_weight_arena(weights, layout_);
  arena_ = DeviceBuffer<std::uint16_t>(img.size());
  arena_.upload(img.data(), img.size(), stream);
  GD_CUDA(cudaStreamSynchronize(stream));  // `img` dies here
  for (const WeightArenaLayout::Layer& L : layout_.layers) {
    DeviceLayerWeights d;
    d.input_norm = at(L.input_norm);
    d.qkv = at(L.qkv);
    d.qkv_bias = at(L.qkv_bias);
    d.q_norm = at(L.q_norm);
    d.k_norm = at(L.k_norm);
    d.o = at(L.o);
    d.o_bias = at(L.o_bias);
    d.post_norm = at(L.post_norm);
    d.gate_up = at(L.gate_up);
    d.down = at(L.down);
    d.cross_kv = at(L.cross_kv);
    d.attn_gate = at(L.attn_gate);
    d.mlp_gate = at(L.mlp_gate);
    layers_.push_back(d);
  }
}

}  // namespace graphdecode
