// GPU: causal extend vs the float64 reference — prefill with prefix (q lengths 1..2000 on prefixes
// 0..thousands), target-verify (N = 4, 8 queries per request), draft-extend-v2 (per-request
// extend lengths; KV extent = prefix + extend, so the just-written rows must be read), and the
// sliding window on all of them (with kInvalidPage before each step's first visible key).
#include <gtest/gtest.h>

#include <vector>

#include "attention_check.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;

class AttentionExtend : public GpuTest {};

constexpr auto kBF16 = DType::kBF16;
constexpr auto kFP16 = DType::kFP16;
constexpr auto kCausal = AttentionMode::kCausal;

// (q_len, prefix) -> Req with kv_len = prefix + q_len.
Req extend(std::int32_t q_len, std::int32_t prefix) {
  return Req{q_len, prefix + q_len};
}

TEST_F(AttentionExtend, WithPrefix) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  // Long extends on long prefixes; few heads keep the reference fast.
  EXPECT_TRUE(run_case({4, 1, 128, 16, kBF16, kCausal},
                       {extend(2000, 3000), extend(1, 1), extend(17, 63), extend(300, 1000),
                        extend(64, 0), extend(129, 4096)},
                       {}, rng));
  EXPECT_TRUE(
      run_case({32, 8, 128, 16, kBF16, kCausal}, extend_reqs(rng, 4, 1, 128, 0, 3000), {}, rng));
  EXPECT_TRUE(
      run_case({7, 1, 64, 1, kFP16, kCausal}, extend_reqs(rng, 8, 1, 300, 0, 3000), {}, rng));
  EXPECT_TRUE(
      run_case({8, 1, 256, 64, kFP16, kCausal}, extend_reqs(rng, 4, 1, 500, 0, 2000), {}, rng));
  EXPECT_TRUE(
      run_case({28, 4, 128, 16, kBF16, kCausal}, extend_reqs(rng, 5, 1, 100, 0, 1000), {}, rng));
}

TEST_F(AttentionExtend, PrefillWithoutPrefix) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  EXPECT_TRUE(run_case({8, 2, 128, 16, kBF16, kCausal},
                       {extend(1000, 0), extend(1, 0), extend(65, 0), extend(16, 0)}, {}, rng));
  EXPECT_TRUE(run_case({16, 2, 64, 64, kFP16, kCausal}, {extend(777, 0), extend(64, 0)}, {}, rng));
}

// Head dim 64 prefill tiles (more than 16 rows) run the warpgroup-MMA body on sm_90a
// (attend_wgmma.cuh): bf16 and fp16, GQA groups 4, 3 (63-row tiles), 8 and 1 (64 tokens a
// tile), partial last tiles, prefixes across page and tile boundaries, and windows.
TEST_F(AttentionExtend, HeadDim64Prefill) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  EXPECT_TRUE(run_case({8, 2, 64, 16, kBF16, kCausal},
                       {extend(1200, 2000), extend(1, 1), extend(17, 63), extend(300, 1000),
                        extend(64, 0), extend(129, 4096), extend(33, 15)},
                       {}, rng));
  EXPECT_TRUE(
      run_case({32, 8, 64, 16, kBF16, kCausal}, extend_reqs(rng, 4, 17, 200, 0, 1500), {}, rng));
  EXPECT_TRUE(
      run_case({12, 4, 64, 16, kBF16, kCausal}, extend_reqs(rng, 5, 1, 400, 0, 2000), {}, rng));
  EXPECT_TRUE(
      run_case({8, 8, 64, 16, kFP16, kCausal}, extend_reqs(rng, 4, 60, 300, 0, 2000), {}, rng));
  for (std::int32_t window : {1, 15, 16, 700}) {
    CaseOptions o;
    o.fill = FillOptions{window, true};
    EXPECT_TRUE(run_case({8, 2, 64, 16, kBF16, kCausal},
                         {extend(900, 300), extend(65, 2000), extend(window + 5, 40)}, o, rng));
  }
}

// 128-row tiles (AttentionBatch::query_tokens_hint; head dim 64 on sm_90a: two warpgroup halves
// that share each K/V tile): the float64 reference, and bitwise equal to 64-row tiles in
// deterministic mode. GQA groups 4, 3 (126-row tiles, halves that cut a token's heads), 8 and 1,
// tiles of one row to 128, prefixes across page and tile edges, windows, split chunks; head dim
// 128 must keep 64-row tiles.
TEST_F(AttentionExtend, WideTiles) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  for (bool det : {true, false}) {
    CaseOptions o;
    o.wide_tiles = true;
    o.deterministic = det;
    o.split_tokens = det ? 256 : 0;  // several chunks a request: the merge of wide partials
    EXPECT_TRUE(run_case({8, 2, 64, 16, kBF16, kCausal},
                         {extend(1200, 2000), extend(1, 1), extend(17, 63), extend(300, 1000),
                          extend(64, 0), extend(129, 4096), extend(33, 15), extend(32, 0)},
                         o, rng));
    EXPECT_TRUE(
        run_case({12, 4, 64, 16, kBF16, kCausal}, extend_reqs(rng, 5, 1, 400, 0, 2000), o, rng));
    EXPECT_TRUE(
        run_case({8, 8, 64, 16, kFP16, kCausal}, extend_reqs(rng, 4, 60, 300, 0, 2000), o, rng));
    EXPECT_TRUE(
        run_case({32, 8, 64, 16, kBF16, kCausal}, extend_reqs(rng, 3, 17, 700, 0, 1500), o, rng));
    for (std::int32_t window : {1, 15, 16, 100, 700}) {
      CaseOptions ow = o;
      ow.fill = FillOptions{window, true};
      EXPECT_TRUE(run_case({8, 2, 64, 16, kBF16, kCausal},
                           {extend(900, 300), extend(65, 2000), extend(window + 5, 40)}, ow, rng));
    }
  }
  CaseOptions o128;
  o128.wide_tiles = true;
  EXPECT_TRUE(
      run_case({8, 2, 128, 16, kBF16, kCausal}, {extend(300, 100), extend(40, 0)}, o128, rng));
}

// Extend items in the dense decode kernel (a caller's requests_hint on a batch with prompts or
// verify rows): 16-row verify tiles take its decode layout (bitwise the base kernel's in
// deterministic mode), longer ones its mma.sync extend layout (against the reference), windows too.
TEST_F(AttentionExtend, DenseDecodeKernelExtendItems) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  for (bool det : {true, false}) {
    CaseOptions o;
    o.dense_decode = true;
    o.deterministic = det;
    o.split_tokens = det ? 256 : 0;
    EXPECT_TRUE(
        run_case({32, 8, 64, 16, kBF16, kCausal}, extend_reqs(rng, 40, 4, 4, 0, 3000), o, rng));
    EXPECT_TRUE(
        run_case({32, 8, 64, 16, kBF16, kCausal}, extend_reqs(rng, 16, 8, 8, 0, 3000), o, rng));
    EXPECT_TRUE(
        run_case({8, 2, 64, 16, kFP16, kCausal}, extend_reqs(rng, 6, 1, 300, 0, 2000), o, rng));
    CaseOptions ow = o;
    ow.fill = FillOptions{100, true};
    EXPECT_TRUE(run_case({8, 2, 64, 16, kBF16, kCausal},
                         {extend(200, 300), extend(1, 1000), extend(101, 40)}, ow, rng));
  }
}

TEST_F(AttentionExtend, TargetVerify) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  for (std::int32_t n : {4, 8}) {
    EXPECT_TRUE(
        run_case({32, 8, 128, 16, kBF16, kCausal}, extend_reqs(rng, 32, n, n, 0, 4000), {}, rng));
    EXPECT_TRUE(
        run_case({7, 1, 64, 1, kFP16, kCausal}, extend_reqs(rng, 16, n, n, 0, 6000), {}, rng));
    EXPECT_TRUE(
        run_case({16, 2, 256, 64, kBF16, kCausal}, extend_reqs(rng, 6, n, n, 0, 9000), {}, rng));
    // Small batch, long context: split-KV with several queries per request.
    EXPECT_TRUE(run_case({32, 8, 128, 16, kFP16, kCausal}, {extend(n, 30000)}, {}, rng));
  }
}

// Draft-extend-v2: each request re-reads its just-verified tokens: extend = accepted count
// (1..N+1) on a prefix. The new rows are in the cache at prefix .. prefix+extend-1 and must be
// attended; prefixes end mid-page and on page boundaries.
TEST_F(AttentionExtend, DraftExtendV2) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  std::uniform_int_distribution<std::int32_t> accepted(1, 5), pages(0, 200), in_page(0, 15);
  std::vector<Req> reqs;
  for (int r = 0; r < 24; ++r) {
    const std::int32_t prefix = pages(rng) * 16 + (r % 3 == 0 ? 0 : in_page(rng));
    reqs.push_back(extend(accepted(rng), prefix));
  }
  EXPECT_TRUE(run_case({32, 8, 128, 16, kBF16, kCausal}, reqs, {}, rng));
  EXPECT_TRUE(run_case({8, 8, 64, 16, kFP16, kCausal}, reqs, {}, rng));
}

// Sliding window on extend, verify and draft-extend: windows {0, 1, 3, page-1, page, large},
// extends longer than the window, prefixes shorter and longer than it, windows starting mid-page.
TEST_F(AttentionExtend, SlidingWindow) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  const Shape shapes[] = {{8, 2, 128, 16, kBF16, kCausal},
                          {8, 1, 64, 64, kFP16, kCausal},
                          {4, 4, 256, 1, kBF16, kCausal}};
  for (const Shape& s : shapes) {
    for (std::int32_t window : {0, 1, 3, s.page_size - 1, s.page_size, 1000}) {
      for (bool invalidate : {false, true}) {
        CaseOptions o;
        o.fill = FillOptions{window, invalidate};
        std::vector<Req> reqs = {
            extend(300, 2),              // extend longer than the window, short prefix
            extend(3, window / 2),       // prefix shorter than the window
            extend(4, 3 * window + 37),  // verify, prefix longer than the window
            extend(8, 2500),             // verify, long prefix
            extend(1, 1500),             // decode
            extend(window + 5, 700),     // extend just longer than the window
            extend(2, 16 * 10 + 7),      // window starting mid-page
        };
        for (const Req& r : extend_reqs(rng, 3, 1, 64, 0, 3000)) reqs.push_back(r);
        std::shuffle(reqs.begin(), reqs.end(), rng);
        EXPECT_TRUE(run_case(s, reqs, o, rng));
      }
    }
  }
}

// A request with no new tokens this step (q_start[r] == q_start[r+1]) contributes no rows and
// must not disturb its neighbours.
TEST_F(AttentionExtend, RequestWithNoNewTokens) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  EXPECT_TRUE(run_case({32, 8, 128, 16, kBF16, kCausal},
                       {extend(5, 100), Req{0, 50}, extend(1, 3000), Req{0, 1}, extend(7, 0)}, {},
                       rng));
}

}  // namespace
}  // namespace graphdecode
