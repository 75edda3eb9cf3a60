// GPU: run_planned(..., PriorWrites::kQueryAndNewKv) behind a kernel that is still writing.
// A step is plan() -> poison (q and this step's K/V rows set to NaN) -> late_writer (triggers its
// PDL dependents at once, sleeps, then writes the true q and new rows) -> attention. The attention
// kernel starts while late_writer sleeps and copies older K/V before it waits; it must still read
// the true q and new rows: out/lse match the float64 reference and are bitwise those of the
// default (kAnything) launch, eagerly and as graph replays, for decode, verify / draft-extend,
// sliding windows, page sizes 1..64, head dims 64..256, adaptive and deterministic split-KV.
// Cross mode ignores the promise (encoder K/V may be new), so there every K/V row comes late.
// Overlap check (not under compute-sanitizer, which serializes kernels): an OLDER row written late
// IS read stale by some rows, i.e. the kernel really runs ahead of its predecessor, so the tests
// above exercise the early path rather than passing because the launches happened to serialize.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attention_check.h"
#include "common/buffers.h"
#include "common/cuda_check.h"
#include "common/pdl.cuh"
#include "common/stream.h"
#include "graphs/cuda_graph.h"
#include "memory/kv_layout.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;

// One 16-byte store of the step's inputs: its destination and its true value.
struct Piece {
  uint4* dst;
  uint4 value;
};

// poison: every destination gets all-ones bits (NaN in bf16 / fp16). Else the true values, after
// `delay_ns`, with the dependents (the attention launch) released at once.
__global__ void late_writer(const Piece* pieces, int n, bool poison, long long delay_ns) {
  pdl_launch_dependents();
  if (!poison && delay_ns > 0) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
      __nanosleep(1000);
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (static_cast<long long>(t - t0) < delay_ns);
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    *pieces[i].dst = poison ? make_uint4(~0u, ~0u, ~0u, ~0u) : pieces[i].value;
}

void launch_writer(const DeviceBuffer<Piece>& pieces, int n, bool poison, long long delay_ns,
                   cudaStream_t stream) {
  if (n == 0) return;
  late_writer<<<64, 256, 0, stream>>>(pieces.data(), n, poison, delay_ns);
  GD_CHECK_LAUNCH();
}

// The 16-byte pieces of rows [begin(r), end(r)) of every request's K and V, and of all of q.
template <typename BeginFn, typename EndFn>
std::vector<Piece> step_pieces(const HostPagedBatch& host, DevicePagedBatch& dev, bool with_q,
                               BeginFn begin, EndFn end) {
  const Shape& sh = host.shape();
  const PagedKvView hv = host.host_view();
  const PagedKvView dv = dev.view();
  const std::int32_t d = sh.head_dim, vecs = d / 8;
  std::vector<Piece> pieces;
  const auto add = [&](void* dev_base, const std::vector<std::uint16_t>& src, std::int64_t off) {
    for (std::int32_t c = 0; c < vecs; ++c) {
      Piece p;
      p.dst = reinterpret_cast<uint4*>(static_cast<std::uint16_t*>(dev_base) + off + 8 * c);
      std::memcpy(&p.value, &src[off + 8 * c], 16);
      pieces.push_back(p);
    }
  };
  for (std::int32_t r = 0; r < host.num_requests(); ++r) {
    for (std::int32_t pos = begin(r); pos < end(r); ++pos) {
      const std::int32_t page = page_of_token(hv, host.slot()[r], pos);
      if (page == kInvalidPage) continue;
      for (std::int32_t h = 0; h < sh.num_kv_heads; ++h) {
        const std::int64_t off = kv_element_offset(hv, page, h, pos % sh.page_size);
        add(dv.k, host.k(), off);
        add(dv.v, host.v(), off);
      }
    }
  }
  if (with_q) {
    const std::int64_t q_rows = static_cast<std::int64_t>(host.total_q()) * sh.num_q_heads;
    for (std::int64_t row = 0; row < q_rows; ++row) add(dev.q_mut(), host.q(), row * d);
  }
  return pieces;
}

struct EarlyCase {
  Shape shape;
  std::vector<Req> reqs;
  std::int32_t window = -1;
};

constexpr long long kDelayNs = 100'000;  // 100 us: far longer than the kernel's early copies

Outputs download(const DevicePagedBatch& dev, std::int32_t total_q, cudaStream_t stream) {
  Outputs o;
  o.out = dev.download_out(total_q, stream);
  o.lse = dev.download_lse(total_q, stream);
  return o;
}

void check_early(const EarlyCase& c, bool deterministic, Rng& rng) {
  const std::vector<Req> reqs = shrink_for_sanitizer(c.reqs, c.shape.mode);
  const Capacity cap = capacity_for(c.shape, reqs, rng);
  HostPagedBatch host(c.shape, cap);
  host.fill(reqs, FillOptions{c.window, c.window >= 0}, rng);
  Stream stream;
  DevicePagedBatch dev(c.shape, cap);
  dev.upload(host, stream);
  const PagedAttention attn(host.config(deterministic, deterministic ? 256 : 0));
  const bool cross = c.shape.mode == AttentionMode::kCross;
  // Causal: this step's rows are [kv_len - q_len, kv_len). Cross: every encoder row.
  const std::vector<Piece> late = step_pieces(
      host, dev, /*with_q=*/true,
      [&](std::int32_t r) { return cross ? 0 : reqs[r].kv_len - reqs[r].q_len; },
      [&](std::int32_t r) { return reqs[r].kv_len; });
  DeviceBuffer<Piece> d_late(late.size());
  d_late.upload(late.data(), late.size(), stream);
  const int n = static_cast<int>(late.size());

  // Reference launch: everything in place, default promise.
  dev.poison_outputs(stream);
  attn.plan(dev.batch(), stream);
  attn.run_planned(dev.batch(), dev.view(), dev.q(), dev.out(), dev.lse(), stream);
  const Outputs in_order = download(dev, host.total_q(), stream);

  const auto step = [&] {
    attn.plan(dev.batch(), stream);
    launch_writer(d_late, n, /*poison=*/true, 0, stream);
    launch_writer(d_late, n, /*poison=*/false, kDelayNs, stream);
    attn.run_planned(dev.batch(), dev.view(), dev.q(), dev.out(), dev.lse(), stream,
                     PriorWrites::kQueryAndNewKv);
  };
  CaseOptions o;
  o.fill.window_left = c.window;
  o.deterministic = deterministic;
  const std::string what = describe(c.shape, reqs, o);
  const std::int32_t row_elems = c.shape.num_q_heads * c.shape.head_dim;

  dev.poison_outputs(stream);
  step();
  const Outputs eager = download(dev, host.total_q(), stream);
  EXPECT_TRUE(bitwise_equal(eager, 0, in_order, 0, host.total_q(), row_elems, c.shape.num_q_heads))
      << "early start (eager) != in-order launch, " << what;
  EXPECT_TRUE(matches_reference(host.reference(), eager.out, &eager.lse, c.shape.dtype))
      << "early start (eager) vs reference, " << what;

  stream.synchronize();
  const CudaGraph graph = CudaGraph::capture(stream, step);
  for (int rep = 0; rep < 2; ++rep) {
    dev.poison_outputs(stream);
    graph.launch(stream);
    const Outputs replayed = download(dev, host.total_q(), stream);
    EXPECT_TRUE(
        bitwise_equal(replayed, 0, in_order, 0, host.total_q(), row_elems, c.shape.num_q_heads))
        << "early start (graph replay " << rep << ") != in-order launch, " << what;
  }
}

class AttentionEarly : public GpuTest, public ::testing::WithParamInterface<bool> {};

constexpr Shape kLlama{32, 8, 128, 16, DType::kBF16, AttentionMode::kCausal};

TEST_P(AttentionEarly, Decode) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  check_early({kLlama, decode_reqs(rng, 13, 1, 5000)}, GetParam(), rng);
  check_early({kLlama, {{1, 1}}}, GetParam(), rng);      // the only key is the new one
  check_early({kLlama, {{1, 20000}}}, GetParam(), rng);  // one request, split-KV
  check_early({kLlama, decode_reqs(rng, 64, 1, 3000)}, GetParam(), rng);
  check_early({{28, 4, 64, 1, DType::kFP16, AttentionMode::kCausal},  // group 7, page 1, d64
               decode_reqs(rng, 9, 1, 2000)},
              GetParam(), rng);
  check_early({{16, 8, 256, 64, DType::kBF16, AttentionMode::kCausal},  // d256: 2 stages
               decode_reqs(rng, 6, 1, 3000)},
              GetParam(), rng);
}

TEST_P(AttentionEarly, ExtendAndSlidingWindow) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  check_early({kLlama, extend_reqs(rng, 7, 1, 40, 0, 3000)}, GetParam(), rng);     // verify / v2
  check_early({kLlama, extend_reqs(rng, 3, 100, 300, 0, 2000)}, GetParam(), rng);  // extend layout
  check_early({kLlama, {{1, 130}, {5, 64}, {3, 3}}, 15}, GetParam(), rng);   // window = page - 1
  check_early({kLlama, decode_reqs(rng, 10, 1, 4000), 0}, GetParam(), rng);  // only new keys
  check_early({kLlama, extend_reqs(rng, 5, 1, 90, 0, 3000), 70}, GetParam(), rng);
  check_early({{32, 8, 128, 64, DType::kFP16, AttentionMode::kCausal},
               extend_reqs(rng, 6, 1, 20, 0, 5000),
               1000},
              GetParam(), rng);
}

TEST_P(AttentionEarly, CrossIgnoresThePromise) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  check_early({{32, 8, 128, 16, DType::kBF16, AttentionMode::kCross},
               {{1, 1}, {1, 4999}, {2, 17}, {1, 300}}},
              GetParam(), rng);
}

INSTANTIATE_TEST_SUITE_P(Split, AttentionEarly, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Deterministic" : "Default";
                         });

// The early path is live: an OLDER key row (key 0, inside the first tile that every request's
// first chunk copies before its wait) written late is read stale by the CTAs that start early, so
// some (token, head) rows differ from the in-order result, in a graph replay (how a model runs its
// steps). (NaN in a chunk's keys makes that chunk's partial empty, lse -inf, so rows are compared,
// not NaN-counted.) Not in sanitize mode: compute-sanitizer serializes the kernels. Eager launches
// are not asserted (the driver's choice); their count is printed.
class AttentionEarlyOverlap : public GpuTest {};

TEST_F(AttentionEarlyOverlap, OlderRowsWrittenLateAreReadStale) {
  if (sanitize_mode()) GTEST_SKIP() << "kernels are serialized under compute-sanitizer";
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  const std::vector<Req> reqs = decode_reqs(rng, 8, 200, 3000);
  const Capacity cap = capacity_for(kLlama, reqs, rng);
  HostPagedBatch host(kLlama, cap);
  host.fill(reqs, FillOptions{}, rng);
  Stream stream;
  DevicePagedBatch dev(kLlama, cap);
  dev.upload(host, stream);
  const PagedAttention attn(host.config());
  const reference::AttentionResult ref = host.reference();
  const std::vector<Piece> old_row = step_pieces(
      host, dev, /*with_q=*/false, [](std::int32_t) { return 0; }, [](std::int32_t) { return 1; });
  DeviceBuffer<Piece> d_old(old_row.size());
  d_old.upload(old_row.data(), old_row.size(), stream);
  const int n = static_cast<int>(old_row.size());
  for (const PriorWrites prior : {PriorWrites::kAnything, PriorWrites::kQueryAndNewKv}) {
    const auto step = [&] {
      attn.plan(dev.batch(), stream);
      launch_writer(d_old, n, /*poison=*/true, 0, stream);
      launch_writer(d_old, n, /*poison=*/false, kDelayNs, stream);
      attn.run_planned(dev.batch(), dev.view(), dev.q(), dev.out(), dev.lse(), stream, prior);
    };
    stream.synchronize();
    const CudaGraph graph = CudaGraph::capture(stream, step);
    for (const bool replay : {false, true}) {
      dev.poison_outputs(stream);
      if (replay)
        graph.launch(stream);
      else
        step();
      const std::vector<float> lse = dev.download_lse(host.total_q(), stream);
      int stale_rows = 0;  // rows whose lse is not the reference's (key 0 read as NaN)
      for (std::size_t i = 0; i < lse.size(); ++i)
        stale_rows += !(std::fabs(lse[i] - ref.lse[i]) <= 1e-2);
      const char* mode = replay ? "graph replay" : "eager";
      if (prior == PriorWrites::kAnything) {
        EXPECT_EQ(stale_rows, 0) << mode << ": the default launch must wait for the late writer";
        EXPECT_TRUE(
            matches_reference(ref, dev.download_out(host.total_q(), stream), &lse, kLlama.dtype))
            << mode;
      } else if (replay) {
        EXPECT_GT(stale_rows, 0) << "with kQueryAndNewKv the CTAs that start early copy key 0 "
                                    "before the late writer restores it";
        std::printf("graph kQueryAndNewKv replay: %d of %zu rows read the stale key 0\n",
                    stale_rows, lse.size());
      } else {
        std::printf("eager kQueryAndNewKv launch: %d of %zu rows read the stale key 0\n",
                    stale_rows, lse.size());
      }
    }
  }
}

}  // namespace
}  // namespace graphdecode
