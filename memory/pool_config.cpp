#include "memory/pool_config.h"

#include <algorithm>
#include <limits>
#include <string>

#include "common/error.h"
#include "common/request_rules.h"

namespace graphdecode {

void PoolGeometry::validate() const {
  GD_REQUIRE(kind == AttentionKind::kFull || kind == AttentionKind::kSliding ||
                 kind == AttentionKind::kCross,
             "kind", static_cast<int>(kind), "unknown pool kind");
  GD_REQUIRE(page_size >= 1, "page_size", page_size, "a page holds at least one token");
  GD_REQUIRE(num_pages >= 2, "num_pages", num_pages,
             "a pool needs the reserved page plus at least one usable page");
  GD_REQUIRE(max_slots >= 2, "max_slots", max_slots,
             "a pool needs the padding slot 0 plus at least one request slot");
  GD_REQUIRE(max_pages_per_slot >= 1, "max_pages_per_slot", max_pages_per_slot,
             "a request needs at least one logical page");
  // Token positions are int32 everywhere (request_rules.h), and so are flat destinations
  // page * page_size + offset in the K/V write kernel.
  constexpr std::int64_t kMaxInt32 = std::numeric_limits<std::int32_t>::max();
  GD_REQUIRE(max_tokens_per_slot() <= kMaxInt32, "max_pages_per_slot", max_pages_per_slot,
             "max_pages_per_slot * page_size overflows int32 token positions");
  GD_REQUIRE(static_cast<std::int64_t>(num_pages) * page_size <= kMaxInt32, "num_pages", num_pages,
             "num_pages * page_size overflows int32 flat destinations");
  GD_REQUIRE(static_cast<std::int64_t>(max_slots) * max_pages_per_slot <= kMaxInt32, "max_slots",
             max_slots, "max_slots * max_pages_per_slot overflows the page table index");
  if (kind == AttentionKind::kSliding) {
    GD_REQUIRE(window_left >= 0 && window_left < max_tokens_per_slot(), "window_left", window_left,
               "a sliding-window pool needs 0 <= window_left < max_pages_per_slot * page_size (" +
                   std::to_string(max_tokens_per_slot()) + ")");
  } else {
    GD_REQUIRE(window_left < 0, "window_left", window_left,
               std::string("only a sliding-window pool takes window_left >= 0; this pool is ") +
                   std::string(attention_kind_name(kind)));
  }
}

void KvShape::validate() const {
  GD_REQUIRE(num_layers >= 1, "num_layers", num_layers, "a pool stores at least one layer");
  GD_REQUIRE(num_kv_heads >= 1, "num_kv_heads", num_kv_heads, "at least one KV head");
  GD_REQUIRE(head_dim >= 8 && head_dim % 8 == 0, "head_dim", head_dim,
             "head_dim must be a positive multiple of 8 (16-byte vectors of 2-byte elements)");
  GD_REQUIRE(dtype == DType::kBF16 || dtype == DType::kFP16, "dtype", static_cast<int>(dtype),
             "K/V dtype must be bf16 or fp16");
}

std::int64_t kv_page_bytes(const KvShape& shape, std::int32_t page_size) {
  shape.validate();
  GD_REQUIRE(page_size >= 1, "page_size", page_size, "a page holds at least one token");
  return 2 /* K and V */ * static_cast<std::int64_t>(shape.num_layers) * shape.num_kv_heads *
         page_size * shape.head_dim * static_cast<std::int64_t>(dtype_bytes(shape.dtype));
}

std::int32_t pages_for_byte_budget(const KvShape& shape, std::int32_t page_size,
                                   std::int64_t budget_bytes) {
  const std::int64_t per_page = kv_page_bytes(shape, page_size);
  const std::int64_t pages = budget_bytes / per_page;
  GD_REQUIRE(pages >= 2, "budget_bytes", budget_bytes,
             "budget holds fewer than 2 pages of " + std::to_string(per_page) +
                 " bytes (the reserved page plus one usable page)");
  return static_cast<std::int32_t>(
      std::min<std::int64_t>(pages, std::numeric_limits<std::int32_t>::max() / page_size));
}

std::int32_t pages_for_token_budget(std::int64_t tokens, std::int32_t page_size) {
  GD_REQUIRE(page_size >= 1, "page_size", page_size, "a page holds at least one token");
  GD_REQUIRE(tokens >= 1, "tokens", tokens, "a pool holds at least one token");
  const std::int64_t pages = (tokens + page_size - 1) / page_size + 1;
  GD_REQUIRE(pages * page_size <= std::numeric_limits<std::int32_t>::max(), "tokens", tokens,
             "token budget overflows int32 flat destinations");
  return static_cast<std::int32_t>(pages);
}

std::int32_t swa_pages_per_request(std::int32_t window_left, std::int32_t max_new_tokens,
                                   std::int32_t page_size) {
  GD_REQUIRE(window_left >= 0, "window_left", window_left,
             "a sliding window needs window_left >= 0");
  GD_REQUIRE(max_new_tokens >= 1, "max_new_tokens", max_new_tokens, "a step adds >= 1 token");
  GD_REQUIRE(page_size >= 1, "page_size", page_size, "a page holds at least one token");
  GD_REQUIRE(window_left <= std::numeric_limits<std::int32_t>::max() - max_new_tokens,
             "window_left", window_left, "window_left + max_new_tokens overflows int32");
  return pages_for_tokens(window_left + max_new_tokens, page_size) + 1;
}

std::int32_t swa_pool_pages(std::int32_t max_requests, std::int32_t window_left,
                            std::int32_t max_new_tokens, std::int32_t page_size) {
  GD_REQUIRE(max_requests >= 1, "max_requests", max_requests, "at least one request");
  const std::int64_t pages = static_cast<std::int64_t>(max_requests) *
                                 swa_pages_per_request(window_left, max_new_tokens, page_size) +
                             1;
  GD_REQUIRE(pages * page_size <= std::numeric_limits<std::int32_t>::max(), "max_requests",
             max_requests, "sliding-window pool overflows int32 flat destinations");
  return static_cast<std::int32_t>(pages);
}

}  // namespace graphdecode
