// The paged attention kernel: one CTA = one work item (request, KV head, query tile, KV chunk).
//
// Two layouts in one kernel, chosen per tile from the request's own shape (so batch-invariant):
//   decode layout (tile rows <= 16): the 4 warps share the 16 query rows and split every 64-key
//     tile into 4 x 16 keys; their states merge through shared memory in warp order at the end.
//   extend layout (more rows): each warp owns 16 of 64 query rows and sweeps all keys; at head
//     dims 64 and 128 on sm_90a the 4 warps run it as one warpgroup on wgmma (attend_wgmma.cuh).
// Rows are (token, head-in-group) pairs: GQA heads that share a KV head share every K/V load.
// K/V tiles stream through a cp.async pipeline (kStages deep) with 16-byte zero-filling copies;
// keys outside the item's span are never read, so released (kInvalidPage) pages are never touched.
// Scores and P.V run on mma.sync m16n8k16 with fp32 accumulation; online softmax in the log2
// domain. A request with one chunk writes `out`/`lse` directly; split requests write fp32
// partials and the last CTA of each (request, head, tile) combines them in chunk order
// (merge_if_last), so a step is one launch of this kernel after the planner.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "attention/attend_wgmma.cuh"
#include "attention/attention_params.cuh"
#include "attention/attention_trace.cuh"
#include "attention/kv_tile_copy.cuh"
#include "attention/mma_utils.cuh"
#include "attention/row_softmax.cuh"
#include "attention/split_merge.cuh"
#include "attention/work_item.cuh"
#include "common/pdl.cuh"
#include "common/request_rules.h"

namespace graphdecode::attn {

// kWarpsKV = 4: decode layout (warps split keys); 1: extend layout (warps split rows).
// kNarrow (decode layout, <= 8 rows): the mma's roles swap, S^T = K Q^T and O^T += V^T P^T, so a
// warp's 16 keys are the M dimension and the rows the N = 8 one (half the mma work of 16 padded
// rows as M; a thread then holds rows 2 * t4 and 2 * t4 + 1, for keys / dims g and g + 8).
// kDense: the dense decode kernel's stages (TileConfig).
template <typename T, int kHeadDim, int kWarpsKV, bool kNarrow = false, bool kDense = false>
__device__ __forceinline__ void attend(const KernelParams& p, const WorkItem& w, bool early, T* sQ,
                                       T* sK, T* sV, float* s_ml) {
  using C = TileConfig<kHeadDim, kMaxRows, kDense>;
  static_assert(!kNarrow || kWarpsKV == 4, "the narrow layout is a decode layout");
  constexpr int kKeysPerWarp = kBlockN / kWarpsKV;  // 16 or 64
  constexpr int kNB = kKeysPerWarp / 8;             // score n-blocks per warp
  constexpr int kDB = kHeadDim / 8;                 // output n-blocks (narrow: kDB / 2 m-blocks)
  constexpr int kQRows = kNarrow ? 8 : kWarpsKV == 4 ? 16 : kMaxRows;
  // The decode layout rolls the Q.K^T head-dim loop and the K/V copies: less code for every CTA
  // to fetch cold. The extend layout's 64-row schedule needs them unrolled (NOTES 23).
  constexpr bool kRolled = kWarpsKV == 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wq = kWarpsKV == 4 ? 0 : warp;  // row group of this warp
  const int wk = kWarpsKV == 4 ? warp : 0;  // key slice of this warp
  const int g = lane / 4, t4 = lane % 4;

  const auto load_q = [&] { load_q_tile<T, kHeadDim, kQRows>(p, w, sQ); };

  // Visible key range of this thread's two rows (g and g + 8 of the warp's 16; narrow: 2 * t4 + i).
  int row_lo[2], row_hi[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = kNarrow ? 2 * t4 + i : wq * 16 + g + 8 * i;
    if (row < w.rows) {
      const int pos = w.pos0 + p.group_div.div(row);
      row_lo[i] = p.call.causal ? max(w.kb, first_visible_key(pos, w.window)) : w.kb;
      row_hi[i] = p.call.causal ? min(w.ke - 1, pos) : w.ke - 1;
    } else {
      row_lo[i] = 1;
      row_hi[i] = 0;  // empty
    }
  }

  const int key_begin = w.kb < w.ke ? (w.kb / kBlockN) * kBlockN : 0;
  const int n_tiles = w.kb < w.ke ? (w.ke - key_begin + kBlockN - 1) / kBlockN : 0;

  constexpr int kOB = kNarrow ? kDB / 2 : kDB;  // accumulator blocks: 16 dims x 8 rows (narrow)
  float o[kOB][4];
#pragma unroll
  for (int d = 0; d < kOB; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const std::uint64_t kv_policy = l2_evict_first_policy();

  // The first kStages - 1 iterations only fill the pipeline: one load site keeps the code small
  // (every CTA fetches it cold; at small batch a CTA runs 1-2 tiles, so code is the latency).
  // The first commit group also carries Q. Early start (`early`, p.early_kv for a CTA's first
  // item): those tiles hold every key but this step's new rows [new_begin, ke), copied before the
  // wait; at it = 0 the wait, then one group with Q and the new rows, so tile 0 needs all but the
  // newest group.
  const int new_begin = p.call.causal ? max(w.kb, w.kv_len - w.q_len) : w.kb;
  // Narrow layout: this lane's V^T ldmatrix offsets (bytes) inside a stage, the same for every
  // tile, so made once per item (per tile they are a tenth of the warp's compute instructions).
  // Set once the prologue's copies are issued: code run before them delays a small batch's first
  // tile (NOTES 58).
  std::uint32_t v_off[kNarrow ? kOB : 1];
  if (!early) load_q();
#pragma unroll 1
  for (int it = 1 - C::kStages; it < n_tiles; ++it) {
    if (early && it == 0) {
      GD_TRACE_POINT(6);
      grid_dependency_sync();
      GD_TRACE_POINT(5);
      load_q();
      for (int t = 0; t < C::kStages - 1 && t < n_tiles; ++t)
        load_kv_tile<T, kHeadDim, true, true>(
            p, w, key_begin + t * kBlockN, sK + t * kBlockN * kHeadDim, sV + t * kBlockN * kHeadDim,
            kv_policy, new_begin, w.ke, true);
      cp_async_commit();
    }
    // Issue tile it + kStages - 1 into the stage tile it - 1 left (one commit group per iteration).
    const int nxt = it + C::kStages - 1;
    if (nxt < n_tiles) {
      const int st = nxt % C::kStages;
      T* k_dst = sK + st * kBlockN * kHeadDim;
      T* v_dst = sV + st * kBlockN * kHeadDim;
      if (early && it < 0)
        load_kv_tile<T, kHeadDim, true, true>(p, w, key_begin + nxt * kBlockN, k_dst, v_dst,
                                              kv_policy, new_begin, w.ke, false);
      else
        load_kv_tile<T, kHeadDim, kRolled>(p, w, key_begin + nxt * kBlockN, k_dst, v_dst,
                                           kv_policy);
    }
    cp_async_commit();
    if (it < 0) {
      if constexpr (kNarrow) {
        if (it == -1) {
          const int vrow = wk * kKeysPerWarp + (lane / 16) * 8 + lane % 8;
#pragma unroll
          for (int mb = 0; mb < kOB; ++mb) {
            v_off[mb] = sizeof(T) * swizzled_offset<kHeadDim>(vrow, mb * 2 + (lane / 8) % 2);
            asm volatile("" : "+r"(v_off[mb]));  // kept in a register: nvcc recomputes it per tile
          }
        }
      }
      continue;
    }
    // Tile it is in the oldest group still open; at it = 0 of an early start, in the newest.
    if (early && it == 0)
      cp_async_wait<1>();
    else
      cp_async_wait<C::kStages - 1>();
    __syncthreads();
    if (it == 0) GD_TRACE_POINT(2);
    GD_TRACE_TILE(it, n_tiles);
    const int st = it % C::kStages;
    const T* k_tile = sK + st * kBlockN * kHeadDim;
    const T* v_tile = sV + st * kBlockN * kHeadDim;
    const int key_tile = key_begin + it * kBlockN;

    if constexpr (kNarrow) {
      // S^T = K Q^T: sc = keys (g, g + 8) x rows (2 * t4, 2 * t4 + 1) of this warp's 16 keys.
      float sc[4] = {0.f, 0.f, 0.f, 0.f};
      const int krow = wk * kKeysPerWarp + ((lane / 8) % 2) * 8 + lane % 8;
#pragma unroll(kRolled ? 1 : kHeadDim / 32)
      for (int kk = 0; kk < kHeadDim / 16; kk += 2) {
        uint32_t qb[4];  // B operands (Q rows as columns) of head-dim steps kk and kk + 1
        ldmatrix_x4(qb, smem_addr(sQ + swizzled_offset<kHeadDim>(lane % 8, kk * 2 + lane / 8)));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t a[4];
          ldmatrix_x4(
              a, smem_addr(k_tile + swizzled_offset<kHeadDim>(krow, (kk + h) * 2 + lane / 16)));
          const uint32_t b[2] = {qb[2 * h], qb[2 * h + 1]};
          mma_16816<T>(sc, a, b);
        }
      }
      // Mask, online softmax (log2 domain); a row's keys are spread over the 8 lanes of a column.
      const int key_g = key_tile + wk * kKeysPerWarp + g;
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e & 1, key = key_g + 8 * (e / 2);
        const bool vis = key >= row_lo[i] && key <= row_hi[i];
        sc[e] = vis ? sc[e] : -INFINITY;  // unscaled: the scale rides in the exponent's FFMA
        mx[i] = fmaxf(mx[i], sc[e]);
      }
      mx[0] *= p.scale_log2;  // (max of x) * s == max of (x * s) for s > 0, rounding included
      mx[1] *= p.scale_log2;
      float alpha[2], m_use[2];
      fold_tile_max(m, l, mx, column_max, alpha, m_use);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[e] = fast_exp2(fmaf(sc[e], p.scale_log2, -m_use[e & 1]));
        l[e & 1] += sc[e];
      }
      rescale_o<kNarrow>(o, alpha);
      // O^T += V^T P^T: P^T (keys x rows) as the B operand, transposed from the accumulator.
      const uint32_t b[2] = {movmatrix_trans(MmaType<T>::pack(sc[0], sc[1])),
                             movmatrix_trans(MmaType<T>::pack(sc[2], sc[3]))};
      const std::uint32_t v_stage = smem_addr(v_tile);
#pragma unroll
      for (int mb = 0; mb < kOB; ++mb) {
        uint32_t a[4];  // V^T: dims mb * 16 + (0..15) x this warp's 16 keys
        ldmatrix_x4_trans(a, v_stage + v_off[mb]);
        mma_16816<T>(o[mb], a, b);
      }
    } else {
      // S = Q K^T for this warp's 16 rows x kKeysPerWarp keys.
      float s[kNB][4];
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
#pragma unroll(kRolled ? 1 : kHeadDim / 16)
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(
            a, smem_addr(sQ + swizzled_offset<kHeadDim>(wq * 16 + lane % 16, kk * 2 + lane / 16)));
#pragma unroll
        for (int nb2 = 0; nb2 < kNB / 2; ++nb2) {
          uint32_t b[4];
          const int krow = wk * kKeysPerWarp + nb2 * 16 + (lane / 16) * 8 + lane % 8;
          ldmatrix_x4(b,
                      smem_addr(k_tile + swizzled_offset<kHeadDim>(krow, kk * 2 + (lane / 8) % 2)));
          const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
          mma_16816<T>(s[2 * nb2], a, b0);
          mma_16816<T>(s[2 * nb2 + 1], a, b1);
        }
      }

      // Mask, online softmax (log2 domain).
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e / 2;
          const int key = key_tile + wk * kKeysPerWarp + nb * 8 + 2 * t4 + (e & 1);
          const bool vis = key >= row_lo[i] && key <= row_hi[i];
          s[nb][e] = vis ? s[nb][e] : -INFINITY;  // unscaled, as in the narrow layout
          mx[i] = fmaxf(mx[i], s[nb][e]);
        }
      }
      mx[0] *= p.scale_log2;
      mx[1] *= p.scale_log2;
      float alpha[2], m_use[2];
      fold_tile_max(m, l, mx, quad_max, alpha, m_use);
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[nb][e] = fast_exp2(fmaf(s[nb][e], p.scale_log2, -m_use[e / 2]));
          l[e / 2] += s[nb][e];
        }
      }
      rescale_o<kNarrow>(o, alpha);

      // O += P V
#pragma unroll
      for (int ks = 0; ks < kKeysPerWarp / 16; ++ks) {
        uint32_t a[4];
        a[0] = MmaType<T>::pack(s[2 * ks][0], s[2 * ks][1]);
        a[1] = MmaType<T>::pack(s[2 * ks][2], s[2 * ks][3]);
        a[2] = MmaType<T>::pack(s[2 * ks + 1][0], s[2 * ks + 1][1]);
        a[3] = MmaType<T>::pack(s[2 * ks + 1][2], s[2 * ks + 1][3]);
        const int vrow = wk * kKeysPerWarp + ks * 16 + lane % 8 + ((lane / 8) % 2) * 8;
#pragma unroll
        for (int db = 0; db < kDB / 2; ++db) {
          uint32_t b[4];
          ldmatrix_x4_trans(
              b, smem_addr(v_tile + swizzled_offset<kHeadDim>(vrow, db * 2 + lane / 16)));
          const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
          mma_16816<T>(o[2 * db], a, b0);
          mma_16816<T>(o[2 * db + 1], a, b1);
        }
      }
    }
    __syncthreads();  // the stage is refilled by the next iteration's load
  }
  cp_async_wait<0>();
  __syncthreads();
  if (early && n_tiles == 0) grid_dependency_sync();  // before the first write

#pragma unroll
  for (int i = 0; i < 2; ++i) l[i] = kNarrow ? column_sum(l[i]) : quad_sum(l[i]);

  if constexpr (kWarpsKV == 1) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = wq * 16 + g + 8 * i;
      if (row >= w.rows) continue;
      const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
#pragma unroll
      for (int d = 0; d < kDB; ++d)
        store_row_pair<T>(p, w, row, d * 8 + 2 * t4, o[d][2 * i] * inv, o[d][2 * i + 1] * inv);
      if (t4 == 0) store_row_lse(p, w, row, l[i] > 0.f ? m[i] + log2f(l[i]) : -INFINITY);
    }
  } else {
    // Merge the 4 warps' states (same 16 rows, disjoint keys) in warp order.
    float* s_o = reinterpret_cast<float*>(sK);  // [4 warps][16 rows][kHeadDim]
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = kNarrow ? 2 * t4 + i : g + 8 * i;
#pragma unroll
      for (int d = 0; d < kOB; ++d) {
        if constexpr (kNarrow) {
          float* dst = s_o + (warp * 16 + row) * kHeadDim + d * 16 + g;
          dst[0] = o[d][i];
          dst[8] = o[d][2 + i];
        } else {
          float* dst = s_o + (warp * 16 + row) * kHeadDim + d * 8 + 2 * t4;
          dst[0] = o[d][2 * i];
          dst[1] = o[d][2 * i + 1];
        }
      }
      if ((kNarrow ? g : t4) == 0) {
        s_ml[(warp * 16 + row) * 2] = m[i];
        s_ml[(warp * 16 + row) * 2 + 1] = l[i];
      }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < w.rows * (kHeadDim / 2); e += kThreads) {
      const int row = e / (kHeadDim / 2);
      const int dim = (e % (kHeadDim / 2)) * 2;
      float mmax = -INFINITY;
#pragma unroll
      for (int k = 0; k < 4; ++k) mmax = fmaxf(mmax, s_ml[(k * 16 + row) * 2]);
      float lsum = 0.f, o0 = 0.f, o1 = 0.f;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float mk = s_ml[(k * 16 + row) * 2];
        const float sc = mk == -INFINITY ? 0.f : exp2f(mk - mmax);
        lsum += s_ml[(k * 16 + row) * 2 + 1] * sc;
        o0 += s_o[(k * 16 + row) * kHeadDim + dim] * sc;
        o1 += s_o[(k * 16 + row) * kHeadDim + dim + 1] * sc;
      }
      const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
      store_row_pair<T>(p, w, row, dim, o0 * inv, o1 * inv);
      if (dim == 0) store_row_lse(p, w, row, lsum > 0.f ? mmax + log2f(lsum) : -INFINITY);
    }
  }
}

// The extend layout on the warpgroup MMA where this build has it (sm_90a, head dims 64 and 128),
// else the mma.sync one.
template <typename T, int kHeadDim>
__device__ __forceinline__ void attend_extend_wgmma_or_mma(const KernelParams& p, const WorkItem& w,
                                                           bool early, T* sQ, T* sK, T* sV,
                                                           float* s_ml) {
#if GD_ATTN_HAS_WGMMA
  if constexpr (kWgmmaExtend<kHeadDim>) {
    attend_extend_wgmma<T, kHeadDim>(p, w, early, sQ, sK, sV);
    return;
  }
#endif
  attend<T, kHeadDim, 1>(p, w, early, sQ, sK, sV, s_ml);
}

// An extend item of the wide-tile kernel (up to kWideRows rows): one 128-row warpgroup tile where
// this build has the body (sm_90a) and the shared memory is aligned for it, else its two 64-row
// halves one after the other on the mma.sync layout (the same rows and keys; kb, ke and pos0
// narrowed to each half as fill_work_item would).
template <typename T, int kHeadDim>
__device__ __forceinline__ void attend_extend_wide(const KernelParams& p, const WorkItem& w,
                                                   bool early, bool aligned, T* sQ, T* sK, T* sV,
                                                   float* s_ml) {
#if GD_ATTN_HAS_WGMMA
  if constexpr (kWideExtend<kHeadDim> && !kWideForceHalves) {
    if (aligned) {
      attend_extend_wgmma<T, kHeadDim, 2>(p, w, early, sQ, sK, sV);
      return;
    }
  }
#endif
  const int half_tokens = kMaxRows / p.call.group;
  for (int h = 0; h < 2; ++h) {
    WorkItem hw = w;
    hw.tok0 = w.tok0 + h * half_tokens;
    hw.tokens = min(half_tokens, w.tokens - h * half_tokens);
    if (hw.tokens <= 0) break;
    hw.rows = hw.tokens * p.call.group;
    if (p.call.causal) {
      hw.pos0 = w.pos0 + h * half_tokens;
      if (w.kb < w.ke) {
        hw.kb = max(w.kb, first_visible_key(hw.pos0, w.window));
        hw.ke = min(w.ke, hw.pos0 + hw.tokens);
      }
    }
    attend<T, kHeadDim, 1>(p, hw, early && h == 0, sQ, sK, sV, s_ml);
    __syncthreads();  // the next half reloads Q and the stages
  }
}

// kPersistent (attention_policy.h): a grid of at most one wave of resident CTAs that claim the
// items past it (the loop below); else (d256, where the loop's registers spill) a grid of the work
// capacity, one item per CTA.
// kWide: extend items of up to kWideRows rows (the plan's tokens_per_tile is kWideRows / group):
// half the K/V copies and barriers per product. A separate kernel because its registers (two
// halves' accumulators) would cost the decode layouts a CTA per SM (PagedAttention picks it per
// plan, paged_attention.cu).
// kDense (kDenseDecode head dims, attention_policy.h): kDenseBlocksPerSm CTAs per SM, registers
// capped for it, kDenseStages stages; its extend items take the mma.sync layout (the warpgroup
// body needs 3 stages). The same decode-layout code, so the same decode outputs bit for bit.
template <typename T, int kHeadDim, bool kWide = false, bool kDense = false>
__global__ void __launch_bounds__(kThreads, kDense ? kDenseBlocksPerSm : kMinBlocksPerSm)
    attention_kernel(const __grid_constant__ KernelParams p) {
  static_assert(!(kWide && kDense), "the dense kernel has 64-row extend tiles");
  using C = KernelTiles<kHeadDim, kWide, kDense>;
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ float s_ml[4 * 16 * 2];
  __shared__ int s_flag;
  __shared__ int s_next;
  GD_TRACE_POINT(0);
  // Launched as a programmatic dependent (PDL) of the kernel before it (the planner, a layer's
  // other kernels): wait for its completion and writes before the first global access, then let
  // the kernel behind this one be scheduled (its CTAs take SM slots as ours exit). With p.early_kv
  // the wait comes later, in attend(), once the copies that may precede it are issued. Every CTA
  // waits before it triggers, even one with no work: PriorWrites::kQueryAndNewKv relies on it.
  if (!p.early_kv) grid_dependency_sync();
  bool waited = !p.early_kv;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + C::kQElems;
  T* sV = sK + C::kKVElems;
  // kPersistent: the grid is at most one wave of resident CTAs; a CTA runs item blockIdx.x, then
  // claims the items past the grid one at a time until none is left (no empty CTAs to launch).
  for (int item = blockIdx.x;;) {
    WorkItem w;
    int total = 0;  // work items of the call, the same in every CTA
    const bool has = p.self_plan ? self_planned_work_item<kAlonePlan<kHeadDim>>(p, item, w, total)
                                 : planned_work_item(p, item, w, total);
    if (has) {
      GD_TRACE_POINT(1);
      GD_TRACE_ITEM(w);
      const bool early = !waited;
      waited = true;  // attend() waits (it always reaches griddepcontrol.wait when early)
      // Narrow layout for <= 8 rows at head dims where its set-up pays, else for long items only:
      // the choice depends on the item alone (deterministic mode anchors its keys per request),
      // so outputs stay batch-invariant. Narrow first: the order of the branches is code layout
      // that the d64 model step feels (NOTES 53).
      if (w.q_len * p.call.group <= 8 &&
          (kHeadDim >= kNarrowMinHeadDim || w.ke - w.kb >= kNarrowMinKeys))
        attend<T, kHeadDim, 4, true, kDense>(p, w, early, sQ, sK, sV, s_ml);
      else if (w.q_len * p.call.group <= kDecodeRows)
        attend<T, kHeadDim, 4, false, kDense>(p, w, early, sQ, sK, sV, s_ml);
      else if constexpr (kDense)
        attend<T, kHeadDim, 1, false, true>(p, w, early, sQ, sK, sV, s_ml);
      else if constexpr (kWide)
        attend_extend_wide<T, kHeadDim>(p, w, early, wgmma_tiles_aligned(smem), sQ, sK, sV, s_ml);
      else if (GD_ATTN_HAS_WGMMA && kWgmmaExtend<kHeadDim> && wgmma_tiles_aligned(smem))
        attend_extend_wgmma_or_mma<T, kHeadDim>(p, w, early, sQ, sK, sV, s_ml);
      else
        attend<T, kHeadDim, 1>(p, w, early, sQ, sK, sV, s_ml);
      GD_TRACE_POINT(3);
      if (w.split) merge_if_last<T, kHeadDim>(p, w, &s_flag);
      GD_TRACE_POINT(4);
    }
    if (!kPersistent<kHeadDim> || total <= static_cast<int>(gridDim.x)) break;  // uniform
    // Every CTA claims until a claim fails, so a launch makes exactly `total` claims (values
    // 0 .. total - 1 of the counter): the last one resets the counter for the next launch.
    __syncthreads();  // the next item reuses shared memory (and s_next)
    if (threadIdx.x == 0) {
      const int c = atomicAdd(p.work_counter, 1);
      if (c == total - 1) *p.work_counter = 0;
      s_next = c + static_cast<int>(gridDim.x);
    }
    __syncthreads();
    item = s_next;
    if (item >= total) break;
  }
  if (!waited) grid_dependency_sync();
}

}  // namespace graphdecode::attn
