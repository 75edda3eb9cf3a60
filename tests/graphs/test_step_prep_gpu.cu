// GPU: the prep kernels (table apply + metadata) against the CPU path, field by field, for every
// mode and random batches with padding rows; eagerly and replayed from one captured graph.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "common/buffers.h"
#include "common/stream.h"
#include "graphs/cuda_graph.h"
#include "graphs/step_graphs.h"
#include "graphs/step_prep.h"
#include "memory/device_page_table.h"
#include "step_gen.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using testing::GeneratedStep;
using testing::random_step;

class StepPrepGpu : public testing::GpuTest {};

// A target's three kinds of pool and a draft's full and sliding pools.
constexpr int kPools = 5;

StepCapacity capacity_with_pools(std::int32_t max_batch, std::int32_t max_tokens) {
  StepCapacity c;
  c.max_batch = max_batch;
  c.max_tokens = max_tokens;
  c.max_slots = max_batch + 24;
  c.max_kv_len = 5000;
  c.max_encoder_len = 700;
  c.max_logit_rows = max_tokens;
  c.max_draft_tokens = 7;  // speculative steps are among the modes drawn
  for (int k = 0; k < kPools; ++k) {
    StepPoolCapacity& p = c.pools[k];
    p.present = true;
    p.model = k / 3;
    p.geometry.kind = static_cast<AttentionKind>(k % 3);
    p.geometry.page_size = 16;
    p.geometry.num_pages = 500;
    p.geometry.max_slots = c.max_slots;
    p.geometry.max_pages_per_slot = 320;
    p.geometry.window_left = k % 3 == 1 ? 127 : -1;
    p.max_commands = 64;
    p.max_page_ids = 256;
  }
  return c;
}

// Random valid commands (sets and clears) on random request slots.
void random_commands(std::mt19937& rng, const StepPoolCapacity& p, TableCommandBatch& b) {
  b.clear();
  const int n = static_cast<int>(rng() % 12);
  for (int i = 0; i < n; ++i) {
    const std::int32_t slot = 1 + static_cast<std::int32_t>(rng() % (p.geometry.max_slots - 1));
    const std::int32_t count = 1 + static_cast<std::int32_t>(rng() % 20);
    const std::int32_t first =
        static_cast<std::int32_t>(rng() % (p.geometry.max_pages_per_slot - count));
    if (rng() % 3 == 0) {
      b.push_clear(slot, first, count);
    } else {
      std::vector<std::int32_t> pages(static_cast<std::size_t>(count));
      for (auto& pg : pages) pg = 1 + static_cast<std::int32_t>(rng() % (p.geometry.num_pages - 1));
      b.push_set(slot, first, pages);
    }
  }
}

struct Harness {
  StepCapacity cap;
  Stream stream;
  std::vector<DevicePageTable> tables;
  std::vector<std::vector<std::int32_t>> host_tables;
  std::unique_ptr<StepInput> input;
  std::unique_ptr<StepPrep> prep;
  std::vector<std::int32_t> chosen;       // [max_batch] kChosenPerRequest offsets (host)
  DeviceBuffer<std::int32_t> chosen_dev;  // the same on the device, bound to the prep

  explicit Harness(const StepCapacity& c) : cap(c) {
    for (int k = 0; k < kPools; ++k) {
      tables.emplace_back(cap.pools[k].geometry, 1, 0, stream.get());
      host_tables.emplace_back(static_cast<std::size_t>(cap.max_slots) *
                               cap.pools[k].geometry.max_pages_per_slot);
      init_page_table_host(cap.pools[k].geometry, host_tables.back());
    }
    stream.synchronize();
    input = std::make_unique<StepInput>(cap);
    prep = std::make_unique<StepPrep>(*input);
    for (int k = 0; k < kPools; ++k) prep->bind_table(k, tables[k].data());
    chosen.assign(static_cast<std::size_t>(cap.max_batch), 0);
    chosen_dev = DeviceBuffer<std::int32_t>(chosen.size());
    prep->set_chosen_rows(chosen_dev.data());
  }

  // Checks the device metadata block and tables against the CPU path for the last written step.
  void check(const std::string& what) {
    std::vector<std::int32_t> gpu(prep->layout().total_words);
    prep->download(gpu, stream);
    std::vector<std::int32_t> cpu(prep->layout().total_words, 0);
    prep_step_host(input->host_view(), cap, cpu, nullptr, chosen.data());
    const StepMetaLayout& l = prep->layout();
    const std::pair<const char*, std::pair<std::size_t, std::size_t>> fields[] = {
        {"scalars", {0, StepMetaLayout::kScalarWords}},
        {"slot", {l.slot, static_cast<std::size_t>(cap.max_batch)}},
        {"q_start", {l.q_start, static_cast<std::size_t>(cap.max_batch) + 1}},
        {"kv_len", {l.kv_len, static_cast<std::size_t>(cap.max_batch)}},
        {"encoder_len", {l.encoder_len, static_cast<std::size_t>(cap.max_batch)}},
        {"cu_seqlens_k", {l.cu_seqlens_k, static_cast<std::size_t>(cap.max_batch) + 1}},
        {"cu_encoder", {l.cu_encoder, static_cast<std::size_t>(cap.max_batch) + 1}},
        {"token_request", {l.token_request, static_cast<std::size_t>(cap.max_tokens)}},
        {"token_slot", {l.token_slot, static_cast<std::size_t>(cap.max_tokens)}},
        {"token_position", {l.token_position, static_cast<std::size_t>(cap.max_tokens)}},
        {"token_id", {l.token_id, static_cast<std::size_t>(cap.max_tokens)}},
        {"logit_row", {l.logit_row, static_cast<std::size_t>(cap.resolved_max_logit_rows())}},
    };
    for (const auto& [name, range] : fields) {
      for (std::size_t i = 0; i < range.second; ++i) {
        ASSERT_EQ(gpu[range.first + i], cpu[range.first + i])
            << what << ": field " << name << "[" << i << "]";
      }
    }
    for (int k = 0; k < kPools; ++k) {
      std::vector<std::int32_t> dev(host_tables[k].size());
      tables[k].download(dev, stream);
      ASSERT_EQ(dev, host_tables[k]) << what << ": page table of pool " << k;
    }
  }

  // Writes a random step of `mode` with n requests (+ random table commands) and applies the
  // commands to the host mirrors.
  void write_random(std::mt19937& rng, StepMode mode, std::int32_t n,
                    std::vector<TableCommandBatch>& batches) {
    const GeneratedStep s = random_step(rng, cap, mode, n);
    StepDesc d = s.desc();
    for (int k = 0; k < kPools; ++k) {
      random_commands(rng, cap.pools[k], batches[k]);
      d.tables[k] = &batches[k];
      apply_table_commands_host(batches[k].commands(), batches[k].page_ids(), cap.pools[k].geometry,
                                host_tables[k]);
    }
    input->write(d);
    // Offsets past either end of a request's rows are clamped.
    for (auto& c : chosen) c = static_cast<std::int32_t>(rng() % 12) - 2;
    chosen_dev.upload(chosen.data(), chosen.size(), stream);
  }
};

std::vector<TableCommandBatch> make_batches(const StepCapacity& cap) {
  std::vector<TableCommandBatch> b;
  for (int k = 0; k < kPools; ++k) {
    b.emplace_back(cap.pools[k].max_commands, cap.pools[k].max_page_ids);
  }
  return b;
}

TEST_F(StepPrepGpu, EagerMatchesCpuForEveryModeAndBatch) {
  for (const auto& [max_batch, max_tokens] : {std::pair{40, 300}, std::pair{600, 2400}}) {
    Harness h(capacity_with_pools(max_batch, max_tokens));
    std::vector<TableCommandBatch> batches = make_batches(h.cap);
    std::mt19937 rng(1234 + max_batch);
    const int steps = std::getenv("GRAPHDECODE_SANITIZE") ? 8 : 60;
    for (int i = 0; i < steps; ++i) {
      const auto mode = static_cast<StepMode>(i % kNumStepModes);
      const std::int32_t n = i == 0 ? max_batch : 1 + static_cast<std::int32_t>(rng() % max_batch);
      h.write_random(rng, mode, n, batches);
      h.input->upload(h.stream);
      h.prep->enqueue(h.stream);
      ASSERT_NO_FATAL_FAILURE(h.check("eager step " + std::to_string(i) + " " +
                                      std::string(step_mode_name(mode)) + " batch " +
                                      std::to_string(n) + " of " + std::to_string(max_batch)));
    }
  }
}

TEST_F(StepPrepGpu, CapturedPrepReplaysEveryStep) {
  Harness h(capacity_with_pools(64, 512));
  std::vector<TableCommandBatch> batches = make_batches(h.cap);
  std::mt19937 rng(99);
  const CudaGraph g = CudaGraph::capture(h.stream, [&] { h.prep->enqueue(h.stream); });
  EXPECT_EQ(g.num_nodes(), 6u);  // five table applies + the metadata kernel
  for (int i = 0; i < 40; ++i) {
    const auto mode = static_cast<StepMode>((i * 7) % kNumStepModes);
    const std::int32_t n = 1 + static_cast<std::int32_t>(rng() % 64);
    h.write_random(rng, mode, n, batches);
    h.input->upload(h.stream);
    g.launch(h.stream);
    ASSERT_NO_FATAL_FAILURE(h.check("replayed step " + std::to_string(i)));
  }
}

// The program of a StepGraphs that records the shape of each enqueue (and runs the prep).
class RecordingProgram : public StepProgram {
 public:
  explicit RecordingProgram(const StepPrep& prep) : prep_(prep) {}
  void enqueue(const StepShape& shape, cudaStream_t stream) override {
    shapes.push_back(shape);
    prep_.enqueue(stream);
  }
  std::vector<StepShape> shapes;

 private:
  const StepPrep& prep_;
};

TEST(StepShapes, ExtendRowsRoundUpToTheGranuleWithinCapacity) {
  EXPECT_EQ(kExtendRowGranule, 64);
  EXPECT_EQ(extend_rows(0, 2400), 64);
  EXPECT_EQ(extend_rows(1, 2400), 64);
  EXPECT_EQ(extend_rows(64, 2400), 64);
  EXPECT_EQ(extend_rows(65, 2400), 128);
  EXPECT_EQ(extend_rows(2399, 2400), 2400);
  EXPECT_EQ(extend_rows(2400, 2400), 2400);
  EXPECT_EQ(extend_rows(5, 40), 40);
}

// An eager extend step that no graph replays hands the program its own rows (the step's tokens
// rounded up to kExtendRowGranule; logits rows of a kEveryRow step no more than those), not
// max_tokens: a short prefill chunk must not cost a max_tokens-row GEMM. With an extend mode
// configured, the eager step keeps the capacity shape a replay has (the GEMM library sees the
// same row count, so graph-on and graph-off engines stay bitwise equal). Decode keeps its bucket.
TEST_F(StepPrepGpu, EagerExtendStepRunsItsOwnRows) {
  Harness h(capacity_with_pools(40, 2400));
  std::mt19937 rng(4321);
  RecordingProgram program(*h.prep);
  for (const bool extend_mode : {false, true}) {
    StepGraphsConfig config;
    config.buckets = {8, 40};
    config.use_graphs = false;
    if (extend_mode) config.modes = {GraphMode{StepMode::kExtend, 0, LogitRows::kEveryRow}};
    StepGraphs graphs(*h.input, program, config);
    int short_extends = 0;
    for (int i = 0; i < 40; ++i) {
      const StepMode mode = i % 4 == 3 ? StepMode::kDecode : StepMode::kExtend;
      const std::int32_t n = 1 + static_cast<std::int32_t>(rng() % 40);
      const GeneratedStep gs = random_step(rng, h.cap, mode, n);
      program.shapes.clear();
      ASSERT_EQ(graphs.step(gs.desc(), h.stream), StepPath::kEager);
      ASSERT_EQ(program.shapes.size(), 1u);
      const StepShape& sh = program.shapes[0];
      const std::int32_t tokens = h.input->num_tokens();
      const std::string what = "step " + std::to_string(i) + ", " + std::to_string(n) +
                               " requests, " + std::to_string(tokens) + " tokens";
      EXPECT_EQ(sh.mode, mode) << what;
      if (mode == StepMode::kDecode) {
        EXPECT_EQ(sh.token_capacity, n <= 8 ? 8 : 40) << what;
      } else if (extend_mode) {
        EXPECT_EQ(sh.token_capacity, h.cap.max_tokens) << what;
      } else {
        EXPECT_GE(sh.token_capacity, tokens) << what;
        EXPECT_LT(sh.token_capacity, std::max(tokens, 1) + kExtendRowGranule) << what;
        EXPECT_TRUE(sh.token_capacity % kExtendRowGranule == 0 ||
                    sh.token_capacity == h.cap.max_tokens)
            << what;
        if (gs.logits == LogitRows::kEveryRow) {
          EXPECT_LE(sh.logit_capacity, sh.token_capacity) << what;
          EXPECT_GE(sh.logit_capacity, tokens) << what;
        }
        short_extends += sh.token_capacity < h.cap.max_tokens;
      }
    }
    if (!extend_mode) EXPECT_GT(short_extends, 10) << "the random steps should be short";
    h.stream.synchronize();
  }
}

}  // namespace
}  // namespace graphdecode
