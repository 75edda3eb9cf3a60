// Diagnosis probe (issue 38): where one replayed decode step's time goes, kernel by kernel, from
// CUPTI's kernel activity records (start and end of every kernel node of the step's graph, the
// overlap of programmatic dependent launches included). nsys is not on the device machines; this
// is the timeline it would draw.
//
//   probe_decode_timeline [--shape 1b|8b] [--batch B] [--context L] [--reps N] [--no-flush]
//                         [--step forward|greedy|sampled]
//
// The rig of bench_decode (bench/decode_rig.cuh: synthetic seeded weights, B requests at KV extent
// L + 1, the forward's graph for bucket B), warmed up, then N replays each after an L2 flush,
// traced. --step greedy / sampled trace the engine's step instead (the forward, sampling and the
// token publish, as bench_decode's `greedy us` / `sampled us`: every row greedy, or every row at
// temperature 0.8, top-k 50, top-p 0.95). Per kernel of the step (graph order = start order),
// medians over the replays:
//   dur    end - start (a PDL kernel starts early and waits inside: dur counts its wait),
//   adds   end - max(start, latest end before it): what it adds to the step's span,
//   gap    start - latest end before it when positive (idle device between kernels).
// Then the same by kernel name (summed over a step) and the step's span against the sum of adds.
// In a trace build (-DGD_ATTN_TRACE=1 in CMAKE_CUDA_FLAGS and CMAKE_CXX_FLAGS), the last replay's
// last attention launch (the last layer's) is also read per CTA (attention/attention_trace.cuh):
// when its CTAs knew their work item, had their first K/V tile, finished attending and exited,
// counted from the end of the kernel before it (the QKV epilogue, whose end the attention waits
// for), taking the first CTA's entry as the kernel's CUPTI start.
#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "bench/decode_rig.cuh"
#include "common/cuda_check.h"
#include "common/error.h"
#include "common/stream.h"
#include "engine/weights.h"

#if GD_ATTN_TRACE
#include "attention/attention_trace.cuh"
#include "attention/paged_attention.h"
#endif

namespace graphdecode::bench {
namespace {

#define GD_CUPTI(expr)                                                                 \
  do {                                                                                 \
    const CUptiResult gd_r_ = (expr);                                                  \
    if (gd_r_ != CUPTI_SUCCESS) {                                                      \
      const char* gd_m_ = nullptr;                                                     \
      cuptiGetResultString(gd_r_, &gd_m_);                                             \
      GD_FAIL(std::string(#expr) + ": " + (gd_m_ != nullptr ? gd_m_ : "CUPTI error")); \
    }                                                                                  \
  } while (0)

struct KernelRecord {
  std::uint64_t start = 0, end = 0;
  std::string name;
};
std::vector<KernelRecord>* g_records = nullptr;  // CUPTI's buffer callbacks append here

constexpr std::size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t,
                               std::size_t valid) {
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    g_records->push_back({k->start, k->end, k->name != nullptr ? k->name : "?"});
  }
  std::free(buffer);
}

// A kernel's name without its template and parameter lists, at most 48 characters.
std::string short_name(const std::string& mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  std::string n = status == 0 && d != nullptr ? d : mangled;
  std::free(d);
  // "(anonymous namespace)" would be taken for the parameter list below (and left no name).
  for (std::size_t at; (at = n.find("(anonymous namespace)")) != std::string::npos;)
    n.replace(at, 21, "anon");
  const std::size_t paren = n.find('(');
  if (paren != std::string::npos) n.resize(paren);
  if (n.rfind("void ", 0) == 0) n.erase(0, 5);
  const std::size_t angle = n.find('<');
  if (angle != std::string::npos) n.resize(angle);
  const std::size_t colons = n.rfind("::");
  if (colons != std::string::npos) n.erase(0, colons + 2);
  if (n.size() > 48) n.resize(48);
  return n;
}

#if GD_ATTN_TRACE
// The last attention launch of `step` per CTA, from the end of the kernel before it (us).
void print_attention_trace(const std::vector<KernelRecord>& step,
                           const std::vector<unsigned long long>& trace) {
  std::size_t ia = step.size();
  for (std::size_t i = 0; i < step.size(); ++i)
    if (short_name(step[i].name) == "attention_kernel") ia = i;
  if (ia == step.size() || ia == 0) {
    std::printf("\nattention trace: no attention kernel with a kernel before it\n");
    return;
  }
  const auto f = [&](std::size_t cta, int field) {
    return trace[cta * attn::kTraceFields + static_cast<std::size_t>(field)];
  };
  std::uint64_t first_entry = ~0ull;
  for (std::size_t c = 0; c < static_cast<std::size_t>(attn::kTraceCtas); ++c)
    if (f(c, 0) != 0) first_entry = std::min<std::uint64_t>(first_entry, f(c, 0));
  if (first_entry == ~0ull) {
    std::printf("\nattention trace: empty\n");
    return;
  }
  // The kernel before it ends at (its end - attention start) after the first CTA's entry.
  const double before_end =
      1e-3 * (static_cast<double>(step[ia - 1].end) - static_cast<double>(step[ia].start));
  // Points in time order: the early start's copies issued (field 30) and its wait returned (28)
  // come between the work item and the first tile; field 16 is the item's tile n_tiles / 2 in
  // shared memory (items of 2+ tiles); fields 32 and 34 are the merging CTAs' (arrivals counted,
  // first partial states loaded).
  constexpr int kPoints = 10;
  const char* names[kPoints] = {"entry",         "work item",      "early copies issued",
                                "wait returned", "first K/V tile", "tile n/2 in smem",
                                "attend done",   "merge: arrived", "merge: loaded",
                                "exit"};
  const int fields[kPoints] = {0, 2, 30, 28, 4, 16, 6, 32, 34, 8};
  std::vector<double> at[kPoints];
  int ctas = 0, merged = 0;
  for (std::size_t c = 0; c < static_cast<std::size_t>(attn::kTraceCtas); ++c) {
    if (f(c, 0) == 0 || f(c, 2) == 0) continue;  // did not run, or had no work item
    ++ctas;
    merged += f(c, 11) == 1 ? 1 : 0;
    // A point this launch did not reach may hold an earlier layer's time (the merging CTA of a
    // head can differ between layers): only times from this launch's first entry on count.
    for (int i = 0; i < kPoints; ++i)
      if (f(c, fields[i]) >= first_entry)
        at[i].push_back(1e-3 * static_cast<double>(f(c, fields[i]) - first_entry) - before_end);
  }
  std::printf(
      "\nlast attention launch (%s before it ends %.2f us after the attention's start): %d CTAs "
      "with work, %d merged; us from that end, min / median / max:\n",
      short_name(step[ia - 1].name).c_str(), before_end, ctas, merged);
  for (int i = 0; i < kPoints; ++i) {
    if (at[i].empty()) continue;
    std::sort(at[i].begin(), at[i].end());
    std::printf("  %-20s %8.2f %8.2f %8.2f\n", names[i], at[i].front(), median(at[i]),
                at[i].back());
  }
  std::printf("  attention end        %8.2f (CUPTI)\n",
              1e-3 * (static_cast<double>(step[ia].end) - static_cast<double>(step[ia - 1].end)));
}
#endif

struct Row {
  std::string name;
  std::vector<double> dur, adds, gap;  // [reps], us
};

int run(int argc, char** argv) {
  std::string shape = "1b";
  std::int32_t b = 1, l = 1024;
  int reps = 20;
  bool flush = true;
  std::string step = "forward";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--shape" && i + 1 < argc) {
      shape = argv[++i];
      GD_REQUIRE(shape == "1b" || shape == "8b", "--shape", shape, "expected 1b or 8b");
    } else if (a == "--batch" && i + 1 < argc) {
      b = std::atoi(argv[++i]);
      GD_REQUIRE(b >= 1, "--batch", b, "must be >= 1");
    } else if (a == "--context" && i + 1 < argc) {
      l = std::atoi(argv[++i]);
      GD_REQUIRE(l >= 1, "--context", l, "must be >= 1");
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
      GD_REQUIRE(reps >= 3, "--reps", reps, "must be >= 3");
    } else if (a == "--no-flush") {
      flush = false;
    } else if (a == "--step" && i + 1 < argc) {
      step = argv[++i];
      GD_REQUIRE(step == "forward" || step == "greedy" || step == "sampled", "--step", step,
                 "expected forward, greedy or sampled");
    } else {
      std::printf(
          "usage: %s [--shape 1b|8b] [--batch B] [--context L] [--reps N] [--no-flush] "
          "[--step forward|greedy|sampled]\n",
          argv[0]);
      return a == "--help" ? 0 : 2;
    }
  }
  cudaDeviceProp dev{};
  GD_CUDA(cudaGetDeviceProperties(&dev, 0));
  const ModelConfig config = bench_model_config(shape, false);
  const HostWeights weights = synthetic_weights(config, 1234);
  Stream s;
  const bool engine_step = step != "forward";
  DecodeRig rig(weights, decode_only_options(b, l, 16), b, l, {}, 0, 1234, s.get(),
                engine_step ? RigSteps::kWithSampling : RigSteps::kForward);
  if (step == "sampled") rig.set_sampling(SamplingParams{0.8f, 50, 0.95f, 1234});
  StepGraphs& graphs = engine_step ? *rig.sampling_graphs : *rig.graphs;
  Timer t(reps, flush, static_cast<std::size_t>(dev.l2CacheSize), s.get());
  const StepDesc d = rig.desc();
  for (int i = 0; i < 10; ++i)
    GD_REQUIRE(graphs.step(d, s.get()) == StepPath::kGraph, "path", "eager",
               "the step did not replay its graph");
  GD_CUDA(cudaStreamSynchronize(s.get()));

  // Traced replays; the flush kernel before each splits the records into steps.
  std::vector<KernelRecord> records;
  g_records = &records;
  GD_CUPTI(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  GD_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  for (int i = 0; i < reps; ++i) {
#if GD_ATTN_TRACE
    if (i == reps - 1) attn::clear_trace();  // the last replay's last attention launch, below
#endif
    t.flush_now(s.get());
    GD_CUDA(cudaStreamSynchronize(s.get()));  // the step alone on the device
    graphs.step(d, s.get());
    GD_CUDA(cudaStreamSynchronize(s.get()));
  }
#if GD_ATTN_TRACE
  const std::vector<unsigned long long> trace = attn::read_trace();
#endif
  GD_CUPTI(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  GD_CUPTI(cuptiActivityFlushAll(1));
  std::sort(records.begin(), records.end(),
            [](const KernelRecord& x, const KernelRecord& y) { return x.start < y.start; });

  std::vector<std::vector<KernelRecord>> steps;
  for (const KernelRecord& r : records) {
    if (r.name.find("l2_flush_read") != std::string::npos) {
      steps.emplace_back();
      continue;
    }
    if (steps.empty()) steps.emplace_back();  // --no-flush: one list, split below
    steps.back().push_back(r);
  }
  if (!flush) {  // no flush kernels: the replays are back to back with a sync between
    std::vector<KernelRecord> all = steps.empty() ? std::vector<KernelRecord>{} : steps[0];
    steps.assign(static_cast<std::size_t>(reps), {});
    GD_REQUIRE(all.size() % static_cast<std::size_t>(reps) == 0, "records", all.size(),
               "not a whole number of steps");
    const std::size_t per = all.size() / static_cast<std::size_t>(reps);
    for (std::size_t i = 0; i < all.size(); ++i) steps[i / per].push_back(all[i]);
  }
  GD_REQUIRE(static_cast<int>(steps.size()) == reps, "steps", steps.size(),
             "expected one traced step per replay");
  const std::size_t kernels = steps[0].size();
  std::vector<Row> rows(kernels);
  std::vector<double> span;
  for (const auto& st : steps) {
    GD_REQUIRE(st.size() == kernels, "kernels", st.size(),
               "every replay of the graph has the same kernels (" + std::to_string(kernels) + ")");
    std::uint64_t latest = st.front().start;
    for (std::size_t i = 0; i < kernels; ++i) {
      const KernelRecord& k = st[i];
      Row& r = rows[i];
      if (r.name.empty()) r.name = short_name(k.name);
      r.dur.push_back(1e-3 * static_cast<double>(k.end - k.start));
      const std::uint64_t from = std::max(k.start, latest);
      r.adds.push_back(k.end > from ? 1e-3 * static_cast<double>(k.end - from) : 0.0);
      r.gap.push_back(k.start > latest ? 1e-3 * static_cast<double>(k.start - latest) : 0.0);
      latest = std::max(latest, k.end);
    }
    span.push_back(1e-3 * static_cast<double>(latest - st.front().start));
  }

  std::printf("device: %s; shape %s, B %d, L %d, step %s, %d traced replays, L2 flush %s\n",
              dev.name, shape.c_str(), b, l, step.c_str(), reps, flush ? "on" : "off");
  std::printf("\n%4s  %-48s %9s %9s %9s\n", "#", "kernel", "dur us", "adds us", "gap us");
  struct Sum {
    int count = 0;
    double dur = 0, adds = 0, gap = 0;
  };
  std::map<std::string, Sum> by_name;
  double adds_total = 0, gap_total = 0;
  for (std::size_t i = 0; i < kernels; ++i) {
    const Row& r = rows[i];
    const double dur = median(r.dur), adds = median(r.adds), gap = median(r.gap);
    std::printf("%4zu  %-48s %9.2f %9.2f %9.2f\n", i, r.name.c_str(), dur, adds, gap);
    Sum& sm = by_name[r.name];
    ++sm.count;
    sm.dur += dur;
    sm.adds += adds;
    sm.gap += gap;
    adds_total += adds;
    gap_total += gap;
  }
  std::printf("\nby kernel (medians summed over one step)\n%-48s %5s %10s %10s %10s\n", "kernel",
              "count", "dur us", "adds us", "gap us");
  std::vector<std::pair<std::string, Sum>> sorted(by_name.begin(), by_name.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) {
    return x.second.adds + x.second.gap > y.second.adds + y.second.gap;
  });
  for (const auto& [name, sm] : sorted)
    std::printf("%-48s %5d %10.1f %10.1f %10.1f\n", name.c_str(), sm.count, sm.dur, sm.adds,
                sm.gap);
  std::printf(
      "\nstep span (first start to last end), median: %.1f us; sum of adds %.1f us + gaps "
      "%.1f us = %.1f us; %zu kernels\n",
      median(span), adds_total, gap_total, adds_total + gap_total, kernels);
#if GD_ATTN_TRACE
  print_attention_trace(steps.back(), trace);
#endif
  return 0;
}

}  // namespace
}  // namespace graphdecode::bench

int main(int argc, char** argv) {
  return graphdecode::bench::bench_main("probe_decode_timeline", argc, argv,
                                        graphdecode::bench::run);
}
