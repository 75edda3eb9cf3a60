// GPU: decode (one query per request) vs the float64 reference — GQA groups 1/4/7/8, head dims
// 64/128/256, bf16/fp16, pages 1/16/64, contexts 1..32k, batches 1..256; split-KV at small batch
// and long context; sliding windows with invalid pages before the window; bad configurations.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "attention/attention_policy.h"
#include "attention_check.h"
#include "common/error.h"
#include "common/stream.h"
#include "support/gpu_test.h"
#include "support/scoped_env.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;

class AttentionDecode : public GpuTest {};

constexpr auto kBF16 = DType::kBF16;
constexpr auto kFP16 = DType::kFP16;
constexpr auto kCausal = AttentionMode::kCausal;

// A covering set, not the cartesian product: every group, head dim, dtype and page size appears,
// with contexts from 1 to 32k and batches from 1 to 256.
struct DecodeCase {
  Shape shape;
  std::int32_t batch, min_ctx, max_ctx;
};
const DecodeCase kDecodeCases[] = {
    {{8, 8, 64, 1, kBF16, kCausal}, 4, 1, 300},         // group 1, page 1
    {{32, 8, 128, 16, kBF16, kCausal}, 64, 1, 2048},    // group 4, the common shape
    {{32, 8, 128, 16, kFP16, kCausal}, 17, 1, 5000},    // fp16
    {{16, 2, 256, 64, kFP16, kCausal}, 16, 1, 4000},    // group 8, d256, page 64
    {{28, 4, 128, 16, kFP16, kCausal}, 33, 1, 1500},    // group 7
    {{7, 1, 64, 64, kBF16, kCausal}, 8, 1, 9000},       // group 7, one kv head
    {{8, 1, 256, 1, kBF16, kCausal}, 8, 1, 700},        // group 8, d256, page 1
    {{4, 1, 128, 64, kBF16, kCausal}, 5, 8000, 16000},  // group 4, long contexts
    {{8, 2, 64, 16, kFP16, kCausal}, 256, 1, 512},      // batch 256
    {{16, 16, 128, 1, kBF16, kCausal}, 3, 1, 3000},     // group 1, d128, page 1
    {{32, 8, 64, 16, kBF16, kCausal}, 64, 1, 3000},     // d64 unsplit: both decode layouts
};

TEST_F(AttentionDecode, CoveringSet) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  for (const DecodeCase& c : kDecodeCases) {
    const auto reqs = decode_reqs(rng, c.batch, c.min_ctx, c.max_ctx);
    EXPECT_TRUE(run_case(c.shape, reqs, {}, rng));
  }
}

TEST_F(AttentionDecode, ContextsAroundPageAndTileBoundaries) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  for (std::int32_t page : {1, 16, 64}) {
    std::vector<Req> reqs;
    for (std::int32_t ctx : {1,   2,   15,  16,   17,   63,   64,   65,   127,  128,  129,
                             255, 256, 257, 1023, 1024, 1025, 2047, 2048, 2049, 4096, 4097})
      reqs.push_back(Req{1, ctx});
    std::shuffle(reqs.begin(), reqs.end(), rng);
    EXPECT_TRUE(run_case({32, 8, 128, page, kBF16, kCausal}, reqs, {}, rng));
  }
}

TEST_F(AttentionDecode, SplitKvSmallBatchLongContext) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  EXPECT_TRUE(run_case({32, 8, 128, 16, kBF16, kCausal}, {{1, 32768}}, {}, rng));
  EXPECT_TRUE(run_case({32, 8, 64, 64, kFP16, kCausal}, {{1, 32000}}, {}, rng));
  EXPECT_TRUE(run_case({16, 2, 256, 16, kBF16, kCausal}, {{1, 20001}, {1, 1}}, {}, rng));
  EXPECT_TRUE(run_case({32, 8, 128, 1, kFP16, kCausal}, decode_reqs(rng, 3, 9000, 12000), {}, rng));
}

TEST_F(AttentionDecode, WithoutLseAndWithoutWindowPointer) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  CaseOptions o;
  o.with_lse = false;
  EXPECT_TRUE(run_case({32, 8, 128, 16, kBF16, kCausal}, decode_reqs(rng, 9, 1, 3000), o, rng));
  o.with_lse = true;
  o.with_window_ptr = false;
  EXPECT_TRUE(run_case({32, 8, 128, 16, kFP16, kCausal}, decode_reqs(rng, 9, 1, 3000), o, rng));
}

// Sliding window: window_left in {0, 1, 3, page-1, page, large}, contexts shorter and longer than
// the window, windows starting mid-page; with and without kInvalidPage before the window.
TEST_F(AttentionDecode, SlidingWindow) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  const Shape shapes[] = {{32, 8, 128, 16, kBF16, kCausal},
                          {8, 1, 64, 1, kFP16, kCausal},
                          {14, 2, 256, 64, kBF16, kCausal}};
  for (const Shape& s : shapes) {
    for (std::int32_t window : {0, 1, 3, s.page_size - 1, s.page_size, 777, 4095}) {
      for (bool invalidate : {false, true}) {
        CaseOptions o;
        o.fill = FillOptions{window, invalidate};
        std::vector<Req> reqs = decode_reqs(rng, 8, 1, 3000);
        reqs.push_back(Req{1, window + 1});  // exactly the window
        reqs.push_back(Req{1, window / 2 + 1});
        EXPECT_TRUE(run_case(s, reqs, o, rng));
      }
    }
  }
}

TEST_F(AttentionDecode, SlidingWindowLongContextSplitKv) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  for (std::int32_t window : {1, 4095, 8191, 20000}) {
    CaseOptions o;
    o.fill = FillOptions{window, true};
    EXPECT_TRUE(run_case({32, 8, 128, 16, kBF16, kCausal}, {{1, 32768}}, o, rng));
  }
}

// Long chunks at a batch that fills the GPU once (B=8 x 8 KV heads, 4-5 chunks of 2k-8k keys per
// head): which CTA finishes a (request, head) last, and so merges its partials, changes from run
// to run. The outputs must not: each run matches the reference and the first run bitwise. Windows
// cut the spans mid-chunk and mid-page.
TEST_F(AttentionDecode, LongChunksRepeatBitwise) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  const Shape shape{32, 8, 128, 16, kBF16, kCausal};
  for (std::int32_t window : {-1, 9000, 2500}) {
    const auto reqs = shrink_for_sanitizer(decode_reqs(rng, 8, 8200, 33000), kCausal);
    Stream stream;
    HostPagedBatch host(shape, capacity_for(shape, reqs, rng));
    DevicePagedBatch dev(shape, host.capacity());
    const PagedAttention attn(host.config(/*deterministic=*/false));
    host.fill(reqs, FillOptions{window, window >= 0}, rng);
    dev.upload(host, stream);
    CaseOptions o;
    o.fill.window_left = window;
    const std::string what = describe(shape, reqs, o);
    const Outputs first = run_eager(attn, dev, host.total_q(), stream);
    EXPECT_TRUE(matches_reference(host.reference(), first.out, &first.lse, shape.dtype)) << what;
    for (int rep = 1; rep < 4; ++rep) {
      const Outputs again = run_eager(attn, dev, host.total_q(), stream);
      EXPECT_TRUE(bitwise_equal(first, 0, again, 0, host.total_q(),
                                shape.num_q_heads * shape.head_dim, shape.num_q_heads))
          << "run " << rep << " != run 0, " << what;
    }
  }
}

// The dense decode kernel (AttentionBatch::requests_hint, head dim 64: 4 CTAs per SM, 2 stages):
// each case runs without the hint, then with it, both against the float64 reference, and bitwise
// equal in deterministic mode. Batches past the dense kernel's wave (96 x 8 KV heads = 768 items
// for 528 CTAs on 132 SMs: the claim loop), the wave split (adaptive, up to 3000 keys), contexts
// around page and tile edges, groups 1 / 4 / 7, pages 1 / 16 / 64, fp16, windows with invalid pages
// before them; at head dim 128 the hint must leave the base kernel.
TEST_F(AttentionDecode, DenseKernelMatchesTheReferenceAndTheBaseBitwise) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  std::vector<Req> edges;
  for (std::int32_t ctx : {1, 2, 15, 16, 17, 63, 64, 65, 1023, 1024, 1025, 2048, 2049, 4097})
    edges.push_back(Req{1, ctx});
  std::shuffle(edges.begin(), edges.end(), rng);
  for (bool det : {true, false}) {
    CaseOptions o;
    o.dense_decode = true;
    o.deterministic = det;
    EXPECT_TRUE(run_case({32, 8, 64, 16, kBF16, kCausal}, decode_reqs(rng, 96, 1, 3000), o, rng));
    EXPECT_TRUE(run_case({32, 8, 64, 16, kBF16, kCausal}, edges, o, rng));
    EXPECT_TRUE(run_case({32, 8, 64, 1, kFP16, kCausal}, decode_reqs(rng, 40, 1, 1500), o, rng));
    EXPECT_TRUE(run_case({7, 1, 64, 64, kBF16, kCausal}, decode_reqs(rng, 8, 1, 9000), o, rng));
    EXPECT_TRUE(run_case({8, 8, 64, 1, kBF16, kCausal}, decode_reqs(rng, 33, 1, 700), o, rng));
    EXPECT_TRUE(run_case({32, 8, 64, 16, kBF16, kCausal}, {{1, 1}}, o, rng));
    for (std::int32_t window : {0, 15, 16, 1000}) {
      CaseOptions ow = o;
      ow.fill = FillOptions{window, true};
      std::vector<Req> reqs = decode_reqs(rng, 40, 1, 3000);
      reqs.push_back(Req{1, window + 1});
      EXPECT_TRUE(run_case({32, 8, 64, 16, kBF16, kCausal}, reqs, ow, rng));
    }
    EXPECT_TRUE(run_case({32, 8, 128, 16, kBF16, kCausal}, decode_reqs(rng, 40, 1, 2000), o, rng));
  }
}

// Which calls take the dense kernel: more requests x KV heads than the base kernel's wave of
// resident CTAs (target_ctas(); 396 on an H100 / H200 at d64, so the 1B shape from 50 requests), at
// head dim 64 only; GRAPHDECODE_ATTN_DENSE_MIN_ITEMS replaces the rule (0 = never).
TEST_F(AttentionDecode, DenseKernelPastTheBaseWave) {
  AttentionConfig c;
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 64;
  c.max_batch = 512;
  c.max_q_tokens = 512;
  c.max_kv_len = 4096;
  const PagedAttention attn(c);
  // Its point: kDenseBlocksPerSm CTAs of its kDenseStages stages resident on every SM (its shared
  // memory, static included, within the SM's share), one more than the base kernel's.
  int sms = 0;
  GD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (attn::kTargetWaves == 0)
    EXPECT_EQ(attn.target_ctas_dense(), attn::kDenseDecode<64> ? attn::kDenseBlocksPerSm * sms : 0);
  // A phase of several tokens per request hints its requests only where they fit one decode
  // tile: 4 tokens x the group of 4 = 16 rows.
  EXPECT_FALSE(attn.decode_layout_for(0));
  EXPECT_TRUE(attn.decode_layout_for(1));
  EXPECT_TRUE(attn.decode_layout_for(4));
  EXPECT_FALSE(attn.decode_layout_for(5));
  const std::int32_t at_wave = attn.target_ctas() / c.num_kv_heads;  // requests filling the wave
  EXPECT_FALSE(attn.dense_decode_for(0));
  EXPECT_FALSE(attn.dense_decode_for(at_wave));
  EXPECT_EQ(attn.dense_decode_for(at_wave + 1), attn::kDenseDecode<64>);
  EXPECT_EQ(attn.dense_decode_for(512), attn::kDenseDecode<64>);
  c.head_dim = 128;
  EXPECT_FALSE(PagedAttention(c).dense_decode_for(512));
  c.head_dim = 64;
  {
    const ScopedEnv never("GRAPHDECODE_ATTN_DENSE_MIN_ITEMS", "0");
    EXPECT_FALSE(PagedAttention(c).dense_decode_for(512));
  }
  {
    const ScopedEnv fixed("GRAPHDECODE_ATTN_DENSE_MIN_ITEMS", "16");
    const PagedAttention a(c);
    EXPECT_FALSE(a.dense_decode_for(1));
    EXPECT_EQ(a.dense_decode_for(2), attn::kDenseDecode<64>);
  }
  for (const char* bad : {"-1", "x", "12k", ""}) {
    const ScopedEnv env("GRAPHDECODE_ATTN_DENSE_MIN_ITEMS", bad);
    try {
      PagedAttention a(c);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.field()).find("GRAPHDECODE_ATTN_DENSE_MIN_ITEMS"), std::string::npos);
    }
  }
}

// ---- bad configurations: graphdecode::Error naming the field ------------------------------------

AttentionConfig good_config() {
  AttentionConfig c;
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_batch = 4;
  c.max_q_tokens = 4;
  c.max_kv_len = 1024;
  return c;
}

// Expects construction to throw graphdecode::Error whose field() contains one of `fields`.
::testing::AssertionResult refused(const AttentionConfig& c, std::vector<std::string> fields) {
  try {
    PagedAttention attn(c);
  } catch (const Error& e) {
    for (const auto& f : fields)
      if (e.field().find(f) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "refused, but field() is '" << e.field() << "': " << e.what();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-graphdecode error: " << e.what();
  }
  return ::testing::AssertionFailure() << "accepted";
}

TEST_F(AttentionDecode, BadConfigNamesTheField) {
  EXPECT_NO_THROW(PagedAttention{good_config()});
  auto c = good_config();
  c.head_dim = 96;
  EXPECT_TRUE(refused(c, {"head_dim"}));
  c = good_config();
  c.head_dim = 0;
  EXPECT_TRUE(refused(c, {"head_dim"}));
  c = good_config();
  c.num_kv_heads = 6;  // 32 % 6 != 0
  EXPECT_TRUE(refused(c, {"num_q_heads", "num_kv_heads", "group"}));
  c = good_config();
  c.num_q_heads = 64;
  c.num_kv_heads = 2;  // group 32 > 16
  EXPECT_TRUE(refused(c, {"num_q_heads", "num_kv_heads", "group"}));
  c = good_config();
  c.num_kv_heads = 0;
  EXPECT_TRUE(refused(c, {"num_kv_heads"}));
  c = good_config();
  c.max_batch = 0;
  EXPECT_TRUE(refused(c, {"max_batch"}));
  c = good_config();
  c.max_q_tokens = -1;
  EXPECT_TRUE(refused(c, {"max_q_tokens"}));
  c = good_config();
  c.max_kv_len = 0;
  EXPECT_TRUE(refused(c, {"max_kv_len"}));
  c = good_config();
  c.deterministic = true;
  c.split_tokens = 100;  // not a multiple of 64
  EXPECT_TRUE(refused(c, {"split_tokens"}));
  c = good_config();
  c.split_tokens = -64;
  EXPECT_TRUE(refused(c, {"split_tokens"}));
  c = good_config();
  c.dtype = static_cast<DType>(7);
  EXPECT_TRUE(refused(c, {"dtype"}));
}

// The K/V tile copies offset a page in 32 bits: a KV view whose one page (all KV heads) exceeds
// 2^31 bytes is refused by run(), naming kv.page_size, before anything is launched.
TEST_F(AttentionDecode, OversizedPageIsRefusedAtRun) {
  const Shape shape{32, 8, 128, 16, kBF16, kCausal};
  const Capacity cap{1, 1, 64, 2, 4, 8};
  DevicePagedBatch dev(shape, cap);
  auto c = good_config();
  c.max_batch = 1;
  c.max_q_tokens = 1;
  c.max_kv_len = 64;
  const PagedAttention attn(c);
  PagedKvView kv = dev.view();  // a valid view but for the page size
  kv.page_size = 1 << 20;       // 8 heads x 2^20 rows x 128 dims x 2 bytes = 2^31 bytes
  try {
    attn.run(dev.batch(), kv, dev.q(), dev.out(), dev.lse(), nullptr);
    ADD_FAILURE() << "accepted a 2^31-byte page";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "kv.page_size") << e.what();
  }
}

}  // namespace
}  // namespace graphdecode
