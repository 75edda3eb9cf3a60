// Probe (bench/NOTES.md 46): the DRAM read rate of a bare copy loop with the attention kernel's
// access pattern at B=8, L=32768 (1.07 GB of K/V), to tell the stream apart from the kernel.
// 256 CTAs x 128 threads, 2 per SM, a 3-stage cp.async pipeline of 32 KB steps; data is dropped.
// Modes 0-3: each CTA streams its own contiguous 2 MB of K and of V (the SDPA peer's layout):
// 0 = every step holds 16 KB of K and 16 KB of V (our kernel's order), 1 = steps alternate between
// 32 KB of K and 32 KB of V (FA2's order), 2 = all K then all V, 3 = mode 0 with K and V pieces in
// separate loops. Modes 4-7: the paged pool of bench_attention (page 16, [page][head][16][128]),
// 64-key tiles, a page-table lookup per 16-byte piece, swizzled shared-memory rows, shuffled or
// in-order pages, with or without the kernel's L2 evict-first policy; mode 8 = mode 6 with the
// attention kernel's 112 KB of shared memory per CTA (96 KB otherwise). Then three recorded runs of
// mode 6: when each CTA ends, to compare with the kernel's trace (scripts/perf/trace-summary.py).
//   build/bench/probe_stream_order      (median of 50 runs per mode, modes interleaved)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "attention/mma_utils.cuh"  // the kernel's own copy helpers, so the same instructions

using namespace graphdecode::attn;

#define CK(x)                                                               \
  do {                                                                      \
    cudaError_t e = (x);                                                    \
    if (e != cudaSuccess) {                                                 \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      return 1;                                                             \
    }                                                                       \
  } while (0)

constexpr int kThreads = 128, kStages = 3, kStep = 32768;  // bytes per pipeline step

// A plain 16-byte copy (no src-size operand, no L2 policy): the copy form of modes 0-5.
__device__ __forceinline__ void cp16(void* smem, const void* g) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(g));
}

// End of pipeline step `it`: commit its copies; from the first tile on, wait for tile `it` (the
// next kStages - 1 stay in flight) and sync twice per tile as the attention kernel does.
__device__ __forceinline__ void finish_step(int it) {
  cp_async_commit();
  if (it < 0) return;
  cp_async_wait<kStages - 1>();
  __syncthreads();
  __syncthreads();  // (the data is dropped: the copies are volatile asm, so they stay)
}

template <int kMode>
__global__ void __launch_bounds__(kThreads, 2)
    stream(const char* k, const char* v, std::int64_t per_cta) {
  extern __shared__ __align__(128) unsigned char smem[];
  const char* kb = k + blockIdx.x * per_cta;
  const char* vb = v + blockIdx.x * per_cta;
  const int steps = static_cast<int>(2 * per_cta / kStep);
  for (int it = 1 - kStages; it < steps; ++it) {
    const int nxt = it + kStages - 1;
    if (nxt < steps) {
      unsigned char* dst = smem + (nxt % kStages) * kStep;
      if (kMode == 0 || kMode == 3) {  // half K, half V
        const std::int64_t off = static_cast<std::int64_t>(nxt) * (kStep / 2);
        if (kMode == 0) {
          for (int i = threadIdx.x; i < kStep / 32; i += kThreads) {
            cp16(dst + i * 16, kb + off + i * 16);
            cp16(dst + kStep / 2 + i * 16, vb + off + i * 16);
          }
        } else {
          for (int i = threadIdx.x; i < kStep / 32; i += kThreads)
            cp16(dst + i * 16, kb + off + i * 16);
          for (int i = threadIdx.x; i < kStep / 32; i += kThreads)
            cp16(dst + kStep / 2 + i * 16, vb + off + i * 16);
        }
      } else {
        const char* src;
        if (kMode == 1)
          src = ((nxt & 1) ? vb : kb) + static_cast<std::int64_t>(nxt / 2) * kStep;
        else
          src = nxt < steps / 2 ? kb + static_cast<std::int64_t>(nxt) * kStep
                                : vb + static_cast<std::int64_t>(nxt - steps / 2) * kStep;
        for (int i = threadIdx.x; i < kStep / 16; i += kThreads) cp16(dst + i * 16, src + i * 16);
      }
    }
    finish_step(it);
  }
  cp_async_wait<0>();
}

__device__ __forceinline__ std::uint64_t now_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned sm_id() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

// Paged: K/V pools [page][8 heads][16 rows][256 B], CTA c = (request c / 32, head (c / 4) % 8,
// chunk c % 4 of 8192 keys), our work order; page of (request, i) = pt[request * 2048 + i].
// kEvict: the L2 evict-first policy and the zero-fill (src-size) form, as in the kernel.
// rec (optional): per CTA {start ns, end ns, SM id}.
template <bool kEvict>
__global__ void __launch_bounds__(kThreads, 2)
    stream_paged(const char* k, const char* v, const int* pt, unsigned long long* rec = nullptr) {
  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint64_t t0 = now_ns();
  const int c = blockIdx.x, r = c / 32, h = (c / 4) % 8, key_base = (c % 4) * 8192;
  const int steps = 8192 / 64;
  const std::uint64_t pol = kEvict ? l2_evict_first_policy() : 0;
  for (int it = 1 - kStages; it < steps; ++it) {
    const int nxt = it + kStages - 1;
    if (nxt < steps) {
      unsigned char* dst = smem + (nxt % kStages) * kStep;
#pragma unroll 1
      for (int i = threadIdx.x; i < 1024; i += kThreads) {
        const int row = i / 16, ch = i % 16, key = key_base + nxt * 64 + row;
        const int page = pt[r * 2048 + key / 16];
        const std::int64_t off =
            ((static_cast<std::int64_t>(page) * 8 + h) * 16 + key % 16) * 256 + ch * 16;
        // The kernel's swizzle (2-byte elements, d128), in bytes.
        const int so = 2 * swizzled_offset<128>(row, ch);
        if (kEvict) {
          cp_async_16_policy(dst + so, k + off, true, pol);
          cp_async_16_policy(dst + 16384 + so, v + off, true, pol);
        } else {
          cp16(dst + so, k + off);
          cp16(dst + 16384 + so, v + off);
        }
      }
    }
    finish_step(it);
  }
  cp_async_wait<0>();
  if (rec != nullptr && threadIdx.x == 0) {
    rec[3 * blockIdx.x] = t0;
    rec[3 * blockIdx.x + 1] = now_ns();
    rec[3 * blockIdx.x + 2] = sm_id();
  }
}

int main() {
  const int ctas = 256;
  const std::int64_t per_cta = 8192LL * 128 * 2;  // one (request, KV head) split of 8192 keys
  const std::int64_t bytes = per_cta * ctas;      // each of K and V
  char *k, *v;
  CK(cudaMalloc(&k, bytes));
  CK(cudaMalloc(&v, bytes));
  CK(cudaMemset(k, 1, bytes));
  CK(cudaMemset(v, 2, bytes));
  const int smem = kStages * kStep;
  auto set = [&](auto kern) {
    return cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  };
  CK(set(stream<0>));
  CK(set(stream<1>));
  CK(set(stream<2>));
  CK(set(stream<3>));
  CK(set(stream_paged<false>));
  // The attention kernel's footprint at d128: Q (64 rows) + 3 stages of K and V = 112 KB per CTA.
  constexpr int kKernelSmem = 2 * (64 * 128 + 2 * kStages * 64 * 128);
  CK(cudaFuncSetAttribute(stream_paged<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          kKernelSmem));
  // Page tables: 8 requests x 2048 pages; shuffled (the bench's default) and in order.
  const int pages = 8 * 2048;
  std::vector<int> order(pages), shuffled(pages);
  for (int i = 0; i < pages; ++i) order[i] = shuffled[i] = i;
  std::uint64_t x = 12345;
  for (int i = pages - 1; i > 0; --i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    std::swap(shuffled[i], shuffled[(x >> 33) % (i + 1)]);
  }
  int *pt_shuf, *pt_ord;
  CK(cudaMalloc(&pt_shuf, pages * 4));
  CK(cudaMalloc(&pt_ord, pages * 4));
  CK(cudaMemcpy(pt_shuf, shuffled.data(), pages * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(pt_ord, order.data(), pages * 4, cudaMemcpyHostToDevice));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  constexpr int kModes = 9;
  const char* names[kModes] = {"K+V each step (ours)",
                               "K / V alternating steps (FA2)",
                               "all K then all V",
                               "K loop then V loop per step",
                               "paged 16, shuffled",
                               "paged 16, in order",
                               "paged 16, shuffled, evict-first",
                               "paged 16, in order, evict-first",
                               "mode 6, 112 KB shared memory per CTA"};
  std::vector<std::vector<float>> t(kModes);
  for (int rep = 0; rep < 60; ++rep) {
    for (int mode = 0; mode < kModes; ++mode) {  // interleaved, so clocks and heat hit all alike
      CK(cudaEventRecord(a));
      if (mode == 0) stream<0><<<ctas, kThreads, smem>>>(k, v, per_cta);
      if (mode == 1) stream<1><<<ctas, kThreads, smem>>>(k, v, per_cta);
      if (mode == 2) stream<2><<<ctas, kThreads, smem>>>(k, v, per_cta);
      if (mode == 3) stream<3><<<ctas, kThreads, smem>>>(k, v, per_cta);
      if (mode == 4) stream_paged<false><<<ctas, kThreads, smem>>>(k, v, pt_shuf);
      if (mode == 5) stream_paged<false><<<ctas, kThreads, smem>>>(k, v, pt_ord);
      if (mode == 6) stream_paged<true><<<ctas, kThreads, smem>>>(k, v, pt_shuf);
      if (mode == 7) stream_paged<true><<<ctas, kThreads, smem>>>(k, v, pt_ord);
      if (mode == 8) stream_paged<true><<<ctas, kThreads, kKernelSmem>>>(k, v, pt_shuf);
      CK(cudaGetLastError());
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      if (rep >= 10) t[mode].push_back(ms * 1000.f);
    }
  }
  // One recorded run of the paged, shuffled, evict-first stream: when each CTA ends (us after the
  // first CTA's start), and the SMs whose CTAs end last.
  {
    unsigned long long* rec;
    CK(cudaMalloc(&rec, 3 * ctas * sizeof(unsigned long long)));
    for (int r = 0; r < 3; ++r) {
      stream_paged<true><<<ctas, kThreads, smem>>>(k, v, pt_shuf, rec);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      std::vector<unsigned long long> h(3 * ctas);
      CK(cudaMemcpy(h.data(), rec, h.size() * 8, cudaMemcpyDeviceToHost));
      unsigned long long first = ~0ULL;
      for (int c = 0; c < ctas; ++c) first = std::min(first, h[3 * c]);
      std::vector<std::pair<float, int>> ends;
      std::vector<float> starts;
      for (int c = 0; c < ctas; ++c) {
        ends.push_back({(h[3 * c + 1] - first) / 1e3f, static_cast<int>(h[3 * c + 2])});
        starts.push_back((h[3 * c] - first) / 1e3f);
      }
      std::sort(ends.begin(), ends.end());
      std::sort(starts.begin(), starts.end());
      std::printf(
          "recorded run %d: start max %.1f us; end min %.1f p10 %.1f median %.1f p90 %.1f "
          "max %.1f us; last SMs:",
          r, starts.back(), ends.front().first, ends[ctas / 10].first, ends[ctas / 2].first,
          ends[ctas * 9 / 10].first, ends.back().first);
      for (int i = ctas - 12; i < ctas; ++i) std::printf(" %d", ends[i].second);
      std::printf("\n");
    }
  }
  for (int mode = 0; mode < kModes; ++mode) {
    std::sort(t[mode].begin(), t[mode].end());
    const float med = t[mode][t[mode].size() / 2];
    std::printf("mode %d %-32s median %7.1f us  %6.0f GB/s\n", mode, names[mode], med,
                2.0 * bytes / med / 1e3);
  }
  return 0;
}
