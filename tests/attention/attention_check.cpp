// Seeds, comparison with the float64 reference, and one-call cases. See attention_check.h.
#include "attention_check.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>

#include "attention/attention_params.cuh"
#include "attention/attention_policy.h"
#include "common/stream.h"

namespace graphdecode::testing {

std::uint64_t base_seed() {
  static const std::uint64_t seed = [] {
    if (const char* s = std::getenv("GRAPHDECODE_SEED"))
      return static_cast<std::uint64_t>(std::strtoull(s, nullptr, 0));
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  }();
  return seed;
}

Rng test_rng() {
  std::string name = "no-test";
  if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info())
    name = std::string(info->test_suite_name()) + "." + info->name();
  return Rng(base_seed() ^ std::hash<std::string>{}(name));
}

std::string seed_note() {
  return "reproduce with GRAPHDECODE_SEED=" + std::to_string(base_seed());
}

bool sanitize_mode() {
  const char* v = std::getenv("GRAPHDECODE_SANITIZE");
  return v != nullptr && std::string(v) == "1";
}

std::vector<Req> shrink_for_sanitizer(std::vector<Req> reqs, AttentionMode mode,
                                      std::size_t max_batch) {
  if (!sanitize_mode()) return reqs;
  if (reqs.size() > max_batch) reqs.resize(max_batch);
  for (Req& r : reqs) {
    r.kv_len = std::min(r.kv_len, 2048);
    r.q_len = std::min(r.q_len, 256);
    if (mode == AttentionMode::kCausal) r.q_len = std::min(r.q_len, r.kv_len);
  }
  return reqs;
}

std::vector<Req> decode_reqs(Rng& rng, std::int32_t batch, std::int32_t min_ctx,
                             std::int32_t max_ctx) {
  std::uniform_int_distribution<std::int32_t> ctx(min_ctx, max_ctx);
  std::vector<Req> reqs(batch);
  for (Req& r : reqs) r = Req{1, ctx(rng)};
  return reqs;
}

std::vector<Req> extend_reqs(Rng& rng, std::int32_t batch, std::int32_t min_q, std::int32_t max_q,
                             std::int32_t min_prefix, std::int32_t max_prefix) {
  std::uniform_int_distribution<std::int32_t> ql(min_q, max_q), pl(min_prefix, max_prefix);
  std::vector<Req> reqs(batch);
  for (Req& r : reqs) {
    const std::int32_t q = ql(rng);
    r = Req{q, pl(rng) + q};
  }
  return reqs;
}

::testing::AssertionResult matches_reference(const reference::AttentionResult& ref,
                                             const std::vector<std::uint16_t>& out,
                                             const std::vector<float>* lse, DType dtype,
                                             const Tolerance& tol) {
  const std::int32_t heads = ref.num_heads, d = ref.head_dim;
  if (out.size() < ref.o.size())
    return ::testing::AssertionFailure()
           << "output has " << out.size() << " elements, expected " << ref.o.size();
  double err2 = 0, ref2 = 0, max_err = 0;
  std::size_t worst = 0;
  std::int64_t nan_count = 0, empty_row_errors = 0;
  std::size_t first_nan = 0;
  for (std::size_t i = 0; i < ref.o.size(); ++i) {
    const double o = reference::to_float(out[i], dtype);
    const bool empty_row = std::isinf(ref.lse[i / d]);
    if (std::isnan(o)) {
      if (nan_count++ == 0) first_nan = i;
      continue;
    }
    if (empty_row && o != 0.0) ++empty_row_errors;
    const double e = std::abs(o - ref.o[i]);
    err2 += e * e;
    ref2 += ref.o[i] * ref.o[i];
    if (e > max_err) max_err = e, worst = i;
  }
  auto where = [&](std::size_t i) {
    std::ostringstream os;
    os << "(row " << i / d / heads << ", head " << (i / d) % heads << ", dim " << i % d << ")";
    return os.str();
  };
  if (nan_count > 0)
    return ::testing::AssertionFailure()
           << nan_count << " output elements are NaN (unwritten poison or NaN math), first at "
           << where(first_nan);
  if (empty_row_errors > 0)
    return ::testing::AssertionFailure()
           << empty_row_errors << " elements of rows that see no key are not exactly 0";
  const double rel = std::sqrt(err2) / std::max(std::sqrt(ref2), 1e-30);
  if (!(rel < tol.rel_l2) || !(max_err < tol.max_abs))
    return ::testing::AssertionFailure()
           << "output error: rel L2 " << rel << " (tol " << tol.rel_l2 << "), max abs " << max_err
           << " (tol " << tol.max_abs << ") at " << where(worst) << ": got "
           << reference::to_float(out[worst], dtype) << ", reference " << ref.o[worst];
  double max_lse_err = 0;
  if (lse != nullptr) {
    if (lse->size() < ref.lse.size())
      return ::testing::AssertionFailure() << "lse has " << lse->size() << " elements";
    for (std::size_t i = 0; i < ref.lse.size(); ++i) {
      const double got = (*lse)[i], want = ref.lse[i];
      const bool ok = std::isinf(want) ? (std::isinf(got) && got < 0)
                                       : std::abs(got - want) < tol.lse_abs;  // NaN fails
      if (!ok)
        return ::testing::AssertionFailure()
               << "lse at (row " << i / heads << ", head " << i % heads << "): got " << got
               << ", reference " << want;
      if (!std::isinf(want)) max_lse_err = std::max(max_lse_err, std::abs(got - want));
    }
  }
  return ::testing::AssertionSuccess()
         << "rel L2 " << rel << ", max abs " << max_err << ", max lse err " << max_lse_err;
}

Outputs run_eager(const PagedAttention& attn, DevicePagedBatch& dev, std::int32_t total_q,
                  cudaStream_t stream, bool with_lse, bool with_window_ptr,
                  std::int32_t query_tokens_hint, std::int32_t requests_hint) {
  dev.poison_outputs(stream);
  AttentionBatch batch = dev.batch(with_window_ptr);
  batch.query_tokens_hint = query_tokens_hint;
  batch.requests_hint = requests_hint;
  attn.run(batch, dev.view(), dev.q(), dev.out(), with_lse ? dev.lse() : nullptr, stream);
  Outputs o;
  o.out = dev.download_out(total_q, stream);
  if (with_lse) o.lse = dev.download_lse(total_q, stream);
  return o;
}

::testing::AssertionResult bitwise_equal(const Outputs& a, std::int32_t a_row, const Outputs& b,
                                         std::int32_t b_row, std::int32_t rows,
                                         std::int32_t row_elems, std::int32_t heads) {
  const std::size_t n = static_cast<std::size_t>(rows) * row_elems;
  const std::uint16_t* pa = a.out.data() + static_cast<std::size_t>(a_row) * row_elems;
  const std::uint16_t* pb = b.out.data() + static_cast<std::size_t>(b_row) * row_elems;
  for (std::size_t i = 0; i < n; ++i)
    if (pa[i] != pb[i])
      return ::testing::AssertionFailure()
             << "output bits differ at element " << i << " of " << n << " (row " << i / row_elems
             << "): 0x" << std::hex << pa[i] << " vs 0x" << pb[i];
  if (!a.lse.empty() && !b.lse.empty()) {
    const std::size_t m = static_cast<std::size_t>(rows) * heads;
    if (std::memcmp(a.lse.data() + static_cast<std::size_t>(a_row) * heads,
                    b.lse.data() + static_cast<std::size_t>(b_row) * heads, m * sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "lse bits differ";
  }
  return ::testing::AssertionSuccess();
}

std::string describe(const Shape& s, const std::vector<Req>& reqs, const CaseOptions& o) {
  std::ostringstream os;
  os << "heads " << s.num_q_heads << "/" << s.num_kv_heads << " d" << s.head_dim << " "
     << dtype_name(s.dtype) << " page " << s.page_size
     << (s.mode == AttentionMode::kCross ? " cross" : " causal") << " window " << o.fill.window_left
     << (o.fill.invalidate_before_window ? " (invalid pages before window)" : "")
     << (o.deterministic ? " deterministic" : "") << " split " << o.split_tokens << "; "
     << reqs.size() << " requests (q_len, kv_len):";
  for (std::size_t i = 0; i < reqs.size() && i < 12; ++i)
    os << " (" << reqs[i].q_len << "," << reqs[i].kv_len << ")";
  if (reqs.size() > 12) os << " ...";
  return os.str();
}

::testing::AssertionResult run_case(const Shape& shape, std::vector<Req> reqs,
                                    const CaseOptions& opts, Rng& rng) {
  reqs = shrink_for_sanitizer(std::move(reqs), shape.mode);
  const Capacity cap = capacity_for(shape, reqs, rng);
  HostPagedBatch host(shape, cap);
  host.fill(reqs, opts.fill, rng);
  Stream stream;
  DevicePagedBatch dev(shape, cap);
  dev.upload(host, stream);
  const PagedAttention attn(host.config(opts.deterministic, opts.split_tokens));
  const Outputs got =
      run_eager(attn, dev, host.total_q(), stream, opts.with_lse, opts.with_window_ptr);
  reference::AttentionResult ref = host.reference();
  if (!opts.with_window_ptr && shape.mode == AttentionMode::kCausal && host.window_left() >= 0)
    return ::testing::AssertionFailure() << "test bug: window set but not passed";
  auto r =
      matches_reference(ref, got.out, opts.with_lse ? &got.lse : nullptr, shape.dtype, opts.tol);
  if (r && opts.wide_tiles) {
    if (attn.wide_tiles_chosen())
      return ::testing::AssertionFailure() << "64-row run chose wide tiles";
    const Outputs wide = run_eager(attn, dev, host.total_q(), stream, opts.with_lse,
                                   opts.with_window_ptr, /*query_tokens_hint=*/1 << 24);
    if ((shape.head_dim == 64 && attn::kWideExtend<64>) != attn.wide_tiles_chosen())
      r = ::testing::AssertionFailure()
          << "the hint chose wide tiles: " << attn.wide_tiles_chosen();
    else
      r = matches_reference(ref, wide.out, opts.with_lse ? &wide.lse : nullptr, shape.dtype,
                            opts.tol);
    // (A build that forces the mma.sync halves rounds as that layout: no bitwise comparison.)
    if (r && opts.deterministic && !attn::kWideForceHalves)
      r = bitwise_equal(got, 0, wide, 0, host.total_q(), shape.num_q_heads * shape.head_dim,
                        shape.num_q_heads);
    if (!r) r << "\n  (wide tiles)";
  }
  if (r && opts.dense_decode) {
    if (attn.dense_decode_chosen())
      return ::testing::AssertionFailure() << "a run without the hint chose the dense kernel";
    const Outputs dense = run_eager(attn, dev, host.total_q(), stream, opts.with_lse,
                                    opts.with_window_ptr, 0, /*requests_hint=*/1 << 20);
    const bool want = shape.head_dim == 64 && attn::kDenseDecode<64>;
    if (want != attn.dense_decode_chosen())
      r = ::testing::AssertionFailure()
          << "the hint chose the dense kernel: " << attn.dense_decode_chosen();
    else
      r = matches_reference(ref, dense.out, opts.with_lse ? &dense.lse : nullptr, shape.dtype,
                            opts.tol);
    const std::int32_t group = shape.num_q_heads / shape.num_kv_heads;
    bool decode_tiles = true;
    for (const Req& q : reqs) decode_tiles = decode_tiles && q.q_len * group <= attn::kDecodeRows;
    if (r && opts.deterministic && decode_tiles)
      r = bitwise_equal(got, 0, dense, 0, host.total_q(), shape.num_q_heads * shape.head_dim,
                        shape.num_q_heads);
    if (!r) r << "\n  (dense decode kernel)";
  }
  if (!r) r << "\n  case: " << describe(shape, reqs, opts);
  return r;
}

}  // namespace graphdecode::testing
