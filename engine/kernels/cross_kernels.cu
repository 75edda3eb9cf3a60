// Per-head RMSNorm and the gated, masked residual add + RMSNorm of the cross layers. See
// cross_kernels.h. The fp32 expressions repeat rmsnorm_kernel's (model_kernels.cu) so a masked
// row's norm is bitwise the plain norm of its unchanged residual.
#include <cuda_bf16.h>

#include <cstdint>

#include "common/align.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/kernels/bf16_vec.cuh"
#include "engine/kernels/cross_kernels.h"

namespace graphdecode {
namespace {

using detail::bf16_bits_to_float;
using detail::load8;
using detail::round_bf16;
using detail::store8;
using detail::Vec8;

constexpr int kNormThreads = 256;
constexpr int kNormMaxVecs = 4;   // 256 threads x 4 vectors x 8 = hidden 8192
constexpr int kHeadWarps = 4;     // heads per block of the head norm
constexpr int kMaxHeadElems = 8;  // head_dim 256 / 32 lanes

// ---- per-head RMSNorm: one warp per (row, head)
// --------------------------------------------------
__global__ void __launch_bounds__(kHeadWarps * 32)
    head_rmsnorm_kernel(const __grid_constant__ HeadNormArgs a) {
  const int row = blockIdx.x;
  if (row >= *a.num_rows) return;
  const int head = blockIdx.y * kHeadWarps + static_cast<int>(threadIdx.x >> 5);
  if (head >= a.num_heads) return;  // whole warps exit together
  const int lane = threadIdx.x & 31;
  const int per_lane = a.head_dim / 32;  // 2, 4 or 8
  std::uint16_t* p = a.x + static_cast<std::size_t>(row) * a.row_stride +
                     static_cast<std::size_t>(head) * a.head_dim;
  float v[kMaxHeadElems];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxHeadElems; ++j) {
    if (j >= per_lane) break;
    v[j] = bf16_bits_to_float(p[lane + 32 * j]);
    ss += v[j] * v[j];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv_rms = rsqrtf(ss / static_cast<float>(a.head_dim) + a.eps);
#pragma unroll
  for (int j = 0; j < kMaxHeadElems; ++j) {
    if (j >= per_lane) break;
    const float w = bf16_bits_to_float(a.weight[lane + 32 * j]);
    p[lane + 32 * j] = detail::float_to_bf16_bits(w * round_bf16(v[j] * inv_rms));
  }
}

// ---- gated residual add + RMSNorm: one block per row, the row in registers ---------------------
__global__ void __launch_bounds__(kNormThreads)
    gated_residual_rmsnorm_kernel(const __grid_constant__ GatedResidualNormArgs a) {
  const int row = blockIdx.x;
  if (row >= *a.num_rows) return;
  __shared__ float scratch[32];
  const std::int32_t request = a.token_request[row];
  // Block-uniform: every thread of the row takes the same branch.
  const bool gated =
      request >= 0 && a.encoder_len[request] > 0 &&
      (a.first_position == nullptr || a.token_position[row] >= a.first_position[a.token_slot[row]]);
  const float gate = round_bf16(tanhf(bf16_bits_to_float(*a.gate)));
  const int nvec = a.hidden / 8;
  const std::size_t base = static_cast<std::size_t>(row) * a.hidden;
  Vec8 v[kNormMaxVecs];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kNormMaxVecs; ++k) {
    const int vi = threadIdx.x + k * kNormThreads;
    if (vi >= nvec) continue;
    v[k] = load8(a.residual + base + vi * 8);
    if (gated) {
      const Vec8 x = load8(a.x + base + vi * 8);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[k].v[e] = round_bf16(v[k].v[e] + round_bf16(gate * x.v[e]));
      store8(a.residual + base + vi * 8, v[k]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v[k].v[e] * v[k].v[e];
  }
  if (a.y == nullptr) return;  // uniform: no thread reaches the block sum
  ss = detail::block_sum(ss, scratch);
  const float inv_rms = rsqrtf(ss / static_cast<float>(a.hidden) + a.eps);
#pragma unroll
  for (int k = 0; k < kNormMaxVecs; ++k) {
    const int vi = threadIdx.x + k * kNormThreads;
    if (vi >= nvec) continue;
    const Vec8 w = load8(a.weight + vi * 8);
    Vec8 out;
#pragma unroll
    for (int e = 0; e < 8; ++e) out.v[e] = w.v[e] * round_bf16(v[k].v[e] * inv_rms);
    store8(a.y + base + vi * 8, out);
  }
}

void require_rows(const std::int32_t* num_rows, std::int32_t max_rows) {
  GD_REQUIRE(num_rows != nullptr, "num_rows", "nullptr", "the live-row count is read on device");
  GD_REQUIRE(max_rows > 0, "max_rows", max_rows, "must be > 0");
}

}  // namespace

void head_rmsnorm(const HeadNormArgs& args, cudaStream_t stream) {
  HeadNormArgs a = args;
  if (a.row_stride == 0) a.row_stride = a.num_heads * a.head_dim;
  require_rows(a.num_rows, a.max_rows);
  GD_REQUIRE(a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256, "head_dim", a.head_dim,
             "the head norm supports head dims 64, 128 and 256");
  GD_REQUIRE(a.num_heads > 0, "num_heads", a.num_heads, "must be > 0");
  GD_REQUIRE(a.row_stride >= a.num_heads * a.head_dim, "row_stride", a.row_stride,
             "must hold num_heads * head_dim elements");
  GD_REQUIRE(a.x != nullptr, "x", "nullptr", "must be non-null");
  GD_REQUIRE(a.weight != nullptr, "weight", "nullptr", "must be non-null");
  GD_REQUIRE(a.eps > 0.f, "eps", a.eps, "must be > 0");
  const unsigned head_blocks = static_cast<unsigned>((a.num_heads + kHeadWarps - 1) / kHeadWarps);
  GD_REQUIRE(head_blocks <= 65535u, "num_heads", a.num_heads, "too many heads for one launch");
  const dim3 grid(static_cast<unsigned>(a.max_rows), head_blocks);
  head_rmsnorm_kernel<<<grid, kHeadWarps * 32, 0, stream>>>(a);
  GD_CHECK_LAUNCH();
}

void gated_residual_rmsnorm(const GatedResidualNormArgs& a, cudaStream_t stream) {
  require_rows(a.num_rows, a.max_rows);
  GD_REQUIRE(a.hidden > 0 && a.hidden % 8 == 0 && a.hidden <= kNormThreads * kNormMaxVecs * 8,
             "hidden", a.hidden, "the gated norm needs a multiple of 8, at most 8192");
  GD_REQUIRE(a.x != nullptr && aligned16(a.x), "x", a.x, "must be non-null and 16-byte aligned");
  GD_REQUIRE(
      a.residual != nullptr && aligned16(a.residual) && a.residual != a.x && a.residual != a.y,
      "residual", a.residual, "must be 16-byte aligned and alias neither x nor y");
  GD_REQUIRE(a.gate != nullptr, "gate", "nullptr", "the cross layer's gate parameter");
  GD_REQUIRE(a.token_request != nullptr, "token_request", "nullptr", "prep metadata");
  GD_REQUIRE(a.encoder_len != nullptr, "encoder_len", "nullptr", "prep metadata");
  GD_REQUIRE(
      (a.first_position == nullptr) == (a.token_slot == nullptr || a.token_position == nullptr),
      "first_position", a.first_position == nullptr ? "nullptr" : "given",
      "comes with token_slot and token_position");
  GD_REQUIRE(a.y == nullptr || aligned16(a.y), "y", a.y, "must be 16-byte aligned");
  GD_REQUIRE(a.y == nullptr || (a.weight != nullptr && aligned16(a.weight)), "weight", a.weight,
             "the norm's weight (16-byte aligned) comes with y");
  GD_REQUIRE(a.y == nullptr || a.eps > 0.f, "eps", a.eps, "must be > 0");
  gated_residual_rmsnorm_kernel<<<a.max_rows, kNormThreads, 0, stream>>>(a);
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
