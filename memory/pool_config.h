// What a KV pool is: its kind, its page geometry, its request slots, and how big it must be.
//
// Everything here is plain host code with no CUDA call, so sizing and validation are tested on a
// CPU-only machine. The device storage (KvPool) and the host bookkeeping (RequestSlots) both take
// a PoolGeometry, so the two halves of one pool cannot disagree on page size or slot count.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/attention_kind.h"
#include "common/dtype.h"

namespace graphdecode {

// One mechanism, three kinds of pool (common/attention_kind.h); they differ only in which pages a
// request keeps.

// Page 0 of every pool is never handed out: the padding slot's row points at it, so padding rows
// of a graph bucket read and write only this page.
inline constexpr std::int32_t kReservedPage = 0;

struct PoolGeometry {
  AttentionKind kind = AttentionKind::kFull;
  std::int32_t page_size = 16;          // tokens per page (1, 16, 32, 64, ...)
  std::int32_t num_pages = 0;           // including kReservedPage
  std::int32_t max_slots = 0;           // including kPaddingSlot (slot 0)
  std::int32_t max_pages_per_slot = 0;  // logical pages per request: the table row length
  std::int32_t window_left = -1;        // kSlidingWindow: >= 0; other kinds: must be < 0

  // Throws Error naming the first bad field. window_left must be below the slot's token capacity
  // (a larger window is a full-attention pool).
  void validate() const;
  std::int64_t max_tokens_per_slot() const {
    return static_cast<std::int64_t>(max_pages_per_slot) * page_size;
  }
  // Tokens the pool can hold in total (the reserved page excluded).
  std::int64_t token_capacity() const {
    return static_cast<std::int64_t>(num_pages - 1) * page_size;
  }
};

// Per-layer shape of the K/V stored in a pool.
struct KvShape {
  std::int32_t num_layers = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;  // multiple of 8: the K/V write kernel moves 16-byte vectors
  DType dtype = DType::kBF16;

  void validate() const;
};

// Bytes one page takes in device memory: K and V, all layers.
std::int64_t kv_page_bytes(const KvShape& shape, std::int32_t page_size);

// Pages (including kReservedPage) that fit in `budget_bytes`; Error when fewer than 2 fit.
std::int32_t pages_for_byte_budget(const KvShape& shape, std::int32_t page_size,
                                   std::int64_t budget_bytes);

// Pages (including kReservedPage) for `tokens` tokens of usable capacity. The count is exact for
// one request; each further request may waste up to page_size - 1 tokens of its last page.
std::int32_t pages_for_token_budget(std::int64_t tokens, std::int32_t page_size);

// Most pages one request of a sliding-window pool holds at once: the step's visible keys
// [prefix - window_left, prefix + extend) span window_left + extend tokens, which touch at most
// ceil((window_left + extend) / page_size) + 1 pages (one more when the span starts mid-page).
std::int32_t swa_pages_per_request(std::int32_t window_left, std::int32_t max_new_tokens,
                                   std::int32_t page_size);

// Pages (including kReservedPage) for a sliding-window pool serving `max_requests` at once.
std::int32_t swa_pool_pages(std::int32_t max_requests, std::int32_t window_left,
                            std::int32_t max_new_tokens, std::int32_t page_size);

}  // namespace graphdecode
