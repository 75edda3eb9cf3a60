#include "engine/gemm.h"

#include <library_types.h>

#include <cstdlib>
#include <cstring>

#include "engine/kernels/plain_gemm.h"
#include "engine/kernels/stream_gemv.h"

namespace graphdecode {

Gemm::Gemm(std::size_t workspace_bytes) : workspace_(workspace_bytes) {
  // Start-up only: a defined workspace (cuBLASLt's split-K reduce reads parts of it that
  // compute-sanitizer's initcheck otherwise reports as uninitialized).
  workspace_.fill_bytes(0, nullptr);
  GD_CUDA(cudaStreamSynchronize(nullptr));
  GD_CUBLAS(cublasCreate(&handle_));
  // Tensor-core math with fp32 accumulation; no atomics, so a GEMM's result is reproducible.
  const cublasStatus_t st = cublasSetAtomicsMode(handle_, CUBLAS_ATOMICS_NOT_ALLOWED);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(handle_);
    handle_ = nullptr;
    GD_CUBLAS(st);
  }
  const char* plain = std::getenv("GRAPHDECODE_PLAIN_GEMM");
  plain_ = plain != nullptr && std::strcmp(plain, "1") == 0;
  const char* gemv = std::getenv("GRAPHDECODE_GEMV");
  stream_ = gemv != nullptr && std::strcmp(gemv, "stream") == 0;
  if (const char* mode = std::getenv("GRAPHDECODE_SKINNY")) {
    if (std::strcmp(mode, "always") == 0) skinny_mode_ = SkinnyMode::kAlways;
    if (std::strcmp(mode, "off") == 0) skinny_mode_ = SkinnyMode::kOff;
  }
  try {
    skinny_dev_ = SkinnyGemmDevice::current();
  } catch (...) {
    cublasDestroy(handle_);
    handle_ = nullptr;
    throw;
  }
}

bool Gemm::uses_skinny(const GemmArgs& a) const noexcept {
  const auto aligned16 = [](const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
  };
  if (skinny_mode_ == SkinnyMode::kOff) return false;
  if (skinny_mode_ == SkinnyMode::kAuto && (a.in < 8192 || a.rows > 4)) return false;
  return a.in > 0 && a.out > 0 && skinny_gemm_supported(skinny_dev_, a.rows, a.in) &&
         aligned16(a.x) && aligned16(a.w);
}

Gemm::~Gemm() {
  if (handle_ != nullptr) static_cast<void>(cublasDestroy(handle_));
}

void Gemm::run(const GemmArgs& a, cudaStream_t stream) const {
  GD_REQUIRE(a.rows >= 0, "rows", a.rows, "must not be negative");
  GD_REQUIRE(a.in > 0, "in", a.in, "must be positive");
  GD_REQUIRE(a.out > 0, "out", a.out, "must be positive");
  GD_REQUIRE(a.x != nullptr && a.w != nullptr && a.y != nullptr, "x/w/y", "nullptr",
             "GEMM operands must be set");
  if (a.rows == 0) return;
  if (plain_) {
    plain_gemm({a.x, a.w, a.y, a.rows, a.in, a.out, a.out_type == GemmOut::kF32}, stream);
    return;
  }
  if (stream_ && a.rows <= kSkinnyMaxRows && a.in % 8 == 0 &&
      stream_gemv_supported(skinny_dev_, a.rows, a.in) &&
      reinterpret_cast<std::uintptr_t>(a.x) % 16 == 0 &&
      reinterpret_cast<std::uintptr_t>(a.w) % 16 == 0) {
    stream_gemv(skinny_dev_, {a.x, a.w, a.y, a.rows, a.in, a.out, a.out_type == GemmOut::kF32},
                stream);
    return;
  }
  if (uses_skinny(a)) {
    skinny_gemm(skinny_dev_, {a.x, a.w, a.y, a.rows, a.in, a.out, a.out_type == GemmOut::kF32},
                stream);
    return;
  }
  GD_CUBLAS(cublasSetStream(handle_, stream));
  GD_CUBLAS(cublasSetWorkspace(handle_, workspace_.data(), workspace_.bytes()));
  const float alpha = 1.f;
  const float beta = 0.f;
  // Column-major view: y^T [out][rows] = W [out][in] (stored as col-major [in][out], so op T)
  // times x^T [in][rows] (row-major x is col-major [in][rows], op N).
  const cudaDataType_t ctype = a.out_type == GemmOut::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  GD_CUBLAS(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, a.out, a.rows, a.in, &alpha, a.w,
                         CUDA_R_16BF, a.in, a.x, CUDA_R_16BF, a.in, &beta, a.y, ctype, a.out,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace graphdecode
