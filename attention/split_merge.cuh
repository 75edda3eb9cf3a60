// The split-KV merge of the attention kernel: partial states (o, lse) of a (request, head, tile)
// written by its chunks' CTAs are combined, in chunk order, by the CTA that finishes last.
#pragma once

#include <cfloat>
#include <cstdint>

#include "attention/attention_params.cuh"
#include "attention/attention_trace.cuh"
#include "attention/mma_utils.cuh"
#include "attention/work_item.cuh"
#include "common/atomics.cuh"

namespace graphdecode::attn {

// Split-KV merge fused into the attention kernel: the last CTA of a (request, head, tile) to finish
// its chunk merges all chunks of those rows, in chunk order (so the result does not depend on which
// CTA came last), writes out/lse and resets the counter for the next launch or graph replay.
// One pass with a running maximum, 4 dims per thread, chunks loaded kMergeBatch at a time: a merge
// of up to kMergeBatch chunks costs one L2 round trip after the arrival count. (A loop whose body
// branches on each loaded lse serializes the loads, NOTES 14.) With kMergePrefetch (head dims >=
// 128, attention_policy.h) the next batch's loads are in flight while this one is summed.
template <typename T, int kHeadDim>
__device__ __forceinline__ void merge_if_last(const KernelParams& p, const WorkItem& w,
                                              int* s_last) {
  // Arrival in CUTLASS's semaphore form: after the barrier thread 0 alone counts with an acq_rel
  // atomic. The release is cumulative over the barrier (every thread's partial stores are visible
  // device-wide before the count); the acquire, then the barrier, order the last CTA's partial
  // reads after it. No separate fence: full fences (fence.sc.gpu) in every thread were about a
  // third of a small merge's time (bench/NOTES.md 79).
  __syncthreads();
  int* counter = p.merge_count + (w.item - w.chunk);
  if (threadIdx.x == 0) {
    const int done = atomic_add_acq_rel_gpu(counter, 1) + 1;
    *s_last = done == w.chunks;
    if (done == w.chunks) *counter = 0;
  }
  __syncthreads();
  if (!*s_last) return;
  GD_TRACE_MERGED();
  GD_TRACE_POINT(7);
  const std::int64_t stride = static_cast<std::int64_t>(w.q_len) * p.call.num_q_heads;  // per chunk
  constexpr int kQuads = kHeadDim / 4;
  for (int e = threadIdx.x; e < w.rows * kQuads; e += kThreads) {
    const int row = e / kQuads;
    const int dim = (e % kQuads) * 4;
    int tok, head;
    row_token_head(p, w, row, tok, head);
    const std::int64_t first =
        w.part_off + static_cast<std::int64_t>(tok) * p.call.num_q_heads + head;
    float mmax = -INFINITY, wsum = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
    // Chunks in batches of kMergeBatch, in chunk order (the sum is deterministic): all loads of a
    // batch are issued before any is used, then one rescale to the batch's maximum.
    const auto load = [&](int c0, float(&lc)[kMergeBatch], float4(&v)[kMergeBatch]) {
#pragma unroll
      for (int k = 0; k < kMergeBatch; ++k) {
        const bool ok = c0 + k < w.chunks;
        const std::int64_t idx = first + static_cast<std::int64_t>(ok ? c0 + k : c0) * stride;
        lc[k] = ok ? __ldcg(p.partial_lse + idx) : -INFINITY;
        v[k] = ok ? __ldcg(reinterpret_cast<const float4*>(p.partial_o + idx * kHeadDim + dim))
                  : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    };
    const auto consume = [&](const float(&lc)[kMergeBatch], const float4(&v)[kMergeBatch]) {
      float bm = mmax;
#pragma unroll
      for (int k = 0; k < kMergeBatch; ++k) bm = fmaxf(bm, lc[k]);
      if (bm == -INFINITY) return;       // no chunk so far saw a key
      const float r = exp2f(mmax - bm);  // mmax = -inf -> 0
      wsum *= r;
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[j] *= r;
      mmax = bm;
#pragma unroll
      for (int k = 0; k < kMergeBatch; ++k) {
        const float sc = exp2f(lc[k] - mmax);  // lc = -inf -> 0
        wsum += sc;
        acc[0] += sc * v[k].x;
        acc[1] += sc * v[k].y;
        acc[2] += sc * v[k].z;
        acc[3] += sc * v[k].w;
      }
    };
    if constexpr (kMergePrefetch<kHeadDim>) {
      // Two register buffers: the next batch's loads are in flight while this batch is summed, so
      // 32 chunks cost about two L2 round trips instead of four.
      float lc_a[kMergeBatch], lc_b[kMergeBatch];
      float4 v_a[kMergeBatch], v_b[kMergeBatch];
      load(0, lc_a, v_a);
      if (e == 0) GD_TRACE_LOADED(__float_as_uint(lc_a[0]) ^ __float_as_uint(v_a[0].x));
      for (int c0 = 0; c0 < w.chunks; c0 += 2 * kMergeBatch) {
        const bool has_b = c0 + kMergeBatch < w.chunks;
        if (has_b) load(c0 + kMergeBatch, lc_b, v_b);
        consume(lc_a, v_a);
        if (!has_b) break;
        if (c0 + 2 * kMergeBatch < w.chunks) load(c0 + 2 * kMergeBatch, lc_a, v_a);
        consume(lc_b, v_b);
      }
    } else {
      for (int c0 = 0; c0 < w.chunks; c0 += kMergeBatch) {
        float lc[kMergeBatch];
        float4 v[kMergeBatch];
        load(c0, lc, v);
        if (c0 == 0 && e == 0) GD_TRACE_LOADED(__float_as_uint(lc[0]) ^ __float_as_uint(v[0].x));
        consume(lc, v);
      }
    }
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    const std::int64_t orow =
        static_cast<std::int64_t>(w.q_begin + tok) * p.call.num_q_heads + head;
    const uint2 packed = make_uint2(MmaType<T>::pack(acc[0] * inv, acc[1] * inv),
                                    MmaType<T>::pack(acc[2] * inv, acc[3] * inv));
    *reinterpret_cast<uint2*>(static_cast<T*>(p.out) + orow * kHeadDim + dim) = packed;
    if (dim == 0 && p.lse != nullptr)
      p.lse[orow] = wsum > 0.f ? (mmax + log2f(wsum)) * 0.6931471805599453f : -INFINITY;
  }
}

}  // namespace graphdecode::attn
