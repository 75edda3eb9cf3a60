// Pointer alignment, for the launchers' argument checks (kernels that load 16-byte vectors).
#pragma once

#include <cstdint>

namespace graphdecode {

inline bool aligned16(const void* p) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

}  // namespace graphdecode
