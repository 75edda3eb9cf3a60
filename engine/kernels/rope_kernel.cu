// RoPE in place on q and k (Hugging Face rotate_half convention). See model_kernels.h.
#include <cuda_bf16.h>

#include <cstdint>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/kernels/model_kernels.h"

namespace graphdecode {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxHalf = 128;  // head_dim 256

// One block per row. cos/sin of the row's position are computed once into shared memory
// (accurate sincosf: positions reach 1e5+ radians), then each thread rotates two adjacent pairs
// (i, i + h) and (i + 1, i + 1 + h) of one head per item with 4-byte loads.
__global__ void __launch_bounds__(kThreads) rope_kernel(const __grid_constant__ RopeArgs a) {
  const int row = blockIdx.x;
  if (row >= *a.num_rows) return;
  __shared__ float s_cos[kMaxHalf], s_sin[kMaxHalf];
  const int half = a.head_dim / 2;
  const float pos = static_cast<float>(a.positions[row]);
  for (int i = threadIdx.x; i < half; i += kThreads) {
    const float angle = a.inv_freq[i] * pos;  // fp32 product, as in Hugging Face
    sincosf(angle, &s_sin[i], &s_cos[i]);
  }
  __syncthreads();

  const int per_head = half / 2;
  const int items = (a.num_q_heads + a.num_kv_heads) * per_head;
  for (int item = threadIdx.x; item < items; item += kThreads) {
    const int head = item / per_head;
    const int i = 2 * (item - head * per_head);
    std::uint16_t* x = head < a.num_q_heads
                           ? a.q + static_cast<std::size_t>(row) * a.q_row_stride +
                                 static_cast<std::size_t>(head) * a.head_dim
                           : a.k + static_cast<std::size_t>(row) * a.k_row_stride +
                                 static_cast<std::size_t>(head - a.num_q_heads) * a.head_dim;
    __nv_bfloat162* lo = reinterpret_cast<__nv_bfloat162*>(x + i);
    __nv_bfloat162* hi = reinterpret_cast<__nv_bfloat162*>(x + half + i);
    const float2 l = __bfloat1622float2(*lo);
    const float2 h = __bfloat1622float2(*hi);
    const float c0 = s_cos[i], c1 = s_cos[i + 1], s0 = s_sin[i], s1 = s_sin[i + 1];
    *lo = __floats2bfloat162_rn(l.x * c0 - h.x * s0, l.y * c1 - h.y * s1);
    *hi = __floats2bfloat162_rn(h.x * c0 + l.x * s0, h.y * c1 + l.y * s1);
  }
}

bool aligned4(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 4 == 0;
}

}  // namespace

void rope(const RopeArgs& args, cudaStream_t stream) {
  RopeArgs a = args;
  GD_REQUIRE(a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256, "head_dim", a.head_dim,
             "RoPE supports head dims 64, 128 and 256");
  GD_REQUIRE(a.num_rows != nullptr, "num_rows", "nullptr", "the live-row count is read on device");
  GD_REQUIRE(a.max_rows > 0, "max_rows", a.max_rows, "must be > 0");
  GD_REQUIRE(a.num_q_heads > 0, "num_q_heads", a.num_q_heads, "must be > 0");
  GD_REQUIRE(a.num_kv_heads >= 0, "num_kv_heads", a.num_kv_heads, "must be >= 0");
  if (a.q_row_stride == 0) a.q_row_stride = a.num_q_heads * a.head_dim;
  if (a.k_row_stride == 0) a.k_row_stride = a.num_kv_heads * a.head_dim;
  GD_REQUIRE(a.q_row_stride >= a.num_q_heads * a.head_dim && a.q_row_stride % 2 == 0,
             "q_row_stride", a.q_row_stride, "must be even and hold num_q_heads * head_dim");
  GD_REQUIRE(a.k_row_stride >= a.num_kv_heads * a.head_dim && a.k_row_stride % 2 == 0,
             "k_row_stride", a.k_row_stride, "must be even and hold num_kv_heads * head_dim");
  GD_REQUIRE(a.q != nullptr && aligned4(a.q), "q", a.q, "must be non-null and 4-byte aligned");
  GD_REQUIRE(a.num_kv_heads == 0 || (a.k != nullptr && aligned4(a.k)), "k", a.k,
             "must be non-null and 4-byte aligned");
  GD_REQUIRE(a.positions != nullptr, "positions", "nullptr", "must be non-null");
  GD_REQUIRE(a.inv_freq != nullptr, "inv_freq", "nullptr", "must be non-null (RopeTable::data)");
  rope_kernel<<<a.max_rows, kThreads, 0, stream>>>(a);
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
