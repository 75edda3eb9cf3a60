// bf16 GEMM of the model's linear layers through cuBLAS, capture-safe:
//   y[rows][out] = x[rows][in] * W^T,   W [out][in] row-major (Hugging Face nn.Linear layout),
// bf16 inputs, fp32 accumulation, bf16 or float output. The handle owns one preset workspace
// (allocated once, bound with cublasSetWorkspace), so no GEMM allocates and every GEMM can be
// captured in a CUDA graph. `rows` is fixed per launch (a graph bucket's token capacity): rows
// past the live tokens compute values nobody reads, which is harmless because rows are
// independent.
//
// rows <= 8 (decode) goes to the skinny kernel (engine/kernels/skinny_gemm.h), which streams W at
// close to the copy bandwidth where cuBLAS does not; it falls back to cuBLAS when in % 8 != 0,
// x [rows][in] does not fit in shared memory (rows * in above ~110K elements on an H100) or x/W
// are not 16-byte aligned. set_skinny(false) forces cuBLAS (tests and benchmarks compare both).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/buffers.h"
#include "common/error.h"
#include "engine/kernels/skinny_gemm.h"

namespace graphdecode::detail {
inline void throw_cublas(cublasStatus_t st, const char* expr, const char* file, int line) {
  throw Error(std::string("cuBLAS call failed: ") + expr + ": status " +
                  std::to_string(static_cast<int>(st)),
              location(file, line));
}
}  // namespace graphdecode::detail

#define GD_CUBLAS(expr)                                                       \
  do {                                                                        \
    cublasStatus_t gd_st_ = (expr);                                           \
    if (gd_st_ != CUBLAS_STATUS_SUCCESS)                                      \
      ::graphdecode::detail::throw_cublas(gd_st_, #expr, __FILE__, __LINE__); \
  } while (0)

namespace graphdecode::engine {

enum class GemmOut : std::uint8_t { kBF16 = 0, kF32 = 1 };

struct GemmArgs {
  const std::uint16_t* x = nullptr;  // [rows][in] bf16
  const std::uint16_t* w = nullptr;  // [out][in] bf16
  void* y = nullptr;                 // [rows][out] bf16 or float (out_type)
  std::int32_t rows = 0;
  std::int32_t in = 0;
  std::int32_t out = 0;
  GemmOut out_type = GemmOut::kBF16;
};

class Gemm {
 public:
  static constexpr std::size_t kDefaultWorkspace = std::size_t{32} << 20;  // 32 MiB (Hopper)

  explicit Gemm(std::size_t workspace_bytes = kDefaultWorkspace);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Validates `args` (Error names the field), binds `stream` and the workspace, runs one GEMM.
  // rows == 0 does nothing.
  void run(const GemmArgs& args, cudaStream_t stream) const;

  // The skinny path for rows <= 8 (on by default). Decide before capturing a graph.
  void set_skinny(bool on) noexcept { skinny_on_ = on; }
  bool skinny() const noexcept { return skinny_on_; }
  // True when run(args) takes the skinny kernel rather than cuBLAS.
  bool uses_skinny(const GemmArgs& args) const noexcept;

 private:
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer<std::uint8_t> workspace_;
  SkinnyGemmDevice skinny_dev_;
  bool skinny_on_ = true;
};

}  // namespace graphdecode::engine
