// The attention block's QKV epilogue: one kernel between the fused QKV GEMM and paged attention.
//
// Per live token row r (r < *num_rows), on the GEMM output qkv[r] = [q heads | k heads | v heads]:
//   x = bf16(x + bias)                               (optional, Qwen2; as add_bias)
//   q, k heads: x = bf16(w * bf16(x * inv_rms))      (optional, Qwen3 per-head norm; as rmsnorm)
//   q, k heads: rotate_half RoPE at positions[r]     (as rope, bf16 rounding of each output)
//   q -> q_out[r]; k, v -> the paged cache at (slot[r], positions[r]) (as write_new_kv, which
//   skips a token whose slot, position or page entry is invalid).
// The results are bitwise those of add_bias -> split -> rmsnorm -> rope -> write_new_kv: each step
// rounds to bf16 where the old kernels stored bf16, in the same fp32 operation order.
//
// Launched as a programmatic dependent that lets the kernel after it start at once (before its
// own wait): that kernel must read, before its own wait, nothing the kernel ahead of this one
// writes (the attention with PriorWrites::kQueryAndNewKv behind the qkv GEMM). positions, slot,
// the page table, inv_freq and the weights are read before the wait: the kernel ahead must not
// write them.
// Graph-safe: *num_rows is read on the device, the grid is sized from max_rows, rows past the live
// count read and write nothing of theirs (q_out and the cache keep what they held; their blocks
// only reach the wait, then exit), nothing is allocated or synced.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "memory/kv_layout.h"

namespace graphdecode {

struct QkvEpilogueArgs {
  const std::uint16_t* qkv = nullptr;       // [max_rows][(hq + 2 hkv) head_dim] bf16, not modified
  const std::uint16_t* bias = nullptr;      // [(hq + 2 hkv) head_dim] or nullptr
  const std::uint16_t* q_norm = nullptr;    // [head_dim] or nullptr (then k_norm too)
  const std::uint16_t* k_norm = nullptr;    // [head_dim] or nullptr
  float eps = 1e-6f;                        // of the q/k norms
  const std::int32_t* positions = nullptr;  // [max_rows] absolute position: rotary angle, cache row
  const float* inv_freq = nullptr;          // [head_dim / 2] (RopeTable::data)
  const std::int32_t* num_rows = nullptr;   // [1] live rows
  std::int32_t max_rows = 0;
  std::int32_t num_q_heads = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;       // 64, 128 or 256
  std::uint16_t* q_out = nullptr;  // [max_rows][hq][head_dim] bf16
  PagedKvView cache;               // the layer's K/V (bf16); page_table read by (slot, position)
  std::int32_t max_slots = 0;      // rows of cache.page_table
  const std::int32_t* slot = nullptr;  // [max_rows] request slot of each token
};

// Validates args on the host (graphdecode::Error names the field; nothing launched), launches one
// kernel on `stream` and checks the launch.
void qkv_epilogue(const QkvEpilogueArgs& args, cudaStream_t stream);

}  // namespace graphdecode
