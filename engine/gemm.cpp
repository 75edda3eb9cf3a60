#include "engine/gemm.h"

#include <library_types.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/align.h"
#include "engine/kernels/plain_gemm.h"
#include "engine/kernels/stream_gemv.h"

namespace graphdecode {
namespace {

// The comma-separated integers of a sweep variable ("8,6144,2") into field[0..]: how many there
// were, or -1 when `text` is not 1 to max_fields of them and nothing else (fields past the count
// keep what the caller put there: their defaults).
int int_fields(const char* text, int* field, int max_fields) {
  int fields = 0, pos = 0;
  while (fields < max_fields) {
    int used = 0;
    if (std::sscanf(text + pos, fields == 0 ? "%d%n" : ",%d%n", &field[fields], &used) != 1)
      return -1;
    ++fields;
    pos += used;
    if (text[pos] != ',') break;
  }
  return text[pos] == '\0' ? fields : -1;
}

}  // namespace

Gemm::Gemm(std::size_t workspace_bytes) : workspace_(workspace_bytes) {
  if (const char* bounds = std::getenv("GRAPHDECODE_GEMV_AUTO")) {  // max_rows,max_out[,long]
    int field[3] = {};
    const int fields = int_fields(bounds, field, 3);
    const auto [rows, out, given_long_rows] = field;
    const int long_rows =
        fields == 3 ? given_long_rows : std::min(rows, kStreamGemvLongMaxRowsAuto);
    GD_REQUIRE(fields >= 2 && rows >= 1 && rows <= kSkinnyMaxRows && out >= 1 && long_rows >= 0 &&
                   long_rows <= rows,
               "GRAPHDECODE_GEMV_AUTO", bounds,
               "must be \"max_rows,max_out[,long_max_rows]\": max_rows 1-8, max_out positive, "
               "long_max_rows 0-max_rows");
    auto_max_rows_ = rows;
    auto_max_out_ = out;
    auto_long_max_rows_ = long_rows;
  }
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
  if (const char* gemv = std::getenv("GRAPHDECODE_GEMV")) {
    if (std::strcmp(gemv, "stream") == 0) gemv_mode_ = GemvMode::kAlways;
    if (std::strcmp(gemv, "off") == 0) gemv_mode_ = GemvMode::kOff;
  }
  if (const char* wg = std::getenv("GRAPHDECODE_WGMMA_GEMM")) {
    wgmma_ = std::strcmp(wg, "off") != 0;
    wgmma_env_routing_ = std::strcmp(wg, "on") == 0;
  }
  // "min_rows,max_rows,max_out[,max_in[,min_out]]" (sweeps): fields left out keep their default.
  if (const char* bounds = std::getenv("GRAPHDECODE_WGMMA_AUTO")) {
    int field[5] = {0, 0, 0, wgmma_max_in_, wgmma_min_out_};
    const int fields = int_fields(bounds, field, 5);
    const auto [lo, hi, out, in, min_out] = field;
    GD_REQUIRE(fields >= 3 && lo >= 1 && lo <= hi && hi <= kWgmmaGemmMaxRows && out >= 1 &&
                   in >= 1 && min_out >= 1 && min_out <= out,
               "GRAPHDECODE_WGMMA_AUTO", bounds,
               "must be \"min_rows,max_rows,max_out[,max_in[,min_out]]\": 1 <= min_rows <= "
               "max_rows <= 128, max_in positive, 1 <= min_out <= max_out");
    wgmma_min_rows_ = lo;
    wgmma_max_rows_ = hi;
    wgmma_max_out_ = out;
    wgmma_max_in_ = in;
    wgmma_min_out_ = min_out;
    wgmma_env_routing_ = true;
  }
  if (const char* mode = std::getenv("GRAPHDECODE_SKINNY")) {
    if (std::strcmp(mode, "always") == 0) skinny_mode_ = SkinnyMode::kAlways;
    if (std::strcmp(mode, "off") == 0) skinny_mode_ = SkinnyMode::kOff;
  }
  try {
    skinny_dev_ = SkinnyGemmDevice::current();
    static_cast<void>(wgmma_gemm_available());  // its one-time probe waits: at start-up, here
  } catch (...) {
    cublasDestroy(handle_);
    handle_ = nullptr;
    throw;
  }
}

bool Gemm::uses_skinny(const GemmArgs& a) const noexcept {
  // Only when asked for (kAlways), and not where the stream GEMV runs; kAuto takes no shape. On
  // the H100 it once beat cuBLAS on the 1B down projection (k 8192), which the stream GEMV now
  // takes; on the H200 it loses everywhere bench_gemm measured, the 8B down projection included
  // (k 14336, rows 1-4: 33.9-35.1 vs cuBLAS 31.0-31.3 us; the 8B decode step is 110-135 us faster
  // with cuBLAS there, bench/results/h200_gemm_rule_8b_2026-11-27.txt).
  if (skinny_mode_ != SkinnyMode::kAlways || uses_stream_gemv(a)) return false;
  return a.in > 0 && a.out > 0 && skinny_gemm_supported(skinny_dev_, a.rows, a.in) &&
         aligned16(a.x) && aligned16(a.w);
}

bool Gemm::uses_stream_gemv(const GemmArgs& a) const noexcept {
  if (gemv_mode_ == GemvMode::kOff) return false;
  // kAuto: an explicit skinny mode (tests, bench_gemm's columns) is what it says; otherwise only
  // the shapes where the stream GEMV was measured ahead on the H200: 1B qkv (n 3072, bench_gemm
  // at rows 1-4 5.85 vs cuBLAS 6.26 us), o (n 2048, 4.58 vs 5.83) and down (n 2048 k 8192, 12.13
  // vs 13.31; bench/results/h200_bench_gemm_8b_2026-11-27.txt). At rows 5-8 it loses alone in
  // bench_gemm but wins in the 1B decode step, where it overlaps the kernels around it (PDL):
  // B = 6 1161 -> 1116 us, B = 8 1181 -> 1149 (bench/results/h200_gemv_rows8_2026-11-28.txt).
  // The 8B qkv (n 6144) and o (n 4096) too: alone in bench_gemm it lost there, and on 2026-11-27
  // the 8B step was 110-150 us slower with it on o (h200_gemm_rule_8b_2026-11-27.txt), but since
  // the multicast x and the residual read ahead the 8B step gains (L = 1024: B = 4 4947 -> 4747
  // us, B = 6 4907 -> 4820, B = 8 5027 -> 4900; bench/results/h200_gemv_rows8_8b_2026-11-29.txt).
  // The 8B down (k 14336, a long k) only at rows <= 2, where it brings the norm fold and the MLP
  // block (LlamaModel::fuses_mlp_block: B = 1 4711 -> 4510; h200_8b_mlp_block_2026-11-29.txt):
  // alone it is behind cuBLAS at every row count (38.5 vs 32.0 us at rows 1,
  // probe_stream_mlp_trace), at rows 3-6 its x leaves the ring 3-6 stages, and with it there the
  // step was slower (B = 6 5095 us, B = 4 4924). The long-k bound sits at the 1B down's 8192,
  // measured ahead; k between 8192 and 14336 (e.g. 8960, 11008) was not measured and follows the
  // 8B's. It loses at gate_up and lm_head (n 16384 and up).
  const int max_rows = a.in > kStreamGemvLongInAuto ? auto_long_max_rows_ : auto_max_rows_;
  if (gemv_mode_ == GemvMode::kAuto &&
      (skinny_mode_ != SkinnyMode::kAuto || a.rows > max_rows || a.out > auto_max_out_))
    return false;
  return a.rows >= 1 && a.rows <= kSkinnyMaxRows && a.out > 0 &&
         stream_gemv_supported(skinny_dev_, a.rows, a.in) && aligned16(a.x) && aligned16(a.w);
}

bool Gemm::uses_wgmma(const GemmArgs& a) const noexcept {
  if (!wgmma_ || plain_ || uses_stream_gemv(a) || uses_skinny(a)) return false;
  const std::int32_t min_rows =
      a.out >= wgmma_wide_min_out_ ? wgmma_wide_min_rows_ : wgmma_min_rows_;
  return a.rows >= min_rows && a.rows <= wgmma_max_rows_ && a.out >= wgmma_min_out_ &&
         a.out <= wgmma_max_out_ && a.in <= wgmma_max_in_ &&
         wgmma_gemm_supported(a.rows, a.in, a.out) && aligned16(a.x) && aligned16(a.w) &&
         aligned16(a.y);
}

bool Gemm::fuses_swiglu(const GemmArgs& a) const noexcept {
  return a.out_type == GemmOut::kBF16 && a.out % 128 == 0 && uses_wgmma(a);
}

void Gemm::run_swiglu(const GemmArgs& a, cudaStream_t stream) const {
  GD_REQUIRE(a.rows > 0 && fuses_swiglu(a), "rows", a.rows,
             "the SwiGLU epilogue runs in the warpgroup GEMM only (bf16 output, out a multiple "
             "of 128, a shape it takes; Gemm::fuses_swiglu)");
  wgmma_gemm(skinny_dev_, {a.x, a.w, a.y, a.rows, a.in, a.out, false}, stream,
             WgmmaEpilogue::kSwiGlu);
}

bool Gemm::fuses_norm(const GemmArgs& a) const noexcept {
  return !plain_ && a.out_type == GemmOut::kBF16 && uses_stream_gemv(a);
}

void Gemm::run_fused(const GemmArgs& a, const StreamGemvFusion& fusion, cudaStream_t stream) const {
  GD_REQUIRE(a.rows > 0 && fuses_norm(a), "rows", a.rows,
             "the norm fusions run in the stream GEMV only (bf16 output, a shape it takes; "
             "Gemm::fuses_norm)");
  stream_gemv(skinny_dev_, {a.x, a.w, a.y, a.rows, a.in, a.out, false}, stream, fusion);
}

bool Gemm::fuses_wgmma_norm(const GemmArgs& a) const noexcept {
  return a.out_type == GemmOut::kBF16 && a.rows <= kWgmmaNormMaxRows &&
         a.in % kWgmmaNormPart == 0 && a.out % kWgmmaNormPart == 0 && uses_wgmma(a);
}

void Gemm::run_wgmma_fused(const GemmArgs& a, const WgmmaNormFusion& fusion, bool swiglu,
                           cudaStream_t stream) const {
  GD_REQUIRE(a.rows > 0 && fuses_wgmma_norm(a), "rows", a.rows,
             "the warpgroup GEMM's norm fusions take bf16 outputs, rows 9-64 where it runs, in "
             "and out multiples of 128 (Gemm::fuses_wgmma_norm)");
  GD_REQUIRE(!swiglu || fuses_swiglu(a), "out", a.out,
             "the SwiGLU epilogue takes W = [gate; up] with a multiple of 64 rows each");
  wgmma_gemm(skinny_dev_, {a.x, a.w, a.y, a.rows, a.in, a.out, false}, stream,
             swiglu ? WgmmaEpilogue::kSwiGlu : WgmmaEpilogue::kStore, fusion);
}

bool Gemm::fuses_mlp(std::int32_t rows, std::int32_t hidden, std::int32_t inter) const noexcept {
  return !plain_ && gemv_mode_ != GemvMode::kOff &&
         stream_mlp_supported(skinny_dev_, rows, hidden, inter);
}

void Gemm::run_mlp(const StreamMlpArgs& a, cudaStream_t stream) const {
  GD_REQUIRE(fuses_mlp(a.rows, a.hidden, a.inter), "rows", a.rows,
             "the MLP block runs where the stream GEMV does, on shapes it takes (Gemm::fuses_mlp)");
  stream_mlp(skinny_dev_, a, stream);
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
  if (uses_stream_gemv(a)) {
    stream_gemv(skinny_dev_, {a.x, a.w, a.y, a.rows, a.in, a.out, a.out_type == GemmOut::kF32},
                stream);
    return;
  }
  if (uses_skinny(a)) {
    skinny_gemm(skinny_dev_, {a.x, a.w, a.y, a.rows, a.in, a.out, a.out_type == GemmOut::kF32},
                stream);
    return;
  }
  if (uses_wgmma(a)) {
    wgmma_gemm(skinny_dev_, {a.x, a.w, a.y, a.rows, a.in, a.out, a.out_type == GemmOut::kF32},
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
