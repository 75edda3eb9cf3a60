// model_parity: greedy generation with graphdecode's Llama-family model, for comparison with
// Hugging Face transformers (scripts/hf_parity.py).
//
//   model_parity (--checkpoint DIR | --synthetic CONFIG_JSON [--seed S]) --prompts FILE
//                --new-tokens N [--graphs on|off] --out PREFIX
//
// FILE: one prompt per line, space-separated token ids. Writes
//   PREFIX.json  {"steps", "batch", "vocab", "graph_steps", "eager_steps", "tokens": [[...]]}
//   PREFIX.f32   raw float32 logits [steps][batch][vocab] (each request's last token per step)
#include <cuda_runtime.h>

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
#include "engine/generate.h"
#include "engine/model_config.h"
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

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open file", "model_parity", "path", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int usage() {
  std::cerr << "usage: model_parity (--checkpoint DIR | --synthetic CONFIG_JSON [--seed S]) "
               "--prompts FILE --new-tokens N [--graphs on|off] --out PREFIX\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string checkpoint, synthetic, prompts_path, out;
  std::uint64_t seed = 1;
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
       << ", \"tokens\": [";
    for (std::size_t p = 0; p < r.tokens.size(); ++p) {
      js << (p ? ", " : "") << "[";
      for (std::size_t t = 0; t < r.tokens[p].size(); ++t) js << (t ? ", " : "") << r.tokens[p][t];
      js << "]";
    }
    js << "]}\n";
    std::cout << "model_parity: " << prompts.size() << " prompts, " << opt.new_tokens
              << " new tokens, graph steps " << r.graph_steps << ", eager steps " << r.eager_steps
              << " -> " << out << ".{json,f32}\n";
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
