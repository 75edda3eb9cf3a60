// Float64 CPU reference of paged attention and of the LSE merge. See attention/reference.h.
#include "attention/reference.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "common/request_rules.h"

namespace graphdecode::reference {

// ---- bf16 / fp16
// ----------------------------------------------------------------------------------

float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::uint16_t float_to_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even; overflow carries to inf
  return static_cast<std::uint16_t>(u >> 16);
}

float fp16_to_float(std::uint16_t bits) {
  const std::uint32_t sign = (bits & 0x8000u) << 16;
  const std::uint32_t exp = (bits >> 10) & 0x1fu;
  const std::uint32_t mant = bits & 0x3ffu;
  std::uint32_t u;
  if (exp == 0) {
    // zero or subnormal: mant * 2^-24, exact in float
    const float mag = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -mag : mag;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::uint16_t float_to_fp16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (u >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf (and inf itself)
  if (u < 0x38800000u) {
    // Below 2^-14: a subnormal (or zero). f * 2^24 is exact; nearbyint rounds to nearest even.
    // A result of 1024 is the bit pattern of the smallest normal, which is right.
    float f;
    std::memcpy(&f, &u, sizeof f);
    return sign | static_cast<std::uint16_t>(std::nearbyint(f * 16777216.0f));
  }
  u += 0xfffu + ((u >> 13) & 1u);  // round to nearest even at bit 13
  u -= 112u << 23;                 // rebias the exponent: 127 -> 15
  return sign | static_cast<std::uint16_t>(u >> 13);
}

float to_float(std::uint16_t bits, DType t) {
  return t == DType::kBF16 ? bf16_to_float(bits) : fp16_to_float(bits);
}
std::uint16_t from_float(float x, DType t) {
  return t == DType::kBF16 ? float_to_bf16(x) : float_to_fp16(x);
}

// ---- attention
// ------------------------------------------------------------------------------------
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double dot(const double* a, const float* b, int n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

// Runs task(i) for i in [0, n) on up to hardware_concurrency threads; rethrows the first error.
template <typename F>
void parallel_for(std::int64_t n, F&& task) {
  const std::int64_t threads =
      std::min<std::int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<std::int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    for (std::int64_t i; (i = next.fetch_add(1)) < n;) {
      try {
        task(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(n);
      }
    }
  };
  std::vector<std::thread> pool;
  for (std::int64_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

// K and V of keys [begin, end) of one request and kv head, as float (exact for bf16/fp16).
struct KeyBlock {
  std::int32_t begin = 0, end = 0;
  std::vector<float> k, v;  // [end - begin][head_dim]
};

KeyBlock gather_keys(const PagedKvView& kv, DType dtype, std::int32_t slot, std::int32_t kv_head,
                     std::int32_t begin, std::int32_t end) {
  KeyBlock b;
  b.begin = begin;
  b.end = std::max(begin, end);
  const std::int32_t n = b.end - b.begin, d = kv.head_dim;
  b.k.resize(static_cast<std::size_t>(n) * d);
  b.v.resize(static_cast<std::size_t>(n) * d);
  const auto* k = static_cast<const std::uint16_t*>(kv.k);
  const auto* v = static_cast<const std::uint16_t*>(kv.v);
  for (std::int32_t pos = b.begin; pos < b.end; ++pos) {
    GD_REQUIRE(pos / kv.page_size < kv.max_pages_per_slot, "kv position", pos,
               "reference: position beyond the page-table row");
    const std::int32_t page = page_of_token(kv, slot, pos);
    GD_REQUIRE(page >= 0 && page < kv.num_pages, "page", page,
               "reference: a visible key's page-table entry is not a page of the pool");
    const std::int64_t off = kv_element_offset(kv, page, kv_head, pos % kv.page_size);
    float* kd = &b.k[static_cast<std::size_t>(pos - b.begin) * d];
    float* vd = &b.v[static_cast<std::size_t>(pos - b.begin) * d];
    for (std::int32_t i = 0; i < d; ++i) {
      kd[i] = to_float(k[off + i], dtype);
      vd[i] = to_float(v[off + i], dtype);
    }
  }
  return b;
}

}  // namespace

AttentionResult attention(const AttentionConfig& config, const HostBatch& batch,
                          const PagedKvView& kv, const std::uint16_t* q, KeyRange keys) {
  const std::int32_t hq = config.num_q_heads, hkv = config.num_kv_heads, d = config.head_dim;
  GD_REQUIRE(hkv > 0 && hq % hkv == 0, "num_q_heads", hq, "reference: bad GQA group");
  GD_REQUIRE(kv.head_dim == d && kv.num_kv_heads == hkv, "kv.head_dim", kv.head_dim,
             "reference: KV view does not match the config");
  const bool cross = config.mode == AttentionMode::kCross;
  const std::int32_t group = hq / hkv;
  const std::int32_t window = cross ? -1 : batch.window_left;
  const double scale = config.sm_scale != 0.f ? static_cast<double>(config.sm_scale)
                                              : 1.0 / std::sqrt(static_cast<double>(d));

  AttentionResult res;
  res.total_q = batch.q_start[batch.num_requests] - batch.q_start[0];
  res.num_heads = hq;
  res.head_dim = d;
  res.o.assign(static_cast<std::size_t>(res.total_q) * hq * d, 0.0);
  res.lse.assign(static_cast<std::size_t>(res.total_q) * hq, kNegInf);

  // Tasks: (request, kv head, block of up to kQueryBlock queries), so one long request still
  // spreads over all threads.
  constexpr std::int32_t kQueryBlock = 32;
  struct Task {
    std::int32_t r, g, i0, i1;
  };
  std::vector<Task> tasks;
  for (std::int32_t r = 0; r < batch.num_requests; ++r) {
    const std::int32_t q_len = batch.q_start[r + 1] - batch.q_start[r];
    if (!cross) {
      GD_REQUIRE(q_len <= batch.kv_len[r], "q_len", q_len,
                 "reference: causal q_len exceeds kv_len");
    }
    for (std::int32_t g = 0; g < hkv; ++g)
      for (std::int32_t i0 = 0; i0 < q_len; i0 += kQueryBlock)
        tasks.push_back(Task{r, g, i0, std::min(q_len, i0 + kQueryBlock)});
  }

  parallel_for(static_cast<std::int64_t>(tasks.size()), [&](std::int64_t t) {
    const auto [r, g, i0, i1] = tasks[t];
    const std::int32_t q0 = batch.q_start[r], q_len = batch.q_start[r + 1] - q0;
    const std::int32_t kv_len = batch.kv_len[r];
    // Keys any query of the block may see: from its first query's first visible key (the most
    // restrictive one) to kv_len (causal: to its last query's position), clipped to the range.
    const std::int32_t first_pos = kv_len - q_len;
    std::int32_t begin = cross ? 0 : first_visible_key(first_pos + i0, window);
    begin = std::max(begin, keys.key_begin);
    std::int32_t end = std::min(kv_len, keys.key_end);
    if (!cross) end = std::min(end, first_pos + i1);
    if (begin >= end) return;  // every row sees no key: o = 0, lse = -inf
    const KeyBlock kb = gather_keys(kv, config.dtype, batch.slot[r], g, begin, end);

    std::vector<double> qd(d), acc(d), score(static_cast<std::size_t>(end - begin));
    for (std::int32_t i = i0; i < i1; ++i) {
      const std::int32_t row = q0 - batch.q_start[0] + i;
      const std::int32_t pos = first_pos + i;
      const std::int32_t lo = cross ? begin : std::max(begin, first_visible_key(pos, window));
      for (std::int32_t h = g * group; h < (g + 1) * group; ++h) {
        const std::uint16_t* qrow = q + (static_cast<std::size_t>(q0 + i) * hq + h) * d;
        for (std::int32_t j = 0; j < d; ++j) qd[j] = to_float(qrow[j], config.dtype);
        double max_s = kNegInf;
        std::int32_t n = 0;
        for (std::int32_t k = lo; k < end; ++k) {
          const bool visible = cross || key_visible(pos, k, window);
          double s = kNegInf;
          if (visible) {
            s = scale * dot(qd.data(), &kb.k[static_cast<std::size_t>(k - begin) * d], d);
            max_s = std::max(max_s, s);
            ++n;
          }
          score[k - lo] = s;
        }
        if (n == 0) continue;  // no visible key: o = 0, lse = -inf (already set)
        std::fill(acc.begin(), acc.end(), 0.0);
        double sum = 0;
        for (std::int32_t k = lo; k < end; ++k) {
          if (score[k - lo] == kNegInf) continue;
          const double p = std::exp(score[k - lo] - max_s);
          sum += p;
          const float* vrow = &kb.v[static_cast<std::size_t>(k - begin) * d];
          for (std::int32_t j = 0; j < d; ++j) acc[j] += p * vrow[j];
        }
        for (std::int32_t j = 0; j < d; ++j) res.at(row, h, j) = acc[j] / sum;
        res.lse[static_cast<std::size_t>(row) * hq + h] = max_s + std::log(sum);
      }
    }
  });
  return res;
}

AttentionResult merge_states(const AttentionResult& a, const AttentionResult& b) {
  GD_REQUIRE(a.total_q == b.total_q && a.num_heads == b.num_heads && a.head_dim == b.head_dim,
             "total_q", b.total_q, "reference merge: the two states differ in shape");
  AttentionResult m = a;
  const std::int32_t d = a.head_dim;
  for (std::size_t rh = 0; rh < a.lse.size(); ++rh) {
    const double la = a.lse[rh], lb = b.lse[rh];
    const double mx = std::max(la, lb);
    double* o = &m.o[rh * d];
    if (mx == kNegInf) {
      std::fill(o, o + d, 0.0);
      m.lse[rh] = kNegInf;
      continue;
    }
    const double wa = std::exp(la - mx), wb = std::exp(lb - mx);  // exp(-inf) = 0
    const double s = wa + wb;
    for (std::int32_t j = 0; j < d; ++j) o[j] = (wa * a.o[rh * d + j] + wb * b.o[rh * d + j]) / s;
    m.lse[rh] = mx + std::log(s);
  }
  return m;
}

}  // namespace graphdecode::reference
