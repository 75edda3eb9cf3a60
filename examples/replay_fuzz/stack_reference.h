// The float64 reference of the synthetic attention stack (attention_stack.h): one row of its
// output rebuilt on the host from the token history alone, since every query, key and value is a
// hash of what identifies it (synthetic.h). Used by the replay fuzzer on sampled rows of every
// phase of a step (a target's or a draft's rows).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "attention_stack.h"

namespace graphdecode::fuzz {

class StackReference {
 public:
  // The stack's residual for the query at position pos = tokens.size() - 1, where tokens[p] is
  // the token id the stack's cache holds at position p as this row sees it (tokens[pos]: the
  // row's own token). Cross layers see the request's encoder_len keys of `request_id`.
  // Returns [num_q_heads * head_dim], valid until the next call.
  const std::vector<double>& row(const AttentionStackConfig& config,
                                 std::span<const std::int32_t> tokens, std::int32_t encoder_len,
                                 std::uint32_t request_id);

 private:
  std::vector<double> residual_, out_, q_, acc_, k_, v_;  // scratch, grown once
};

struct RowError {
  double worst = 0.0;       // max over elements of |got - want| / (1 + |want|); NaN counts as inf
  std::size_t element = 0;  // where
};
RowError row_error(const float* got, const std::vector<double>& want);

// The error a row may show: the device rounds q, K/V and each layer's output to the dtype.
double row_tolerance(DType dtype);

}  // namespace graphdecode::fuzz
