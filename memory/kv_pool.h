// Device storage of one paged KV pool: per layer K and V in HND layout (memory/kv_layout.h), and
// the pool's device request->page table. All device memory is taken here, at start-up.
//
// A model has one pool per attention kind (full, sliding window, cross); all layers of that kind
// share the pool's page ids, its page table and its host bookkeeping (RequestSlots over a
// PageAllocator of geometry.num_pages pages).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/buffers.h"
#include "memory/device_page_table.h"
#include "memory/kv_layout.h"
#include "memory/pool_config.h"
#include "memory/table_commands.h"

namespace graphdecode {

struct KvPoolConfig {
  PoolGeometry geometry;
  KvShape shape;
  // Capacity of one table update (DevicePageTable::apply). 0 picks a default:
  // commands 4 * max_slots (a release, re-acquire and extend of every slot in one step), page ids
  // num_pages (every page of the pool handed out in one step).
  std::int32_t max_commands = 0;
  std::int32_t max_page_ids = 0;

  // Throws Error naming the first bad field (geometry, shape, capacities). No CUDA call.
  void validate() const;
  std::int32_t resolved_max_commands() const;
  std::int32_t resolved_max_page_ids() const;
};

class KvPool {
 public:
  // Validates, allocates K/V for every layer and the table, zeroes the K/V storage and resets the
  // table, all on `stream`.
  explicit KvPool(const KvPoolConfig& config, cudaStream_t stream = nullptr);

  // The view the attention kernels and write_new_kv take for `layer`.
  PagedKvView view(std::int32_t layer) const;
  DevicePageTable& table() noexcept { return table_; }
  const DevicePageTable& table() const noexcept { return table_; }
  // A host batch with this pool's table capacities.
  TableCommandBatch make_batch() const {
    return TableCommandBatch(table_.max_commands(), table_.max_page_ids());
  }

  const KvPoolConfig& config() const noexcept { return config_; }
  std::int32_t num_pages() const noexcept { return config_.geometry.num_pages; }
  // Usable tokens (reserved page excluded).
  std::int64_t token_capacity() const noexcept { return config_.geometry.token_capacity(); }
  // Bytes of K/V storage (all layers).
  std::size_t kv_bytes() const noexcept { return storage_.bytes(); }

 private:
  KvPoolConfig config_;
  std::size_t layer_elems_ = 0;          // elements of K (or V) of one layer
  DeviceBuffer<std::uint16_t> storage_;  // [num_layers][2 (K, V)][num_pages][heads][page][dim]
  DevicePageTable table_;
};

}  // namespace graphdecode
