// Pieces every benchmark binary shares: random device data, the L2 flush, medians and the
// device copy bandwidth that floors are measured against. Header-only: each bench is one TU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/buffers.h"
#include "common/cuda_check.h"
#include "common/stream.h"

namespace graphdecode::bench {
namespace {

__device__ std::uint32_t hash32(std::uint64_t x) {  // murmur3 finalizer
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

// Random bf16 with magnitude uniform in [min_mag, 1] and a random sign (min_mag > 0: never zero).
__global__ void fill_random_bf16(__nv_bfloat16* p, std::size_t n, std::uint64_t seed,
                                 float min_mag) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t h = hash32(i * 0x9e3779b97f4a7c15ull + seed);
    const float mag = min_mag + (1.f - min_mag) * ((h & 0xffffffu) * (1.f / 16777216.f));
    p[i] = __float2bfloat16_rn((h >> 31) ? -mag : mag);
  }
}

// bf16 bits in [-1, -1/64] U [1/64, 1] (K/V, Q, weights: never timed on zeros).
void fill_random(std::uint16_t* p, std::size_t n, std::uint64_t seed, cudaStream_t s,
                 float min_mag = 1.f / 64.f) {
  fill_random_bf16<<<1024, 256, 0, s>>>(reinterpret_cast<__nv_bfloat16*>(p), n, seed, min_mag);
  GD_CHECK_LAUNCH();
}
void fill_random(DeviceBuffer<std::uint16_t>& buf, std::uint64_t seed, cudaStream_t s,
                 float min_mag = 1.f / 64.f) {
  fill_random(buf.data(), buf.size(), seed, s, min_mag);
}

// Reads the whole buffer (evicting the L2 with clean lines: no write-back lands in a timed
// step); the store never happens in practice but keeps the loads alive.
__global__ void l2_flush_read(const int4* p, std::size_t n, int* sink) {
  int acc = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7fffffff) *sink = acc;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median GB/s of a D2D cudaMemcpy, counting read + write bytes.
double copy_bandwidth_gbps(cudaStream_t s) {
  std::size_t free_b = 0, total_b = 0;
  GD_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const std::size_t bytes =
      std::min<std::size_t>(std::size_t{1} << 30, free_b / 4) & ~std::size_t{255};
  DeviceBuffer<char> a(bytes), b(bytes);
  a.fill_bytes(1, s);
  for (int i = 0; i < 3; ++i)
    GD_CUDA(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, s));
  std::vector<double> ms;
  Event e0, e1;
  for (int i = 0; i < 20; ++i) {
    e0.record(s);
    GD_CUDA(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, s));
    e1.record(s);
    e1.synchronize();
    ms.push_back(e1.elapsed_ms_since(e0));
  }
  return 2.0 * static_cast<double>(bytes) / (median(ms) * 1e-3) / 1e9;
}

}  // namespace
}  // namespace graphdecode::bench
