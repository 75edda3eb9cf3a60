// The float64 EAGLE-3 head reference (eagle3_reference.h) on the CPU: one row against a hand
// computation written out here (norm weights that differ, so a swapped norm or concat order
// fails); own-state rows skip fc exactly; rows see only their past and attention reaches it; each
// of the three target states and the token change the drafts; draft ids map through d2t.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "attention/reference.h"
#include "eagle3_reference.h"
#include "engine/spec/eagle_weights.h"

namespace graphdecode {
namespace {

using testing::Eagle3Input;
using testing::Eagle3ReferenceRow;
using Vec = std::vector<double>;

double bf(std::uint16_t b) {
  return reference::bf16_to_float(b);
}

Vec as_vec(const HostTensor& t) {
  Vec v(t.data.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = bf(t.data[i]);
  return v;
}

// Norm weights 1 + N(0, 0.25): every norm scales differently.
void vary_norms(EagleWeights& h, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 0.5f);
  for (auto& [name, t] : h.tensors)
    if (name.ends_with("norm.weight"))
      for (std::uint16_t& x : t.data) x = reference::float_to_bf16(1.f + n(rng));
}

Vec random_state(std::size_t n, std::mt19937_64& rng, double sd = 1.0) {
  std::normal_distribution<double> g(0.0, sd);
  Vec v(n);
  for (double& x : v) x = g(rng);
  return v;
}

struct Fixture {
  ModelConfig target_config = small_test_config();
  HostWeights target = synthetic_weights(target_config, 11);
  EagleWeights head = synthetic_eagle3_weights(target_config, 12, 200);
  std::mt19937_64 rng{13};
  Fixture() { vary_norms(head, 14); }
  std::vector<Eagle3Input> states(std::size_t n) {
    std::vector<Eagle3Input> in(n);
    for (auto& s : in)
      s.state = random_state(static_cast<std::size_t>(head.config.state_width()), rng);
    return in;
  }
  std::vector<std::int32_t> tokens(std::size_t n) {
    std::vector<std::int32_t> t(n);
    for (auto& x : t) x = static_cast<std::int32_t>(rng() % 512);
    return t;
  }
};

Vec norm(const Vec& x, const Vec& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
  return y;
}

Vec matvec(const Vec& w, const Vec& x, std::size_t rows) {
  Vec y(rows, 0.0);
  for (std::size_t o = 0; o < rows; ++o)
    for (std::size_t i = 0; i < x.size(); ++i) y[o] += w[o * x.size() + i] * x[i];
  return y;
}

TEST(Eagle3Reference, OneRowMatchesAHandComputation) {
  Fixture f;
  const EagleWeights& h = f.head;
  const ModelConfig& c = h.config.layer;
  const std::size_t H = 256, d = 64, hq = 4, hkv = 2, inter = 512;
  const double eps = c.rms_norm_eps;
  const auto in = f.states(1);
  const std::vector<std::int32_t> tok = {77};
  const Eagle3ReferenceRow got = testing::reference_eagle3(h, f.target, tok, in, 0).at(0);
  // At position 0 the one key is the row's own: attention returns its v, whatever q and RoPE.
  const Vec x = matvec(as_vec(h.at("fc.weight")), in[0].state, H);
  Vec e(H);
  const HostTensor& emb = f.target.at("model.embed_tokens.weight");
  for (std::size_t i = 0; i < H; ++i) e[i] = bf(emb.data[77 * H + i]);
  Vec cat = norm(e, as_vec(h.at("midlayer.input_layernorm.weight")), eps);
  const Vec xn = norm(x, as_vec(h.at("midlayer.hidden_norm.weight")), eps);
  cat.insert(cat.end(), xn.begin(), xn.end());
  const Vec v = matvec(as_vec(h.at("midlayer.self_attn.v_proj.weight")), cat, hkv * d);
  Vec attn(hq * d);
  for (std::size_t head = 0; head < hq; ++head)
    for (std::size_t i = 0; i < d; ++i) attn[head * d + i] = v[(head / (hq / hkv)) * d + i];
  const Vec o = matvec(as_vec(h.at("midlayer.self_attn.o_proj.weight")), attn, H);
  Vec r(H);
  for (std::size_t i = 0; i < H; ++i) r[i] = x[i] + o[i];
  const Vec hn = norm(r, as_vec(h.at("midlayer.post_attention_layernorm.weight")), eps);
  const Vec g = matvec(as_vec(h.at("midlayer.mlp.gate_proj.weight")), hn, inter);
  const Vec u = matvec(as_vec(h.at("midlayer.mlp.up_proj.weight")), hn, inter);
  Vec act(inter);
  for (std::size_t i = 0; i < inter; ++i) act[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
  const Vec m = matvec(as_vec(h.at("midlayer.mlp.down_proj.weight")), act, H);
  Vec y(H);
  for (std::size_t i = 0; i < H; ++i) y[i] = r[i] + m[i];
  const Vec logits =
      matvec(as_vec(h.at("lm_head.weight")), norm(y, as_vec(h.at("norm.weight")), eps), 200);
  double scale = 0, err = 0;
  for (std::size_t i = 0; i < H; ++i) {
    scale = std::max(scale, std::abs(y[i]));
    err = std::max(err, std::abs(y[i] - got.y[i]));
  }
  EXPECT_LE(err, 1e-12 * scale) << "y";
  scale = err = 0;
  for (std::size_t i = 0; i < 200; ++i) {
    scale = std::max(scale, std::abs(logits[i]));
    err = std::max(err, std::abs(logits[i] - got.draft_logits[i]));
  }
  EXPECT_LE(err, 1e-12 * scale) << "draft logits";
  const auto arg =
      static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  EXPECT_EQ(got.draft_id, arg);
  EXPECT_EQ(got.token, h.draft_to_target[static_cast<std::size_t>(arg)]);
}

TEST(Eagle3Reference, OwnStateRowsSkipFc) {
  Fixture f;
  // fc = [I | 0 | 0]: a target row whose first block is s equals an own row of state s.
  EagleWeights h = f.head;
  std::vector<std::uint16_t>& fc = h.tensors.at("fc.weight").data;
  std::fill(fc.begin(), fc.end(), std::uint16_t{0});
  for (std::size_t i = 0; i < 256; ++i) fc[i * 768 + i] = reference::float_to_bf16(1.f);
  const auto tok = f.tokens(5);
  auto via_fc = f.states(5);
  std::vector<Eagle3Input> own = via_fc;
  for (std::size_t j = 0; j < 5; ++j) {
    std::fill(via_fc[j].state.begin() + 256, via_fc[j].state.end(), 0.0);
    own[j].state.resize(256);
    own[j].own = j % 2 == 1;  // a mix of both kinds in one sequence
    if (!own[j].own) own[j].state = via_fc[j].state;
  }
  const auto a = testing::reference_eagle3(h, f.target, tok, via_fc, 0);
  const auto b = testing::reference_eagle3(h, f.target, tok, own, 0);
  for (std::size_t j = 0; j < 5; ++j)
    for (std::size_t i = 0; i < a[j].draft_logits.size(); ++i)
      ASSERT_NEAR(a[j].draft_logits[i], b[j].draft_logits[i], 1e-12) << "row " << j;
  // With the head's real fc the own row differs: fc is really skipped, not applied twice.
  const auto c = testing::reference_eagle3(f.head, f.target, tok, own, 0);
  EXPECT_NE(c[1].draft_logits,
            testing::reference_eagle3(f.head, f.target, tok, via_fc, 0)[1].draft_logits);
}

TEST(Eagle3Reference, RowsSeeTheirPastOnly) {
  Fixture f;
  const auto tok = f.tokens(6);
  const auto in = f.states(6);
  const auto all = testing::reference_eagle3(f.head, f.target, tok, in, 0);
  const std::vector<std::int32_t> tok4(tok.begin(), tok.begin() + 4);
  const std::vector<Eagle3Input> in4(in.begin(), in.begin() + 4);
  const auto four = testing::reference_eagle3(f.head, f.target, tok4, in4, 2);
  ASSERT_EQ(four.size(), 2u);
  for (std::size_t j = 0; j < 2; ++j) EXPECT_EQ(four[j].y, all[j + 2].y) << "row " << j + 2;
  // Attention reaches back: another token at row 1 changes row 5.
  auto tok2 = tok;
  tok2[1] = (tok2[1] + 1) % 512;
  const auto other = testing::reference_eagle3(f.head, f.target, tok2, in, 5);
  EXPECT_NE(other[0].y, all[5].y);
}

TEST(Eagle3Reference, EveryInputChangesTheDraft) {
  Fixture f;
  const auto tok = f.tokens(3);
  const auto in = f.states(3);
  const auto base = testing::reference_eagle3(f.head, f.target, tok, in, 2).at(0);
  for (std::size_t block = 0; block < 3; ++block) {
    auto in2 = in;
    for (std::size_t i = 0; i < 256; ++i) in2[2].state[block * 256 + i] *= -1.0;
    const auto got = testing::reference_eagle3(f.head, f.target, tok, in2, 2).at(0);
    EXPECT_NE(got.draft_logits, base.draft_logits) << "target state " << block;
  }
  auto tok2 = tok;
  tok2[2] = (tok2[2] + 5) % 512;
  EXPECT_NE(testing::reference_eagle3(f.head, f.target, tok2, in, 2).at(0).draft_logits,
            base.draft_logits);
}

TEST(Eagle3Reference, DraftIdsMapThroughD2t) {
  Fixture f;
  const auto tok = f.tokens(40);
  const auto in = f.states(40);
  const auto rows = testing::reference_eagle3(f.head, f.target, tok, in, 0);
  int mapped = 0;
  for (const Eagle3ReferenceRow& r : rows) {
    ASSERT_EQ(r.token, f.head.draft_to_target[static_cast<std::size_t>(r.draft_id)]);
    const std::vector<double> full = testing::scatter_draft_logits(f.head, r.draft_logits, 512);
    EXPECT_EQ(std::max_element(full.begin(), full.end()) - full.begin(), r.token);
    EXPECT_EQ(std::count_if(full.begin(), full.end(), [](double x) { return std::isinf(x); }),
              512 - 200);
    mapped += r.token != r.draft_id;
  }
  // Draft ids and target ids differ: a proposer that skipped d2t would fail the device tests.
  EXPECT_GT(mapped, 30);
}

}  // namespace
}  // namespace graphdecode
