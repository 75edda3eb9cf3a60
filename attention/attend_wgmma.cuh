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
template <typename T, int kHeadDim>
__device__ __forceinline__ void attend_extend_wgmma(const KernelParams& p, const WorkItem& w,
                                                    bool early, T* sQ, T* sK, T* sV) {
  static_assert(kHeadDim == 64 || kHeadDim == 128, "64-column slabs of a 64-row tile");
  using C = TileConfig<kHeadDim>;
  constexpr int kSlabs = kHeadDim / 64;                 // 64-column slabs (slab_offset)
  constexpr bool kSlabbed = kSlabs > 1;                 // at d64 the layout is swizzled_offset's
  constexpr unsigned kSlabBytes = 64 * 64 * sizeof(T);  // a 64-row tile's slab
  // Tile it + 1 lands in the stage of tile it - 2 while tile it - 1's O += P V may still run: its
  // wait joins tile it's S wait instead of stalling the warpgroup on its own (bench/NOTES.md 95:
  // 3 stages with 1 tile ahead and this deferred wait beat 3 stages with 2 ahead waiting in the
  // tile, and 4 stages with 2 ahead, whose larger shared memory also slowed the decode step).
  constexpr int kStages = C::kStages;
  constexpr int kAhead = kStages - 2;  // tiles copied ahead of the one in use
  static_assert(kAhead >= 1, "the deferred wait needs a stage beyond the tiles ahead");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;

  // Visible key range of this thread's two rows (warp * 16 + g and + 8), as in attend().
  int row_lo[2], row_hi[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = warp * 16 + g + 8 * i;
    if (row < w.rows) {
      const int pos = w.pos0 + p.group_div.div(row);
      row_lo[i] = p.call.causal ? max(w.kb, first_visible_key(pos, w.window)) : w.kb;
      row_hi[i] = p.call.causal ? min(w.ke - 1, pos) : w.ke - 1;
    } else {
      row_lo[i] = 1;
      row_hi[i] = 0;  // empty
    }
  }
  const int lo_any = max(row_lo[0], row_lo[1]), hi_any = min(row_hi[0], row_hi[1]);

  const int key_begin = w.kb < w.ke ? (w.kb / kBlockN) * kBlockN : 0;
  const int n_tiles = w.kb < w.ke ? (w.ke - key_begin + kBlockN - 1) / kBlockN : 0;

  // s: scores, then exponents; its old values are never read (scale-d 0). o[h]: dims of slab h.
  float o[kSlabs][8][4], s[8][4];
#pragma unroll
  for (int d = 0; d < 8; ++d) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[d][e] = 0.f;
#pragma unroll
      for (int h = 0; h < kSlabs; ++h) o[h][d][e] = 0.f;
    }
  }
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  // P (the exponents, 16-bit pairs): the A operand of O += P V, in the mma.sync A layout per key
  // step of 16. Declared here so that a deferred product's registers stay live until its wait.
  uint32_t p_frag[4][4] = {};
  const std::uint64_t kv_policy = l2_evict_first_policy();
  const std::uint64_t q_desc = sw128_desc(smem_addr(sQ));
  const int new_begin = p.call.causal ? max(w.kb, w.kv_len - w.q_len) : w.kb;

  if (!early) load_q_tile<T, kHeadDim, kMaxRows, kSlabbed>(p, w, sQ);
#pragma unroll 1
  for (int it = -kAhead; it < n_tiles; ++it) {
    if (early && it == 0) {
      grid_dependency_sync();
      load_q_tile<T, kHeadDim, kMaxRows, kSlabbed>(p, w, sQ);
      for (int t = 0; t < kAhead && t < n_tiles; ++t)
        load_kv_tile<T, kHeadDim, true, true, kSlabbed>(
            p, w, key_begin + t * kBlockN, sK + t * kBlockN * kHeadDim, sV + t * kBlockN * kHeadDim,
            kv_policy, new_begin, w.ke, true);
      cp_async_commit();
    }
    const int nxt = it + kAhead;
    if (nxt < n_tiles) {
      const int st = nxt % kStages;
      T* k_dst = sK + st * kBlockN * kHeadDim;
      T* v_dst = sV + st * kBlockN * kHeadDim;
      if (early && it < 0)
        load_kv_tile<T, kHeadDim, true, true, kSlabbed>(p, w, key_begin + nxt * kBlockN, k_dst,
                                                        v_dst, kv_policy, new_begin, w.ke, false);
      else
        load_kv_tile<T, kHeadDim, false, false, kSlabbed>(p, w, key_begin + nxt * kBlockN, k_dst,
                                                          v_dst, kv_policy);
    }
    cp_async_commit();
    if (it < 0) continue;
    if (early && it == 0)
      cp_async_wait<1>();
    else
      cp_async_wait<kAhead>();
    fence_proxy_async_shared();  // this thread's copies, to the wgmma's (async) proxy
    __syncthreads();
    const int st = it % kStages;
    const std::uint32_t k_addr = smem_addr(sK + st * kBlockN * kHeadDim);
    const std::uint32_t v_addr = smem_addr(sV + st * kBlockN * kHeadDim);
    const int key_tile = key_begin + it * kBlockN;

    // S = Q K^T over head dim in steps of 16: 32 bytes along a slab's swizzled rows, 4 a slab.
    wgmma_fence();
    const std::uint64_t k_desc = sw128_desc(k_addr);
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const unsigned step = ((kk / 4) * kSlabBytes + (kk % 4) * 32) >> 4;
      wgmma_64x64x16_ss<T>(s, q_desc + step, k_desc + step, kk > 0);
    }
    wgmma_commit();
    wgmma_wait_all();  // and tile it - 1's P V
    wgmma_fence_operands(s);
#pragma unroll
    for (int h = 0; h < kSlabs; ++h) wgmma_fence_operands(o[h]);
    wgmma_fence_operands(p_frag);

    // Mask (skipped when every key of the tile is visible to both of this thread's rows: the
    // same values), online softmax (log2 domain), as attend()'s extend layout. The key index is
    // redefined after the wait: else the compiler computes the 32 masks before the products and
    // keeps them as bits of a register (~250 instructions a tile where the masks are not needed).
    int kt = key_tile;
    asm volatile("" : "+r"(kt));
    if (!__all_sync(0xffffffffu, kt >= lo_any && kt + kBlockN - 1 <= hi_any)) {
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = kt + nb * 8 + 2 * t4 + (e & 1);
          const bool vis = key >= row_lo[e / 2] && key <= row_hi[e / 2];
          s[nb][e] = vis ? s[nb][e] : -INFINITY;
        }
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) mx[e / 2] = fmaxf(mx[e / 2], s[nb][e]);
    }
    mx[0] *= p.scale_log2;
    mx[1] *= p.scale_log2;
    float alpha[2], m_use[2];
    fold_tile_max(m, l, mx, quad_max, alpha, m_use);
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nb][e] = fast_exp2(fmaf(s[nb][e], p.scale_log2, -m_use[e / 2]));
        l[e / 2] += s[nb][e];
      }
    }
#pragma unroll
    for (int h = 0; h < kSlabs; ++h) rescale_o<false>(o[h], alpha);

    // O += P V over the tile's keys in 4 steps of 16 (16 rows of a slab: 2048 bytes), per slab.
    auto& a = p_frag;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      a[ks][0] = MmaType<T>::pack(s[2 * ks][0], s[2 * ks][1]);
      a[ks][1] = MmaType<T>::pack(s[2 * ks][2], s[2 * ks][3]);
      a[ks][2] = MmaType<T>::pack(s[2 * ks + 1][0], s[2 * ks + 1][1]);
      a[ks][3] = MmaType<T>::pack(s[2 * ks + 1][2], s[2 * ks + 1][3]);
    }
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
      for (int h = 0; h < kSlabs; ++h)
        wgmma_64x64x16_rs_mn<T>(o[h], a[ks], sw128_desc(v_addr + h * kSlabBytes + ks * 2048));
    }
    wgmma_commit();  // waited for with the next tile's S, or after the loop
    // Every warp is past its wait for tile it - 1's P V, whose stage the next iteration refills.
    __syncthreads();
  }
  wgmma_wait_all();
#pragma unroll
  for (int h = 0; h < kSlabs; ++h) wgmma_fence_operands(o[h]);
  wgmma_fence_operands(p_frag);
  cp_async_wait<0>();
  __syncthreads();
  if (early && n_tiles == 0) grid_dependency_sync();  // before the first write

#pragma unroll
  for (int i = 0; i < 2; ++i) l[i] = quad_sum(l[i]);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = warp * 16 + g + 8 * i;
    if (row >= w.rows) continue;
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
#pragma unroll
    for (int h = 0; h < kSlabs; ++h) {
#pragma unroll
      for (int d = 0; d < 8; ++d)
        store_row_pair<T>(p, w, row, h * 64 + d * 8 + 2 * t4, o[h][d][2 * i] * inv,
                          o[h][d][2 * i + 1] * inv);
    }
    if (t4 == 0) store_row_lse(p, w, row, l[i] > 0.f ? m[i] + log2f(l[i]) : -INFINITY);
  }
}
#endif

}  // namespace graphdecode::attn
