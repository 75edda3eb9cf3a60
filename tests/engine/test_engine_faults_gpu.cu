// The serving loop's edges. A CUDA error inside a step (an out-of-range write by a test-only
// kernel on the engine's stream) is an Error from step() naming the step; the engine then refuses
// further steps and submissions by name, and destroying it neither throws nor hangs (the fault
// corrupts the CUDA context for good, so it runs in a child process: a gtest death test,
// re-executed). A throwing callback loses no other event of its step. A cancel at the step that
// would have finished a request. Engines created and destroyed in a loop leave neither device
// nor host memory behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_check.h"  // sanitize_mode
#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/engine.h"
#include "engine/model_config.h"
#include "engine/weights.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

class EngineFaults : public testing::GpuTest {};

__global__ void write_out_of_range(int* p) {
  p[threadIdx.x] = 1;
}

RequestSpec request(std::int32_t len, std::int32_t first, std::int32_t new_tokens) {
  RequestSpec s;
  for (std::int32_t i = 0; i < len; ++i) s.prompt.push_back((first + 37 * i) % 500);
  s.max_new_tokens = new_tokens;
  return s;
}

[[noreturn]] void child_check_failed(const char* what) {
  std::fprintf(stderr, "FAULT-CHECK-FAILED: %s\n", what);
  std::fflush(stderr);
  std::_Exit(3);
}

// Runs in the death test's child: any failed expectation exits with 3 and says which.
[[noreturn]] void fault_inside_a_step(bool pipeline) {
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, 11);
  EngineConfig ec;
  ec.max_batch = 4;
  ec.max_context = 64;
  // Pipelined, the fault may surface at step 2's launch, at the launch of step 3 (planned ahead)
  // or at step 2's wait: each names step 2, the step being delivered.
  ec.pipeline = pipeline;
  std::string step_field, step_value, engine_field, submit_field;
  {
    Engine engine(w, ec);
    for (int r = 0; r < 3; ++r) engine.submit(request(8 + r, r, 20));
    if (!engine.step()) child_check_failed("the prefill step ran");
    // The fault: a kernel of the step's stream writes where nothing is mapped.
    write_out_of_range<<<1, 32, 0, engine.stream()>>>(reinterpret_cast<int*>(0x1000));
    try {
      engine.step();
      child_check_failed("the faulting step returned normally");
    } catch (const Error& e) {
      step_field = e.field();
      step_value = e.value();
      std::fprintf(stderr, "step(): %s\n", e.what());
    }
    if (!engine.failed()) child_check_failed("the engine is marked failed");
    try {
      engine.step();
      child_check_failed("a failed engine ran another step");
    } catch (const Error& e) {
      engine_field = e.field();
    }
    try {
      engine.submit(request(4, 1, 4));
      child_check_failed("a failed engine took a request");
    } catch (const Error& e) {
      submit_field = e.field();
    }
  }  // destroyed here, after the fault
  std::fprintf(stderr, "FAULT-HANDLED step=%s engine=%s submit=%s at [%s]\n", step_field.c_str(),
               engine_field.c_str(), submit_field.c_str(), step_value.c_str());
  std::fflush(stderr);
  std::_Exit(0);
}

TEST_F(EngineFaults, CudaErrorInsideAStepFailsTheEngineByName) {
  if (testing::sanitize_mode()) GTEST_SKIP() << "a deliberate illegal address";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child starts CUDA afresh
  EXPECT_EXIT(
      fault_inside_a_step(false), ::testing::ExitedWithCode(0),
      "FAULT-HANDLED step=step engine=engine submit=engine at \\[2 \\(decode, 3 requests\\)\\]");
}

TEST_F(EngineFaults, CudaErrorInsideAPipelinedStepFailsTheEngineByName) {
  if (testing::sanitize_mode()) GTEST_SKIP() << "a deliberate illegal address";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      fault_inside_a_step(true), ::testing::ExitedWithCode(0),
      "FAULT-HANDLED step=step engine=engine submit=engine at \\[2 \\(decode, 3 requests\\)\\]");
}

// A callback that throws: step() rethrows it, but only after every other event of the step was
// delivered (tokens of other requests, the cancellations callbacks made), and the engine serves on.
TEST_F(EngineFaults, AThrowingCallbackLosesNoOtherEvent) {
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, 13);
  EngineConfig ec;
  ec.max_batch = 4;
  ec.max_context = 64;
  Engine engine(w, ec);
  std::vector<TokenEvent> a_events, b_events, c_events;
  int throws = 0;
  RequestId c = 0;
  const RequestId a = engine.submit(request(6, 1, 10), [&](const TokenEvent& e) {
    a_events.push_back(e);
    if (a_events.size() == 3) {
      engine.cancel(c);  // a cancellation made just before the throw still arrives
      ++throws;
      throw std::runtime_error("callback failed");
    }
  });
  const RequestId b =
      engine.submit(request(7, 2, 10), [&](const TokenEvent& e) { b_events.push_back(e); });
  c = engine.submit(request(8, 3, 10), [&](const TokenEvent& e) { c_events.push_back(e); });
  int caught = 0;
  for (;;) {
    try {
      if (!engine.step()) break;
    } catch (const std::runtime_error& e) {
      ++caught;
    }
  }
  EXPECT_EQ(throws, 1);
  EXPECT_EQ(caught, 1);
  EXPECT_EQ(a_events.size(), 10u);
  EXPECT_EQ(b_events.size(), 10u);
  ASSERT_EQ(c_events.size(), 3u);  // two tokens, then the cancellation from a's callback
  EXPECT_TRUE(c_events.back().cancelled && c_events.back().finished);
  EXPECT_TRUE(a_events.back().finished && b_events.back().finished);
  EXPECT_EQ(engine.stats().generated_tokens, 22);
  EXPECT_EQ(engine.stats().finished, 3);
  EXPECT_TRUE(engine.idle() && !engine.failed());
  EXPECT_EQ(engine.ledger().free_pages(0), engine.ledger().usable_pages(0));
  static_cast<void>(a);
  static_cast<void>(b);
}

// Cancellation at the step that would have finished a request: cancelled between steps when one
// token is left, it gets the cancel event and never its last token; cancelled from another
// request's callback during the step that produced its last token, the finish wins (Error
// "request") and its final event still arrives, after the canceller's.
TEST_F(EngineFaults, CancelAtTheStepThatWouldHaveFinishedIt) {
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, 14);
  EngineConfig ec;
  ec.max_batch = 4;
  ec.max_context = 64;
  for (const bool speculative : {false, true}) {
    EngineConfig c = ec;
    if (speculative) c.speculative.max_draft_tokens = 1;  // still one token per step: ngram
    if (speculative) c.speculative.proposer = SpecProposer::kNgram;
    Engine engine(w, c);
    std::vector<TokenEvent> a_ev, b_ev, c_ev;
    std::string race_field = "<no error>";
    RequestId b = 0;
    // Submission order = event order in a step: c's callback runs before b's final event.
    const RequestId cid = engine.submit(request(9, 1, 8), [&](const TokenEvent& e) {
      c_ev.push_back(e);
      if (c_ev.size() == 5) {
        try {
          engine.cancel(b);
        } catch (const Error& err) {
          race_field = err.field();
        }
      }
    });
    b = engine.submit(request(9, 2, 5), [&](const TokenEvent& e) { b_ev.push_back(e); });
    const RequestId a =
        engine.submit(request(9, 3, 5), [&](const TokenEvent& e) { a_ev.push_back(e); });
    bool a_cancelled = false;
    while (engine.step()) {
      if (a_ev.size() == 4 && !a_cancelled) {
        engine.cancel(a);  // one token left: the next step would have finished it
        a_cancelled = true;
      }
    }
    const char* what = speculative ? "speculative" : "plain";
    if (speculative) {
      // With drafts, requests may commit several tokens per step: only check the invariants.
      EXPECT_TRUE(a_ev.back().finished) << what;
      EXPECT_TRUE(b_ev.back().finished && c_ev.back().finished) << what;
    } else {
      ASSERT_EQ(a_ev.size(), 5u) << what;
      EXPECT_TRUE(a_ev[4].cancelled && a_ev[4].finished && a_ev[4].token == kNoToken);
      EXPECT_EQ(race_field, "request") << what;
      ASSERT_EQ(b_ev.size(), 5u) << what;
      EXPECT_TRUE(b_ev[4].finished && !b_ev[4].cancelled && b_ev[4].token != kNoToken);
      EXPECT_EQ(c_ev.size(), 8u);
    }
    for (const auto* ev : {&a_ev, &b_ev, &c_ev})
      for (std::size_t i = 0; i + 1 < ev->size(); ++i)
        EXPECT_FALSE((*ev)[i].finished) << what << ": an event after a final one";
    EXPECT_TRUE(engine.idle());
    EXPECT_EQ(engine.ledger().free_pages(0), engine.ledger().usable_pages(0));
    static_cast<void>(cid);
  }
}

std::size_t host_rss_bytes() {
  std::ifstream f("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

std::size_t device_free_bytes() {
  std::size_t free = 0, total = 0;
  GD_CUDA(cudaDeviceSynchronize());
  GD_CUDA(cudaMemGetInfo(&free, &total));
  return free;
}

TEST_F(EngineFaults, CreateAndDestroyInALoopLeavesNothingBehind) {
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, 12);
  const auto cycle = [&](int i) {
    EngineConfig ec;
    ec.max_batch = 8;
    ec.max_context = 128;
    if (i % 2 == 1) ec.speculative.max_draft_tokens = 3;  // a draft model's pools and graphs too
    Engine engine(w, ec, i % 2 == 1 ? &w : nullptr);
    for (int r = 0; r < 5; ++r) engine.submit(request(10 + 3 * r, i + r, 12));
    engine.run_until_idle();
    EXPECT_EQ(engine.stats().finished, 5);
  };
  cycle(0);  // warm-up: modules, cuBLAS, allocator arenas
  cycle(1);
  // Free device memory is the whole GPU's: another process (a parallel test, a soak) moves it
  // too (152 MiB of "growth" was seen beside two soaks). A leak grows in every round, so the
  // check takes the round with the least growth.
  const int cycles = testing::sanitize_mode() ? 4 : 16;
  const int rounds = testing::sanitize_mode() ? 1 : 3;
  const double mib = 1.0 / (1 << 20);
  double dev_growth = 0, rss_growth = 0;
  for (int round = 0; round < rounds; ++round) {
    const std::size_t dev0 = device_free_bytes(), rss0 = host_rss_bytes();
    for (int i = 0; i < cycles; ++i) cycle(i);
    const std::size_t dev1 = device_free_bytes(), rss1 = host_rss_bytes();
    const double dev = (static_cast<double>(dev0) - static_cast<double>(dev1)) * mib;
    const double rss = (static_cast<double>(rss1) - static_cast<double>(rss0)) * mib;
    std::printf(
        "[ create/destroy ] round %d, %d engines: device free %.1f -> %.1f MiB (growth %.2f MiB), "
        "host RSS %.1f -> %.1f MiB (growth %.2f MiB)\n",
        round, cycles, dev0 * mib, dev1 * mib, dev, rss0 * mib, rss1 * mib, rss);
    dev_growth = round == 0 ? dev : std::min(dev_growth, dev);
    rss_growth += rss;  // host RSS is this process's own: every round counts
  }
  // Under compute-sanitizer the tool's own shadow allocations grow with the run: no bound there.
  if (testing::sanitize_mode()) return;
  // One engine of this size holds several MiB of device memory and its weights' host copies:
  // a leak of one per cycle would exceed these bounds many times over.
  EXPECT_LE(dev_growth, 2.0);
  EXPECT_LE(rss_growth, 16.0 * rounds);
}

}  // namespace
}  // namespace graphdecode
