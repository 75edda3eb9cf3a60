// Float64 CPU reference of the paged attention family (attention/paged_attention.h), for tests.
//
// It reads HOST copies of the paged K/V pool and page table through a PagedKvView whose pointers
// are host pointers, and applies exactly the documented semantics, calling the shared per-request
// rules of common/request_rules.h (key_visible, first_visible_key):
//   causal: request r has q_len = q_start[r+1] - q_start[r] queries; query i sits at position
//           kv_len - q_len + i and sees keys k < kv_len with key_visible(pos, k, window_left).
//   cross:  every query of request r sees all kv_len[r] keys; no mask, no window.
//   GQA:    q head h reads kv head h / (num_q_heads / num_kv_heads).
//   scale:  sm_scale, or 1/sqrt(head_dim) when it is 0.
// Outputs o [total_q][num_q_heads][head_dim] and lse [total_q][num_q_heads] (natural log of the
// sum of exp(scaled score)); a row that sees no key gets o = 0 and lse = -inf.
//
// Work is spread over (request, kv head) pairs on std::threads; each pair converts its keys and
// values to double once, so 32k context x 32 heads takes well under a second per request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention/paged_attention.h"
#include "common/dtype.h"
#include "memory/kv_layout.h"

namespace graphdecode::reference {

// ---- bf16 / fp16 on the host (bit patterns as uint16)
// --------------------------------------------
float bf16_to_float(std::uint16_t bits);
float fp16_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float x);  // round to nearest even; NaN stays NaN
std::uint16_t float_to_fp16(float x);  // round to nearest even; subnormals; overflow -> inf
float to_float(std::uint16_t bits, DType t);
std::uint16_t from_float(float x, DType t);

// ---- problem description (host memory)
// ------------------------------------------------------------
struct HostBatch {
  std::int32_t num_requests = 0;
  const std::int32_t* slot = nullptr;     // [num_requests] page-table row of each request
  const std::int32_t* q_start = nullptr;  // [num_requests + 1] cu_seqlens of the queries
  const std::int32_t* kv_len = nullptr;   // [num_requests] causal: prefix + extend; cross: enc len
  std::int32_t window_left = -1;          // < 0 = full; ignored in cross mode
};

// Optional restriction to absolute key positions [key_begin, key_end), applied on top of the
// mode's mask: the partial state over a key subset (e.g. the cached prefix or the new tokens).
struct KeyRange {
  std::int32_t key_begin = 0;
  std::int32_t key_end = INT32_MAX;
};

struct AttentionResult {
  std::int32_t total_q = 0;
  std::int32_t num_heads = 0;
  std::int32_t head_dim = 0;
  std::vector<double> o;    // [total_q][num_heads][head_dim]
  std::vector<double> lse;  // [total_q][num_heads]; -inf for a row that sees no key

  double& at(std::int32_t row, std::int32_t h, std::int32_t d) {
    return o[(static_cast<std::size_t>(row) * num_heads + h) * head_dim + d];
  }
  double at(std::int32_t row, std::int32_t h, std::int32_t d) const {
    return o[(static_cast<std::size_t>(row) * num_heads + h) * head_dim + d];
  }
};

// The reference of PagedAttention::run. Uses config's num_q_heads, num_kv_heads, head_dim, dtype,
// mode and sm_scale (capacities and the deterministic flag do not change the math).
//   kv: pointers to HOST copies (k, v: [num_pages][num_kv_heads][page_size][head_dim] uint16 bits
//       of config.dtype; page_table [max_slots][max_pages_per_slot]).
//   q:  [total_q][num_q_heads][head_dim] uint16 bits of config.dtype.
// Throws graphdecode::Error when a visible key's page-table entry is kInvalidPage or out of the
// pool (a broken test batch, not a kernel bug).
AttentionResult attention(const AttentionConfig& config, const HostBatch& batch,
                          const PagedKvView& kv, const std::uint16_t* q, KeyRange keys = {});

// Reference of merge_attention_states over two states on disjoint key sets (same shapes):
//   lse = log(exp(lse_a) + exp(lse_b)), o = (exp(lse_a - lse) o_a + exp(lse_b - lse) o_b);
// a state with lse = -inf contributes nothing; both -inf gives o = 0, lse = -inf.
AttentionResult merge_states(const AttentionResult& a, const AttentionResult& b);

}  // namespace graphdecode::reference
