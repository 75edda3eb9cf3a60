// GPU: graph safety. PagedAttention::run is captured once in a CUDA graph (non-default stream,
// cudaStreamCaptureModeThreadLocal); then the device metadata is changed IN PLACE (num_requests,
// q lengths, KV extents / encoder lengths, window, page tables, Q) and the graph replayed. The
// replay must equal an eager run on the same inputs bitwise, and match the float64 reference.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "attention_check.h"
#include "common/cuda_check.h"
#include "common/stream.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;

// Owns a captured graph and its executable instance. Move-only; never throws on destruction.
class CapturedGraph {
 public:
  template <typename F>
  static CapturedGraph capture(cudaStream_t stream, F&& body) {
    CapturedGraph g;
    GD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      body();
    } catch (...) {
      cudaGraph_t partial = nullptr;
      GD_CUDA_NOTHROW(cudaStreamEndCapture(stream, &partial));  // end capture on every error path
      if (partial) GD_CUDA_NOTHROW(cudaGraphDestroy(partial));
      throw;
    }
    GD_CUDA(cudaStreamEndCapture(stream, &g.graph_));
    GD_CUDA(cudaGraphInstantiate(&g.exec_, g.graph_, 0));
    return g;
  }
  CapturedGraph(CapturedGraph&& o) noexcept
      : graph_(std::exchange(o.graph_, nullptr)), exec_(std::exchange(o.exec_, nullptr)) {}
  CapturedGraph& operator=(CapturedGraph&&) = delete;
  ~CapturedGraph() {
    if (exec_) GD_CUDA_NOTHROW(cudaGraphExecDestroy(exec_));
    if (graph_) GD_CUDA_NOTHROW(cudaGraphDestroy(graph_));
  }
  void replay(cudaStream_t stream) const { GD_CUDA(cudaGraphLaunch(exec_, stream)); }

 private:
  CapturedGraph() = default;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

class AttentionGraph : public GpuTest, public ::testing::WithParamInterface<bool> {};

struct Step {
  std::vector<Req> reqs;
  std::int32_t window = -1;
};

// Captures on steps[0], then replays every step (steps[0] included) after uploading it in place.
void replay_steps(const Shape& shape, std::vector<Step> steps, bool deterministic) {
  SCOPED_TRACE(seed_note());
  SCOPED_TRACE(deterministic ? "deterministic" : "default split");
  Rng rng = test_rng();
  Capacity cap{};
  for (Step& s : steps) {
    s.reqs = shrink_for_sanitizer(std::move(s.reqs), shape.mode);
    cap = max_capacity(cap, capacity_for(shape, s.reqs, rng));
  }
  Stream stream;
  HostPagedBatch host(shape, cap);
  DevicePagedBatch dev(shape, cap);
  const PagedAttention attn(host.config(deterministic));

  host.fill(steps[0].reqs, FillOptions{steps[0].window, steps[0].window >= 0}, rng);
  dev.upload(host, stream);
  stream.synchronize();
  const CapturedGraph graph = CapturedGraph::capture(
      stream, [&] { attn.run(dev.batch(), dev.view(), dev.q(), dev.out(), dev.lse(), stream); });

  const std::int32_t row_elems = shape.num_q_heads * shape.head_dim;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    if (i > 0) {
      host.fill(s.reqs, FillOptions{s.window, s.window >= 0}, rng);
      dev.upload(host, stream);
    }
    dev.poison_outputs(stream);
    graph.replay(stream);
    Outputs replayed;
    replayed.out = dev.download_out(host.total_q(), stream);
    replayed.lse = dev.download_lse(host.total_q(), stream);
    const Outputs eager = run_eager(attn, dev, host.total_q(), stream);
    CaseOptions o;
    o.fill.window_left = s.window;
    const std::string what = "step " + std::to_string(i) + ": " + describe(shape, s.reqs, o);
    EXPECT_TRUE(bitwise_equal(replayed, 0, eager, 0, host.total_q(), row_elems, shape.num_q_heads))
        << "graph replay != eager, " << what;
    EXPECT_TRUE(matches_reference(host.reference(), replayed.out, &replayed.lse, shape.dtype))
        << "graph replay vs reference, " << what;
  }
}

TEST_P(AttentionGraph, CausalReplayWithNewMetadata) {
  Rng rng = test_rng();
  std::vector<Step> steps;
  steps.push_back({decode_reqs(rng, 8, 1, 3000), -1});           // captured: decode, full
  steps.push_back({extend_reqs(rng, 20, 1, 40, 0, 2000), 100});  // more requests, extend, SWA
  steps.push_back({{{1, 30000}, {4, 9000}}, -1});                // fewer, long: split-KV
  steps.push_back({decode_reqs(rng, 30, 1, 2500), 0});           // window 0
  auto mixed = extend_reqs(rng, 6, 1, 8, 0, 5000);
  for (const Req& r : decode_reqs(rng, 6, 1, 5000)) mixed.push_back(r);
  steps.push_back({mixed, 4000});                              // mixed verify/decode, big window
  steps.push_back({{{1, 17}}, 15});                            // one request, window = page - 1
  steps.push_back({decode_reqs(rng, 8, 8200, 20000), -1});     // long chunks, split-KV
  steps.push_back({decode_reqs(rng, 8, 12000, 20000), 9000});  // long chunks, window
  replay_steps({32, 8, 128, 16, DType::kBF16, AttentionMode::kCausal}, steps, GetParam());
}

TEST_P(AttentionGraph, CrossReplayWithNewEncoderLengths) {
  Rng rng = test_rng();
  auto enc = [&](std::int32_t n, std::int32_t max_q) {
    std::uniform_int_distribution<std::int32_t> e(1, 5000), q(1, max_q);
    std::vector<Req> reqs;
    for (std::int32_t i = 0; i < n; ++i) reqs.push_back(Req{q(rng), e(rng)});
    return reqs;
  };
  std::vector<Step> steps;
  steps.push_back({enc(8, 1), -1});  // captured
  steps.push_back({enc(24, 1), -1});
  steps.push_back({{{1, 1}, {1, 4999}, {1, 17}}, -1});
  steps.push_back({enc(5, 6), -1});
  steps.push_back({{{2, 20000}}, -1});
  steps.push_back({decode_reqs(rng, 8, 8200, 20000), -1});  // long chunks, split-KV
  replay_steps({32, 8, 128, 16, DType::kFP16, AttentionMode::kCross}, steps, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Split, AttentionGraph, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Deterministic" : "Default";
                         });

}  // namespace
}  // namespace graphdecode
