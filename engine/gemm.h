// bf16 GEMM of the model's linear layers through cuBLAS, capture-safe:
//   y[rows][out] = x[rows][in] * W^T,   W [out][in] row-major (Hugging Face nn.Linear layout),
// bf16 inputs, fp32 accumulation, bf16 or float output. The handle owns one preset workspace
// (allocated once, bound with cublasSetWorkspace), so no GEMM allocates and every GEMM can be
// captured in a CUDA graph. `rows` is fixed per launch (a graph bucket's token capacity): rows
// past the live tokens compute values nobody reads, which is harmless because rows are
// independent.
//
// Two kernels of ours for rows <= 8 stream W once: the stream GEMV (engine/kernels/stream_gemv.h),
// which runs by default where bench_gemm measured it ahead (GemvMode::kAuto below), and the skinny
// kernel (engine/kernels/skinny_gemm.h), which runs only when asked for (it is behind cuBLAS at
// every shape measured on the H200). Both need in % 8 == 0, x [rows][in] in shared memory and
// 16-byte aligned x/W; otherwise cuBLAS runs.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/buffers.h"
#include "common/error.h"
#include "engine/kernels/skinny_gemm.h"
#include "engine/kernels/stream_gemv.h"
#include "engine/kernels/stream_mlp.h"
#include "engine/kernels/wgmma_gemm.h"

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

namespace graphdecode {

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

  // When the skinny kernel runs instead of cuBLAS (decide before capturing a graph):
  //   kAuto (default): never (cuBLAS or the stream GEMV; gemm.cpp has the H200 figures).
  //   kAlways: every supported call (tests, benchmarks).  kOff: cuBLAS only.
  // GRAPHDECODE_SKINNY=always|off in the environment when the Gemm is made sets the mode (A/B of
  // the model step in bench_decode); anything else keeps kAuto.
  enum class SkinnyMode : std::uint8_t { kOff, kAuto, kAlways };
  void set_skinny_mode(SkinnyMode m) noexcept { skinny_mode_ = m; }
  void set_skinny(bool on) noexcept { skinny_mode_ = on ? SkinnyMode::kAlways : SkinnyMode::kOff; }
  SkinnyMode skinny_mode() const noexcept { return skinny_mode_; }
  // True when run(args) takes the skinny kernel rather than cuBLAS (and not the stream GEMV).
  bool uses_skinny(const GemmArgs& args) const noexcept;

  // When the stream GEMV (engine/kernels/stream_gemv.h) runs, before the skinny kernel or cuBLAS:
  //   kAuto (default): rows <= kStreamGemvMaxRowsAuto and out <= kStreamGemvMaxOutAuto, and for
  //                    a long k (in > kStreamGemvLongInAuto) rows <= kStreamGemvLongMaxRowsAuto,
  //                    with the skinny mode at kAuto (where it was measured ahead: gemm.cpp); the
  //                    bounds are GRAPHDECODE_GEMV_AUTO="max_rows,max_out[,long_max_rows]" for
  //                    sweeps (long_max_rows left out: min(max_rows, 2); checked: an Error names
  //                    it);
  //   kAlways: every call it takes (GRAPHDECODE_GEMV=stream);  kOff: never (GRAPHDECODE_GEMV=off).
  enum class GemvMode : std::uint8_t { kOff, kAuto, kAlways };
  static constexpr std::int32_t kStreamGemvMaxRowsAuto = 8;
  static constexpr std::int32_t kStreamGemvMaxOutAuto = 6144;
  static constexpr std::int32_t kStreamGemvLongInAuto = 8192;  // the 1B down's k; the 8B's 14336
  static constexpr std::int32_t kStreamGemvLongMaxRowsAuto = 2;
  void set_gemv_mode(GemvMode m) noexcept { gemv_mode_ = m; }
  GemvMode gemv_mode() const noexcept { return gemv_mode_; }
  bool uses_stream_gemv(const GemmArgs& args) const noexcept;

  // When the warpgroup GEMM (engine/kernels/wgmma_gemm.h) runs instead of cuBLAS: rows 9 to
  // kWgmmaMaxRowsAuto, k up to kWgmmaMaxInAuto, on a Hopper GPU with sm_90a code, shapes it takes
  // (k % 64 == 0, out % 8 == 0, 16-byte aligned operands). GRAPHDECODE_WGMMA_GEMM=off when the Gemm
  // is made keeps cuBLAS (A/B of the model step); set_wgmma(false) likewise; =on also overrides a
  // model's own rule (wgmma_routing_from_env()).
  // GRAPHDECODE_WGMMA_AUTO="min_rows,max_rows,max_out[,max_in[,min_out]]" replaces the bounds,
  // a model's rule included (sweeps; the stream GEMV keeps the shapes it takes). 64: alone it
  // trails cuBLAS on most 1B shapes (bench_gemm, 64 rows: down 15.4 vs 13.5 us, gate_up 20.5
  // vs 19.1; lm_head 147 vs 153), but its weights stream before its PDL wait, and the 1B step
  // is 4.9% faster at B = 32 and 64; at 128 rows (two row blocks) the step is 3.2% slower
  // (bench/NOTES.md 103, t98). LlamaModel raises the fewest rows to 33 past hidden 2048 (the 8B
  // step, NOTES 104), to 32 for its gate_up and lm_head (NOTES 132).
  static constexpr std::int32_t kWgmmaMaxRowsAuto = 64;
  // The longest k it takes by default (the 1B down's 8192). The 8B down (k 14336) at 64 rows is
  // faster on cuBLAS: 41.0 vs 35.4 us alone (bench_gemm, t100), and the 8B step at B = 64 gains
  // 0.9% / 0.7% at L = 1024 / 4096 on one host (two rounds, t186), 0.1% on another (t187;
  // bench/NOTES.md 131). k between 8192 and 14336 was not measured and follows the 8B's.
  static constexpr std::int32_t kWgmmaMaxInAuto = 8192;
  // An output bound that no GEMM reaches: "no bound".
  static constexpr std::int32_t kNoOutBound = 1 << 30;
  void set_wgmma(bool on) noexcept { wgmma_ = on; }
  // Raises the fewest rows it takes (a model's measured rule; not below 9, where the stream GEMV
  // and cuBLAS run); outputs of wide_out or more from wide_rows instead (left out: the same rows).
  void set_wgmma_min_rows(std::int32_t rows, std::int32_t wide_rows = 0,
                          std::int32_t wide_out = kNoOutBound) noexcept {
    wgmma_min_rows_ = std::max(rows, kSkinnyMaxRows + 1);
    wgmma_wide_min_rows_ =
        wide_rows > 0 ? std::max(wide_rows, kSkinnyMaxRows + 1) : wgmma_min_rows_;
    wgmma_wide_min_out_ = wide_out;
  }
  // GRAPHDECODE_WGMMA_GEMM=on or GRAPHDECODE_WGMMA_AUTO: the environment routes, a model's
  // set_wgmma_min_rows is left out (a sweep's bounds are the ones it set).
  bool wgmma_routing_from_env() const noexcept { return wgmma_env_routing_; }
  bool uses_wgmma(const GemmArgs& args) const noexcept;

  // An MLP's gate_up projection with the SwiGLU folded into the warpgroup GEMM's epilogue
  // (WgmmaEpilogue::kSwiGlu): args.w = [gate; up] (args.out = 2 x inter), args.y = act
  // [rows][inter] bf16; the bits of run() into gate_up followed by the swiglu kernel.
  // fuses_swiglu(args): run(args) would take the warpgroup GEMM, bf16 out, inter % 64 == 0;
  // run_swiglu throws otherwise.
  bool fuses_swiglu(const GemmArgs& args) const noexcept;
  void run_swiglu(const GemmArgs& args, cudaStream_t stream) const;

  // The stream GEMV's norm fusions (StreamGemvFusion, engine/kernels/stream_gemv.h): a decode
  // layer's input RMSNorm folded into the down projection before it and the qkv projection after
  // it. fuses_norm(args): run(args) takes the stream GEMV (not the plain GEMM of racecheck runs)
  // with a bf16 output, so run_fused may be used; run_fused throws otherwise.
  bool fuses_norm(const GemmArgs& args) const noexcept;
  void run_fused(const GemmArgs& args, const StreamGemvFusion& fusion, cudaStream_t stream) const;
  // The warpgroup GEMM's norm fusions (WgmmaNormFusion, engine/kernels/wgmma_gemm.h): a decode
  // layer's two RMSNorms folded into the GEMMs around them at 9-64 rows. fuses_wgmma_norm(args):
  // run(args) takes the warpgroup GEMM with a bf16 output, rows <= 64, in and out multiples of
  // 128. run_wgmma_fused throws otherwise; with `swiglu` (the row scale on gate_up) it also needs
  // fuses_swiglu(args).
  bool fuses_wgmma_norm(const GemmArgs& args) const noexcept;
  void run_wgmma_fused(const GemmArgs& args, const WgmmaNormFusion& fusion, bool swiglu,
                       cudaStream_t stream) const;
  // A decode layer's MLP block in one grid (engine/kernels/stream_mlp.h): the post-attention norm,
  // gate_up, SwiGLU and down with its residual epilogue. fuses_mlp: the stream GEMV is on (not
  // the plain GEMM of racecheck runs, not GRAPHDECODE_GEMV=off) and the kernel takes the shape;
  // run_mlp throws otherwise.
  bool fuses_mlp(std::int32_t rows, std::int32_t hidden, std::int32_t inter) const noexcept;
  void run_mlp(const StreamMlpArgs& args, cudaStream_t stream) const;
  // CTAs of the stream GEMV over `out` outputs: the parts of the squares its epilogue leaves.
  std::int32_t stream_gemv_parts(std::int32_t out) const {
    return stream_gemv_grid(skinny_dev_, out);
  }
  // GRAPHDECODE_PLAIN_GEMM=1 in the environment when the Gemm was made: every GEMM runs the plain
  // kernel of engine/kernels/plain_gemm.h instead of cuBLAS or the skinny kernel (racecheck runs;
  // the reason is in that header).
  bool plain() const noexcept { return plain_; }

 private:
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer<std::uint8_t> workspace_;
  SkinnyGemmDevice skinny_dev_;
  SkinnyMode skinny_mode_ = SkinnyMode::kAuto;
  bool plain_ = false;
  bool wgmma_ = true;
  bool wgmma_env_routing_ = false;                    // wgmma_routing_from_env()
  std::int32_t wgmma_min_rows_ = kSkinnyMaxRows + 1;  // uses_wgmma's bounds (above)
  std::int32_t wgmma_max_rows_ = kWgmmaMaxRowsAuto;
  std::int32_t wgmma_max_out_ = kNoOutBound;
  std::int32_t wgmma_max_in_ = kWgmmaMaxInAuto;
  std::int32_t wgmma_min_out_ = 1;
  std::int32_t wgmma_wide_min_rows_ = kSkinnyMaxRows + 1;  // set_wgmma_min_rows's wide outputs
  std::int32_t wgmma_wide_min_out_ = kNoOutBound;
  GemvMode gemv_mode_ = GemvMode::kAuto;
  std::int32_t auto_max_rows_ = kStreamGemvMaxRowsAuto;  // kAuto's bounds (above)
  std::int32_t auto_max_out_ = kStreamGemvMaxOutAuto;
  std::int32_t auto_long_max_rows_ = kStreamGemvLongMaxRowsAuto;
};

}  // namespace graphdecode
