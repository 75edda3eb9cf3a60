// Per-page checksums of a KV pool (all layers, K and V), computed on the device: the fuzzer's
// proof that a step left pages it must not touch bit for bit unchanged.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "memory/kv_pool.h"

namespace graphdecode::fuzz {

// out: [num_pages] device. Synchronous download into `host`.
void page_checksums(const KvPool& pool, std::uint64_t* d_out, std::vector<std::uint64_t>& host,
                    cudaStream_t stream);

}  // namespace graphdecode::fuzz
