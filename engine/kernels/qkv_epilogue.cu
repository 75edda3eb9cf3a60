// Fused QKV epilogue (bias, per-head q/k RMSNorm, RoPE, q out, K/V into pages). See qkv_epilogue.h.
//
// Bitwise parity with the unfused path rests on repeating its fp32 expressions verbatim:
//   add_bias   y = bf16(y + b)
//   rmsnorm    per-thread ss over 8 contiguous elements (ss += x * x), then an xor-butterfly
//              over the vectors of the row; here a thread holds vectors j and j + nvec / 2, so its
//              lo + hi sum is the butterfly's first non-trivial level and the shuffles the rest
//              (the old kernel's other levels add exact zeros); inv = rsqrtf(ss / d + eps)
//   rope       angle = inv_freq[i] * pos; sincosf; l * c - h * s and h * c + l * s, rounded once
// Keep these expressions identical to model_kernels.cu / rope_kernel.cu (same contraction).
#include <cuda_bf16.h>

#include <cstdint>

#include "common/align.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "common/pdl.cuh"
#include "engine/kernels/bf16_vec.cuh"
#include "engine/kernels/qkv_epilogue.h"

namespace graphdecode {
namespace {

using detail::load8;
using detail::round_bf16;
using detail::store8;
using detail::Vec8;

constexpr int kThreads = 128;
constexpr int kMaxHalf = 128;  // head_dim 256
constexpr int kMaxGridY = 65535;

// Grid (max_rows, head chunks). Item = (head, j): threads per head tph = head_dim / 16 (4, 8, 16)
// sit in adjacent lanes; thread j owns elements [8j, 8j + 8) and their RoPE partners
// [d/2 + 8j, d/2 + 8j + 8) of its head. Heads in qkv order: q [0, hq), k, then v.
__global__ void __launch_bounds__(kThreads)
    qkv_epilogue_kernel(const __grid_constant__ QkvEpilogueArgs a) {
  // Launched as a programmatic dependent of the qkv GEMM. Its one dependent is the attention
  // (PriorWrites::kQueryAndNewKv), which reads before its own wait only what no kernel of the layer
  // writes (its plan, the page table, older K/V), so this kernel lets it be scheduled at once,
  // before its own wait (the one exception to common/pdl.cuh's promise): behind a stream GEMV,
  // which triggers early, the attention's CTAs then load older K/V while the GEMV still streams.
  // The qkv GEMM, which may then still run, writes only qkv; every kernel before it has completed
  // (it triggered after its own wait). Likewise this kernel reads before its wait what depends on
  // no kernel of the layer: the step's metadata (num_rows, positions, slot, the page table:
  // written at the step's start), inv_freq and the weights (bias, q/k norm); after the wait one
  // round trip, for qkv, is left. The trigger comes first, so these loads never delay the
  // attention's start (bench/NOTES.md 98).
  pdl_launch_dependents();
  const int row = blockIdx.x;
  const bool live = row < *a.num_rows;
  __shared__ float s_cos[kMaxHalf], s_sin[kMaxHalf];
  __shared__ std::int32_t s_page, s_in_page;  // cache destination of this row; page -1 = skip
  const int d = a.head_dim, half = d / 2;
  if (live) {
    const float pos = static_cast<float>(a.positions[row]);
    for (int i = threadIdx.x; i < half; i += kThreads) {
      const float angle = a.inv_freq[i] * pos;  // as rope_kernel
      sincosf(angle, &s_sin[i], &s_cos[i]);
    }
    if (threadIdx.x == 0) {  // write_new_kv's (slot, position) resolution
      const PagedKvView& c = a.cache;
      const std::int32_t s = a.slot[row], p = a.positions[row];
      std::int32_t page = -1, in_page = 0;
      if (s >= 0 && s < a.max_slots && p >= 0 && p / c.page_size < c.max_pages_per_slot) {
        const std::int32_t logical = p / c.page_size;
        page = c.page_table[static_cast<std::int64_t>(s) * c.max_pages_per_slot + logical];
        if (page >= c.num_pages) page = -1;  // negative: kInvalidPage (released / never allocated)
        in_page = p - logical * c.page_size;
      }
      s_page = page;
      s_in_page = in_page;
    }
  }
  const int tph = half / 8;
  const int hq = a.num_q_heads, hkv = a.num_kv_heads, heads = hq + 2 * hkv;
  const int item = blockIdx.y * kThreads + threadIdx.x;
  const bool valid = live && item < heads * tph;  // whole head groups alike
  const int head = valid ? item / tph : 0;
  const int lo_off = 8 * (item - head * tph), hi_off = half + lo_off;
  const bool is_v = head >= hq + hkv;
  const bool norm = valid && !is_v && a.q_norm != nullptr;
  Vec8 bl, bh, wl, wh;
  if (valid && a.bias != nullptr) {
    bl = load8(a.bias + head * d + lo_off);
    bh = load8(a.bias + head * d + hi_off);
  }
  if (norm) {
    const std::uint16_t* w = head < hq ? a.q_norm : a.k_norm;
    wl = load8(w + lo_off);
    wh = load8(w + hi_off);
  }
  __syncthreads();
  pdl_wait_for_prior_grid();
  if (!valid) return;
  const std::uint16_t* src = a.qkv + (static_cast<std::size_t>(row) * heads + head) * d;
  Vec8 lo = load8(src + lo_off), hi = load8(src + hi_off);
  if (a.bias != nullptr) {  // as add_bias: fp32 add, bf16 store
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      lo.v[e] = round_bf16(lo.v[e] + bl.v[e]);
      hi.v[e] = round_bf16(hi.v[e] + bh.v[e]);
    }
  }
  if (norm) {  // as rmsnorm_kernel over one head of d elements
    float ss_lo = 0.f, ss_hi = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) ss_lo += lo.v[e] * lo.v[e];
#pragma unroll
    for (int e = 0; e < 8; ++e) ss_hi += hi.v[e] * hi.v[e];
    float ss = ss_lo + ss_hi;
    const int lane = threadIdx.x & 31;
    const unsigned mask = ((1u << tph) - 1u) << (lane & ~(tph - 1));
    for (int o = tph / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(mask, ss, o);
    const float inv_rms = rsqrtf(ss / static_cast<float>(d) + a.eps);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      lo.v[e] = round_bf16(wl.v[e] * round_bf16(lo.v[e] * inv_rms));
      hi.v[e] = round_bf16(wh.v[e] * round_bf16(hi.v[e] * inv_rms));
    }
  }
  if (!is_v) {  // as rope_kernel; the bf16 rounding happens in store8
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float l = lo.v[e], h = hi.v[e];
      const float c = s_cos[lo_off + e], s = s_sin[lo_off + e];
      lo.v[e] = l * c - h * s;
      hi.v[e] = h * c + l * s;
    }
  }
  std::uint16_t* dst;
  if (head < hq) {
    dst = a.q_out + (static_cast<std::size_t>(row) * hq + head) * d;
  } else {
    const std::int32_t page = s_page;
    if (page < 0) return;
    const int kv_head = is_v ? head - hq - hkv : head - hq;
    dst = static_cast<std::uint16_t*>(is_v ? a.cache.v : a.cache.k) +
          kv_element_offset(a.cache, page, kv_head, s_in_page);
  }
  store8(dst + lo_off, lo);
  store8(dst + hi_off, hi);
}

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

}  // namespace

void qkv_epilogue(const QkvEpilogueArgs& a, cudaStream_t stream) {
  const PagedKvView& c = a.cache;
  GD_REQUIRE(a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256, "head_dim", a.head_dim,
             "the QKV epilogue supports head dims 64, 128 and 256");
  GD_REQUIRE(a.num_rows != nullptr, "num_rows", "nullptr", "the live-row count is read on device");
  GD_REQUIRE(a.max_rows > 0, "max_rows", a.max_rows, "must be > 0");
  GD_REQUIRE(a.num_q_heads > 0, "num_q_heads", a.num_q_heads, "must be > 0");
  GD_REQUIRE(a.num_kv_heads > 0, "num_kv_heads", a.num_kv_heads, "must be > 0");
  GD_REQUIRE(a.qkv != nullptr && aligned16(a.qkv), "qkv", a.qkv,
             "must be non-null and 16-byte aligned");
  GD_REQUIRE(a.q_out != nullptr && aligned16(a.q_out), "q_out", a.q_out,
             "must be non-null and 16-byte aligned");
  GD_REQUIRE(a.bias == nullptr || aligned16(a.bias), "bias", a.bias, "must be 16-byte aligned");
  GD_REQUIRE((a.q_norm == nullptr) == (a.k_norm == nullptr), "k_norm", a.k_norm,
             "q_norm and k_norm come together (Qwen3) or not at all");
  GD_REQUIRE(a.q_norm == nullptr || aligned16(a.q_norm), "q_norm", a.q_norm,
             "must be 16-byte aligned");
  GD_REQUIRE(a.k_norm == nullptr || aligned16(a.k_norm), "k_norm", a.k_norm,
             "must be 16-byte aligned");
  GD_REQUIRE(a.q_norm == nullptr || a.eps > 0.f, "eps", a.eps, "must be > 0");
  GD_REQUIRE(a.positions != nullptr, "positions", "nullptr", "must be non-null");
  GD_REQUIRE(a.inv_freq != nullptr, "inv_freq", "nullptr", "must be non-null (RopeTable::data)");
  GD_REQUIRE(a.slot != nullptr, "slot", "nullptr", "must be non-null");
  GD_REQUIRE(c.k != nullptr && aligned16(c.k), "cache.k", c.k, "null or not 16-byte aligned");
  GD_REQUIRE(c.v != nullptr && aligned16(c.v), "cache.v", c.v, "null or not 16-byte aligned");
  GD_REQUIRE(c.page_table != nullptr, "cache.page_table", "null", "the destination needs it");
  GD_REQUIRE(c.page_size >= 1, "cache.page_size", c.page_size, "must be positive");
  GD_REQUIRE(c.num_pages >= 1, "cache.num_pages", c.num_pages, "must be positive");
  GD_REQUIRE(c.max_pages_per_slot >= 1, "cache.max_pages_per_slot", c.max_pages_per_slot,
             "page table rows need at least one entry");
  GD_REQUIRE(c.num_kv_heads == a.num_kv_heads, "cache.num_kv_heads", c.num_kv_heads,
             "must equal num_kv_heads");
  GD_REQUIRE(c.head_dim == a.head_dim, "cache.head_dim", c.head_dim, "must equal head_dim");
  GD_REQUIRE(a.max_slots >= 1, "max_slots", a.max_slots, "page table rows must be positive");
  const std::int64_t heads = a.num_q_heads + 2LL * a.num_kv_heads;
  const auto rows = static_cast<std::size_t>(a.max_rows);
  GD_REQUIRE(!overlaps(a.q_out, rows * a.num_q_heads * a.head_dim * 2, a.qkv,
                       rows * heads * a.head_dim * 2),
             "q_out", a.q_out, "must not overlap qkv");
  const std::int64_t chunks = (heads * (a.head_dim / 16) + kThreads - 1) / kThreads;
  GD_REQUIRE(chunks <= kMaxGridY, "num_q_heads", a.num_q_heads, "too many heads for one launch");
  const dim3 grid(static_cast<unsigned>(a.max_rows), static_cast<unsigned>(chunks));
  launch_pdl(qkv_epilogue_kernel, grid, dim3(kThreads), 0, stream, a);
}

}  // namespace graphdecode
