// Device sampling: one request per row of logits, per-row parameters in device arrays, the token
// written to a device int array. Graph-safe (live rows read from device, grids sized for max_rows,
// no allocation, no host sync, no device-to-host reads).
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
//       key = seed[r] and counter = (i / 4, 0, step[r]) (philox.h); u_i in (0, 1); lowest index on
//       ties.
//   The token depends only on the row's logits, parameters, seed and step: not on the row's
//   position in the batch, other rows, the grid or timing. Thresholds are exact: masses are
//   fixed-point integers, mass_i = floor(exp((l_i - max l) / T) * 2^40), summed in integers, and
//   top-p keeps token i when the integer mass of strictly larger logits is < ceil(p * Z) (clamped
//   to [1, Z]), Z = the integer mass of the top-k set (sampling_math.h holds these definitions).
//   A row whose max logit is +-inf, or whose 1 / T overflows, takes its argmax.
// NaN logits are unsupported (NaN orders above +inf). The host validates parameters when a request
// is submitted; the kernel only needs them to be defined as above.
//
// How (sampling_kernels.cuh has the details): each row is cut into chunks of 2048 or 8192 logits,
// one CTA each. A scan pass takes the argmax and, for rows with top-k or top-p, a 12-bit radix
// histogram of the order keys (counts, and approximate masses with error bounds); the row's last
// CTA turns the histogram into a plan: the bucket holding the k-th key and a range of buckets
// that must hold the top-p threshold (with top-k <= 256 as well: every bucket of the top-k set, no
// masses in the histogram). A filter pass then scores every token above that range
// (Gumbel-max, merged with one 64-bit atomicMax per CTA), sums the exact masses the top-p total
// needs, and compacts the tokens of the boundary buckets into a per-row candidate list. A resolve
// pass (one CTA per row at a time) finds the exact thresholds among the candidates, checks with
// exact integers that the plan's range held them, and draws. A row whose candidates overflow the
// list, or whose check fails, is decided exactly over its whole row by the resolve CTA (slow,
// same result). Rows with top-k <= 64 at the large chunk skip the histogram and the filter: the
// scan appends every logit at or above its CTA's bound of the k-th key (a superset of the top-k
// set) to the candidate list, and resolve selects both thresholds exactly among them.
// GRAPHDECODE_SAMPLING_SCAN_CAND=0 turns that off (A/B runs). Rows with top-p >= 0.7 and no top-k
// (without row_stats) skip the histogram too: the filter lists every token whose score reaches a
// floor (the top token's score, or a chunk's log-sum-exp less 4 when higher: the kept set's
// best-scored token is among them unless it lies below the floor, ~e^-38 of rows at p 0.7) and
// keeps the 8 best-scored as picks; a check pass over the whole grid sums the row's exact mass
// and, for each pick, the exact mass of strictly larger logits; resolve draws the first pick top-p
// keeps: the same token, by the definition above. If none of the 8 is kept, the exact path
// decides. GRAPHDECODE_SAMPLING_P_DRAW=0 turns that off, _DRAW_FLOOR=0 the floor, _DRAW_MIN_P=x
// moves the 0.7 (A/B runs). The filter and the check loop over (row, chunk) items; after its
// first, a CTA takes the next from a counter, since a draw row's items cost 2-4x another's
// (GRAPHDECODE_SAMPLING_DYNAMIC=0, _DYNAMIC_CHECK=0: the static stride).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace graphdecode {

enum class LogitsType : std::uint8_t { kFloat32 = 0, kBF16 = 1 };

// How a live row's token was decided (SamplingArgs::path, diagnostics for tests and benchmarks).
enum class SamplingPath : std::int32_t {
  kGreedy = 0,         // greedy row (or a sampled row whose max logit or 1 / T is not finite)
  kFast = 1,           // the plan's candidates decided it
  kExactOverflow = 2,  // too many candidates for the list: decided over the whole row
  kExactCheck = 3,     // the plan's range missed the top-p threshold: decided over the whole row
};

// The distribution a live row's token was drawn from (SamplingArgs::row_stats), for speculative
// acceptance (engine/spec/accept_sampled.h), which needs p(x) of any token x:
//   point_token >= 0: a point mass at that token (greedy rows, and sampled rows decided by their
//     argmax: a non-finite max or 1 / T); the other fields then only describe the row.
//   point_token = -1: the kept set is {i : key_of(l_i) >= keep_key} (sampling_math.h; 0 = every
//     token), token i of it has the integer mass mass_of(l_i, max_logit, inv_temperature), and
//     total_mass is their exact sum Z, so p(i) = mass_i / Z. The kernel that knows the exact
//     thresholds writes it; Z is summed in integers, independent of the grid.
struct SamplingRowStats {
  std::uint64_t total_mass;  // Z over the kept set (1 for a point mass)
  float max_logit;           // the row's max logit: the reference of every mass
  float inv_temperature;     // 1 / T (0 for greedy rows)
  std::uint32_t keep_key;    // smallest kept order key
  std::int32_t point_token;  // >= 0: the row is a point mass at this token; -1: sampled
};

struct SamplingArgs {
  const void* logits = nullptr;  // [max_rows][row_stride] float or bf16 bits (logits_type)
  LogitsType logits_type = LogitsType::kFloat32;
  const float* temperature = nullptr;      // [max_rows] 0 = greedy
  const std::int32_t* top_k = nullptr;     // [max_rows] 0 = off
  const float* top_p = nullptr;            // [max_rows] 1 = off, in (0, 1]
  const std::uint64_t* seed = nullptr;     // [max_rows] per request
  const std::uint64_t* step = nullptr;     // [max_rows] per request decode step (the RNG counter)
  std::int32_t* tokens = nullptr;          // [max_rows] out; rows >= num_rows are not written
  const std::int32_t* num_rows = nullptr;  // [1] live rows
  std::int32_t max_rows = 0;
  std::int32_t vocab = 0;       // at most kMaxSamplingVocab
  std::int64_t row_stride = 0;  // elements between rows of logits; 0 = vocab
  // Device scratch of at least sampling_workspace_bytes(max_rows, vocab) bytes, 16-byte aligned,
  // zero-filled once before its first call (every call leaves the counters it relies on zeroed
  // again; the plan fields it leaves set are rewritten before they are read). One workspace
  // serves one vocab and one stream at a time; a call may use fewer rows than it was sized for.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  std::int32_t* path = nullptr;      // optional [max_rows] out: SamplingPath of each live row
  std::int32_t candidate_limit = 0;  // 0 = the workspace's capacity; tests lower it to force the
                                     // exact whole-row path
  // Optional [max_rows] out: each live row's distribution (SamplingRowStats); nullptr = not
  // written and not computed. With it, rows without top-p also sum their exact masses (an expf
  // per token in the filter pass).
  SamplingRowStats* row_stats = nullptr;
};

constexpr std::int32_t kMaxSamplingVocab = 1 << 22;

// Bytes of device workspace sample() needs for up to max_rows rows of `vocab` logits (the query
// half of a two-phase API: allocate once at start-up, pass it in every call).
std::size_t sampling_workspace_bytes(std::int32_t max_rows, std::int32_t vocab);

void sample(const SamplingArgs& args, cudaStream_t stream);

}  // namespace graphdecode
