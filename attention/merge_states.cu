// merge_attention_states: combine two partial attention states over disjoint key sets.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "attention/mma_utils.cuh"
#include "attention/paged_attention.h"
#include "common/cuda_check.h"
#include "common/error.h"

namespace graphdecode {
namespace {

constexpr int kWarps = 4;

// One warp per (row, head); lanes stride over head_dim.
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    merge_states_kernel(const __grid_constant__ MergeStatesArgs a) {
  const long long item = static_cast<long long>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int rows = min(*a.num_rows, a.max_rows);
  if (item >= static_cast<long long>(rows) * a.num_heads) return;
  const float la = a.lse_a[item], lb = a.lse_b[item];
  const float m = fmaxf(la, lb);
  const float wa = la == -INFINITY ? 0.f : expf(la - m);
  const float wb = lb == -INFINITY ? 0.f : expf(lb - m);
  const float sum = wa + wb;
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  const T* oa = static_cast<const T*>(a.o_a) + item * a.head_dim;
  const T* ob = static_cast<const T*>(a.o_b) + item * a.head_dim;
  T* out = static_cast<T*>(a.out) + item * a.head_dim;
  for (int d = lane; d < a.head_dim; d += 32) {
    const float v = (wa * static_cast<float>(oa[d]) + wb * static_cast<float>(ob[d])) * inv;
    out[d] = attn::MmaType<T>::from_float(v);
  }
  if (lane == 0 && a.lse_out != nullptr) a.lse_out[item] = sum > 0.f ? m + logf(sum) : -INFINITY;
}

}  // namespace

void merge_attention_states(const MergeStatesArgs& a, cudaStream_t stream) {
  GD_REQUIRE(a.o_a && a.o_b && a.lse_a && a.lse_b && a.out && a.num_rows, "args", "null",
             "merge_attention_states needs both states, the output and num_rows");
  GD_REQUIRE(a.max_rows > 0, "max_rows", a.max_rows, "must be positive");
  GD_REQUIRE(a.num_heads > 0, "num_heads", a.num_heads, "must be positive");
  GD_REQUIRE(a.head_dim > 0 && a.head_dim <= 1024, "head_dim", a.head_dim, "out of range");
  const long long items = static_cast<long long>(a.max_rows) * a.num_heads;
  const int grid = static_cast<int>((items + kWarps - 1) / kWarps);
  if (a.dtype == DType::kBF16) {
    merge_states_kernel<__nv_bfloat16><<<grid, kWarps * 32, 0, stream>>>(a);
  } else {
    GD_REQUIRE(a.dtype == DType::kFP16, "dtype", static_cast<int>(a.dtype), "unsupported dtype");
    merge_states_kernel<__half><<<grid, kWarps * 32, 0, stream>>>(a);
  }
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
