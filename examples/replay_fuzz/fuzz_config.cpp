#include "fuzz_config.h"

#include <algorithm>
#include <array>
#include <sstream>

namespace graphdecode::fuzz {
namespace {

// Windows at and around page boundaries.
std::int32_t draw_window(std::mt19937_64& rng, std::int32_t ps) {
  return std::array<std::int32_t, 6>{
      ps - 1, ps, 2 * ps - 1, 2 * ps, 2 * ps + 1, 3 * ps - 2}[uniform(rng, 0, 5)];
}

DType draw_dtype(std::mt19937_64& rng) {
  return uniform(rng, 0, 3) == 0 ? DType::kFP16 : DType::kBF16;
}

void describe_stack(std::ostringstream& os, const char* name, const AttentionStackConfig& c) {
  os << name << " layers=";
  for (AttentionKind k : c.layout.layers) os << "FSC"[static_cast<int>(k)];
  os << " window_left=" << c.layout.window_left << " heads=" << c.layout.num_q_heads << "/"
     << c.layout.num_kv_heads << " dim=" << c.layout.head_dim << " " << dtype_name(c.layout.dtype);
}

}  // namespace

SpecStackConfig draw_config(std::mt19937_64& rng, std::int32_t max_batch) {
  SpecStackConfig c;
  RuntimeOptions& o = c.target.options;
  o.page_size = std::array<std::int32_t, 3>{8, 16, 32}[uniform(rng, 0, 2)];
  o.max_batch = max_batch;
  // A verify of K + 1 rows per request for a full batch, or a batch of prompts.
  o.max_tokens = max_batch * (kMaxDrafts + 1) + kMaxPrompt;
  // Also bounds a sliding pool's pages per request: a speculative step adds at most 2K.
  o.max_new_tokens = kMaxPrompt;
  o.max_kv_len = 512;
  o.max_encoder_len = 192;
  c.draft.options = o;

  // Target: full, sliding and cross layers, then a few more of any kind.
  AttentionLayout& t = c.target.layout;
  t.window_left = draw_window(rng, o.page_size);
  t.layers = {AttentionKind::kFull, AttentionKind::kSliding, AttentionKind::kCross};
  for (std::int32_t i = uniform(rng, 0, 3); i > 0; --i)
    t.layers.push_back(static_cast<AttentionKind>(uniform(rng, 0, 2)));
  std::shuffle(t.layers.begin(), t.layers.end(), rng);
  t.num_q_heads = 4;
  t.num_kv_heads = uniform(rng, 0, 1) ? 2 : 1;
  t.head_dim = 64;
  t.dtype = draw_dtype(rng);

  // Draft: its own window, heads and dtype; sliding and full layers, sometimes a cross layer.
  AttentionLayout& d = c.draft.layout;
  d.window_left = draw_window(rng, o.page_size);
  d.layers = {AttentionKind::kSliding, AttentionKind::kFull};
  for (std::int32_t i = uniform(rng, 0, 2); i > 0; --i) {
    d.layers.push_back(uniform(rng, 0, 3) == 0 ? AttentionKind::kCross
                                               : static_cast<AttentionKind>(uniform(rng, 0, 1)));
  }
  std::shuffle(d.layers.begin(), d.layers.end(), rng);
  d.num_q_heads = uniform(rng, 0, 1) ? 4 : 2;
  d.num_kv_heads = uniform(rng, 0, 1) ? 2 : 1;
  d.head_dim = uniform(rng, 0, 2) == 0 ? 128 : 64;
  d.dtype = draw_dtype(rng);

  c.target.seed = static_cast<std::uint32_t>(rng());
  c.draft.seed = static_cast<std::uint32_t>(rng());
  c.draft_seed = static_cast<std::uint32_t>(rng());
  c.max_draft_tokens = kMaxDrafts;
  c.vocab = kVocab;
  return c;
}

std::string describe(const SpecStackConfig& c) {
  std::ostringstream os;
  describe_stack(os, "target", c.target);
  os << "; ";
  describe_stack(os, "draft", c.draft);
  const RuntimeOptions& o = c.target.options;
  os << "; page=" << o.page_size << " max_batch=" << o.max_batch << " max_tokens=" << o.max_tokens
     << " max_drafts=" << c.max_draft_tokens;
  return os.str();
}

}  // namespace graphdecode::fuzz
