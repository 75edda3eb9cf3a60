// Sampled speculative acceptance (accept_sampled.h): one CTA per request. Warp 0 decides the
// drafts, one lane each (two loads and a Philox call per draft: the rows' Z come from the
// sampler's row stats); on a rejection the whole CTA draws the residual token in one pass over the
// rejected position's two rows (exact integer weights summed per vocabulary segment), then warp 0
// finds the token inside the segment that holds the target.
#include <cuda_bf16.h>

#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/kernels/sampling_math.h"
#include "engine/spec/accept_sampled.h"
#include "engine/spec/accept_sampled_rules.h"

namespace graphdecode {
namespace {

using accept_rules::u128;
using u64 = std::uint64_t;

// 16 warps keep enough loads in flight for the residual pass over two rows of up to 2^22 logits.
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
// The residual pass cuts the vocabulary into kSegments contiguous segments (multiples of 32
// tokens) and keeps their weight sums (16 bytes each) in shared memory: the search then reads
// one segment again instead of the whole row. Warp 0 scans them, kSegPerLane per lane.
constexpr int kSegments = 256;
constexpr int kSegPerLane = kSegments / 32;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// One filtered distribution over the vocabulary (SamplingRowStats): a point mass (row ==
// nullptr), or a logits row's kept set and integer masses with their exact total z.
template <typename T>
struct Dist {
  const T* row = nullptr;
  u64 z = 1;
  float top = 0.f, inv_t = 0.f;
  std::uint32_t keep = 0;
  std::int32_t point = -1;

  __device__ u64 mass(int y) const {
    if (row == nullptr) return y == point ? 1ull : 0ull;
    const float v = to_float(row[y]);
    return sampling::key_of(v) >= keep ? sampling::mass_of(v, top, inv_t) : 0ull;
  }
};

template <typename T>
__device__ Dist<T> point_at(int token) {
  Dist<T> d;
  d.point = token;
  return d;
}

template <typename T>
__device__ Dist<T> dist_of(const T* row, const SamplingRowStats& s) {
  if (s.point_token >= 0) return point_at<T>(s.point_token);
  Dist<T> d;
  d.row = row;
  d.z = s.total_mass;
  d.top = s.max_logit;
  d.inv_t = s.inv_temperature;
  d.keep = s.keep_key;
  return d;
}

// The request's view of the arguments.
template <typename T>
struct Request {
  const AcceptSampledArgs& a;
  int r, base;  // request, its first verify row
  u64 seed;

  __device__ bool valid(int x) const { return x >= 0 && x < a.vocab; }
  // The absolute position of the token decided after verify row base + i (the sampler's step).
  __device__ u64 position(int i) const {
    return static_cast<std::uint32_t>(a.verify.token_position[base + i] + 1);
  }
  __device__ Dist<T> target(int i) const {
    const T* row = static_cast<const T*>(a.target_logits) +
                   static_cast<std::int64_t>(base + i) * a.target_stride;
    return dist_of(row, a.target_stats[base + i]);
  }
  // q_i as the accept test and the residual see it: a point mass at x when the proposer has no
  // distribution or gives x no mass (accept_rules::accept_draft).
  __device__ Dist<T> draft(int i, int x) const {
    if (a.draft_kind == DraftKind::kPointMass || !valid(x)) return point_at<T>(x);
    const std::int64_t j = static_cast<std::int64_t>(i) * a.draft_rows + r;
    const Dist<T> q =
        dist_of(static_cast<const T*>(a.draft_logits) + j * a.draft_stride, a.draft_stats[j]);
    return q.mass(x) != 0 ? q : point_at<T>(x);
  }
  // Whether draft i (token x) is accepted.
  __device__ bool accepted(int i, int x) const {
    const std::uint32_t word = accept_rules::accept_word(seed, position(i));
    if (!valid(x)) return false;
    const Dist<T> p = target(i), q = draft(i, x);
    return accept_rules::accept_draft(p.mass(x), p.z, q.mass(x), q.z, word);
  }
};

__device__ __forceinline__ u128 shfl_u128(u128 v, int src) {
  const u64 lo = __shfl_sync(kFull, static_cast<u64>(v), src);
  const u64 hi = __shfl_sync(kFull, static_cast<u64>(v >> 64), src);
  return (static_cast<u128>(hi) << 64) | lo;
}
__device__ __forceinline__ u128 shfl_up_u128(u128 v, int delta) {
  const u64 lo = __shfl_up_sync(kFull, static_cast<u64>(v), delta);
  const u64 hi = __shfl_up_sync(kFull, static_cast<u64>(v >> 64), delta);
  return (static_cast<u128>(hi) << 64) | lo;
}
__device__ __forceinline__ u128 warp_sum_u128(u128 v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const u64 lo = __shfl_xor_sync(kFull, static_cast<u64>(v), o);
    const u64 hi = __shfl_xor_sync(kFull, static_cast<u64>(v >> 64), o);
    v += (static_cast<u128>(hi) << 64) | lo;
  }
  return v;
}
__device__ __forceinline__ u128 warp_inclusive_u128(u128 v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u128 y = shfl_up_u128(v, o);
    if (lane >= o) v += y;
  }
  return v;
}

struct ResidualShared {
  u128 seg[kSegments];  // weight sum of each vocabulary segment
  std::int32_t token;
};

// The residual draw after draft i (token x) was rejected: normalize(max(0, p_i - q_i)) by inverse
// CDF in index order (all threads; returns the token in every thread).
template <typename T>
__device__ int residual_token(const Request<T>& req, int i, int x, ResidualShared& sh) {
  const Dist<T> p = req.target(i);
  if (p.row == nullptr) return p.point;  // a point mass: max(0, p - q) lives on its token
  const Dist<T> q = req.draft(i, x);
  const int vocab = req.a.vocab;
  // max(0, p - q) is 0 wherever p is: tokens outside p's kept set (most of a top-k / top-p row)
  // or of zero mass skip the draft's row and the 128-bit products.
  auto weight = [&](int y) -> u128 {
    const u64 mp = p.mass(y);
    return mp == 0 ? u128{0} : accept_rules::residual_weight(mp, p.z, q.mass(y), q.z);
  };
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int seg_len = ((vocab + kSegments - 1) / kSegments + 31) / 32 * 32;
  for (int s = warp; s < kSegments; s += kWarps) {
    const int lo = s * seg_len, hi = min(vocab, lo + seg_len);
    u128 acc = 0;
#pragma unroll 4
    for (int y = lo + lane; y < hi; y += 32) acc += weight(y);
    acc = warp_sum_u128(acc);
    if (lane == 0) sh.seg[s] = acc;
  }
  __syncthreads();
  if (warp == 0) {
    // Lane l owns segments kSegPerLane * l .. + kSegPerLane - 1: an inclusive scan finds the
    // lane whose range holds the target, that lane the segment, the warp the token.
    u128 own = 0;
#pragma unroll
    for (int j = 0; j < kSegPerLane; ++j) own += sh.seg[kSegPerLane * lane + j];
    const u128 incl = warp_inclusive_u128(own);
    const u128 total = shfl_u128(incl, 31);
    int token = req.a.target_tokens[req.base + i];  // total = 0 cannot happen after a rejection
    if (total != 0) {
      const u128 target =
          accept_rules::mul_hi_128(accept_rules::residual_random(req.seed, req.position(i)), total);
      const u128 excl = incl - own;
      const unsigned holder = __ballot_sync(kFull, excl <= target && target < incl);
      const int src = __ffs(holder) - 1;
      int s = 0;
      u128 rem = 0;
      if (lane == src) {
        u128 c = excl;
        for (int j = 0; j < kSegPerLane; ++j) {
          const u128 w = sh.seg[kSegPerLane * lane + j];
          if (target < c + w) {
            s = kSegPerLane * lane + j;
            rem = target - c;
            break;
          }
          c += w;
        }
      }
      s = __shfl_sync(kFull, s, src);
      rem = shfl_u128(rem, src);
      const int hi = min(vocab, s * seg_len + seg_len);
      for (int y0 = s * seg_len; y0 < hi; y0 += 32) {
        const int y = y0 + lane;
        const u128 c = warp_inclusive_u128(y < hi ? weight(y) : u128{0});
        const unsigned past = __ballot_sync(kFull, rem < c);
        if (past != 0) {
          token = y0 + __ffs(past) - 1;
          break;
        }
        rem -= shfl_u128(c, 31);
      }
    }
    if (lane == 0) sh.token = token;
  }
  __syncthreads();
  return sh.token;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    accept_sampled_kernel(const __grid_constant__ AcceptSampledArgs a) {
  __shared__ ResidualShared sh;
  __shared__ std::int32_t s_accepted;
  const int r = static_cast<int>(blockIdx.x), lane = threadIdx.x & 31;
  if (r == 0 && threadIdx.x == 0) {
    a.out[static_cast<std::int64_t>(a.max_rows) * a.stride] =
        (a.flag_a != nullptr ? *a.flag_a : 0) | (a.flag_b != nullptr ? *a.flag_b : 0);
  }
  if (r >= a.verify.scalars[StepMetaLayout::kNumRequests]) return;
  const std::int32_t* words = a.aux + static_cast<std::int64_t>(r) * a.aux_words;
  const Request<T> req{a, r, r * (a.k + 1),
                       (static_cast<u64>(static_cast<std::uint32_t>(words[a.seed_hi_word])) << 32) |
                           static_cast<std::uint32_t>(words[a.seed_lo_word])};
  const int cap = accept_rules::accept_cap(a.k, words[a.accept_limit_word]);
  const std::int32_t* drafts = a.verify.token_id + req.base + 1;
  if (threadIdx.x < 32) {  // warp 0: lane i decides draft i0 + i; the first rejection stops
    int accepted = cap;
    for (int i0 = 0; i0 < cap; i0 += 32) {
      const int i = i0 + lane;
      const unsigned rejected = __ballot_sync(kFull, i < cap && !req.accepted(i, drafts[i]));
      if (rejected != 0) {
        accepted = i0 + __ffs(rejected) - 1;
        break;
      }
    }
    if (lane == 0) s_accepted = accepted;
  }
  __syncthreads();
  const int acc = s_accepted;  // uniform over the CTA
  std::int32_t* out = a.out + static_cast<std::int64_t>(r) * a.stride;
  for (int i = threadIdx.x; i < acc; i += kThreads) out[1 + i] = drafts[i];
  const int last =
      acc == cap ? a.target_tokens[req.base + cap] : residual_token(req, acc, drafts[acc], sh);
  if (threadIdx.x == 0) {
    out[0] = acc + 1;
    out[1 + acc] = last;
  }
}

constexpr int kPublishThreads = 128;

struct PublishLastParams {
  const std::int32_t* num_requests;
  const std::int32_t* tokens;
  std::int32_t* out;
  std::int32_t stride, max_rows;
  const std::int32_t* flag_a;
  const std::int32_t* flag_b;
};

__global__ void publish_last_kernel(const __grid_constant__ PublishLastParams p) {
  const std::int32_t r = static_cast<std::int32_t>(blockIdx.x * kPublishThreads + threadIdx.x);
  if (r == 0) {
    p.out[static_cast<std::int64_t>(p.max_rows) * p.stride] =
        (p.flag_a != nullptr ? *p.flag_a : 0) | (p.flag_b != nullptr ? *p.flag_b : 0);
  }
  if (r >= p.max_rows || r >= *p.num_requests) return;
  p.out[static_cast<std::int64_t>(r) * p.stride] = 1;
  p.out[static_cast<std::int64_t>(r) * p.stride + 1] = p.tokens[r];
}

}  // namespace

void accept_sampled(const AcceptSampledArgs& args, cudaStream_t stream) {
  AcceptSampledArgs a = args;
  if (a.target_stride == 0) a.target_stride = a.vocab;
  if (a.draft_stride == 0) a.draft_stride = a.vocab;
  GD_REQUIRE(a.k >= 0 && a.k <= kMaxAcceptSampledDrafts, "k", a.k, "must be in [0, 64]");
  GD_REQUIRE(a.vocab > 0 && a.vocab <= kMaxSamplingVocab, "vocab", a.vocab, "must be in [1, 2^22]");
  GD_REQUIRE(a.logits_type == LogitsType::kFloat32 || a.logits_type == LogitsType::kBF16,
             "logits_type", static_cast<int>(a.logits_type), "unknown logits type");
  GD_REQUIRE(a.verify.scalars != nullptr && a.verify.token_id != nullptr &&
                 a.verify.token_position != nullptr,
             "verify", "nullptr", "needs the verify block's scalars, token ids and positions");
  GD_REQUIRE(a.target_logits != nullptr, "target_logits", "nullptr", "must be non-null");
  GD_REQUIRE(a.target_stride >= a.vocab, "target_stride", a.target_stride, "must be >= vocab");
  GD_REQUIRE(a.target_stats != nullptr, "target_stats", "nullptr",
             "needs the sampler's row_stats of the verify rows");
  GD_REQUIRE(a.target_tokens != nullptr, "target_tokens", "nullptr", "must be non-null");
  GD_REQUIRE(a.draft_kind == DraftKind::kDistribution || a.draft_kind == DraftKind::kPointMass,
             "draft_kind", static_cast<int>(a.draft_kind), "unknown draft kind");
  if (a.draft_kind == DraftKind::kDistribution && a.k > 0) {
    GD_REQUIRE(a.draft_logits != nullptr, "draft_logits", "nullptr",
               "a draft distribution needs the draft's logits (or DraftKind::kPointMass)");
    GD_REQUIRE(a.draft_stride >= a.vocab, "draft_stride", a.draft_stride, "must be >= vocab");
    GD_REQUIRE(a.draft_stats != nullptr, "draft_stats", "nullptr",
               "a draft distribution needs the draft sampler's row_stats");
    GD_REQUIRE(a.draft_rows >= a.max_rows, "draft_rows", a.draft_rows,
               "must be >= max_rows (rows between draft positions)");
  }
  GD_REQUIRE(a.aux != nullptr, "aux", "nullptr", "the seeds and accept limits are read from it");
  GD_REQUIRE(a.aux_words > 0, "aux_words", a.aux_words, "must be positive");
  GD_REQUIRE(a.seed_lo_word >= 0 && a.seed_lo_word < a.aux_words, "seed_lo_word", a.seed_lo_word,
             "must be a word of aux ([0, aux_words))");
  GD_REQUIRE(a.seed_hi_word >= 0 && a.seed_hi_word < a.aux_words, "seed_hi_word", a.seed_hi_word,
             "must be a word of aux ([0, aux_words))");
  GD_REQUIRE(a.accept_limit_word >= 0 && a.accept_limit_word < a.aux_words, "accept_limit_word",
             a.accept_limit_word, "must be a word of aux ([0, aux_words))");
  GD_REQUIRE(a.out != nullptr, "out", "nullptr", "must be non-null");
  GD_REQUIRE(a.stride >= a.k + 2, "stride", a.stride, "must hold a count and k + 1 tokens");
  GD_REQUIRE(a.max_rows >= 1, "max_rows", a.max_rows, "must be positive");
  const dim3 grid(static_cast<unsigned>(a.max_rows));
  if (a.logits_type == LogitsType::kFloat32)
    accept_sampled_kernel<float><<<grid, kThreads, 0, stream>>>(a);
  else
    accept_sampled_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
  GD_CHECK_LAUNCH();
}

void publish_last_tokens(const StepMetaView& meta, const std::int32_t* tokens,
                         std::int32_t max_rows, std::int32_t* out, std::int32_t stride,
                         const std::int32_t* flag_a, const std::int32_t* flag_b,
                         cudaStream_t stream) {
  GD_REQUIRE(stride >= 2 && max_rows >= 1, "stride", stride, "needs a count and a token");
  PublishLastParams p{
      meta.scalars + StepMetaLayout::kNumRequests, tokens, out, stride, max_rows, flag_a, flag_b};
  publish_last_kernel<<<static_cast<unsigned>((max_rows + kPublishThreads - 1) / kPublishThreads),
                        kPublishThreads, 0, stream>>>(p);
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
