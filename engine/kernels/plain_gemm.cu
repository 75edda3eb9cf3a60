#include <cuda_bf16.h>

#include "common/cuda_check.h"
#include "engine/kernels/plain_gemm.h"

namespace graphdecode {
namespace {

constexpr int kWarps = 8;  // outputs per CTA along n

__global__ void __launch_bounds__(kWarps * 32) plain_gemm_kernel(const SkinnyGemmArgs a) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const std::int64_t row = blockIdx.y;
  if (col >= a.n) return;
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(a.x) + row * a.k;
  const auto* w = reinterpret_cast<const __nv_bfloat16*>(a.w) + col * a.k;
  float acc = 0.f;
  for (std::int32_t i = lane; i < a.k; i += 32)
    acc += __bfloat162float(x[i]) * __bfloat162float(w[i]);
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane != 0) return;
  if (a.out_f32) {
    static_cast<float*>(a.y)[row * a.n + col] = acc;
  } else {
    static_cast<__nv_bfloat16*>(a.y)[row * a.n + col] = __float2bfloat16_rn(acc);
  }
}

}  // namespace

void plain_gemm(const SkinnyGemmArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  const dim3 grid(static_cast<unsigned>((a.n + kWarps - 1) / kWarps),
                  static_cast<unsigned>(a.rows));
  plain_gemm_kernel<<<grid, kWarps * 32, 0, stream>>>(a);
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
