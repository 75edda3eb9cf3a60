// replay_fuzz: proves that captured CUDA graphs of whole steps replay correctly for any batch.
//
// Random step sequences (batch size changes every step, padding rows, mixed modes, whole
// speculative steps of a target and a draft stack with acceptance and rollback, different encoder
// lengths, scrambled pages, arrivals, departures) run by graph replay on engine A and eagerly on
// engine B; every phase's outputs are compared bitwise, sampled rows of every phase against a
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
      "usage: replay_fuzz [--seed S] [--steps N] [--max-batch B] [--ref-rows R] [--spec P]\n"
      "                   [--verbose]\n"
      "  --seed S       RNG seed; also draws the configuration (page size, windows, both stacks'\n"
      "                 layers, heads and dtypes) (default 1)\n"
      "  --steps N      fuzzed steps (default 1000)\n"
      "  --max-batch B  largest batch and graph bucket (default 32)\n"
      "  --ref-rows R   rows per step (per verify) checked against the float64 reference; plus\n"
      "                 one draft row, and in speculative steps one draft-extend and one draft\n"
      "                 decode row (default 2; 0 = no reference)\n"
      "  --spec P       percent of steps that are whole speculative steps (default 40; 0 = none)\n"
      "  --verbose      print every step\n"
      "Exit status: 0 when every step matched, 1 on any mismatch, 2 on a usage error or no GPU.\n");
}

bool parse_int(const char* s, long long& out) {
  char* end = nullptr;
  out = std::strtoll(s, &end, 10);
  return end != s && *end == '\0';
}

void print_result(const graphdecode::fuzz::FuzzOptions& o, const graphdecode::fuzz::FuzzResult& r) {
  std::printf("seed %llu: %s\n", static_cast<unsigned long long>(o.seed), r.config.c_str());
  std::printf("graphs: %zu captured, %.1f MiB device memory\n", r.num_graphs,
              r.graph_memory_bytes / 1048576.0);
  std::printf("%-16s %7s %7s %7s %7s %9s %10s %11s\n", "mode", "steps", "graph", "padded", "eager",
              "ref rows", "mismatches", "max rel err");
  for (int m = 0; m < static_cast<int>(r.modes.size()); ++m) {
    const graphdecode::fuzz::ModeCounts& c = r.modes[static_cast<std::size_t>(m)];
    const std::string name(graphdecode::step_mode_name(static_cast<graphdecode::StepMode>(m)));
    std::printf("%-16s %7lld %7lld %7lld %7lld %9lld %10lld %11.3g\n", name.c_str(),
                static_cast<long long>(c.steps), static_cast<long long>(c.graph_steps),
                static_cast<long long>(c.padded_steps), static_cast<long long>(c.eager_steps),
                static_cast<long long>(c.ref_rows), static_cast<long long>(c.mismatches),
                c.max_ref_error);
  }
  const graphdecode::fuzz::SpecCounts& s = r.spec;
  std::printf(
      "speculative: %lld request rows, %lld steps of k = 0, %lld draft decodes, %lld drafted, "
      "%lld accepted, %lld draft tokens checked; reference rows: draft-extend %lld, draft decode "
      "%lld, verify %lld\n",
      static_cast<long long>(s.requests), static_cast<long long>(s.k0_steps),
      static_cast<long long>(s.draft_decodes), static_cast<long long>(s.drafted),
      static_cast<long long>(s.accepted), static_cast<long long>(s.drafts_checked),
      static_cast<long long>(s.draft_extend_rows), static_cast<long long>(s.draft_decode_rows),
      static_cast<long long>(s.verify_rows));
  std::printf(
      "steps: %lld by graph (%lld padded), %lld eager fallback; reference rows %lld, max rel error "
      "%.3g\n",
      static_cast<long long>(r.graph_steps), static_cast<long long>(r.padded_steps),
      static_cast<long long>(r.eager_steps), static_cast<long long>(r.ref_rows), r.max_ref_error);
  std::printf("%lld steps, %lld mismatches\n", static_cast<long long>(r.steps),
              static_cast<long long>(r.mismatches));
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
    } else if ((a == "--seed" || a == "--steps" || a == "--max-batch" || a == "--ref-rows" ||
                a == "--spec") &&
               has_value && parse_int(argv[i + 1], v) && v >= 0 &&
               (a == "--seed" || a == "--steps" || v <= (a == "--spec" ? 100 : 0x7fffffff))) {
      ++i;
      if (a == "--seed") o.seed = static_cast<std::uint64_t>(v);
      if (a == "--steps") o.steps = v;
      if (a == "--max-batch") o.max_batch = static_cast<std::int32_t>(v);
      if (a == "--ref-rows") o.ref_rows = static_cast<std::int32_t>(v);
      if (a == "--spec") o.spec_percent = static_cast<std::int32_t>(v);
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
    print_result(o, r);
    return r.mismatches == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "replay_fuzz (seed %llu): %s\n", static_cast<unsigned long long>(o.seed),
                 e.what());
    return 1;
  }
}
