// The contract between memory/ (which owns and fills KV pages) and attention/ (which reads them).
//
// Layout is HND: one page of one layer holds, for each KV head, page_size consecutive tokens of
// head_dim elements:  K, V : [num_pages][num_kv_heads][page_size][head_dim]
// Why HND: an attention block works on one KV head at a time, and in HND a page of that head is
// one contiguous run of page_size * head_dim * 2 bytes (4 KiB at page 16, head dim 128), so tiles
// load as long coalesced 16-byte vectors whatever the page size. NHD would interleave heads and
// cut every page into num_kv_heads strided pieces of head_dim * 2 bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/request_rules.h"

namespace graphdecode {

// Trivially copyable view of one layer of one pool, passed to kernels by value.
struct PagedKvView {
  void* k = nullptr;                         // [num_pages][num_kv_heads][page_size][head_dim]
  void* v = nullptr;                         // [num_pages][num_kv_heads][page_size][head_dim]
  const std::int32_t* page_table = nullptr;  // [max_slots][max_pages_per_slot], kInvalidPage = none
  std::int32_t max_pages_per_slot = 0;
  std::int32_t page_size = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t num_pages = 0;
};

// Element offset of (page, head, token-in-page, 0) in K or V.
GD_HD std::int64_t kv_element_offset(const PagedKvView& v, std::int32_t page, std::int32_t head,
                                     std::int32_t token_in_page) {
  return ((static_cast<std::int64_t>(page) * v.num_kv_heads + head) * v.page_size + token_in_page) *
         v.head_dim;
}

// Entry `page_index` of the page-table row of `slot` (may be kInvalidPage).
GD_HD std::int32_t page_at(const PagedKvView& v, std::int32_t slot, std::int32_t page_index) {
  return v.page_table[static_cast<std::int64_t>(slot) * v.max_pages_per_slot + page_index];
}

// Page holding absolute token position `pos` of the request in `slot` (may be kInvalidPage).
GD_HD std::int32_t page_of_token(const PagedKvView& v, std::int32_t slot, std::int32_t pos) {
  return page_at(v, slot, pos / v.page_size);
}

}  // namespace graphdecode
