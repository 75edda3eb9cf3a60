// The float64 references' shared arithmetic (llama_reference.cpp, eagle_reference.cpp): bf16
// weights read as doubles and a dense layer, nothing rounded on the way.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/weights.h"

namespace graphdecode::testing::refmath {

using Vec = std::vector<double>;

inline double bf16(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline Vec vec(const HostTensor& t) {
  Vec v(t.data.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = bf16(t.data[i]);
  return v;
}

// y[o] = sum_i W[o][i] x[i] (+ b[o])
inline Vec linear(const Vec& w, const Vec& x, std::size_t out, const Vec* b = nullptr) {
  const std::size_t in = x.size();
  Vec y(out, 0.0);
  for (std::size_t o = 0; o < out; ++o) {
    double s = 0;
    for (std::size_t i = 0; i < in; ++i) s += w[o * in + i] * x[i];
    y[o] = s + (b ? (*b)[o] : 0.0);
  }
  return y;
}

}  // namespace graphdecode::testing::refmath
