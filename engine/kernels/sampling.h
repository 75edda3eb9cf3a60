// Device sampling: one request per row of logits, per-row parameters in device arrays, the token
// written to a device int array. Graph-safe (live rows read from device, grid of max_rows blocks,
// no allocation, no host sync).
//
// Per row r, with l = logits[r], T = temperature[r]:
//   T <= 0 (or NaN): greedy, the argmax of l, lowest index on ties.
//   otherwise, in Hugging Face's order (temperature, top-k, top-p):
//     top-k (0 < k < vocab): keep tokens with l_i >= the k-th largest logit (ties at the k-th value
//       are all kept, as in HF's TopKLogitsWarper); k <= 0 or k >= vocab: off.
//     top-p (p < 1): with probabilities p_i = softmax(l / T) over the top-k set, keep token i when
//       the mass of tokens with strictly larger logit is < p (the smallest prefix of the sorted
//       distribution reaching p, with ties at the boundary all kept); the top token is always kept.
//       p >= 1 or NaN: off.
//     draw from softmax(l / T) renormalized over the kept set, by the Gumbel-max trick:
//       token = argmax_i (l_i - max l) / T + G_i, G_i = -log(-log1p(-u_i)) from Philox4x32-10 with
//       key = seed[r] and counter = (i / 4, 0, step[r]) (philox.h); u_i in (0, 1).
//   The token depends only on the row's logits, parameters, seed and step: not on the row's
//   position in the batch nor on other rows. Thresholds are exact: found by radix select over the
//   float order keys (counts for top-k, fixed-point probability masses with 2^-40 resolution for
//   top-p, summed in integers, so the result is deterministic).
// NaN logits are unsupported (NaN orders above +inf). The host validates parameters when a request
// is submitted; the kernel only needs them to be defined as above.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace graphdecode {

enum class LogitsType : std::uint8_t { kFloat32 = 0, kBF16 = 1 };

struct SamplingArgs {
  const void* logits = nullptr;  // [max_rows][row_stride] float or bf16 bits (logits_type)
  LogitsType logits_type = LogitsType::kFloat32;
  const float* temperature = nullptr;      // [max_rows] 0 = greedy
  const std::int32_t* top_k = nullptr;     // [max_rows] 0 = off
  const float* top_p = nullptr;            // [max_rows] 1 = off, in (0, 1]
  const std::uint64_t* seed = nullptr;     // [max_rows] per request
  const std::uint64_t* step = nullptr;     // [max_rows] per request decode step (the RNG counter)
  std::int32_t* tokens = nullptr;          // [max_rows] out
  const std::int32_t* num_rows = nullptr;  // [1] live rows
  std::int32_t max_rows = 0;
  std::int32_t vocab = 0;       // at most kMaxSamplingVocab
  std::int64_t row_stride = 0;  // elements between rows of logits; 0 = vocab
};

constexpr std::int32_t kMaxSamplingVocab = 1 << 22;

void sample(const SamplingArgs& args, cudaStream_t stream);

}  // namespace graphdecode
