// Device sampling, host side: argument checks, the workspace query and the passes
// (sampling_kernels.cuh; the check pass only with draw rows on). See sampling.h for the contract.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/kernels/sampling.h"
#include "engine/kernels/sampling_kernels.cuh"

namespace graphdecode {

std::size_t sampling_workspace_bytes(std::int32_t max_rows, std::int32_t vocab) {
  GD_REQUIRE(max_rows > 0, "max_rows", max_rows, "must be > 0");
  GD_REQUIRE(vocab > 0 && vocab <= kMaxSamplingVocab, "vocab", vocab, "must be in [1, 2^22]");
  return static_cast<std::size_t>(max_rows) * sampling::row_block_bytes(vocab);
}

namespace sampling {
namespace {

// An A/B switch read once: the environment variable `name` set to "0" turns a path off.
bool env_is_zero(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "0") == 0;
}

// GRAPHDECODE_SAMPLING_DRAW_MIN_P (read once): the smallest top-p of a draw row (kDrawMinTopP
// unless set), for A/B runs of lower p on the draw path; a value outside (0, 1] is refused.
float draw_min_top_p() {
  static const float p = [] {
    const char* v = std::getenv("GRAPHDECODE_SAMPLING_DRAW_MIN_P");
    if (v == nullptr) return kDrawMinTopP;
    char* end = nullptr;
    const float x = std::strtof(v, &end);
    GD_REQUIRE(end != v && *end == '\0' && x > 0.f && x <= 1.f, "GRAPHDECODE_SAMPLING_DRAW_MIN_P",
               v, "must be a number in (0, 1]");
    return x;
  }();
  return p;
}

}  // namespace

Launch make_launch(const SamplingArgs& args) {
  SamplingArgs a = args;
  if (a.row_stride == 0) a.row_stride = a.vocab;
  GD_REQUIRE(a.num_rows != nullptr, "num_rows", "nullptr", "the live-row count is read on device");
  GD_REQUIRE(a.max_rows > 0, "max_rows", a.max_rows, "must be > 0");
  GD_REQUIRE(a.vocab > 0 && a.vocab <= kMaxSamplingVocab, "vocab", a.vocab, "must be in [1, 2^22]");
  GD_REQUIRE(a.row_stride >= a.vocab, "row_stride", a.row_stride, "must be >= vocab");
  GD_REQUIRE(a.logits != nullptr, "logits", "nullptr", "must be non-null");
  GD_REQUIRE(a.tokens != nullptr, "tokens", "nullptr", "must be non-null");
  GD_REQUIRE(a.temperature != nullptr, "temperature", "nullptr", "must be non-null");
  GD_REQUIRE(a.top_k != nullptr, "top_k", "nullptr", "must be non-null");
  GD_REQUIRE(a.top_p != nullptr, "top_p", "nullptr", "must be non-null");
  GD_REQUIRE(a.seed != nullptr, "seed", "nullptr", "must be non-null");
  GD_REQUIRE(a.step != nullptr, "step", "nullptr", "must be non-null");
  GD_REQUIRE(a.logits_type == LogitsType::kFloat32 || a.logits_type == LogitsType::kBF16,
             "logits_type", static_cast<int>(a.logits_type), "unknown logits type");
  GD_REQUIRE(a.workspace != nullptr, "workspace", "nullptr",
             "needs sampling_workspace_bytes(max_rows, vocab) bytes of device memory");
  GD_REQUIRE(reinterpret_cast<std::uintptr_t>(a.workspace) % 16 == 0, "workspace", a.workspace,
             "must be 16-byte aligned");
  const std::size_t need = sampling_workspace_bytes(a.max_rows, a.vocab);
  GD_REQUIRE(a.workspace_bytes >= need, "workspace_bytes", a.workspace_bytes,
             "smaller than sampling_workspace_bytes(max_rows, vocab) = " + std::to_string(need));
  GD_REQUIRE(a.candidate_limit >= 0, "candidate_limit", a.candidate_limit, "must be >= 0");

  Launch L;
  L.a = a;
  L.ws.base = static_cast<unsigned char*>(a.workspace);
  L.ws.row_bytes = row_block_bytes(a.vocab);
  L.ws.cap = static_cast<std::int32_t>(candidate_capacity(a.vocab));
  L.cand_limit =
      a.candidate_limit > 0 && a.candidate_limit < L.ws.cap ? a.candidate_limit : L.ws.cap;
  L.chunk = a.max_rows <= kSmallBatch ? kSmallChunk : kLargeChunk;
  L.chunks = (a.vocab + L.chunk - 1) / L.chunk;
  GD_REQUIRE(
      static_cast<std::int64_t>(L.chunks) * a.max_rows <= std::numeric_limits<std::int32_t>::max(),
      "max_rows", a.max_rows, "too many rows for one grid");
  const std::size_t esize = a.logits_type == LogitsType::kFloat32 ? 4 : 2;
  L.vec_ok = reinterpret_cast<std::uintptr_t>(a.logits) % 16 == 0 &&
             (static_cast<std::size_t>(a.row_stride) * esize) % 16 == 0;
  static const bool scan_cand = !env_is_zero("GRAPHDECODE_SAMPLING_SCAN_CAND");
  static const bool p_draw = !env_is_zero("GRAPHDECODE_SAMPLING_P_DRAW");
  L.scan_cand = scan_cand;
  L.p_draw = p_draw;
  static const bool dynamic_items = !env_is_zero("GRAPHDECODE_SAMPLING_DYNAMIC");
  static const bool dynamic_check = !env_is_zero("GRAPHDECODE_SAMPLING_DYNAMIC_CHECK");
  L.dynamic_items = dynamic_items;
  L.dynamic_check = dynamic_items && dynamic_check;
  static const bool draw_floor = !env_is_zero("GRAPHDECODE_SAMPLING_DRAW_FLOOR");
  L.draw_floor = draw_floor;
  L.draw_min_top_p = draw_min_top_p();
  int dev = 0;
  GD_CUDA(cudaGetDevice(&dev));
  GD_CUDA(cudaDeviceGetAttribute(&L.sms, cudaDevAttrMultiProcessorCount, dev));
  return L;
}

}  // namespace sampling

void sample(const SamplingArgs& args, cudaStream_t stream) {
  const sampling::Launch L = sampling::make_launch(args);
  sampling::launch_scan(L, stream);
  sampling::launch_filter(L, stream);
  if (L.p_draw) sampling::launch_check(L, stream);
  sampling::launch_resolve(L, stream);
}

}  // namespace graphdecode
