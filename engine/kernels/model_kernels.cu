// RMSNorm (+ residual add), SwiGLU, embedding gather and bias add. See model_kernels.h.
#include <cuda_bf16.h>

#include <cstdint>

#include "common/align.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "common/pdl.cuh"
#include "engine/kernels/bf16_vec.cuh"
#include "engine/kernels/model_kernels.h"

namespace graphdecode {
namespace {

using detail::load8;
using detail::round_bf16;
using detail::store8;
using detail::swiglu_value;
using detail::Vec8;

constexpr int kThreads = 256;
constexpr int kNormMaxVecs = 4;  // 256 threads x 4 vectors x 8 = hidden 8192
constexpr int kMaxGridY = 65535;

void require_rows(const std::int32_t* num_rows, std::int32_t max_rows, bool grid_y) {
  GD_REQUIRE(num_rows != nullptr, "num_rows", "nullptr", "the live-row count is read on device");
  GD_REQUIRE(max_rows > 0, "max_rows", max_rows, "must be > 0");
  if (grid_y)
    GD_REQUIRE(max_rows <= kMaxGridY, "max_rows", max_rows, "at most 65535 rows per launch");
}

// ---- RMSNorm: one block per row, the row cached in registers ------------------------------------
// rmsnorm and swiglu are launched as programmatic dependents (common/pdl.cuh): they wait for the
// kernel before them, then let the next one (a GEMM that streams its weights before its own wait)
// be scheduled at once. The norm's weight depends on no kernel of a step (as a GEMM's W), so its
// load is issued before the wait, and every load of the row before the first store: after the
// wait a block makes one round trip to memory, not one per vector and another for the weight
// (the stores may alias the loads, so the compiler would not reorder them itself). The 8B step's
// norms (hidden 4096, two vectors a thread) took ~3.9 us each against ~2.1 for the 1B's (H200,
// probe_decode_timeline, 2026-11-28).
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(const __grid_constant__ RmsNormArgs a) {
  const int nvec = a.hidden / 8;
  Vec8 w[kNormMaxVecs];
#pragma unroll
  for (int k = 0; k < kNormMaxVecs; ++k) {
    const int vi = threadIdx.x + k * kThreads;
    if (vi < nvec) w[k] = load8(a.weight + vi * 8);
  }
  pdl_wait_for_prior_grid();
  pdl_launch_dependents();
  const int row = blockIdx.x;
  if (row >= *a.num_rows) return;
  __shared__ float scratch[32];
  const std::size_t base = static_cast<std::size_t>(row) * a.hidden;
  Vec8 v[kNormMaxVecs], r[kNormMaxVecs];
#pragma unroll
  for (int k = 0; k < kNormMaxVecs; ++k) {
    const int vi = threadIdx.x + k * kThreads;
    if (vi >= nvec) continue;
    v[k] = load8(a.x + base + vi * 8);
    if (a.residual != nullptr) r[k] = load8(a.residual + base + vi * 8);
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kNormMaxVecs; ++k) {
    const int vi = threadIdx.x + k * kThreads;
    if (vi >= nvec) continue;
    if (a.residual != nullptr) {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[k].v[e] = round_bf16(r[k].v[e] + v[k].v[e]);
      store8(a.residual + base + vi * 8, v[k]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v[k].v[e] * v[k].v[e];
  }
  ss = detail::block_sum(ss, scratch);
  const float inv_rms = rsqrtf(ss / static_cast<float>(a.hidden) + a.eps);
#pragma unroll
  for (int k = 0; k < kNormMaxVecs; ++k) {
    const int vi = threadIdx.x + k * kThreads;
    if (vi >= nvec) continue;
    Vec8 out;
#pragma unroll
    for (int e = 0; e < 8; ++e) out.v[e] = w[k].v[e] * round_bf16(v[k].v[e] * inv_rms);
    store8(a.y + base + vi * 8, out);
  }
}

// ---- SwiGLU: grid (column blocks, rows) ---------------------------------------------------------
__global__ void __launch_bounds__(kThreads) swiglu_kernel(const __grid_constant__ SwiGluArgs a) {
  pdl_wait_for_prior_grid();
  pdl_launch_dependents();
  const int row = blockIdx.y;
  if (row >= *a.num_rows) return;
  const int vi = blockIdx.x * kThreads + threadIdx.x;
  if (vi * 8 >= a.inter) return;
  const std::uint16_t* in = a.gate_up + static_cast<std::size_t>(row) * 2 * a.inter;
  const Vec8 g = load8(in + vi * 8);
  const Vec8 u = load8(in + a.inter + vi * 8);
  Vec8 out;
#pragma unroll
  for (int e = 0; e < 8; ++e) out.v[e] = swiglu_value(g.v[e], u.v[e]);
  store8(a.out + static_cast<std::size_t>(row) * a.inter + vi * 8, out);
}

// ---- embedding gather: grid (column blocks, rows) -----------------------------------------------
__global__ void __launch_bounds__(kThreads)
    embedding_kernel(const __grid_constant__ EmbeddingArgs a) {
  const int row = blockIdx.y;
  if (row >= *a.num_rows) return;
  const int vi = blockIdx.x * kThreads + threadIdx.x;
  const std::int32_t token = a.token_ids[row];
  const bool bad = token < 0 || token >= a.vocab;
  if (bad && blockIdx.x == 0 && threadIdx.x == 0) atomicOr(a.error_flag, kEmbeddingBadTokenBit);
  if (vi * 8 >= a.hidden) return;
  std::uint16_t* dst = a.out + static_cast<std::size_t>(row) * a.hidden + vi * 8;
  if (bad) {
    detail::store8_zero(dst);
    return;
  }
  const std::uint16_t* src = a.table + static_cast<std::size_t>(token) * a.hidden + vi * 8;
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
}

// ---- bias add: grid (column blocks, rows) -------------------------------------------------------
__global__ void __launch_bounds__(kThreads) add_bias_kernel(const __grid_constant__ AddBiasArgs a) {
  const int row = blockIdx.y;
  if (row >= *a.num_rows) return;
  const int vi = blockIdx.x * kThreads + threadIdx.x;
  if (vi * 8 >= a.cols) return;
  std::uint16_t* p = a.y + static_cast<std::size_t>(row) * a.row_stride + vi * 8;
  Vec8 y = load8(p);
  const Vec8 b = load8(a.bias + vi * 8);
#pragma unroll
  for (int e = 0; e < 8; ++e) y.v[e] += b.v[e];
  store8(p, y);
}

unsigned column_blocks(std::int32_t cols) {
  return static_cast<unsigned>((cols / 8 + kThreads - 1) / kThreads);
}

}  // namespace

void rmsnorm(const RmsNormArgs& a, cudaStream_t stream) {
  require_rows(a.num_rows, a.max_rows, false);
  GD_REQUIRE(a.hidden > 0 && a.hidden % 8 == 0 && a.hidden <= kThreads * kNormMaxVecs * 8, "hidden",
             a.hidden, "RMSNorm needs a multiple of 8, at most 8192");
  GD_REQUIRE(a.eps > 0.f, "eps", a.eps, "must be > 0");
  GD_REQUIRE(a.x != nullptr && aligned16(a.x), "x", a.x, "must be non-null and 16-byte aligned");
  GD_REQUIRE(a.y != nullptr && aligned16(a.y), "y", a.y, "must be non-null and 16-byte aligned");
  GD_REQUIRE(a.weight != nullptr && aligned16(a.weight), "weight", a.weight,
             "must be non-null and 16-byte aligned");
  GD_REQUIRE(
      a.residual == nullptr || (aligned16(a.residual) && a.residual != a.x && a.residual != a.y),
      "residual", a.residual, "must be 16-byte aligned and alias neither x nor y");
  launch_pdl(rmsnorm_kernel, dim3(static_cast<unsigned>(a.max_rows)), dim3(kThreads), 0, stream, a);
}

void swiglu(const SwiGluArgs& a, cudaStream_t stream) {
  require_rows(a.num_rows, a.max_rows, true);
  GD_REQUIRE(a.inter > 0 && a.inter % 8 == 0, "inter", a.inter, "must be a positive multiple of 8");
  GD_REQUIRE(a.gate_up != nullptr && aligned16(a.gate_up), "gate_up", a.gate_up,
             "must be non-null and 16-byte aligned");
  GD_REQUIRE(a.out != nullptr && aligned16(a.out), "out", a.out,
             "must be non-null and 16-byte aligned");
  const dim3 grid(column_blocks(a.inter), static_cast<unsigned>(a.max_rows));
  launch_pdl(swiglu_kernel, grid, dim3(kThreads), 0, stream, a);
}

void embedding(const EmbeddingArgs& a, cudaStream_t stream) {
  require_rows(a.num_rows, a.max_rows, true);
  GD_REQUIRE(a.vocab > 0, "vocab", a.vocab, "must be > 0");
  GD_REQUIRE(a.hidden > 0 && a.hidden % 8 == 0, "hidden", a.hidden,
             "must be a positive multiple of 8");
  GD_REQUIRE(a.table != nullptr && aligned16(a.table), "table", a.table,
             "must be non-null and 16-byte aligned");
  GD_REQUIRE(a.out != nullptr && aligned16(a.out), "out", a.out,
             "must be non-null and 16-byte aligned");
  GD_REQUIRE(a.token_ids != nullptr, "token_ids", "nullptr", "must be non-null");
  GD_REQUIRE(a.error_flag != nullptr, "error_flag", "nullptr",
             "bad token ids are reported through it");
  const dim3 grid(column_blocks(a.hidden), static_cast<unsigned>(a.max_rows));
  embedding_kernel<<<grid, kThreads, 0, stream>>>(a);
  GD_CHECK_LAUNCH();
}

void add_bias(const AddBiasArgs& args, cudaStream_t stream) {
  AddBiasArgs a = args;
  if (a.row_stride == 0) a.row_stride = a.cols;
  require_rows(a.num_rows, a.max_rows, true);
  GD_REQUIRE(a.cols > 0 && a.cols % 8 == 0, "cols", a.cols, "must be a positive multiple of 8");
  GD_REQUIRE(a.row_stride >= a.cols && a.row_stride % 8 == 0, "row_stride", a.row_stride,
             "must be a multiple of 8 and >= cols");
  GD_REQUIRE(a.y != nullptr && aligned16(a.y), "y", a.y, "must be non-null and 16-byte aligned");
  GD_REQUIRE(a.bias != nullptr && aligned16(a.bias), "bias", a.bias,
             "must be non-null and 16-byte aligned");
  const dim3 grid(column_blocks(a.cols), static_cast<unsigned>(a.max_rows));
  add_bias_kernel<<<grid, kThreads, 0, stream>>>(a);
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
