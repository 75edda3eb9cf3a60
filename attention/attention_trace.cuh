// Diagnosis builds only (-DGD_ATTN_TRACE=1): per-CTA timestamps of the last attention launch,
// written by bench_attention to $GD_TRACE_DIR and summarized by scripts/perf/trace-summary.py. In
// normal builds every macro below is empty: no state, no parameter and no instruction is added to
// the kernels (their SASS is that of a build without the trace points).
// Record of CTA b, g_attn_trace[b * kTraceFields + f]:
//   f = 2i, 2i+1: globaltimer, clock64 at point i: 0 entry, 1 work item known, 2 first K/V tile in
//                 shared memory, 3 attention done, 4 exit (after the split-KV merge, if any)
//   f = 28, 29:   the same at point 5: an early start's griddepcontrol.wait returned (decode and
//                 mma.sync extend layouts; 0 where the CTA waited at entry)
//   f = 30, 31:   point 6: the early start's copies before the wait are issued, the wait not begun
//                 (issue stalls on copies in flight show as time between 1 and 6)
//   f = 32, 33:   point 7 (merging CTAs): the arrivals counted, this CTA merges
//   f = 34:       globaltimer once thread 0's first batch of partial states is in registers
//                 (f = 35 holds a value made from it, stored first, so the time is read after)
//   f = 10: smid | chunks << 16 | chunk << 32 | keys of the item << 40;  f = 11: 1 if it merged.
//   f = 12 + j (j < 8): globaltimer when tile n_tiles * j / 8 of its item is in shared memory
//                 (the stream's progress over time: does a CTA speed up once others are done?).
//   f = 20 + k (k < 4): clock64 inside the self-planned CTA's plan, once value k has arrived
//                 (0 num_requests, 1 thread 0's request row, 2 the block sum, 3 the plan's scans);
//                 f = 24 + k holds that value, stored first so the clock is read after it is there.
#pragma once

#ifndef GD_ATTN_TRACE
#define GD_ATTN_TRACE 0
#endif

#if GD_ATTN_TRACE
namespace graphdecode::attn {
constexpr int kTraceCtas = 8192, kTraceFields = 36;
__device__ unsigned long long g_attn_trace[kTraceCtas * kTraceFields];

__device__ __forceinline__ void trace_value(int field, unsigned long long v) {
  if (threadIdx.x == 0 && blockIdx.x < kTraceCtas)
    g_attn_trace[blockIdx.x * kTraceFields + field] = v;
}
__device__ __forceinline__ void trace_point(int i) {
  unsigned long long g;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
  const int f = i < 5 ? 2 * i : 28 + 2 * (i - 5);
  trace_value(f, g);
  trace_value(f + 1, clock64());
}
__device__ __forceinline__ void trace_tile(int it, int n_tiles) {
  for (int j = 0; j < 8; ++j) {
    if (it == n_tiles * j / 8) {
      unsigned long long g;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
      trace_value(12 + j, g);
      break;
    }
  }
}
// Stores `dep` into dep_field, then the time (globaltimer if kGlobal, else clock64) into
// time_field: the store waits for `dep` (in-order issue), so the time is read after it is known.
template <bool kGlobal>
__device__ __forceinline__ void trace_time_after(int dep_field, unsigned dep, int time_field) {
  trace_value(dep_field, dep);
  unsigned long long t;
  if constexpr (kGlobal)
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  else
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  trace_value(time_field, t);
}
}  // namespace graphdecode::attn
#define GD_TRACE_POINT(i) trace_point(i)
#define GD_TRACE_AFTER(k, dep) \
  trace_time_after<false>(24 + (k), static_cast<unsigned>(dep), 20 + (k))
#define GD_TRACE_TILE(it, n) trace_tile(it, n)
#define GD_TRACE_ITEM(w)                                                           \
  do {                                                                             \
    unsigned smid_;                                                                \
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid_));                             \
    trace_value(10, smid_ | (static_cast<unsigned long long>((w).chunks) << 16) |  \
                        (static_cast<unsigned long long>((w).chunk) << 32) |       \
                        (static_cast<unsigned long long>((w).ke - (w).kb) << 40)); \
    trace_value(11, 0);                                                            \
  } while (0)
#define GD_TRACE_MERGED() trace_value(11, 1)
#define GD_TRACE_LOADED(dep) trace_time_after<true>(35, dep, 34)
#else
#define GD_TRACE_POINT(i)
#define GD_TRACE_AFTER(k, dep)
#define GD_TRACE_TILE(it, n)
#define GD_TRACE_ITEM(w)
#define GD_TRACE_MERGED()
#define GD_TRACE_LOADED(dep)
#endif
