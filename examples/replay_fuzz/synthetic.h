// Deterministic synthetic activations for the attention stack (attention_stack.h) and its
// float64 reference: every query, key and value element is a hash of what identifies it, so the
// CPU reference rebuilds every cached key and value from (token id, position) history alone.
//
// Values are multiples of 2^-23 in [-1, 1), exact in float; the device rounds them to bf16/fp16
// with round-to-nearest-even, like reference::from_float, so host and device agree bit for bit.
#pragma once

#include <cstdint>

#include "common/request_rules.h"

namespace graphdecode::synthetic {

enum Tag : std::uint32_t {
  kQuery = 1,
  kKey = 2,
  kValue = 3,
  kEncoderKey = 4,
  kEncoderValue = 5,
  kDraftToken = 6,
};

GD_HD std::uint32_t mix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Element index inside one token: (layer, head, dim) packed; heads < 64, dims < 512.
GD_HD std::uint32_t element_id(std::int32_t layer, std::int32_t head, std::int32_t dim) {
  return (static_cast<std::uint32_t>(layer) * 64u + static_cast<std::uint32_t>(head)) * 512u +
         static_cast<std::uint32_t>(dim);
}

// Self layers: a = token id, b = absolute position. Encoder K/V: a = request id, b = encoder
// position.
GD_HD float value(std::uint32_t seed, Tag tag, std::uint32_t a, std::uint32_t b,
                  std::uint32_t element) {
  const std::uint32_t h =
      mix32(mix32(seed * 8u + tag) ^ mix32(a + 0x9e3779b9u * mix32(b ^ mix32(element))));
  return static_cast<float>(h >> 8) * (1.0f / 8388608.0f) - 1.0f;  // [0, 2^24) / 2^23 - 1
}

// The synthetic draft "sampler" of a speculative step (spec_stack.h): the token that follows the
// row at `position` holding `token` (d_1 from the draft-extend's last row, d_{j+1} from draft
// decode j's row, which holds d_j), in [0, vocab). A chain through the row's token id, so a draft
// decode that read the wrong id (scatter_draft_tokens) changes every later draft.
GD_HD std::int32_t draft_token(std::uint32_t seed, std::int32_t slot, std::int32_t position,
                               std::int32_t token, std::int32_t vocab) {
  const std::uint32_t h =
      mix32(mix32(seed * 8u + kDraftToken) ^
            mix32(static_cast<std::uint32_t>(slot) +
                  0x9e3779b9u * mix32(static_cast<std::uint32_t>(position) ^
                                      mix32(static_cast<std::uint32_t>(token)))));
  return static_cast<std::int32_t>(h % static_cast<std::uint32_t>(vocab));
}

}  // namespace graphdecode::synthetic
