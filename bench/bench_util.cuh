// Pieces every benchmark binary shares: random device data, the L2 flush, medians, the device
// copy bandwidth that floors are measured against, the dense bf16 peak that compute fractions are
// taken of, the model shapes of the decode and prefill benches and the comma-list flag parser.
// Header-only: each bench is one TU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/buffers.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "common/stream.h"
#include "engine/model_config.h"

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

// The Llama-3.2-1B or Llama-3.1-8B shape (engine/model_config.h); --quick shrinks either to the
// same small model for a smoke run.
ModelConfig bench_model_config(const std::string& shape, bool quick) {
  ModelConfig c = shape == "8b" ? llama_8b_config() : llama_1b_config();
  if (!quick) return c;
  c.tie_word_embeddings = true;
  c.head_dim = 64;
  c.vocab_size = 32000;
  c.hidden_size = 512;
  c.intermediate_size = 1536;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.layers.assign(static_cast<std::size_t>(c.num_hidden_layers), LayerAttention{});
  c.validate();
  return c;
}

// Dense bf16 tensor peak (TFLOP/s, no sparsity) of the device, from its name, for the "% of
// peak" of compute-bound work; 0 when the name is not one we know (the fraction is then not
// reported). NVIDIA datasheets: H100 SXM and H200 SXM 989 (names "NVIDIA H100 80GB HBM3",
// "NVIDIA H200"), H100 NVL and H200 NVL 835, H100 PCIe 756. `source` says which entry matched.
double dense_bf16_peak_tflops(std::string_view name, std::string* source = nullptr) {
  struct Entry {
    std::string_view key;
    double tflops;
    std::string_view what;
  };
  // Most specific first: "H100 NVL" before "H100".
  constexpr Entry kTable[] = {
      {"H200 NVL", 835, "H200 NVL datasheet"}, {"H200", 989, "H200 SXM datasheet"},
      {"H100 NVL", 835, "H100 NVL datasheet"}, {"H100 PCIe", 756, "H100 PCIe datasheet"},
      {"H100", 989, "H100 SXM datasheet"},
  };
  for (const Entry& e : kTable) {
    if (name.find(e.key) == std::string_view::npos) continue;
    if (source) *source = std::string(e.what);
    return e.tflops;
  }
  if (source) *source = "unknown device";
  return 0;
}

// A flag's comma-separated items ("a,b" -> {"a", "b"}); an empty value is refused by name.
std::vector<std::string> split_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> v;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(item);
  GD_REQUIRE(!v.empty(), flag, text, "empty list");
  return v;
}

// "1,8,64" -> {1, 8, 64}; every entry positive.
std::vector<std::int32_t> parse_list(const std::string& flag, const std::string& text) {
  std::vector<std::int32_t> v;
  for (const std::string& item : split_list(flag, text)) {
    char* end = nullptr;
    const long x = std::strtol(item.c_str(), &end, 10);
    GD_REQUIRE(!item.empty() && *end == '\0' && x > 0 && x < (1l << 30), flag, item,
               "expected a comma-separated list of positive integers");
    v.push_back(static_cast<std::int32_t>(x));
  }
  return v;
}

// A bench's main: stdout line-buffered (so a run cut short by `timeout` still shows the rows it
// finished), then run(argc, argv); an exception is printed as "<name>: <what>", exit status 1.
inline int bench_main(const char* name, int argc, char** argv, int (*run)(int, char**)) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace
}  // namespace graphdecode::bench
