#include "stack_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attention/reference.h"
#include "common/error.h"
#include "common/request_rules.h"
#include "synthetic.h"

namespace graphdecode::fuzz {
namespace {

// What the device holds for a synthetic element: the hash rounded to the dtype.
double rounded(std::uint32_t seed, synthetic::Tag tag, std::uint32_t a, std::uint32_t b,
               std::uint32_t element, DType dtype) {
  const float x = synthetic::value(seed, tag, a, b, element);
  return reference::to_float(reference::from_float(x, dtype), dtype);
}

}  // namespace

const std::vector<double>& StackReference::row(const AttentionStackConfig& c,
                                               std::span<const std::int32_t> tokens,
                                               std::int32_t encoder_len, std::uint32_t request_id) {
  GD_REQUIRE(!tokens.empty(), "tokens", 0, "a row needs its own token");
  const AttentionLayout& layout = c.layout;
  const std::int32_t hq = layout.num_q_heads, hkv = layout.num_kv_heads, dim = layout.head_dim;
  const std::int32_t group = hq / hkv;
  const auto pos = static_cast<std::int32_t>(tokens.size()) - 1;
  const auto query_token = static_cast<std::uint32_t>(tokens[static_cast<std::size_t>(pos)]);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  const auto row_elems = static_cast<std::size_t>(hq * dim);
  residual_.assign(row_elems, 0.0);
  out_.resize(row_elems);
  q_.resize(static_cast<std::size_t>(dim));
  acc_.resize(static_cast<std::size_t>(dim));
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(layout.layers.size()); ++l) {
    const AttentionKind kind = layout.layers[static_cast<std::size_t>(l)];
    const bool cross = kind == AttentionKind::kCross;
    std::int32_t k_begin = 0, k_end = pos + 1;
    if (kind == AttentionKind::kSliding) k_begin = first_visible_key(pos, layout.window_left);
    if (cross) k_end = encoder_len;
    std::fill(out_.begin(), out_.end(), 0.0);
    const std::int32_t keys = std::max(0, k_end - k_begin);
    // K and V of every visible key, once per kv head: [key][kv head][dim].
    const auto kv_elems = static_cast<std::size_t>(keys) * hkv * dim;
    if (k_.size() < kv_elems) {
      k_.resize(kv_elems);
      v_.resize(kv_elems);
    }
    const auto tk = cross ? synthetic::kEncoderKey : synthetic::kKey;
    const auto tv = cross ? synthetic::kEncoderValue : synthetic::kValue;
    for (std::int32_t i = 0; i < keys; ++i) {
      const std::int32_t key = k_begin + i;
      const std::uint32_t a =
          cross ? request_id : static_cast<std::uint32_t>(tokens[static_cast<std::size_t>(key)]);
      for (std::int32_t h = 0; h < hkv; ++h) {
        for (std::int32_t d = 0; d < dim; ++d) {
          const std::uint32_t el = synthetic::element_id(l, h, d);
          const std::size_t at = (static_cast<std::size_t>(i) * hkv + h) * dim + d;
          k_[at] = rounded(c.seed, tk, a, static_cast<std::uint32_t>(key), el, layout.dtype);
          v_[at] = rounded(c.seed, tv, a, static_cast<std::uint32_t>(key), el, layout.dtype);
        }
      }
    }
    for (std::int32_t h = 0; h < hq && keys > 0; ++h) {  // no key: the layer's output is 0
      const std::int32_t kvh = h / group;
      for (std::int32_t d = 0; d < dim; ++d) {
        // The device: round(hash + gain * residual), residual a float sum.
        const float x =
            synthetic::value(c.seed, synthetic::kQuery, query_token,
                             static_cast<std::uint32_t>(pos), synthetic::element_id(l, h, d));
        const float v = x + c.residual_gain * static_cast<float>(
                                                  residual_[static_cast<std::size_t>(h * dim + d)]);
        q_[static_cast<std::size_t>(d)] =
            reference::to_float(reference::from_float(v, layout.dtype), layout.dtype);
      }
      double m = -INFINITY, denom = 0.0;
      std::fill(acc_.begin(), acc_.end(), 0.0);
      for (std::int32_t i = 0; i < keys; ++i) {
        const double* kr = &k_[(static_cast<std::size_t>(i) * hkv + kvh) * dim];
        const double* vr = &v_[(static_cast<std::size_t>(i) * hkv + kvh) * dim];
        double score = 0.0;
        for (std::int32_t d = 0; d < dim; ++d) score += q_[static_cast<std::size_t>(d)] * kr[d];
        score *= scale;
        const double m_new = std::max(m, score);
        const double cm = std::exp(m - m_new), p = std::exp(score - m_new);
        denom = denom * cm + p;
        for (std::int32_t d = 0; d < dim; ++d)
          acc_[static_cast<std::size_t>(d)] = acc_[static_cast<std::size_t>(d)] * cm + p * vr[d];
        m = m_new;
      }
      for (std::int32_t d = 0; d < dim; ++d)
        out_[static_cast<std::size_t>(h * dim + d)] = acc_[static_cast<std::size_t>(d)] / denom;
    }
    for (std::size_t i = 0; i < row_elems; ++i) residual_[i] += out_[i];
  }
  return residual_;
}

RowError row_error(const float* got, const std::vector<double>& want) {
  RowError e;
  for (std::size_t i = 0; i < want.size(); ++i) {
    double err = std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i]));
    if (std::isnan(err)) err = std::numeric_limits<double>::infinity();
    if (err > e.worst) {
      e.worst = err;
      e.element = i;
    }
  }
  return e;
}

double row_tolerance(DType dtype) {
  return dtype == DType::kBF16 ? 3e-2 : 1e-2;
}

}  // namespace graphdecode::fuzz
