// Element types of K/V, Q and outputs. Kernels are instantiated for exactly these two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace graphdecode {

enum class DType : std::uint8_t { kBF16 = 0, kFP16 = 1 };

constexpr std::size_t dtype_bytes(DType) {
  return 2;
}
constexpr std::string_view dtype_name(DType t) {
  return t == DType::kBF16 ? "bf16" : "fp16";
}

}  // namespace graphdecode
