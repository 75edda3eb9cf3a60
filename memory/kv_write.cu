#include <cstdint>
#include <limits>

#include "common/align.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "common/pdl.cuh"
#include "memory/kv_write.h"

namespace graphdecode {
namespace {

constexpr int kWriteThreads = 256;
constexpr int kElemsPerVec = 8;  // 16 bytes of 2-byte elements

// Trivially copyable launch parameters, built once from validated KvWriteArgs.
struct KvWriteParams {
  uint4* k_cache;                  // [num_pages][num_kv_heads][page_size][vecs_per_head]
  uint4* v_cache;                  // same
  const uint4* k_new;              // [max_tokens][num_kv_heads][vecs_per_head]
  const uint4* v_new;              // same
  const std::int32_t* page_table;  // [max_slots][max_pages_per_slot] (slot/position mode)
  const std::int32_t* num_tokens;  // [1]
  const std::int32_t* slot;        // [max_tokens] or null
  const std::int32_t* position;    // [max_tokens] or null
  const std::int32_t* flat_dest;   // [max_tokens] or null
  std::int32_t max_tokens;
  std::int32_t max_slots;
  std::int32_t max_pages_per_slot;
  std::int32_t page_size;
  std::int32_t num_pages;
  std::int32_t num_kv_heads;
  std::int32_t vecs_per_head;  // head_dim / 8
};

// One thread moves one 16-byte vector of K and the same vector of V. Items are token-major, so a
// warp reads a contiguous run of k_new and writes contiguous runs of a head's row in its page.
__global__ void __launch_bounds__(kWriteThreads)
    write_kv_kernel(const __grid_constant__ KvWriteParams p) {
  // An attention launch behind this one (PDL) may start now: it waits for this grid before
  // reading what it writes, and with PriorWrites::kQueryAndNewKv reads only older K/V before
  // that. Launched without PDL, this kernel may trigger at once (common/pdl.cuh).
  pdl_launch_dependents();
  const std::int64_t vecs_per_token = static_cast<std::int64_t>(p.num_kv_heads) * p.vecs_per_head;
  const std::int64_t item = static_cast<std::int64_t>(blockIdx.x) * kWriteThreads + threadIdx.x;
  const std::int32_t n = min(max(*p.num_tokens, 0), p.max_tokens);
  if (item >= n * vecs_per_token) return;
  const auto t = static_cast<std::int32_t>(item / vecs_per_token);
  const auto v = static_cast<std::int32_t>(item - t * vecs_per_token);

  std::int32_t page, in_page;
  if (p.flat_dest != nullptr) {
    const std::int32_t d = p.flat_dest[t];
    if (d < 0 || d / p.page_size >= p.num_pages) return;
    page = d / p.page_size;
    in_page = d - page * p.page_size;
  } else {
    const std::int32_t s = p.slot[t];
    const std::int32_t pos = p.position[t];
    if (s < 0 || s >= p.max_slots || pos < 0) return;
    const std::int32_t logical = pos / p.page_size;
    if (logical >= p.max_pages_per_slot) return;
    page = p.page_table[static_cast<std::int64_t>(s) * p.max_pages_per_slot + logical];
    if (page < 0 || page >= p.num_pages) return;  // kInvalidPage: released or never allocated
    in_page = pos - logical * p.page_size;
  }
  const std::int32_t head = v / p.vecs_per_head;
  const std::int32_t chunk = v - head * p.vecs_per_head;
  const std::int64_t dst =
      ((static_cast<std::int64_t>(page) * p.num_kv_heads + head) * p.page_size + in_page) *
          p.vecs_per_head +
      chunk;
  p.k_cache[dst] = p.k_new[item];
  p.v_cache[dst] = p.v_new[item];
}

}  // namespace

void write_new_kv(const KvWriteArgs& a, cudaStream_t stream) {
  const PagedKvView& c = a.cache;
  GD_REQUIRE(a.dtype == DType::kBF16 || a.dtype == DType::kFP16, "dtype", static_cast<int>(a.dtype),
             "K/V dtype must be bf16 or fp16");
  GD_REQUIRE(c.k != nullptr && aligned16(c.k), "cache.k", c.k, "null or not 16-byte aligned");
  GD_REQUIRE(c.v != nullptr && aligned16(c.v), "cache.v", c.v, "null or not 16-byte aligned");
  GD_REQUIRE(c.page_size >= 1, "cache.page_size", c.page_size, "must be positive");
  GD_REQUIRE(c.num_pages >= 1, "cache.num_pages", c.num_pages, "must be positive");
  GD_REQUIRE(c.num_kv_heads >= 1, "cache.num_kv_heads", c.num_kv_heads, "must be positive");
  GD_REQUIRE(c.head_dim >= kElemsPerVec && c.head_dim % kElemsPerVec == 0, "cache.head_dim",
             c.head_dim, "must be a positive multiple of 8 (16-byte vectors)");
  GD_REQUIRE(a.max_tokens >= 0, "max_tokens", a.max_tokens, "capacity cannot be negative");
  GD_REQUIRE(a.num_tokens != nullptr, "num_tokens", "null", "device token count missing");
  GD_REQUIRE(a.k_new != nullptr && aligned16(a.k_new), "k_new", a.k_new,
             "null or not 16-byte aligned");
  GD_REQUIRE(a.v_new != nullptr && aligned16(a.v_new), "v_new", a.v_new,
             "null or not 16-byte aligned");
  const bool by_slot = a.slot != nullptr || a.position != nullptr;
  GD_REQUIRE(by_slot != (a.flat_dest != nullptr), "destination",
             by_slot ? "slot/position and flat_dest" : "none",
             "give exactly one destination: (slot, position) or flat_dest");
  if (by_slot) {
    GD_REQUIRE(a.slot != nullptr, "slot", "null", "position given without slot");
    GD_REQUIRE(a.position != nullptr, "position", "null", "slot given without position");
    GD_REQUIRE(c.page_table != nullptr, "cache.page_table", "null",
               "slot/position destinations need the page table");
    GD_REQUIRE(a.max_slots >= 1, "max_slots", a.max_slots, "page table rows must be positive");
    GD_REQUIRE(c.max_pages_per_slot >= 1, "cache.max_pages_per_slot", c.max_pages_per_slot,
               "page table rows need at least one entry");
  }
  const std::int64_t vecs_per_token =
      static_cast<std::int64_t>(c.num_kv_heads) * (c.head_dim / kElemsPerVec);
  const std::int64_t blocks =
      (static_cast<std::int64_t>(a.max_tokens) * vecs_per_token + kWriteThreads - 1) /
      kWriteThreads;
  GD_REQUIRE(blocks <= std::numeric_limits<std::int32_t>::max(), "max_tokens", a.max_tokens,
             "too many tokens for one launch");
  if (blocks == 0) return;

  KvWriteParams p;
  p.k_cache = static_cast<uint4*>(c.k);
  p.v_cache = static_cast<uint4*>(c.v);
  p.k_new = static_cast<const uint4*>(a.k_new);
  p.v_new = static_cast<const uint4*>(a.v_new);
  p.page_table = c.page_table;
  p.num_tokens = a.num_tokens;
  p.slot = by_slot ? a.slot : nullptr;
  p.position = by_slot ? a.position : nullptr;
  p.flat_dest = by_slot ? nullptr : a.flat_dest;
  p.max_tokens = a.max_tokens;
  p.max_slots = a.max_slots;
  p.max_pages_per_slot = c.max_pages_per_slot;
  p.page_size = c.page_size;
  p.num_pages = c.num_pages;
  p.num_kv_heads = c.num_kv_heads;
  p.vecs_per_head = c.head_dim / kElemsPerVec;
  write_kv_kernel<<<static_cast<unsigned>(blocks), kWriteThreads, 0, stream>>>(p);
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
