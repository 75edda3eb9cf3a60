// bench_step: the cost of one step of graphs/.
//   1. host time per step (StepInput::write + the one copy + one cudaGraphLaunch), CPU timer
//      around the host work only, decode at batch 1..256 (target <= 10 us);
//   2. device time of the prep kernels per step at batch 256 (table apply + metadata, replayed
//      from a graph; target <= 5 us), and the metadata kernel alone;
//   3. step time, graph replay vs eager, of a 32-layer attention stack (full/sliding/cross) at
//      batch 1, 8, 64.
// Prints tables; --json PATH writes the numbers.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "attention_stack.h"
#include "bench_util.cuh"
#include "common/device.h"
#include "common/error.h"
#include "common/stream.h"
#include "graphs/cuda_graph.h"
#include "graphs/step_graphs.h"

using namespace graphdecode;
using fuzz::AttentionStack;
using fuzz::AttentionStackConfig;

namespace {

struct Rig {
  AttentionStackConfig config;
  std::unique_ptr<StepContext> step;
  std::unique_ptr<AttentionStack> stack;
  std::unique_ptr<StepGraphs> graphs;
  std::vector<StepRequest> requests;  // [max_batch] decode rows, pages allocated
  std::vector<std::int32_t> tokens;

  Rig(const AttentionStackConfig& c, std::int32_t prefix, Stream& s) : config(c) {
    const StepCapacity cap = fuzz::stack_step_capacity(c);
    step = std::make_unique<StepContext>(cap, ledger_pools(cap, c.options));
    stack = std::make_unique<AttentionStack>(c, *step, s.get());
    graphs = std::make_unique<StepGraphs>(step->input(), *stack, StepGraphsConfig{});
    // Allocate every request's pages once (prefix + the decoded token) and write encoder K/V.
    KvLedger& ledger = step->ledger();
    const std::int32_t batch = c.options.max_batch;
    // Chunks of at most max_new_tokens: a sliding-window pool holds window + chunk tokens.
    const std::int32_t chunk = c.options.resolved_max_new_tokens();
    for (std::int32_t r = 0; r < batch; ++r) {
      const std::int32_t slot = ledger.acquire();
      for (std::int32_t done = 0; done < prefix + 1; done += chunk) {
        if (!has_room(chunk)) apply_commands(s);
        ledger.extend(slot, std::min(chunk, prefix + 1 - done));
      }
      const std::int32_t enc =
          c.layout.has(AttentionKind::kCross) ? c.options.max_encoder_len - r % 7 : 0;
      if (enc > 0) {
        apply_commands(s);
        ledger.set_encoder(slot, enc);
        apply_commands(s);
        stack->encode(slot, static_cast<std::uint32_t>(r + 1), enc, s.get());
      }
      requests.push_back({slot, prefix, 1, enc});
      tokens.push_back(100 + r);
    }
    apply_commands(s);
    s.synchronize();
    graphs->capture(s.get());
  }

  StepDesc desc(std::int32_t batch) const {
    StepDesc d;
    d.mode = StepMode::kDecode;
    d.tokens_per_request = 1;
    d.requests = {requests.data(), static_cast<std::size_t>(batch)};
    d.token_ids = {tokens.data(), static_cast<std::size_t>(batch)};
    return d;
  }

 private:
  bool has_room(std::int32_t chunk) const {
    const KvLedger& ledger = step->ledger();
    for (std::int32_t i = 0; i < ledger.num_pools(); ++i)
      if (!ledger.commands(i).has_room(4, chunk + 2)) return false;
    return true;
  }
  void apply_commands(Stream& s) {
    KvLedger& ledger = step->ledger();
    for (std::int32_t i = 0; i < ledger.num_pools(); ++i) {
      const TableCommandBatch& b = ledger.commands(i);
      if (!b.empty()) stack->apply_table(ledger.config(i).geometry.kind, b, s.get());
    }
    s.synchronize();
    ledger.clear_commands();
  }
};

AttentionStackConfig small_config(std::int32_t max_batch) {
  AttentionStackConfig c;
  c.layout.layers = {AttentionKind::kFull};
  c.layout.num_q_heads = 4;
  c.layout.num_kv_heads = 2;
  c.layout.head_dim = 64;
  c.options.max_batch = max_batch;
  c.options.max_tokens = max_batch;
  c.options.max_new_tokens = 1;
  c.options.max_slots = max_batch + 1;
  c.options.max_kv_len = 128;
  return c;
}

AttentionStackConfig stack32_config(std::int32_t max_batch) {
  AttentionStackConfig c;
  for (int l = 0; l < 32; ++l) {
    c.layout.layers.push_back(l % 4 == 3
                                  ? AttentionKind::kCross
                                  : (l % 2 ? AttentionKind::kSliding : AttentionKind::kFull));
  }
  c.layout.num_q_heads = 32;
  c.layout.num_kv_heads = 8;
  c.layout.head_dim = 128;
  c.layout.window_left = 255;
  c.options.max_batch = max_batch;
  c.options.max_tokens = std::max(max_batch, 64);
  c.options.max_new_tokens = 64;
  c.options.max_slots = max_batch + 1;
  c.options.max_kv_len = 1040;
  c.options.max_encoder_len = 256;
  return c;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run_main(int argc, char** argv) {
  const char* json_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::printf("usage: bench_step [--json PATH]\n");
      return std::strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  if (!cuda_device_available()) {
    std::fprintf(stderr, "bench_step: no CUDA device\n");
    return 2;
  }
  std::string json = "{\n";
  Stream s;
  // ---- 1. host time per step -----------------------------------------------------------
  Rig host_rig(small_config(256), 64, s);
  std::printf("host time per step (write + copy + graph launch), decode, 1-layer stack\n");
  std::printf("%8s %12s %12s %8s\n", "batch", "median_us", "mean_us", "path");
  json += "  \"host_us\": {";
  const std::int32_t batches[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  for (std::int32_t b : batches) {
    const StepDesc d = host_rig.desc(b);
    std::vector<double> us;
    StepPath path = StepPath::kGraph;
    // The device is drained before every timed step (outside the timed region): otherwise a
    // back-to-back loop is device-bound and the host time would include waiting for the copy
    // out of a pinned image still in flight, which is back-pressure, not host work.
    for (int rep = 0; rep < 2000; ++rep) {
      s.synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      path = host_rig.graphs->step(d, s.get());
      const auto t1 = std::chrono::steady_clock::now();
      if (rep >= 100) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    s.synchronize();
    double mean = 0;
    for (double x : us) mean += x;
    mean /= static_cast<double>(us.size());
    std::printf("%8d %12.2f %12.2f %8s\n", b, median(us), mean,
                path == StepPath::kGraph ? "graph" : "eager");
    json += (b == 1 ? "" : ", ") + std::string("\"") + std::to_string(b) +
            "\": " + std::to_string(median(us));
  }
  json += "},\n";

  // ---- 2. prep kernels device time at batch 256 ------------------------------------------
  {
    host_rig.step->input().write(host_rig.desc(256));
    host_rig.step->input().upload(s.get());
    const StepPrep& prep = host_rig.step->prep();
    const CudaGraph full = CudaGraph::capture(s.get(), [&] {
      for (int i = 0; i < 100; ++i) prep.enqueue(s.get());
    });
    const CudaGraph meta = CudaGraph::capture(s.get(), [&] {
      for (int i = 0; i < 100; ++i) prep.enqueue_metadata(s.get());
    });
    Event e0, e1;
    double us_full = 0, us_meta = 0;
    for (int which = 0; which < 2; ++which) {
      const CudaGraph& g = which == 0 ? full : meta;
      g.launch(s.get());  // warm
      e0.record(s.get());
      for (int i = 0; i < 10; ++i) g.launch(s.get());
      e1.record(s.get());
      e1.synchronize();
      const double us = e1.elapsed_ms_since(e0) * 1000.0 / 1000.0;  // 10 x 100 preps
      (which == 0 ? us_full : us_meta) = us;
    }
    std::printf("\nprep device time per step at batch 256 (graph of 100 preps)\n");
    std::printf(
        "  table apply (1 pool) + metadata: %.2f us\n  metadata kernel alone:          %.2f us\n",
        us_full, us_meta);
    json += "  \"prep_us_batch256\": " + std::to_string(us_full) +
            ",\n  \"prep_metadata_us_batch256\": " + std::to_string(us_meta) + ",\n";
  }

  // ---- 3. replay vs eager, 32-layer stack ------------------------------------------------
  std::printf(
      "\n32-layer attention stack (F/S/F/C, 32q/8kv heads, dim 128, bf16, prefix 1024, "
      "encoder 256, window_left 255), decode step time\n");
  std::printf("%8s %12s %12s %8s\n", "batch", "replay_us", "eager_us", "speedup");
  json += "  \"stack32\": [";
  bool first = true;
  for (std::int32_t b : {1, 8, 64}) {
    Rig rig(stack32_config(b), 1024, s);
    const StepDesc d = rig.desc(b);
    double t[2] = {0, 0};
    for (int mode = 0; mode < 2; ++mode) {
      rig.graphs->set_use_graphs(mode == 0);
      for (int i = 0; i < 5; ++i) rig.graphs->step(d, s.get());
      s.synchronize();
      Event e0, e1;
      e0.record(s.get());
      const int iters = 50;
      for (int i = 0; i < iters; ++i) rig.graphs->step(d, s.get());
      e1.record(s.get());
      e1.synchronize();
      t[mode] = e1.elapsed_ms_since(e0) * 1000.0 / iters;
    }
    std::printf("%8d %12.1f %12.1f %8.2f\n", b, t[0], t[1], t[1] / t[0]);
    json += std::string(first ? "" : ", ") + "{\"batch\": " + std::to_string(b) +
            ", \"replay_us\": " + std::to_string(t[0]) + ", \"eager_us\": " + std::to_string(t[1]) +
            ", \"graph_memory_bytes\": " + std::to_string(rig.graphs->graph_memory_bytes()) + "}";
    first = false;
  }
  json += "]\n}\n";
  if (json_path) {
    FILE* f = std::fopen(json_path, "w");
    if (!f) {
      std::fprintf(stderr, "bench_step: cannot write %s\n", json_path);
      return 1;
    }
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return graphdecode::bench::bench_main("bench_step", argc, argv, run_main);
}
