// What both bodies of the attention kernel's work item share (attention_kernel.cuh's mma.sync
// layouts and attend_wgmma.cuh's warpgroup layout): the PDL handshake, the online softmax's
// per-row fold of a tile's maximum, the rescale of o, and the writes of a finished row.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "attention/attention_params.cuh"
#include "attention/mma_utils.cuh"
#include "attention/work_item.cuh"
#include "common/pdl.cuh"

namespace graphdecode::attn {

// Waits for the kernel before this one in the stream, then lets the kernel after this one be
// scheduled: in that order, as common/pdl.cuh's promise asks of a PDL-launched kernel.
__device__ __forceinline__ void grid_dependency_sync() {
  pdl_wait_for_prior_grid();
  pdl_launch_dependents();
}

// Writes one finished row (normalized o, lse in log2 domain) to out/lse or to the partials.
template <typename T>
__device__ __forceinline__ void store_row_pair(const KernelParams& p, const WorkItem& w, int row,
                                               int dim, float o0, float o1) {
  int tok, head;
  row_token_head(p, w, row, tok, head);
  if (w.split) {
    const std::int64_t e =
        w.part_off + (static_cast<std::int64_t>(w.chunk) * w.q_len + tok) * p.call.num_q_heads +
        head;
    *reinterpret_cast<float2*>(p.partial_o + e * p.kv.head_dim + dim) = make_float2(o0, o1);
  } else {
    const std::int64_t e = static_cast<std::int64_t>(w.q_begin + tok) * p.call.num_q_heads + head;
    T* out = static_cast<T*>(p.out) + e * p.kv.head_dim + dim;
    *reinterpret_cast<uint32_t*>(out) = MmaType<T>::pack(o0, o1);
  }
}
__device__ __forceinline__ void store_row_lse(const KernelParams& p, const WorkItem& w, int row,
                                              float lse2) {
  int tok, head;
  row_token_head(p, w, row, tok, head);
  if (w.split) {
    const std::int64_t e =
        w.part_off + (static_cast<std::int64_t>(w.chunk) * w.q_len + tok) * p.call.num_q_heads +
        head;
    p.partial_lse[e] = lse2;
  } else if (p.lse != nullptr) {
    const std::int64_t e = static_cast<std::int64_t>(w.q_begin + tok) * p.call.num_q_heads + head;
    p.lse[e] = lse2 == -INFINITY ? -INFINITY : lse2 * 0.6931471805599453f;
  }
}

// Online softmax (log2 domain), per row i of a thread's two: folds the tile's row maximum (mx,
// this thread's part, reduced over the row's lanes by `reduce`) into m; alpha rescales the old l
// (here) and o (by the caller), m_use is the base of this tile's exponents.
template <typename Reduce>
__device__ __forceinline__ void fold_tile_max(float (&m)[2], float (&l)[2], const float (&mx)[2],
                                              Reduce reduce, float (&alpha)[2], float (&m_use)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = fmaxf(m[i], reduce(mx[i]));
    m_use[i] = m_new == -INFINITY ? 0.f : m_new;
    alpha[i] = fast_exp2(m[i] - m_use[i]);  // m = -inf -> 0
    m[i] = m_new;
    l[i] *= alpha[i];
  }
}

// o *= alpha per row, after a tile moved the row maxima. Element e of an accumulator block belongs
// to row e / 2 of the thread's two in the 16-row layouts, to row e % 2 in the narrow one (rows are
// its mma's N dimension).
// Skipped when no row of the warp moved (alpha == 1 exactly: the same result), which is most tiles
// of a long span. Called by every lane of the warp.
template <bool kNarrow, int kBlocks>
__device__ __forceinline__ void rescale_o(float (&o)[kBlocks][4], const float (&alpha)[2]) {
  if (__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) return;
#pragma unroll
  for (int d = 0; d < kBlocks; ++d) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[d][e] *= alpha[kNarrow ? e % 2 : e / 2];
  }
}

}  // namespace graphdecode::attn
