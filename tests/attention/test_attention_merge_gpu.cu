// GPU: merge_attention_states. Extend-with-prefix computed as two partial states — the cached
// prefix (keys [0, prefix)) and the new tokens (keys [prefix, kv_len)) — merged by log-sum-exp
// must equal attending the whole:
//   * no window: both parts by PagedAttention (prefix in cross mode over a page table holding
//     only the prefix; suffix in causal mode over only the new tokens), merged on the device;
//   * with a window (applied to BOTH parts): parts from the float64 reference, rounded to the
//     device dtype, merged on the device.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "attention_check.h"
#include "common/stream.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;

class AttentionMerge : public GpuTest {};

// Runs merge_attention_states on device states a and b ([rows][heads][d] dtype, [rows][heads]
// lse) and returns the merged outputs of the first `rows` rows.
Outputs merge_on_device(const void* o_a, const float* lse_a, const void* o_b, const float* lse_b,
                        std::int32_t rows, std::int32_t max_rows, const Shape& s,
                        cudaStream_t stream) {
  const std::size_t row_elems = static_cast<std::size_t>(s.num_q_heads) * s.head_dim;
  DeviceBuffer<std::uint16_t> out(max_rows * row_elems);
  DeviceBuffer<float> lse(static_cast<std::size_t>(max_rows) * s.num_q_heads);
  DeviceBuffer<std::int32_t> num_rows(1);
  num_rows.upload(&rows, 1, stream);
  out.fill_bytes(0xff, stream);
  lse.fill_bytes(0xff, stream);
  MergeStatesArgs args;
  args.o_a = o_a;
  args.lse_a = lse_a;
  args.o_b = o_b;
  args.lse_b = lse_b;
  args.out = out.data();
  args.lse_out = lse.data();
  args.num_rows = num_rows.data();
  args.max_rows = max_rows;
  args.num_heads = s.num_q_heads;
  args.head_dim = s.head_dim;
  args.dtype = s.dtype;
  merge_attention_states(args, stream);
  Outputs o;
  o.out.resize(rows * row_elems);
  o.lse.resize(static_cast<std::size_t>(rows) * s.num_q_heads);
  out.download(o.out.data(), o.out.size(), stream);
  lse.download(o.lse.data(), o.lse.size(), stream);
  GD_CUDA(cudaStreamSynchronize(stream));
  return o;
}

::testing::AssertionResult merged_parts_equal_whole(const Shape& shape,
                                                    const std::vector<Req>& whole_reqs, Rng& rng) {
  Stream stream;
  Shape cross = shape;
  cross.mode = AttentionMode::kCross;
  std::vector<Req> prefix_reqs, suffix_reqs;
  for (const Req& r : whole_reqs) {
    prefix_reqs.push_back(Req{r.q_len, r.kv_len - r.q_len});  // cross: all prefix keys
    suffix_reqs.push_back(Req{r.q_len, r.q_len});             // causal over the new tokens
  }
  HostPagedBatch whole(shape, capacity_for(shape, whole_reqs, rng));
  whole.fill(whole_reqs, {}, rng);
  HostPagedBatch prefix(cross, capacity_for(cross, prefix_reqs, rng));
  prefix.fill(prefix_reqs, {}, rng);
  HostPagedBatch suffix(shape, capacity_for(shape, suffix_reqs, rng));
  suffix.fill(suffix_reqs, {}, rng);
  for (std::int32_t r = 0; r < whole.num_requests(); ++r) {
    const RequestData data = whole.extract(r);
    const Req& w = whole_reqs[r];
    prefix.implant(r, slice_keys(data, shape, w.kv_len, 0, w.kv_len - w.q_len));
    suffix.implant(r, slice_keys(data, shape, w.kv_len, w.kv_len - w.q_len, w.kv_len));
  }
  DevicePagedBatch dev_prefix(cross, prefix.capacity()), dev_suffix(shape, suffix.capacity());
  dev_prefix.upload(prefix, stream);
  dev_suffix.upload(suffix, stream);
  const PagedAttention attn_prefix(prefix.config()), attn_suffix(suffix.config());
  const std::int32_t rows = whole.total_q();
  run_eager(attn_prefix, dev_prefix, rows, stream);
  run_eager(attn_suffix, dev_suffix, rows, stream);
  const std::int32_t max_rows =
      std::min(prefix.capacity().max_q_tokens, suffix.capacity().max_q_tokens);
  const Outputs merged = merge_on_device(dev_prefix.out(), dev_prefix.lse(), dev_suffix.out(),
                                         dev_suffix.lse(), rows, max_rows, shape, stream);
  auto res = matches_reference(whole.reference(), merged.out, &merged.lse, shape.dtype);
  if (!res) res << "\n  case: " << describe(shape, whole_reqs, {});
  return res;
}

TEST_F(AttentionMerge, PrefixAndSuffixFromTheKernelEqualTheWhole) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  // (q_len, kv_len = prefix + q_len); prefix 0 makes the prefix state empty (lse = -inf).
  const std::vector<Req> reqs = shrink_for_sanitizer(
      {{5, 105}, {1, 3001}, {64, 64}, {17, 1017}, {300, 340}, {8, 5008}, {1, 1}},
      AttentionMode::kCausal);
  EXPECT_TRUE(
      merged_parts_equal_whole({32, 8, 128, 16, DType::kBF16, AttentionMode::kCausal}, reqs, rng));
  EXPECT_TRUE(
      merged_parts_equal_whole({8, 1, 64, 1, DType::kFP16, AttentionMode::kCausal}, reqs, rng));
  EXPECT_TRUE(
      merged_parts_equal_whole({16, 2, 256, 64, DType::kBF16, AttentionMode::kCausal}, reqs, rng));
}

// Windowed parts from the reference (the window applied to both), merged on the device.
::testing::AssertionResult windowed_merge_equals_whole(const Shape& shape, std::vector<Req> reqs,
                                                       std::int32_t window, Rng& rng) {
  reqs = shrink_for_sanitizer(std::move(reqs), shape.mode);
  HostPagedBatch whole(shape, capacity_for(shape, reqs, rng));
  whole.fill(reqs, FillOptions{window, false}, rng);
  const std::int32_t rows = whole.total_q(), hq = shape.num_q_heads, d = shape.head_dim;
  const std::size_t row_elems = static_cast<std::size_t>(hq) * d;
  std::vector<std::uint16_t> o_pre(rows * row_elems), o_suf(rows * row_elems);
  std::vector<float> lse_pre(static_cast<std::size_t>(rows) * hq), lse_suf(lse_pre.size());
  for (std::int32_t r = 0; r < whole.num_requests(); ++r) {
    const std::int32_t prefix = reqs[r].kv_len - reqs[r].q_len, q0 = whole.q_start()[r];
    const reference::HostBatch one{1, &whole.slot()[r], &whole.q_start()[r], &whole.kv_len()[r],
                                   window};
    const auto pre =
        reference::attention(whole.config(), one, whole.host_view(), whole.q().data(), {0, prefix});
    const auto suf =
        reference::attention(whole.config(), one, whole.host_view(), whole.q().data(), {prefix});
    for (std::size_t i = 0; i < pre.o.size(); ++i) {
      o_pre[q0 * row_elems + i] = reference::from_float(static_cast<float>(pre.o[i]), shape.dtype);
      o_suf[q0 * row_elems + i] = reference::from_float(static_cast<float>(suf.o[i]), shape.dtype);
    }
    for (std::size_t i = 0; i < pre.lse.size(); ++i) {
      lse_pre[q0 * hq + i] = static_cast<float>(pre.lse[i]);
      lse_suf[q0 * hq + i] = static_cast<float>(suf.lse[i]);
    }
  }
  Stream stream;
  DeviceBuffer<std::uint16_t> d_o_pre(o_pre.size()), d_o_suf(o_suf.size());
  DeviceBuffer<float> d_lse_pre(lse_pre.size()), d_lse_suf(lse_suf.size());
  d_o_pre.upload(o_pre.data(), o_pre.size(), stream);
  d_o_suf.upload(o_suf.data(), o_suf.size(), stream);
  d_lse_pre.upload(lse_pre.data(), lse_pre.size(), stream);
  d_lse_suf.upload(lse_suf.data(), lse_suf.size(), stream);
  const Outputs merged = merge_on_device(d_o_pre.data(), d_lse_pre.data(), d_o_suf.data(),
                                         d_lse_suf.data(), rows, rows, shape, stream);
  auto res = matches_reference(whole.reference(), merged.out, &merged.lse, shape.dtype);
  CaseOptions o;
  o.fill.window_left = window;
  if (!res) res << "\n  case: " << describe(shape, reqs, o);
  return res;
}

TEST_F(AttentionMerge, WindowAppliedToBothParts) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  const Shape shape{32, 8, 128, 16, DType::kBF16, AttentionMode::kCausal};
  // Prefixes shorter and longer than the window; extends longer than it.
  const std::vector<Req> reqs = {{5, 105},   {1, 3001}, {64, 64}, {17, 1017},
                                 {300, 340}, {8, 5008}, {1, 1},   {40, 43}};
  for (std::int32_t window : {0, 1, 3, 15, 16, 100, 1000})
    EXPECT_TRUE(windowed_merge_equals_whole(shape, reqs, window, rng)) << "window " << window;
  EXPECT_TRUE(windowed_merge_equals_whole({8, 1, 64, 64, DType::kFP16, AttentionMode::kCausal},
                                          reqs, 63, rng));
}

}  // namespace
}  // namespace graphdecode
