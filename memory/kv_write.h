// Writes the K/V of a step's new tokens into their pages of one layer of a pool.
//
// Each token's destination is either resolved through the request->page table from
// (slot, absolute position), or given flat as page * page_size + offset. A destination whose page
// entry is kInvalidPage (released by the sliding window, or never allocated), a negative flat
// destination, or anything out of range is skipped: nothing is written for that token.
//
// Capture-safe: num_tokens is read from device memory, the grid is sized from max_tokens (a
// capacity) and threads past num_tokens exit. Elements are moved as raw 16-byte vectors, so one
// kernel serves bf16 and fp16 alike (dtype is checked, never dispatched on).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtype.h"
#include "memory/kv_layout.h"

namespace graphdecode {

struct KvWriteArgs {
  PagedKvView cache;           // destination layer; page_table is read in slot/position mode
  std::int32_t max_slots = 0;  // rows of cache.page_table (slot/position mode)
  DType dtype = DType::kBF16;  // element type of k_new, v_new and the cache (2 bytes)

  const void* k_new = nullptr;               // [max_tokens][num_kv_heads][head_dim]
  const void* v_new = nullptr;               // [max_tokens][num_kv_heads][head_dim]
  const std::int32_t* num_tokens = nullptr;  // [1] device: tokens to write this launch
  std::int32_t max_tokens = 0;               // capacity: the launch covers this many tokens

  // Destination, exactly one of the two forms:
  const std::int32_t* slot = nullptr;       // [max_tokens] request slot of each token ...
  const std::int32_t* position = nullptr;   // [max_tokens] ... and its absolute position
  const std::int32_t* flat_dest = nullptr;  // [max_tokens] page * page_size + offset; < 0 skips
};

// Validates `args` on the host (Error names the field; nothing is launched then), then launches
// one kernel on `stream`. max_tokens == 0 launches nothing.
void write_new_kv(const KvWriteArgs& args, cudaStream_t stream);

}  // namespace graphdecode
