// The device-resident request->page table of one pool, [max_slots][max_pages_per_slot] int32,
// changed only by applying TableCommand batches (host bookkeeping: request_slots.h).
//
// Two ways in:
//  - launch_apply_table_commands: device pointers only (commands, count, page ids). Capture-safe:
//    the command count is read from device memory, the grid is sized from max_slots (a
//    capacity), and blocks with nothing to do exit. graphs/ launches this inside its graph with
//    pointers into the per-step input struct.
//  - DevicePageTable::apply: the eager path; stages a host batch through pinned memory (one copy)
//    and launches the same kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "common/buffers.h"
#include "common/stream.h"
#include "memory/pool_config.h"
#include "memory/table_commands.h"

namespace graphdecode {

// Trivially copyable kernel parameters (passed by value as __grid_constant__).
struct TableApplyParams {
  const TableCommand* commands = nullptr;      // [max_commands]
  const std::int32_t* num_commands = nullptr;  // [1] commands to apply, read on the device
  const std::int32_t* page_ids = nullptr;      // [max_page_ids]
  std::int32_t* page_table = nullptr;          // [max_slots][max_pages_per_slot]
  std::int32_t max_commands = 0;
  std::int32_t max_page_ids = 0;
  std::int32_t max_slots = 0;
  std::int32_t max_pages_per_slot = 0;
  std::int32_t num_pages = 0;  // page ids outside (kReservedPage, num_pages) are never written
};

// Applies commands [0, min(*num_commands, max_commands)) in order: one block per slot scans the
// batch, so commands on the same slot apply in batch order and a later one wins. The kernel
// skips (never writes out of bounds for) malformed commands; validate on the host for errors.
// Throws Error naming the field when a pointer is null or a capacity is not positive.
void launch_apply_table_commands(const TableApplyParams& params, cudaStream_t stream);

class DevicePageTable {
 public:
  // Allocates the table and the command staging; the table starts as reset() leaves it.
  DevicePageTable(const PoolGeometry& geometry, std::int32_t max_commands,
                  std::int32_t max_page_ids, cudaStream_t stream = nullptr);

  // Fresh state: the padding slot's row all kReservedPage, every other entry kInvalidPage.
  void reset(cudaStream_t stream);

  // Validates the batch (capacity, then every command; Error names the field and nothing is
  // copied or launched), then one pinned->device copy and one kernel launch on `stream`. May wait
  // for the previous apply's copy to finish before reusing the pinned staging.
  void apply(const TableCommandBatch& batch, cudaStream_t stream);

  // Synchronous copy of the whole table to `host` ([max_slots][max_pages_per_slot]); for tests.
  void download(std::span<std::int32_t> host, cudaStream_t stream) const;

  const std::int32_t* data() const noexcept { return table_.data(); }
  // For TableApplyParams::page_table when graphs/ launches the apply kernel itself.
  std::int32_t* data() noexcept { return table_.data(); }
  const PoolGeometry& geometry() const noexcept { return geometry_; }
  std::int32_t max_commands() const noexcept { return max_commands_; }
  std::int32_t max_page_ids() const noexcept { return max_page_ids_; }

 private:
  PoolGeometry geometry_;
  std::int32_t max_commands_ = 0;
  std::int32_t max_page_ids_ = 0;
  DeviceBuffer<std::int32_t> table_;  // [max_slots][max_pages_per_slot]
  // Staging layout, in int32 words: [0] command count, [kHeaderWords ...) commands,
  // [page_ids_word_ ...) page ids. Same layout on both sides, so one copy moves a batch.
  PinnedBuffer<std::int32_t> staging_host_;
  DeviceBuffer<std::int32_t> staging_dev_;
  std::size_t page_ids_word_ = 0;
  Event staged_{cudaEventDisableTiming};  // the last staging copy; waited on before reuse
  bool staged_pending_ = false;
};

}  // namespace graphdecode
