#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/spec/accept.h"
#include "engine/spec/spec_rules.h"

namespace graphdecode {
namespace {

constexpr int kThreads = 128;

__global__ void accept_greedy_kernel(const __grid_constant__ AcceptArgs a) {
  const std::int32_t r = static_cast<std::int32_t>(blockIdx.x * kThreads + threadIdx.x);
  if (r == 0) {
    a.out[static_cast<std::int64_t>(a.max_rows) * a.stride] =
        (a.flag_a != nullptr ? *a.flag_a : 0) | (a.flag_b != nullptr ? *a.flag_b : 0);
  }
  if (r >= a.max_rows || r >= a.verify.scalars[StepMetaLayout::kNumRequests]) return;
  const std::int32_t w = a.k + 1;
  const std::int32_t* drafts = a.verify.token_id + r * w + 1;
  const std::int32_t* picks = a.picks + r * w;
  const std::int32_t limit =
      a.aux != nullptr ? a.aux[static_cast<std::int64_t>(r) * a.aux_words + a.accept_limit_word]
                       : -1;
  const std::int32_t accepted = spec_rules::greedy_accepted(drafts, picks, a.k, limit);
  std::int32_t* out = a.out + static_cast<std::int64_t>(r) * a.stride;
  out[0] = accepted + 1;
  for (std::int32_t i = 0; i < accepted; ++i) out[1 + i] = drafts[i];
  out[1 + accepted] = picks[accepted];
}

struct PublishLastParams {
  const std::int32_t* num_requests;
  const std::int32_t* tokens;
  std::int32_t* out;
  std::int32_t stride, max_rows;
  const std::int32_t* flag_a;
  const std::int32_t* flag_b;
};

__global__ void publish_last_kernel(const __grid_constant__ PublishLastParams p) {
  const std::int32_t r = static_cast<std::int32_t>(blockIdx.x * kThreads + threadIdx.x);
  if (r == 0) {
    p.out[static_cast<std::int64_t>(p.max_rows) * p.stride] =
        (p.flag_a != nullptr ? *p.flag_a : 0) | (p.flag_b != nullptr ? *p.flag_b : 0);
  }
  if (r >= p.max_rows || r >= *p.num_requests) return;
  p.out[static_cast<std::int64_t>(r) * p.stride] = 1;
  p.out[static_cast<std::int64_t>(r) * p.stride + 1] = p.tokens[r];
}

}  // namespace

void publish_last_tokens(const StepMetaView& meta, const std::int32_t* tokens,
                         std::int32_t max_rows, std::int32_t* out, std::int32_t stride,
                         const std::int32_t* flag_a, const std::int32_t* flag_b,
                         cudaStream_t stream) {
  GD_REQUIRE(stride >= 2 && max_rows >= 1, "stride", stride, "needs a count and a token");
  PublishLastParams p{
      meta.scalars + StepMetaLayout::kNumRequests, tokens, out, stride, max_rows, flag_a, flag_b};
  publish_last_kernel<<<static_cast<unsigned>((max_rows + kThreads - 1) / kThreads), kThreads, 0,
                        stream>>>(p);
  GD_CHECK_LAUNCH();
}

void accept_greedy(const AcceptArgs& a, cudaStream_t stream) {
  GD_REQUIRE(a.k >= 0, "k", a.k, "cannot be negative");
  GD_REQUIRE(a.stride >= a.k + 2, "stride", a.stride, "must hold a count and k + 1 tokens");
  GD_REQUIRE(a.max_rows >= 1, "max_rows", a.max_rows, "must be positive");
  GD_REQUIRE(a.picks != nullptr && a.out != nullptr, "picks/out", "nullptr", "must be set");
  accept_greedy_kernel<<<static_cast<unsigned>((a.max_rows + kThreads - 1) / kThreads), kThreads, 0,
                         stream>>>(a);
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
