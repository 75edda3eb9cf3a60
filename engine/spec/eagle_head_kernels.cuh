// Kernels of the EAGLE heads' forward (engine/spec/eagle_head.cu for EAGLE-1/2,
// eagle3_head.cu for EAGLE-3): row gathers by hidden-state source, the concat of two row blocks,
// the output rows and the draft-to-target scatter of EAGLE-3's logits. Internal linkage: each
// translation unit that includes this gets its own copy.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "engine/spec/eagle_head.h"
#include "engine/spec/eagle_rules.h"

namespace graphdecode {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(std::int64_t items) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, (items + kThreads - 1) / kThreads));
}

// cat[t] = [emb[t] | hidden(t)] for live rows t, 16-byte vectors.
struct ConcatParams {
  const uint4* emb;  // [rows][hidden]
  HiddenInput in;
  uint4* cat;                       // [rows][2 hidden]
  const std::int32_t* num_rows;     // [1]
  std::int32_t max_rows, row_vecs;  // row_vecs = hidden / 8
};

__global__ void __launch_bounds__(kThreads) concat_kernel(const __grid_constant__ ConcatParams p) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const std::int32_t n = min(*p.num_rows, p.max_rows);
  if (i >= static_cast<std::int64_t>(n) * p.row_vecs) return;
  const auto t = static_cast<std::int32_t>(i / p.row_vecs);
  const auto e = static_cast<std::int32_t>(i - static_cast<std::int64_t>(t) * p.row_vecs);
  const uint4* h;
  if (p.in.rows != nullptr) {
    h = reinterpret_cast<const uint4*>(p.in.rows) + static_cast<std::int64_t>(t) * p.row_vecs;
  } else {
    const std::int32_t code = p.in.source[t];
    h = code >= 0 ? reinterpret_cast<const uint4*>(p.in.target) +
                        static_cast<std::int64_t>(code) * p.row_vecs
                  : reinterpret_cast<const uint4*>(p.in.carry) +
                        static_cast<std::int64_t>(eagle_rules::carry_index(code)) * p.row_vecs;
  }
  uint4* out = p.cat + static_cast<std::int64_t>(t) * 2 * p.row_vecs;
  out[e] = p.emb[static_cast<std::int64_t>(t) * p.row_vecs + e];
  out[p.row_vecs + e] = h[e];
}

// out[i] = bf16(res[row_i] + x[row_i]) for the phase's logits rows i: the layer's output there.
struct OutParams {
  const std::uint16_t* x;
  const std::uint16_t* res;
  std::uint16_t* out;
  const std::int32_t* num_rows;   // [1]
  const std::int32_t* logit_row;  // [max_rows]
  std::int32_t max_rows, hidden;
};

__global__ void __launch_bounds__(kThreads)
    output_rows_kernel(const __grid_constant__ OutParams p) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const std::int32_t n = min(*p.num_rows, p.max_rows);
  if (i >= static_cast<std::int64_t>(n) * p.hidden) return;
  const auto r = static_cast<std::int32_t>(i / p.hidden);
  const auto e = static_cast<std::int32_t>(i - static_cast<std::int64_t>(r) * p.hidden);
  const std::int64_t src = static_cast<std::int64_t>(p.logit_row[r]) * p.hidden + e;
  const float v = __bfloat162float(__ushort_as_bfloat16(p.res[src])) +
                  __bfloat162float(__ushort_as_bfloat16(p.x[src]));
  p.out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// dst[t] = the row `in` names for row t (in.rows: row t; else by source code: >= 0 a row of
// in.target, < 0 a row of in.carry), `row_vecs` 16-byte vectors wide, for live rows t.
struct GatherParams {
  HiddenInput in;
  uint4* dst;                    // [rows][row_vecs]
  const std::int32_t* num_rows;  // [1]
  std::int32_t max_rows, row_vecs;
};

__global__ void __launch_bounds__(kThreads)
    gather_states_kernel(const __grid_constant__ GatherParams p) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const std::int32_t n = min(*p.num_rows, p.max_rows);
  if (i >= static_cast<std::int64_t>(n) * p.row_vecs) return;
  const auto t = static_cast<std::int32_t>(i / p.row_vecs);
  const auto e = static_cast<std::int32_t>(i - static_cast<std::int64_t>(t) * p.row_vecs);
  const uint4* src;
  if (p.in.rows != nullptr) {
    src = reinterpret_cast<const uint4*>(p.in.rows) + static_cast<std::int64_t>(t) * p.row_vecs;
  } else {
    const std::int32_t code = p.in.source[t];
    src = code >= 0 ? reinterpret_cast<const uint4*>(p.in.target) +
                          static_cast<std::int64_t>(code) * p.row_vecs
                    : reinterpret_cast<const uint4*>(p.in.carry) +
                          static_cast<std::int64_t>(eagle_rules::carry_index(code)) * p.row_vecs;
  }
  p.dst[i] = src[e];
}

// logits[r][v] = draft[r][target_to_draft[v]], or -inf where v is no draft id, for the phase's
// logits rows r: a draft distribution over the target's vocabulary (zero mass off the draft
// vocabulary), which the sampler and sampled acceptance read as any draft model's.
struct ScatterParams {
  const float* draft;                   // [max_rows][draft_vocab]
  const std::int32_t* target_to_draft;  // [vocab], -1 off the draft vocabulary
  float* logits;                        // [max_rows][vocab]
  const std::int32_t* num_rows;         // [1] the phase's logits rows
  std::int32_t max_rows, vocab, draft_vocab;
};

__global__ void __launch_bounds__(kThreads)
    scatter_draft_kernel(const __grid_constant__ ScatterParams p) {
  const std::int64_t v = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const auto r = static_cast<std::int32_t>(blockIdx.y);
  if (v >= p.vocab || r >= min(*p.num_rows, p.max_rows)) return;
  const std::int32_t d = p.target_to_draft[v];
  p.logits[static_cast<std::int64_t>(r) * p.vocab + v] =
      d >= 0 ? p.draft[static_cast<std::int64_t>(r) * p.draft_vocab + d] : -INFINITY;
}

}  // namespace
}  // namespace graphdecode
