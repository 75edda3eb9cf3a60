// K/V tiles of the paged attention kernel: shared-memory tile geometry (TileConfig) and the
// cp.async copies that gather a 64-key tile of K and V through the request's page table into a
// pipeline stage (swizzled rows, zero-filled outside the item's key span, released pages never
// dereferenced).
#pragma once

#include <cstdint>
#include <type_traits>

#include "attention/attention_params.cuh"
#include "attention/mma_utils.cuh"
#include "attention/work_item.cuh"
#include "memory/kv_layout.h"

namespace graphdecode::attn {

// Shared-memory geometry of a CTA: Q (kQRows rows: kMaxRows, or kWideRows in the wide-tile
// kernel), then kStages stages of K and of V (kDense: the dense decode kernel's, fewer stages).
template <int kHeadDim, int kQRows = kMaxRows, bool kDense = false>
struct TileConfig {
  static constexpr int kStages =  // attention_policy.h
      kQRows > kMaxRows ? kWideStages
      : kDense          ? kDenseStages
                        : kPipelineStages<kHeadDim>;
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kQElems = kQRows * kHeadDim;
  static constexpr int kKVElems = kStages * kBlockN * kHeadDim;  // each of K and V
  static constexpr size_t kSmemBytes = 2 * (kQElems + 2 * kKVElems);
  // The decode layout's cross-warp merge reuses the K/V area: 4 warps x 16 rows x head_dim floats.
  static_assert(4 * 16 * kHeadDim * 4 <= 2 * kKVElems * 2, "merge buffer must fit in K/V area");
};
// The geometry of attention_kernel<T, kHeadDim, kWide, kDense> (kWide: 128-row extend tiles;
// kDense: the dense decode kernel, attention_policy.h kDenseDecode).
template <int kHeadDim, bool kWide, bool kDense = false>
using KernelTiles = TileConfig<kHeadDim, kWide ? kWideRows : kMaxRows, kDense>;

// Copies the query tile of an item into sQ: row R = (token R / group, head kv_head * group +
// R % group), rows past w.rows zero-filled. kSlabs: slab_offset's layout (the warpgroup body).
template <typename T, int kHeadDim, int kQRows, bool kSlabs = false>
__device__ __forceinline__ void load_q_tile(const KernelParams& p, const WorkItem& w, T* sQ) {
  using C = TileConfig<kHeadDim>;
  const T* Q = static_cast<const T*>(p.q);
  for (int i = threadIdx.x; i < kQRows * C::kChunksPerRow; i += kThreads) {
    const int row = i / C::kChunksPerRow, ch = i % C::kChunksPerRow;
    const bool valid = row < w.rows;
    std::int64_t off = 0;
    if (valid) {
      int tok, head;
      row_token_head(p, w, row, tok, head);
      off = (static_cast<std::int64_t>(w.q_begin + tok) * p.call.num_q_heads + head) * kHeadDim +
            ch * 8;
    }
    const int s = kSlabs ? slab_offset<kQRows>(row, ch) : swizzled_offset<kHeadDim>(row, ch);
    cp_async_16(sQ + s, Q + off, valid);
  }
}

// Copies a 64-key tile of K and V (keys key0 ..) into a pipeline stage: thread t copies 16-byte
// column t % kChunksPerRow of rows t / kChunksPerRow + j * kRowsPerPass. Pieces outside the item's
// keys [kb, ke), or on a released page, are zero-filled and never read. A piece's address is
// kv_element_offset's (memory/kv_layout.h) in bytes, one 32 x 32 -> 64-bit multiply-add (a page
// of all KV heads is under 2^31 bytes, checked by run()): the copies are most of the instructions
// a decode CTA issues, so each piece's address costs as few as possible (bench/NOTES.md 58).
// Every copy carries an L2 evict-first policy: K/V stream through once, and should not push the
// plan, page tables, partials and the next layer's inputs out of L2 (NOTES 31, 35).
// kRolled: a rolled loop (the decode layout: less code to fetch cold), else unrolled (the extend
// layout's schedule needs it). kSlabs: slab_offset's layout (the warpgroup body). kFiltered (early
// start, p.early_kv): only the pieces whose key is (`inside`) or is not (!`inside`) in [lo, hi),
// i.e. the rows the kernel before may still be writing, or every other row; the others are not
// touched at all (another commit group fills them).
// Each piece looks its page id up just before its copy: the compiler overlaps each lookup with the
// previous copies (reading every page id of the tile first was slower, NOTES 2, 9, 56).
template <typename T, int kHeadDim, bool kRolled, bool kFiltered = false, bool kSlabs = false>
__device__ __forceinline__ void load_kv_tile(const KernelParams& p, const WorkItem& w, int key0,
                                             T* sK, T* sV, std::uint64_t policy, int lo = 0,
                                             int hi = 0, bool inside = false) {
  using C = TileConfig<kHeadDim>;
  constexpr int kRowsPerPass = kThreads / C::kChunksPerRow;
  constexpr unsigned kRowBytes = kHeadDim * sizeof(T);
  const int ch = static_cast<int>(threadIdx.x) % C::kChunksPerRow;
  const int row0 = static_cast<int>(threadIdx.x) / C::kChunksPerRow;
  const std::int32_t* table =
      p.kv.page_table + static_cast<std::int64_t>(w.slot) * p.kv.max_pages_per_slot;
  const unsigned page_size = static_cast<unsigned>(p.kv.page_size);
  const unsigned page_bytes = static_cast<unsigned>(p.kv.num_kv_heads) * page_size * kRowBytes;
  const unsigned col_bytes = static_cast<unsigned>(w.kv_head) * page_size * kRowBytes + ch * 16;
  const unsigned num_pages = static_cast<unsigned>(p.kv.num_pages);
  const char* k = static_cast<const char*>(p.kv.k);
  const char* v = static_cast<const char*>(p.kv.v);
  // Rows step by a multiple of 8 at head dims 64 and 128, so the swizzle phase is the thread's own.
  const int s0 = swizzled_offset<kHeadDim>(row0, ch);
  const auto wanted = [&](int key) { return !kFiltered || (key >= lo && key < hi) == inside; };
  const auto copy = [&](int row, std::uint64_t off, bool valid) {
    if (!wanted(key0 + row)) return;
    const int s = kSlabs                  ? slab_offset<kBlockN>(row, ch)
                  : kRowsPerPass % 8 == 0 ? s0 + (row - row0) * kHeadDim
                                          : swizzled_offset<kHeadDim>(row, ch);
    cp_async_16_policy(sK + s, k + off, valid, policy);
    cp_async_16_policy(sV + s, v + off, valid, policy);
  };
  // kPair: rows row and row + kRowsPerPass share a page (the page size is a multiple of twice the
  // step and tiles start at multiples of 64), so one page lookup serves both pieces.
  const auto copy_rows = [&](auto pair) {
    constexpr bool kPair = decltype(pair)::value;
    constexpr int kStride = kPair ? 2 * kRowsPerPass : kRowsPerPass;
    const auto rows = [&](int row) {
      const int key = key0 + row;  // >= 0
      const bool valid0 = key >= w.kb && key < w.ke;
      const bool valid1 = kPair && key + kRowsPerPass >= w.kb && key + kRowsPerPass < w.ke;
      const bool read = (valid0 && wanted(key)) || (valid1 && wanted(key + kRowsPerPass));
      const unsigned page_idx = static_cast<unsigned>(p.page_div.div(key));
      const unsigned in_page = static_cast<unsigned>(key) - page_idx * page_size;
      const std::int32_t* entry = table + page_idx;
      const unsigned page = read ? static_cast<unsigned>(*entry) : 0u;
      const bool live = page < num_pages;  // never dereference a released page
      const std::uint64_t off =
          static_cast<std::uint64_t>(page) * page_bytes + (col_bytes + in_page * kRowBytes);
      copy(row, off, valid0 && live);
      if constexpr (kPair) copy(row + kRowsPerPass, off + kRowsPerPass * kRowBytes, valid1 && live);
    };
    if constexpr (kRolled) {
#pragma unroll 1
      for (int row = row0; row < kBlockN; row += kStride) rows(row);
    } else {
#pragma unroll
      for (int row = row0; row < kBlockN; row += kStride) rows(row);
    }
  };
  // The filtered copies (a step's first tiles only) keep one form: their code is fetched cold on
  // the critical path of a small batch's step.
  if (!kFiltered && page_size % (2 * kRowsPerPass) == 0)
    copy_rows(std::true_type{});
  else
    copy_rows(std::false_type{});
}

}  // namespace graphdecode::attn
