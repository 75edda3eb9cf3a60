// Probe: the DRAM read rate the stream kernels' ring can reach, against a plain load loop and the
// D2D copy rate the issue-38 floor is measured with, for a long stream and for a burst the size of
// one MLP block (bench/NOTES.md 115: the 1B block streams 100.6 MB in ~31 us, ~3.3 TB/s, where
// the floor's copy rate is ~4.2 TB/s and lm_head's 525 MB stream GEMV reaches ~4.0).
//   copy   cudaMemcpyAsync D2D; rate = (read + write bytes) / time, as bench_decode's floor
//   ldg    SMs x 4 CTAs of 256 threads, 16-byte loads, 4 in flight a thread, grid-stride
//   ring   the stream GEMV's CTA without its math (engine/kernels/stream_ring.cuh produce_item,
//          the same bulk copies and mbarriers): one CTA an SM, a producer warp, 8 consumer warps
//          that wait for each stage, read one word of it and release it; each CTA streams a
//          contiguous slice of tiles of 8 rows (row bytes x stages as given)
// Each mode reads `bytes` starting at a rotating offset of a 2 GiB buffer (never the L2's copy of
// the last rep), filled with a non-zero pattern; median of `reps` launches, CUDA events around
// each. The burst sizes show each kernel's start and end (ramp and tail), the long ones the rate;
// the last rows split one 100 MB stream over 2 or 4 kernels back to back (plain or PDL): what a
// kernel boundary costs a stream.
//   build/bench/probe_read_rate [--reps N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/buffers.h"
#include "common/cuda_check.h"
#include "common/pdl.cuh"
#include "common/stream.h"
#include "engine/kernels/stream_ring.cuh"

namespace graphdecode {
namespace {

using namespace detail::ring;
using detail::mbar_arrive;
using detail::mbar_wait;

constexpr std::size_t kBufferBytes = std::size_t{2} << 30;

__global__ void __launch_bounds__(256)
    ldg_kernel(const uint4* in, std::size_t n16, unsigned* sink) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  unsigned acc = 0;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    const uint4 a = __ldcs(in + i), b = __ldcs(in + i + stride), c = __ldcs(in + i + 2 * stride),
                d = __ldcs(in + i + 3 * stride);
    acc ^= a.x ^ b.y ^ c.z ^ d.w;
  }
  for (; i < n16; i += stride) acc ^= __ldcs(in + i).x;
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads; never true for the fill pattern
}

struct RingProbe {
  const std::uint16_t* w;  // [tiles x 8 rows][row_elems]
  int tiles, row_elems;
  RingShape ring;
  unsigned* sink;
  bool pdl;  // as the stream kernels: the first fill before the wait for the prior grid
};

__global__ void __launch_bounds__(kThreads, 1) ring_kernel(const __grid_constant__ RingProbe p) {
  extern __shared__ __align__(128) unsigned char smem[];
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(smem);
  std::uint64_t* empty = full + kMaxStages;
  unsigned char* ring = smem + kFixedBytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t0 = static_cast<int>(static_cast<std::int64_t>(blockIdx.x) * p.tiles / gridDim.x);
  const int t1 = static_cast<int>(static_cast<std::int64_t>(blockIdx.x + 1) * p.tiles / gridDim.x);
  init_ring(full, empty, p.ring.stages);
  const int chunks = p.row_elems / p.ring.chunk_k;
  if (warp == 0) {
    int i = 0;
    for (int t = t0; t < t1; ++t)
      for (int c = 0; c < chunks; ++c) {
        if (p.pdl && i == p.ring.stages) {
          pdl_wait_for_prior_grid();
          pdl_launch_dependents();
        }
        produce_item(p.ring, ring, full, empty, i++, p.w, p.row_elems, t * kTileRows, kTileRows,
                     c * p.ring.chunk_k, p.ring.chunk_k, lane);
      }
    if (p.pdl && i <= p.ring.stages) {
      pdl_wait_for_prior_grid();
      pdl_launch_dependents();
    }
    return;
  }
  if (p.pdl) {
    pdl_wait_for_prior_grid();
    pdl_launch_dependents();
  }
  RingCursor cur;
  unsigned acc = 0;
  for (int item = 0; item < (t1 - t0) * chunks; ++item) {
    mbar_wait(&full[cur.s], cur.phase);
    acc ^= reinterpret_cast<const unsigned*>(ring + cur.s * p.ring.stage_bytes)[lane];
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[cur.s]);
    cur.advance(p.ring.stages);
  }
  if (acc == 0x12345678u) *p.sink = acc;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace
}  // namespace graphdecode

int main(int argc, char** argv) {
  using namespace graphdecode;
  int reps = 20;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(3, std::atoi(argv[i + 1]));
  Stream s;
  cudaDeviceProp prop{};
  GD_CUDA(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  DeviceBuffer<uint4> buf(kBufferBytes / 16);
  buf.fill_bytes(0x5a, s.get());
  DeviceBuffer<uint4> dst(kBufferBytes / 32);
  DeviceBuffer<unsigned> sink(1);
  GD_CUDA(cudaFuncSetAttribute(ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(prop.sharedMemPerBlockOptin)));
  cudaEvent_t a, b;
  GD_CUDA(cudaEventCreate(&a));
  GD_CUDA(cudaEventCreate(&b));
  // Times `launch(offset_bytes)` over reps, the offset rotating through the buffer.
  const auto time_us = [&](std::size_t bytes, auto launch) {
    std::vector<double> us;
    const std::size_t slots = kBufferBytes / bytes;
    for (int r = 0; r < reps + 2; ++r) {
      const std::size_t off = (static_cast<std::size_t>(r) % slots) * bytes;
      GD_CUDA(cudaEventRecord(a, s.get()));
      launch(off);
      GD_CUDA(cudaEventRecord(b, s.get()));
      GD_CUDA(cudaEventSynchronize(b));
      float ms = 0;
      GD_CUDA(cudaEventElapsedTime(&ms, a, b));
      if (r >= 2) us.push_back(ms * 1e3);
    }
    return median(us);
  };
  std::printf("%s, %d SMs, median of %d, L2 never warm\n", prop.name, sms, reps);
  std::printf("%-34s %10s %9s %9s\n", "mode", "MB read", "us", "TB/s");
  const auto row = [](const char* name, std::size_t bytes, double us, double moved) {
    std::printf("%-34s %10.1f %9.2f %9.3f\n", name, bytes / 1e6, us, moved / us / 1e6);
  };
  for (const std::size_t bytes : {std::size_t{512} << 20, std::size_t{100} << 20}) {
    const std::size_t copy = bytes / 2;  // read + write = bytes
    const double t = time_us(copy, [&](std::size_t off) {
      GD_CUDA(cudaMemcpyAsync(dst.data(), reinterpret_cast<const char*>(buf.data()) + off, copy,
                              cudaMemcpyDeviceToDevice, s.get()));
    });
    row("copy (read + write bytes)", bytes, t, static_cast<double>(bytes));
  }
  for (const std::size_t bytes : {std::size_t{1} << 30, std::size_t{100} << 20}) {
    const double t = time_us(bytes, [&](std::size_t off) {
      ldg_kernel<<<sms * 4, 256, 0, s.get()>>>(buf.data() + off / 16, bytes / 16, sink.data());
      GD_CHECK_LAUNCH();
    });
    row("ldg", bytes, t, static_cast<double>(bytes));
  }
  struct Geometry {
    int row_bytes, stages;
  };
  for (const Geometry g :
       {Geometry{4096, 6}, Geometry{2048, 8}, Geometry{4096, 4}, Geometry{8192, 3}}) {
    if (g.stages > kMaxStages) continue;
    for (const std::size_t bytes :
         {std::size_t{1} << 30, std::size_t{100} << 20, std::size_t{12} << 20}) {
      RingProbe p{};
      p.row_elems = 8192;  // 16 KB rows (W_down's at the 1B shape), chunk_k a stage's row
      p.tiles = static_cast<int>(bytes / (static_cast<std::size_t>(kTileRows) * p.row_elems * 2));
      p.ring.chunk_k = g.row_bytes / 2;
      p.ring.stage_row_bytes = g.row_bytes;  // no pad: the probe never reads across rows
      p.ring.stage_bytes = kTileRows * g.row_bytes;
      p.ring.stages = g.stages;
      p.sink = sink.data();
      const std::size_t smem =
          kFixedBytes + static_cast<std::size_t>(g.stages) * p.ring.stage_bytes;
      const int grid = std::min(sms, p.tiles);
      const double t = time_us(bytes, [&](std::size_t off) {
        p.w =
            reinterpret_cast<const std::uint16_t*>(reinterpret_cast<const char*>(buf.data()) + off);
        ring_kernel<<<grid, kThreads, smem, s.get()>>>(p);
        GD_CHECK_LAUNCH();
      });
      char name[64];
      std::snprintf(name, sizeof(name), "ring %d B rows x 8, %d stages", g.row_bytes, g.stages);
      row(name, bytes, t, static_cast<double>(p.tiles) * kTileRows * p.row_elems * 2);
    }
  }
  // What a kernel boundary costs a stream: 100 MB (800 tiles) as one ring kernel, then as two or
  // four kernels back to back over the same tiles, plain launches or PDL (the second's first fill
  // before its wait, as the engine's stream kernels), at the MLP block's geometry.
  {
    RingProbe p{};
    p.row_elems = 8192;
    p.ring.chunk_k = 2048;
    p.ring.stage_row_bytes = 4096;
    p.ring.stage_bytes = kTileRows * 4096;
    p.ring.stages = 6;
    p.sink = sink.data();
    const std::size_t smem = kFixedBytes + static_cast<std::size_t>(6) * p.ring.stage_bytes;
    const std::size_t tile_bytes = static_cast<std::size_t>(kTileRows) * p.row_elems * 2;
    const int tiles = 800;
    const std::size_t bytes = tiles * tile_bytes;
    for (const int parts : {1, 2, 4})
      for (const bool pdl : {false, true}) {
        if (parts == 1 && pdl) continue;
        const double t = time_us(bytes, [&](std::size_t off) {
          for (int k = 0; k < parts; ++k) {
            RingProbe q = p;
            q.tiles = tiles / parts;
            q.pdl = pdl;
            q.w = reinterpret_cast<const std::uint16_t*>(reinterpret_cast<const char*>(buf.data()) +
                                                         off + k * q.tiles * tile_bytes);
            const dim3 grid(static_cast<unsigned>(std::min(sms, q.tiles)));
            if (pdl)
              launch_pdl(ring_kernel, grid, dim3(kThreads), smem, s.get(), q);
            else
              ring_kernel<<<grid, kThreads, smem, s.get()>>>(q);
            GD_CHECK_LAUNCH();
          }
        });
        char name[64];
        std::snprintf(name, sizeof(name), "ring 100 MB as %d kernel%s%s", parts,
                      parts > 1 ? "s" : "", pdl ? ", PDL" : "");
        row(name, bytes, t, static_cast<double>(bytes));
      }
  }
  GD_CUDA(cudaEventDestroy(a));
  GD_CUDA(cudaEventDestroy(b));
  return 0;
}
