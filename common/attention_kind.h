// The kind of attention a layer does, which is also the kind of KV pool its keys live in: one
// enum for the model config, the layers, the pools and the step input.
#pragma once

#include <cstdint>
#include <string_view>

namespace graphdecode {

enum class AttentionKind : std::uint8_t {
  kFull = 0,     // causal over the whole prefix; every page of a request stays until released
  kSliding = 1,  // causal within window_left; pages left of the window are returned as it grows
  kCross = 2,    // non-causal over the request's encoder keys, written once when it arrives
};
inline constexpr int kNumAttentionKinds = 3;

constexpr int kind_index(AttentionKind k) {
  return static_cast<int>(k);
}

constexpr std::string_view attention_kind_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::kFull:
      return "full";
    case AttentionKind::kSliding:
      return "sliding";
    case AttentionKind::kCross:
      return "cross";
  }
  return "unknown";
}

}  // namespace graphdecode
