// replay_fuzz: proves that captured CUDA graphs of whole steps replay correctly for any batch.
//
// Random step sequences (batch size changes every step, padding rows, mixed modes, different
// encoder lengths, scrambled pages, arrivals, departures, speculative rollback) run by graph
// replay on engine A and eagerly on engine B; outputs are compared bitwise, sampled rows against a
// float64 reference, and KV pages that must not change are checksummed. Any failure prints the
// seed and step; rerun with --seed S --steps (step + 1) --verbose to replay it.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "common/device.h"
#include "fuzz.h"

namespace {

void usage() {
  std::printf(
      "usage: replay_fuzz [--seed S] [--steps N] [--max-batch B] [--ref-rows R] [--verbose]\n"
      "  --seed S       RNG seed; also draws the configuration (page size, window, layers, dtype)\n"
      "                 (default 1)\n"
      "  --steps N      fuzzed steps (default 1000)\n"
      "  --max-batch B  largest batch and graph bucket (default 32)\n"
      "  --ref-rows R   rows per step checked against the float64 reference (default 2)\n"
      "  --verbose      print every step\n"
      "Exit status: 0 when every step matched, 1 on any mismatch, 2 on a usage error or no GPU.\n");
}

bool parse_int(const char* s, long long& out) {
  char* end = nullptr;
  out = std::strtoll(s, &end, 10);
  return end != s && *end == '\0';
}

}  // namespace

int main(int argc, char** argv) {
  graphdecode::fuzz::FuzzOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    long long v = 0;
    const bool has_value = i + 1 < argc;
    if (a == "--help" || a == "-h") {
      usage();
      return 0;
    } else if (a == "--verbose") {
      o.verbose = true;
    } else if ((a == "--seed" || a == "--steps" || a == "--max-batch" || a == "--ref-rows") &&
               has_value && parse_int(argv[i + 1], v) && v >= 0) {
      ++i;
      if (a == "--seed") o.seed = static_cast<std::uint64_t>(v);
      if (a == "--steps") o.steps = v;
      if (a == "--max-batch") o.max_batch = static_cast<std::int32_t>(v);
      if (a == "--ref-rows") o.ref_rows = static_cast<std::int32_t>(v);
    } else {
      std::fprintf(stderr, "replay_fuzz: bad argument '%s'\n", a.c_str());
      usage();
      return 2;
    }
  }
  if (!graphdecode::cuda_device_available()) {
    std::fprintf(stderr, "replay_fuzz: no CUDA device; nothing was fuzzed\n");
    return 2;
  }
  o.log = &std::cout;
  try {
    const graphdecode::fuzz::FuzzResult r = graphdecode::fuzz::run_replay_fuzz(o);
    std::printf("seed %llu: %s\n", static_cast<unsigned long long>(o.seed), r.config.c_str());
    std::printf(
        "graphs: %zu captured, %.1f MiB device memory; steps: %lld by graph (%lld padded), %lld "
        "eager fallback; reference rows %lld, max rel error %.3g\n",
        r.num_graphs, r.graph_memory_bytes / 1048576.0, static_cast<long long>(r.graph_steps),
        static_cast<long long>(r.padded_steps), static_cast<long long>(r.eager_steps),
        static_cast<long long>(r.ref_rows), r.max_ref_error);
    std::printf("%lld steps, %lld mismatches\n", static_cast<long long>(r.steps),
                static_cast<long long>(r.mismatches));
    return r.mismatches == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "replay_fuzz (seed %llu): %s\n", static_cast<unsigned long long>(o.seed),
                 e.what());
    return 1;
  }
}
