// soak: the serving loop under a long seeded random stream of requests, checked after every step
// against an exact host model (examples/soak/soak.h says what is checked).
//
//   soak --seed 1 --requests 100000                 # plain decoding
//   soak --seed 2 --requests 20000 --speculative 4  # the target as its own draft
//   soak --seed 3 --requests 20000 --speculative 4 --ngram
//   soak --seed 4 --requests 100000 --pipeline      # pipelined decode steps
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "common/device.h"
#include "soak.h"

namespace {

void usage() {
  std::printf(
      "usage: soak [--seed S] [--requests N] [--max-batch B] [--max-context C] [--kv-pages P]\n"
      "            [--speculative K [--ngram | --eagle | --eagle3]] [--eager] [--pipeline]\n"
      "  --seed S         RNG seed of the request stream and the weights (default 1)\n"
      "  --requests N     requests submitted, bad ones included (default 10000)\n"
      "  --max-batch B    requests running at once (default 16)\n"
      "  --max-context C  prompt + output limit (default 160)\n"
      "  --kv-pages P     full-pool pages (default: a third of the batch at max context)\n"
      "  --speculative K  speculative decoding, k = K, the target as its own draft\n"
      "  --ngram          with --speculative: prompt lookup instead of the draft model\n"
      "  --eagle          with --speculative: a synthetic EAGLE head instead of the draft model\n"
      "  --eagle3         the same with a synthetic EAGLE-3 head (three target layers)\n"
      "  --eager          no CUDA graphs\n"
      "  --pipeline       pipelined decode steps (EngineConfig::pipeline)\n"
      "Exit status: 0 with no accounting error, 1 on any, 2 on a usage error or no GPU.\n");
}

}  // namespace

int main(int argc, char** argv) {
  graphdecode::soak::SoakConfig c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> long long {
      if (i + 1 >= argc) {
        usage();
        std::exit(2);
      }
      return std::atoll(argv[++i]);
    };
    if (a == "--seed") {
      c.seed = static_cast<std::uint64_t>(next());
    } else if (a == "--requests") {
      c.requests = next();
    } else if (a == "--max-batch") {
      c.max_batch = static_cast<std::int32_t>(next());
    } else if (a == "--max-context") {
      c.max_context = static_cast<std::int32_t>(next());
    } else if (a == "--kv-pages") {
      c.kv_pages = static_cast<std::int32_t>(next());
    } else if (a == "--speculative") {
      c.max_draft_tokens = static_cast<std::int32_t>(next());
    } else if (a == "--ngram") {
      c.ngram = true;
    } else if (a == "--eagle") {
      c.eagle = true;
    } else if (a == "--eagle3") {
      c.eagle = c.eagle3 = true;
    } else if (a == "--eager") {
      c.use_graphs = false;
    } else if (a == "--pipeline") {
      c.pipeline = true;
    } else {
      usage();
      return 2;
    }
  }
  if (!graphdecode::cuda_device_available()) {
    std::fprintf(stderr, "soak: no CUDA device\n");
    return 2;
  }
  try {
    const graphdecode::soak::SoakReport r = graphdecode::soak::run_soak(c);
    for (const std::string& e : r.first_errors) std::printf("ERROR %s\n", e.c_str());
    std::printf("soak: seed %llu, batch %d, context %d, k %d%s%s: %s\n",
                static_cast<unsigned long long>(c.seed), c.max_batch, c.max_context,
                c.max_draft_tokens,
                c.ngram    ? " (prompt lookup)"
                : c.eagle3 ? " (EAGLE-3 head)"
                : c.eagle  ? " (EAGLE head)"
                           : "",
                c.pipeline ? ", pipelined" : "", r.summary().c_str());
    return r.errors == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "soak: %s\n", e.what());
    return 1;
  }
}
