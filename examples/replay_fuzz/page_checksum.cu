#include <cub/block/block_reduce.cuh>

#include "common/cuda_check.h"
#include "common/error.h"
#include "page_checksum.h"

namespace graphdecode::fuzz {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxLayers = 32;

struct ChecksumParams {
  const std::uint16_t* k[kMaxLayers];
  const std::uint16_t* v[kMaxLayers];
  std::int32_t layers;
  std::int64_t page_elems;  // heads * page_size * head_dim
  unsigned long long* out;  // [num_pages]
};

__device__ __forceinline__ std::uint32_t mix(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// One block per page; order-independent sum of position-salted hashes.
__global__ void __launch_bounds__(kThreads)
    checksum_kernel(const __grid_constant__ ChecksumParams p) {
  using Reduce = cub::BlockReduce<unsigned long long, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * p.page_elems;
  unsigned long long acc = 0;
  for (int l = 0; l < p.layers; ++l) {
    for (std::int64_t i = threadIdx.x; i < p.page_elems; i += kThreads) {
      const auto salt = static_cast<std::uint32_t>(i * 2654435761u + l * 97u);
      acc += mix(p.k[l][base + i] ^ salt);
      acc += static_cast<unsigned long long>(mix(p.v[l][base + i] ^ ~salt)) << 7;
    }
  }
  const unsigned long long sum = Reduce(temp).Sum(acc);
  if (threadIdx.x == 0) p.out[blockIdx.x] = sum;
}

}  // namespace

void page_checksums(const KvPool& pool, std::uint64_t* d_out, std::vector<std::uint64_t>& host,
                    cudaStream_t stream) {
  const KvShape& s = pool.config().shape;
  GD_REQUIRE(s.num_layers <= kMaxLayers, "num_layers", s.num_layers, "checksum covers 32 layers");
  ChecksumParams p{};
  for (int l = 0; l < s.num_layers; ++l) {
    const PagedKvView v = pool.view(l);
    p.k[l] = static_cast<const std::uint16_t*>(v.k);
    p.v[l] = static_cast<const std::uint16_t*>(v.v);
  }
  p.layers = s.num_layers;
  p.page_elems =
      static_cast<std::int64_t>(s.num_kv_heads) * pool.config().geometry.page_size * s.head_dim;
  p.out = reinterpret_cast<unsigned long long*>(d_out);
  const std::int32_t pages = pool.num_pages();
  checksum_kernel<<<pages, kThreads, 0, stream>>>(p);
  GD_CHECK_LAUNCH();
  host.resize(static_cast<std::size_t>(pages));
  GD_CUDA(cudaMemcpyAsync(host.data(), d_out, pages * sizeof(std::uint64_t), cudaMemcpyDeviceToHost,
                          stream));
  GD_CUDA(cudaStreamSynchronize(stream));
}

}  // namespace graphdecode::fuzz
