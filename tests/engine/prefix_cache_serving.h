// The prefix-cache GPU tests' serving harness (test_prefix_cache_gpu.cu and
// test_prefix_cache_spec_gpu.cu): an Engine stepped to the end, every request's tokens kept and,
// when asked, the logits row of every position it sampled.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "common/cuda_check.h"
#include "engine/engine.h"

namespace graphdecode::testing {

constexpr std::int32_t kPage = 16;  // the engines' page size in these tests

inline std::vector<std::int32_t> cat(std::vector<std::int32_t> a,
                                     const std::vector<std::int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// What a served request produced: its tokens and (when asked) the logits row of every sampled
// position, read after each step from the model's logits (plain decoding: row i = request i).
struct Served {
  std::map<RequestId, std::vector<std::int32_t>> tokens;
  std::map<RequestId, std::vector<std::vector<float>>> logits;
  std::map<RequestId, int> finished;
};

class Server {
 public:
  Server(Engine& e, bool keep_logits) : e_(e), keep_logits_(keep_logits) {}
  RequestId submit(RequestSpec s) {
    return e_.submit(std::move(s), [this](const TokenEvent& ev) {
      EXPECT_EQ(out.finished[ev.id], 0) << "token after the finish of request " << ev.id;
      out.tokens[ev.id].push_back(ev.token);
      if (ev.finished) ++out.finished[ev.id];
    });
  }
  bool step() {
    if (!e_.step()) return false;
    if (!keep_logits_) return true;
    const StepPlan& plan = e_.last_plan();
    const auto vocab = static_cast<std::size_t>(e_.model().config().vocab_size);
    for (std::size_t i = 0; i < plan.requests.size(); ++i) {
      if (!plan.requests[i].samples) continue;
      std::vector<float> row(vocab);
      GD_CUDA(cudaMemcpy(row.data(), e_.model().logits() + i * vocab, vocab * sizeof(float),
                         cudaMemcpyDeviceToHost));
      out.logits[plan.requests[i].id].push_back(std::move(row));
    }
    return true;
  }
  void run() {
    while (step()) {
    }
  }
  Served out;

 private:
  Engine& e_;
  bool keep_logits_;
};

}  // namespace graphdecode::testing
