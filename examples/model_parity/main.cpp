// model_parity: greedy generation with graphdecode's Llama-family model, for comparison with
// Hugging Face transformers (scripts/hf_parity.py, scripts/hf_spec_parity.py).
//
//   model_parity (--checkpoint DIR | --synthetic CONFIG_JSON [--seed S]) --prompts FILE
//                --new-tokens N [--graphs on|off] --out PREFIX
//                [--draft DIR | --lookup | --eagle DIR|synthetic] [--k K]
//                [--encoders FILE --encoder-lens L0,L1,... [--encoder-first-positions F0,...]
//                 [--control-encoder-len-of K]]
//
// FILE: one prompt per line, space-separated token ids. Writes
//   PREFIX.json  {"steps", "batch", "vocab", "graph_steps", "eager_steps", "tokens": [[...]]}
//   PREFIX.f32   raw float32 logits [steps][batch][vocab] (each request's last token per step)
// With --draft (a draft model's checkpoint) or --lookup (prompt lookup): speculative decoding of
// up to K drafts per step (default 4) by the Engine, all prompts in one batch; the JSON adds the
// acceptance ("drafted", "accepted", "tokens_per_step"), no logits file. With --eagle (an EAGLE
// head directory, or `synthetic`: a seeded random head) speculative decoding step by step with
// every step's drafts in the JSON (eagle_steps.h; scripts/hf_eagle_parity.py).
// Cross-attention models (Mllama): --encoders FILE holds every prompt's encoder states, raw bf16
// [sum of lengths][hidden] in prompt order, and --encoder-lens their lengths (0 = text only), one
// per prompt (scripts/hf_mllama_parity.py); --encoder-first-positions the prompt position of each
// one's first <|image|> token (rows before it skip the cross MLP, EncoderStates::first_position).
// --control-encoder-len-of K runs the control of that script: every step tells the model that every
// request has prompt K's encoder length (the bug class the parity check must catch).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/device.h"
#include "common/error.h"
#include "common/stream.h"
#include "eagle_steps.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/model_config.h"
#include "engine/spec/eagle_weights.h"
#include "engine/weights.h"

namespace {

using namespace graphdecode;

std::vector<std::vector<std::int32_t>> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open prompts file", "model_parity", "prompts", path);
  std::vector<std::vector<std::int32_t>> prompts;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::vector<std::int32_t> p;
    std::int64_t id = 0;
    while (ls >> id) p.push_back(static_cast<std::int32_t>(id));
    if (!p.empty()) prompts.push_back(std::move(p));
  }
  return prompts;
}

std::vector<std::int32_t> parse_lens(const std::string& list) {
  std::vector<std::int32_t> lens;
  std::istringstream ls(list);
  std::string item;
  while (std::getline(ls, item, ',')) lens.push_back(std::stoi(item));
  return lens;
}

// Every prompt's encoder states: raw bf16 [sum(lens)][hidden].
std::vector<std::uint16_t> read_encoders(const std::string& path, std::int64_t elems) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open encoder states file", "model_parity", "encoders", path);
  std::vector<std::uint16_t> data(static_cast<std::size_t>(elems));
  in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(elems * 2));
  if (in.gcount() != elems * 2 || in.peek() != std::ifstream::traits_type::eof())
    throw Error("encoder states file does not hold sum(encoder-lens) x hidden bf16 values",
                "model_parity", "encoders", path);
  return data;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open file", "model_parity", "path", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int usage() {
  std::cerr << "usage: model_parity (--checkpoint DIR | --synthetic CONFIG_JSON [--seed S]) "
               "--prompts FILE --new-tokens N [--graphs on|off] --out PREFIX "
               "[--draft DIR | --lookup | --eagle DIR|synthetic] [--k K] [--encoders FILE "
               "--encoder-lens L0,L1,... [--encoder-first-positions F0,F1,...] "
               "[--control-encoder-len-of K]]\n";
  return 2;
}

void write_tokens(std::ostream& js, const std::vector<std::vector<std::int32_t>>& tokens) {
  js << "\"tokens\": [";
  for (std::size_t p = 0; p < tokens.size(); ++p) {
    js << (p ? ", " : "") << "[";
    for (std::size_t t = 0; t < tokens[p].size(); ++t) js << (t ? ", " : "") << tokens[p][t];
    js << "]";
  }
  js << "]";
}

// Greedy speculative decoding of every prompt in one batch by the Engine.
int run_speculative(const HostWeights& target, const HostWeights* draft,
                    const std::vector<std::vector<std::int32_t>>& prompts, std::int32_t new_tokens,
                    std::int32_t k, bool graphs, const std::string& out) {
  EngineConfig ec;
  ec.max_batch = static_cast<std::int32_t>(prompts.size());
  std::int32_t longest = 0, total = 0;
  for (const auto& p : prompts) {
    longest = std::max(longest, static_cast<std::int32_t>(p.size()));
    total += static_cast<std::int32_t>(p.size());
  }
  ec.max_context = longest + new_tokens;
  ec.max_step_tokens = total;
  ec.use_graphs = graphs;
  ec.speculative.max_draft_tokens = k;
  ec.speculative.k_by_batch = {{ec.max_batch, k}};
  ec.speculative.proposer = draft ? SpecProposer::kDraftModel : SpecProposer::kNgram;
  Engine engine(target, ec, draft);
  std::vector<std::vector<std::int32_t>> tokens(prompts.size());
  for (std::size_t r = 0; r < prompts.size(); ++r) {
    RequestSpec s;
    s.prompt = prompts[r];
    s.max_new_tokens = new_tokens;
    engine.submit(std::move(s),
                  [&tokens, r](const TokenEvent& e) { tokens[r].push_back(e.token); });
  }
  engine.run_until_idle();
  const EngineStats st = engine.stats();
  std::ofstream js(out + ".json");
  js << "{\"steps\": " << new_tokens << ", \"batch\": " << prompts.size()
     << ", \"vocab\": " << target.config.vocab_size << ", \"graph_steps\": " << st.graph_steps
     << ", \"eager_steps\": " << st.eager_steps << ", \"drafted\": " << st.drafted_tokens
     << ", \"accepted\": " << st.accepted_tokens
     << ", \"tokens_per_step\": " << st.tokens_per_spec_row() << ", ";
  write_tokens(js, tokens);
  js << "}\n";
  std::cout << "model_parity: speculative, " << prompts.size() << " prompts, " << st.accepted_tokens
            << " of " << st.drafted_tokens << " drafts accepted, " << st.tokens_per_spec_row()
            << " tokens per step -> " << out << ".json\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string checkpoint, synthetic, prompts_path, out, draft_dir, encoders_path, encoder_lens,
      encoder_firsts, eagle_dir;
  std::int32_t control_of = -1;
  std::uint64_t seed = 1;
  bool lookup = false;
  std::int32_t k = 4;
  GenerateOptions opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--checkpoint")
      checkpoint = next();
    else if (a == "--synthetic")
      synthetic = next();
    else if (a == "--seed")
      seed = std::stoull(next());
    else if (a == "--prompts")
      prompts_path = next();
    else if (a == "--new-tokens")
      opt.new_tokens = std::stoi(next());
    else if (a == "--graphs")
      opt.use_graphs = next() != "off";
    else if (a == "--out")
      out = next();
    else if (a == "--draft")
      draft_dir = next();
    else if (a == "--lookup")
      lookup = true;
    else if (a == "--eagle")
      eagle_dir = next();
    else if (a == "--k")
      k = std::stoi(next());
    else if (a == "--encoders")
      encoders_path = next();
    else if (a == "--encoder-lens")
      encoder_lens = next();
    else if (a == "--encoder-first-positions")
      encoder_firsts = next();
    else if (a == "--control-encoder-len-of")
      control_of = std::stoi(next());
    else
      return usage();
  }
  if ((checkpoint.empty() == synthetic.empty()) || prompts_path.empty() || out.empty())
    return usage();
  if (!cuda_device_available()) {
    std::cerr << "model_parity: no CUDA device\n";
    return 1;
  }
  try {
    const HostWeights weights =
        checkpoint.empty()
            ? synthetic_weights(ModelConfig::from_json_text(read_text(synthetic), synthetic), seed)
            : load_checkpoint(checkpoint);
    const auto prompts = read_prompts(prompts_path);
    // Cross-attention models: every prompt's encoder states, views into one buffer.
    std::vector<std::uint16_t> enc_data;
    std::vector<EncoderStatesView> encoders;
    if (encoders_path.empty() != encoder_lens.empty()) return usage();
    if (!encoders_path.empty()) {
      const std::vector<std::int32_t> lens = parse_lens(encoder_lens);
      if (lens.size() != prompts.size())
        throw Error("one encoder length per prompt", "model_parity", "encoder-lens",
                    std::to_string(lens.size()) + " for " + std::to_string(prompts.size()));
      std::int64_t rows = 0;
      for (std::int32_t l : lens) rows += l;
      enc_data = read_encoders(encoders_path, rows * weights.config.hidden_size);
      const std::vector<std::int32_t> firsts = encoder_firsts.empty()
                                                   ? std::vector<std::int32_t>(lens.size(), 0)
                                                   : parse_lens(encoder_firsts);
      if (firsts.size() != lens.size())
        throw Error("one first image position per prompt", "model_parity",
                    "encoder-first-positions", encoder_firsts);
      std::int64_t at = 0;
      for (std::size_t r = 0; r < lens.size(); ++r) {
        const std::int32_t l = lens[r];
        encoders.push_back({l > 0 ? enc_data.data() + at : nullptr, l, false, firsts[r]});
        at += static_cast<std::int64_t>(l) * weights.config.hidden_size;
      }
      opt.encoders = encoders;
      opt.control_encoder_len_of = control_of;
    }
    if (!eagle_dir.empty()) {
      if (!encoders.empty() || !draft_dir.empty() || lookup) return usage();
      const EagleWeights head = eagle_dir == "synthetic"
                                    ? synthetic_eagle_weights(weights.config, seed + 1)
                                    : load_eagle_head(eagle_dir);
      return run_eagle_steps(weights, head, prompts, opt.new_tokens, k, opt.use_graphs, out);
    }
    if (!draft_dir.empty() || lookup) {
      if (!encoders.empty()) return usage();
      if (!draft_dir.empty() && lookup) return usage();
      const HostWeights draft = draft_dir.empty() ? HostWeights{} : load_checkpoint(draft_dir);
      return run_speculative(weights, draft_dir.empty() ? nullptr : &draft, prompts, opt.new_tokens,
                             k, opt.use_graphs, out);
    }
    Stream stream;
    std::ofstream logits_out(out + ".f32", std::ios::binary);
    if (!logits_out) throw Error("cannot write", "model_parity", "out", out + ".f32");
    const GenerateResult r = generate_greedy(
        weights, prompts, opt, stream.get(),
        [&](std::int32_t, std::span<const float> logits, std::span<const std::int32_t>) {
          logits_out.write(reinterpret_cast<const char*>(logits.data()),
                           static_cast<std::streamsize>(logits.size_bytes()));
        });
    logits_out.close();
    std::ofstream js(out + ".json");
    js << "{\"steps\": " << opt.new_tokens << ", \"batch\": " << prompts.size()
       << ", \"vocab\": " << weights.config.vocab_size
       << ", \"graphs\": " << (opt.use_graphs ? "true" : "false")
       << ", \"graph_steps\": " << r.graph_steps << ", \"eager_steps\": " << r.eager_steps
       << ", \"control_encoder_len_of\": " << control_of << ", ";
    write_tokens(js, r.tokens);
    js << "}\n";
    std::cout << "model_parity: " << prompts.size() << " prompts, " << opt.new_tokens
              << " new tokens, graph steps " << r.graph_steps << ", eager steps " << r.eager_steps
              << " -> " << out << ".{json,f32}\n";
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
