// The extend layout at head dims 64 and 128 on Hopper's warpgroup MMA (sm_90a): the CTA's 4 warps
// are one warpgroup, its 64 query rows one wgmma M. Per 64-key tile, S = Q K^T is head_dim / 16
// m64n64k16 products with Q and K read from their shared-memory tiles, and O += P V 4 per 64-dim
// slab more, with P (the exponents, packed to 16 bits) from registers and V from its tile.
//
// Why: the mma.sync layout (attend<T, D, 1>) loads every K and V fragment once per warp through
// ldmatrix (four times per tile), plus Q's every tile; those shared-memory reads and the mma issue
// slots held long prompts' attention near 20% of the bf16 peak at head dim 64 (bench/NOTES.md
// 95). A warpgroup product reads its shared operands once for the 64 rows.
//
// Tiles: the wgmma 128-byte swizzle atom is 8 rows of 128 bytes. At head dim 64 a row is one,
// and the tiles are the mma.sync layout's (swizzled_offset<64>). At 128 the tiles are stored as two
// 64-column slabs (slab_offset, mma_utils.cuh); only this body reads them.
//
// Everything else is the mma.sync extend layout's, in the same order: the work item, the cp.async
// pipeline and its early start (attention_kernel.cuh), the masks, the online softmax (log2
// domain, fast exp2), and the row writes. The wgmma accumulator layout is the m16n8 one per warp
// (wgmma.cuh), so the softmax reads the same elements at the same places.
#pragma once

#include <cstdint>

#include "attention/attention_params.cuh"
#include "attention/kv_tile_copy.cuh"
#include "attention/mma_utils.cuh"
#include "attention/row_softmax.cuh"
#include "attention/wgmma.cuh"
#include "attention/work_item.cuh"

namespace graphdecode::attn {

// The warpgroup body runs where the CTA's dynamic shared memory starts on a 1024-byte boundary
// (the 128-byte swizzle's period: every tile is a multiple of it, see TileConfig). Uniform.
__device__ __forceinline__ bool wgmma_tiles_aligned(const void* smem) {
  return (smem_addr(smem) & 1023u) == 0;
}

#if GD_ATTN_HAS_WGMMA
// kHalves = 1: a 64-row tile. kHalves = 2 (head dim 64, the wide tiles of attention_kernel<..,
// true>): a 128-row tile as two 64-row halves that share every K/V tile, so each K/V byte copied
// serves twice the products. Per K/V tile the two S products are issued together, then each half's
// softmax runs while the other half's product is in flight (S of half 1 beside the softmax of
// half 0, O += P V of half 0 beside the softmax of half 1).
template <typename T, int kHeadDim, int kHalves = 1>
__device__ __forceinline__ void attend_extend_wgmma(const KernelParams& p, const WorkItem& w,
                                                    bool early, T* sQ, T* sK, T* sV) {
  static_assert(kHeadDim == 64 || kHeadDim == 128, "64-column slabs of a 64-row tile");
  static_assert(kHalves == 1 || (kHalves == 2 && kHeadDim == 64),
                "128-row tiles at head dim 64 only (registers)");
  constexpr int kQRows = 64 * kHalves;
  using C = TileConfig<kHeadDim, kQRows>;               // the wide kernel's stages with two halves
  constexpr int kSlabs = kHeadDim / 64;                 // 64-column slabs (slab_offset)
  constexpr bool kSlabbed = kSlabs > 1;                 // at d64 the layout is swizzled_offset's
  constexpr unsigned kSlabBytes = 64 * 64 * sizeof(T);  // a 64-row tile's slab
  // One half: tile it + 1 lands in the stage of tile it - 2 while tile it - 1's O += P V may
  // still run: its wait joins tile it's S wait instead of stalling the warpgroup on its own
  // (bench/NOTES.md 95: 3 stages with 1 tile ahead and this deferred wait beat 3 stages with 2
  // ahead waiting in the tile, and 4 stages with 2 ahead, whose larger shared memory also slowed
  // the decode step).
  // Two halves: no product stays in flight into the next tile (ptxas, unable to count commit
  // groups across the loop's back edge, would serialize every wgmma: C7514). The copies of tile
  // it + 2 (into tile it - 1's stage) are issued after half 1's O += P V instead, and its wait
  // comes after them; every stage is 2 tiles ahead.
  constexpr int kStages = C::kStages;
  constexpr int kAhead = kHalves == 2 ? kStages - 1 : kStages - 2;  // tiles copied ahead
  static_assert(kStages - 2 >= 1, "the deferred wait needs a stage beyond the tiles ahead");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;

  // Visible key range of this thread's two rows of each half (h * 64 + warp * 16 + g and + 8), as
  // in attend().
  int row_lo[kHalves][2], row_hi[kHalves][2], lo_any[kHalves], hi_any[kHalves];
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = h * 64 + warp * 16 + g + 8 * i;
      if (row < w.rows) {
        const int pos = w.pos0 + p.group_div.div(row);
        row_lo[h][i] = p.call.causal ? max(w.kb, first_visible_key(pos, w.window)) : w.kb;
        row_hi[h][i] = p.call.causal ? min(w.ke - 1, pos) : w.ke - 1;
      } else {
        row_lo[h][i] = 1;
        row_hi[h][i] = 0;  // empty
      }
    }
    lo_any[h] = max(row_lo[h][0], row_lo[h][1]);
    hi_any[h] = min(row_hi[h][0], row_hi[h][1]);
  }

  const int key_begin = w.kb < w.ke ? (w.kb / kBlockN) * kBlockN : 0;
  const int n_tiles = w.kb < w.ke ? (w.ke - key_begin + kBlockN - 1) / kBlockN : 0;

  // s: scores, then exponents; its old values are never read (scale-d 0). o[.][h]: dims of slab h.
  float o[kHalves][kSlabs][8][4], s[kHalves][8][4];
#pragma unroll
  for (int d = 0; d < 8; ++d) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
#pragma unroll
      for (int hf = 0; hf < kHalves; ++hf) {
        s[hf][d][e] = 0.f;
#pragma unroll
        for (int h = 0; h < kSlabs; ++h) o[hf][h][d][e] = 0.f;
      }
    }
  }
  float m[kHalves][2], l[kHalves][2];
#pragma unroll
  for (int hf = 0; hf < kHalves; ++hf) {
    m[hf][0] = m[hf][1] = -INFINITY;
    l[hf][0] = l[hf][1] = 0.f;
  }
  // P (the exponents, 16-bit pairs): the A operand of O += P V, in the mma.sync A layout per key
  // step of 16. Declared here so that a deferred product's registers stay live until its wait.
  uint32_t p_frag[4][4] = {};
  const std::uint64_t kv_policy = l2_evict_first_policy();
  const std::uint64_t q_desc = sw128_desc(smem_addr(sQ));
  constexpr unsigned kQHalfStep = (64 * kHeadDim * sizeof(T)) >> 4;  // descriptor units (d64)
  const int new_begin = p.call.causal ? max(w.kb, w.kv_len - w.q_len) : w.kb;

  if (!early) load_q_tile<T, kHeadDim, kQRows, kSlabbed>(p, w, sQ);
#pragma unroll 1
  for (int it = -kAhead; it < n_tiles; ++it) {
    if (early && it == 0) {
      grid_dependency_sync();
      load_q_tile<T, kHeadDim, kQRows, kSlabbed>(p, w, sQ);
      for (int t = 0; t < kAhead && t < n_tiles; ++t)
        load_kv_tile<T, kHeadDim, true, true, kSlabbed>(
            p, w, key_begin + t * kBlockN, sK + t * kBlockN * kHeadDim, sV + t * kBlockN * kHeadDim,
            kv_policy, new_begin, w.ke, true);
      cp_async_commit();
    }
    // Tile from + kAhead, into the stage of tile from + kAhead - kStages (one half: before this
    // tile's products; two halves: the prologue's tiles here, the others after the products).
    const auto load_ahead = [&](int from) {
      const int nxt = from + kAhead;
      if (nxt < n_tiles) {
        const int st = nxt % kStages;
        T* k_dst = sK + st * kBlockN * kHeadDim;
        T* v_dst = sV + st * kBlockN * kHeadDim;
        if (early && from < 0)
          load_kv_tile<T, kHeadDim, true, true, kSlabbed>(p, w, key_begin + nxt * kBlockN, k_dst,
                                                          v_dst, kv_policy, new_begin, w.ke, false);
        else
          load_kv_tile<T, kHeadDim, false, false, kSlabbed>(p, w, key_begin + nxt * kBlockN, k_dst,
                                                            v_dst, kv_policy);
      }
      cp_async_commit();
    };
    if (kHalves == 1 || it < 0) load_ahead(it);
    if (it < 0) continue;
    // Tile it (and the early start's group): one half waits with tile it + 1 in flight, two with
    // tile it + 1 (it > 0) or nothing (the early start's first tile).
    if (early && it == 0) {
      if constexpr (kHalves == 2)
        cp_async_wait<0>();
      else
        cp_async_wait<1>();
    } else {
      cp_async_wait<kHalves == 2 ? kAhead - 1 : kAhead>();
    }
    fence_proxy_async_shared();  // this thread's copies, to the wgmma's (async) proxy
    // Two halves, kWideDeferPv: tile it - 1's last O += P V ran beside the copy wait; its wait
    // comes before the barrier that orders the refill of its stage (at the end of this tile).
    if constexpr (kHalves == 2 && kWideDeferPv) wgmma_wait<0>();
    __syncthreads();
    if constexpr (kHalves == 2 && kWideDeferPv) {
      wgmma_fence_operands(p_frag);
#pragma unroll
      for (int h = 0; h < kSlabs; ++h) wgmma_fence_operands(o[kHalves - 1][h]);
    }
    const int st = it % kStages;
    const std::uint32_t k_addr = smem_addr(sK + st * kBlockN * kHeadDim);
    const std::uint32_t v_addr = smem_addr(sV + st * kBlockN * kHeadDim);
    const int key_tile = key_begin + it * kBlockN;

    // S = Q K^T over head dim in steps of 16: 32 bytes along a slab's swizzled rows, 4 a slab.
    // One commit group per half, each after its own fence: ptxas treats the products between a
    // fence and the wait for the last of them as one stage, whose accumulators nothing may read
    // until that wait (C7514).
    const std::uint64_t k_desc = sw128_desc(k_addr);
#pragma unroll
    for (int hf = 0; hf < kHalves; ++hf) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const unsigned step = ((kk / 4) * kSlabBytes + (kk % 4) * 32) >> 4;
        wgmma_64x64x16_ss<T>(s[hf], q_desc + hf * kQHalfStep + step, k_desc + step, kk > 0);
      }
      wgmma_commit();
    }

    // Mask (skipped when every key of the tile is visible to both of this thread's rows: the
    // same values), online softmax (log2 domain), as attend()'s extend layout; s[hf] becomes the
    // exponents, o[hf] is rescaled.
    const auto softmax = [&](int hf) {
      // The key index is redefined after the wait: else the compiler computes the 32 masks before
      // the products and keeps them as bits of a register (~250 instructions a tile where the
      // masks are not needed).
      int kt = key_tile;
      asm volatile("" : "+r"(kt));
      if (!__all_sync(0xffffffffu, kt >= lo_any[hf] && kt + kBlockN - 1 <= hi_any[hf])) {
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = kt + nb * 8 + 2 * t4 + (e & 1);
            const bool vis = key >= row_lo[hf][e / 2] && key <= row_hi[hf][e / 2];
            s[hf][nb][e] = vis ? s[hf][nb][e] : -INFINITY;
          }
        }
      }
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) mx[e / 2] = fmaxf(mx[e / 2], s[hf][nb][e]);
      }
      mx[0] *= p.scale_log2;
      mx[1] *= p.scale_log2;
      float alpha[2], m_use[2];
      fold_tile_max(m[hf], l[hf], mx, quad_max, alpha, m_use);
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[hf][nb][e] = fast_exp2(fmaf(s[hf][nb][e], p.scale_log2, -m_use[e / 2]));
          l[hf][e / 2] += s[hf][nb][e];
        }
      }
#pragma unroll
      for (int h = 0; h < kSlabs; ++h) rescale_o<false>(o[hf][h], alpha);
    };
    // O += P V over the tile's keys in 4 steps of 16 (16 rows of a slab: 2048 bytes), per slab.
    // P is packed only while no product is in flight: ptxas serializes every wgmma of a kernel
    // that defines a register operand of one while another runs (C7513).
    const auto issue_pv = [&](int hf) {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        p_frag[ks][0] = MmaType<T>::pack(s[hf][2 * ks][0], s[hf][2 * ks][1]);
        p_frag[ks][1] = MmaType<T>::pack(s[hf][2 * ks][2], s[hf][2 * ks][3]);
        p_frag[ks][2] = MmaType<T>::pack(s[hf][2 * ks + 1][0], s[hf][2 * ks + 1][1]);
        p_frag[ks][3] = MmaType<T>::pack(s[hf][2 * ks + 1][2], s[hf][2 * ks + 1][3]);
      }
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
        for (int h = 0; h < kSlabs; ++h)
          wgmma_64x64x16_rs_mn<T>(o[hf][h], p_frag[ks],
                                  sw128_desc(v_addr + h * kSlabBytes + ks * 2048));
      }
      wgmma_commit();
    };
    const auto fence_half = [&](int hf) {
#pragma unroll
      for (int h = 0; h < kSlabs; ++h) wgmma_fence_operands(o[hf][h]);
    };

    // Half 0's S, with everything before it (one half: tile it - 1's P V); half 1's S stays in
    // flight.
    wgmma_wait<kHalves - 1>();
    wgmma_fence_operands(s[0]);
    wgmma_fence_operands(p_frag);
    fence_half(0);
    softmax(0);
    if constexpr (kHalves == 2) {
      wgmma_wait<0>();  // half 1's S
      wgmma_fence_operands(s[1]);
      fence_half(1);
      issue_pv(0);
      softmax(1);  // beside half 0's P V
      wgmma_wait<0>();
      wgmma_fence_operands(p_frag);
      fence_half(0);
      issue_pv(1);
      // Tile it - 1's stage: every warp waited for its products before this tile's barrier.
      load_ahead(it);
      if constexpr (!kWideDeferPv) {
        wgmma_wait<0>();
        wgmma_fence_operands(p_frag);
        fence_half(1);
      }
    } else {
      issue_pv(0);  // waited for with the next tile's S, or after the loop
      // Every warp is past its wait for tile it - 1's P V, whose stage the next iteration refills.
      __syncthreads();
    }
  }
  wgmma_wait_all();
#pragma unroll
  for (int hf = 0; hf < kHalves; ++hf) {
#pragma unroll
    for (int h = 0; h < kSlabs; ++h) wgmma_fence_operands(o[hf][h]);
  }
  wgmma_fence_operands(p_frag);
  cp_async_wait<0>();
  __syncthreads();
  if (early && n_tiles == 0) grid_dependency_sync();  // before the first write

#pragma unroll
  for (int hf = 0; hf < kHalves; ++hf) {
#pragma unroll
    for (int i = 0; i < 2; ++i) l[hf][i] = quad_sum(l[hf][i]);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = hf * 64 + warp * 16 + g + 8 * i;
      if (row >= w.rows) continue;
      const float inv = l[hf][i] > 0.f ? 1.f / l[hf][i] : 0.f;
#pragma unroll
      for (int h = 0; h < kSlabs; ++h) {
#pragma unroll
        for (int d = 0; d < 8; ++d)
          store_row_pair<T>(p, w, row, h * 64 + d * 8 + 2 * t4, o[hf][h][d][2 * i] * inv,
                            o[hf][h][d][2 * i + 1] * inv);
      }
      if (t4 == 0)
        store_row_lse(p, w, row, l[hf][i] > 0.f ? m[hf][i] + log2f(l[hf][i]) : -INFINITY);
    }
  }
}
#endif

}  // namespace graphdecode::attn
