// GPU: deterministic mode (config.deterministic = true). A request's output (and lse) is BITWISE
// identical when it runs alone and in batches of 8, 64 and 256 with random other requests, at a
// random position in the batch and on other pages/slots — on the full, SWA and cross paths, for
// decode and extend. The alone run is also checked against the float64 reference.
#include <gtest/gtest.h>

#include <vector>

#include "attention_check.h"
#include "common/stream.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;

class AttentionDeterminism : public GpuTest {};

struct Path {
  Shape shape;
  std::int32_t window = -1;  // causal only
  Req target;                // the request whose output must not change
  std::int32_t others_max_q = 1;
  std::int32_t others_max_kv = 2000;
  std::int32_t split_tokens = 0;  // 0 = library default
};

std::vector<Req> others(Rng& rng, const Path& p, std::int32_t n) {
  std::uniform_int_distribution<std::int32_t> ql(1, p.others_max_q), kl(1, p.others_max_kv);
  std::vector<Req> reqs;
  for (std::int32_t i = 0; i < n; ++i) {
    const std::int32_t q = ql(rng);
    const std::int32_t kv = kl(rng);
    reqs.push_back(p.shape.mode == AttentionMode::kCausal ? Req{q, kv + q} : Req{q, kv});
  }
  return reqs;
}

void check_batch_invariance(const Path& p) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  const std::vector<std::int32_t> sizes =
      sanitize_mode() ? std::vector<std::int32_t>{1, 8} : std::vector<std::int32_t>{1, 8, 64, 256};
  Req target = p.target;
  if (sanitize_mode()) target = shrink_for_sanitizer({target}, p.shape.mode)[0];

  // One request list per batch size, the target at a random position.
  std::vector<std::vector<Req>> lists;
  std::vector<std::int32_t> position;
  Capacity cap{};
  for (std::int32_t n : sizes) {
    std::vector<Req> reqs = others(rng, p, n - 1);
    const auto at = static_cast<std::int32_t>(rng() % n);
    reqs.insert(reqs.begin() + at, target);
    cap = max_capacity(cap, capacity_for(p.shape, reqs, rng));
    lists.push_back(std::move(reqs));
    position.push_back(at);
  }

  HostPagedBatch host(p.shape, cap);
  Stream stream;
  DevicePagedBatch dev(p.shape, cap);
  const PagedAttention attn(host.config(/*deterministic=*/true, p.split_tokens));
  const FillOptions fill{p.window, p.window >= 0};
  const std::int32_t row_elems = p.shape.num_q_heads * p.shape.head_dim;

  Outputs alone;
  RequestData target_data;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    host.fill(lists[i], fill, rng);
    if (i == 0) {
      target_data = host.extract(position[0]);
    } else {
      host.implant(position[i], target_data);
    }
    dev.upload(host, stream);
    const Outputs got = run_eager(attn, dev, host.total_q(), stream);
    if (i == 0) {
      alone = got;
      EXPECT_TRUE(matches_reference(host.reference(), got.out, &got.lse, p.shape.dtype))
          << "alone run vs reference";
      continue;
    }
    const std::int32_t row = host.q_start()[position[i]];
    EXPECT_TRUE(bitwise_equal(alone, 0, got, row, target.q_len, row_elems, p.shape.num_q_heads))
        << "target (q_len " << target.q_len << ", kv_len " << target.kv_len << ") at position "
        << position[i] << " of a batch of " << sizes[i] << ", split_tokens " << attn.split_tokens();
  }
}

constexpr auto kBF16 = DType::kBF16;
constexpr auto kFP16 = DType::kFP16;
constexpr auto kCausal = AttentionMode::kCausal;
constexpr auto kCross = AttentionMode::kCross;

TEST_F(AttentionDeterminism, FullDecode) {
  check_batch_invariance(Path{{16, 2, 128, 16, kBF16, kCausal}, -1, {1, 7001}, 1, 2000});
}
TEST_F(AttentionDeterminism, FullDecodeSmallSplit) {
  check_batch_invariance(Path{{8, 1, 64, 1, kFP16, kCausal}, -1, {1, 3001}, 1, 2000, 64});
}
// d64: the target's 1024-key chunks take the narrow decode layout, its last, shorter one the
// 16-row layout; the other requests' short chunks the 16-row one.
TEST_F(AttentionDeterminism, FullDecodeHeadDim64MixedLayouts) {
  check_batch_invariance(Path{{32, 8, 64, 16, kBF16, kCausal}, -1, {1, 5000}, 1, 2000});
}
TEST_F(AttentionDeterminism, FullExtend) {
  check_batch_invariance(Path{{16, 2, 128, 16, kBF16, kCausal}, -1, {37, 3037}, 24, 1000});
}
TEST_F(AttentionDeterminism, SlidingWindowDecode) {
  check_batch_invariance(Path{{16, 2, 128, 16, kFP16, kCausal}, 1500, {1, 6001}, 1, 2000});
}
TEST_F(AttentionDeterminism, SlidingWindowExtend) {
  check_batch_invariance(Path{{16, 2, 128, 64, kBF16, kCausal}, 300, {37, 3037}, 24, 1000, 128});
}
TEST_F(AttentionDeterminism, CrossDecode) {
  check_batch_invariance(Path{{8, 1, 64, 16, kFP16, kCross}, -1, {1, 4097}, 1, 2000});
}
TEST_F(AttentionDeterminism, CrossExtend) {
  check_batch_invariance(Path{{16, 2, 128, 16, kBF16, kCross}, -1, {9, 4097}, 8, 2000});
}

}  // namespace
}  // namespace graphdecode
