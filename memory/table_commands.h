// Compact commands that update the device request->page table incrementally.
//
// The host bookkeeping (RequestSlots) emits them; one kernel applies a whole batch on the device
// (device_page_table.h); apply_table_commands_host is the same semantics on the CPU, used as the
// reference in tests. A batch is two fixed-capacity arrays, so graphs/ can embed it in the per-step
// input struct that is copied to the device once per step.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "memory/pool_config.h"

namespace graphdecode {

enum TableOp : std::int32_t {
  kTableSetPages = 1,    // row[first_index + j] = page_ids[page_offset + j], j < count
  kTableClearPages = 2,  // row[first_index + j] = kInvalidPage, j < count (page_offset unused)
};

// One command: 20 bytes, trivially copyable, no pointers (offsets into the batch's page-id array),
// so it means the same on the host and in any device copy of the batch.
struct TableCommand {
  std::int32_t slot = 0;         // request slot (never kPaddingSlot)
  std::int32_t op = 0;           // TableOp
  std::int32_t first_index = 0;  // first logical page of the row that changes
  std::int32_t count = 0;        // entries that change
  std::int32_t page_offset = 0;  // kTableSetPages: index of the first page id in the id array
};
static_assert(std::is_trivially_copyable_v<TableCommand> && sizeof(TableCommand) == 20);

// Commands of one step, applied in order: a later command on the same entry wins. Fixed capacity,
// taken at construction; pushing never allocates.
class TableCommandBatch {
 public:
  TableCommandBatch(std::int32_t max_commands, std::int32_t max_page_ids);

  void clear() noexcept {
    num_commands_ = 0;
    num_page_ids_ = 0;
  }
  bool has_room(std::int32_t commands, std::int32_t page_ids) const noexcept {
    return commands <= max_commands() - num_commands_ && page_ids <= max_page_ids() - num_page_ids_;
  }
  // Throws Error naming "commands" or "page_ids" when the batch lacks room; changes nothing then.
  void require_room(std::int32_t commands, std::int32_t page_ids) const;

  // Both check room first (require_room) and append nothing on error.
  void push_set(std::int32_t slot, std::int32_t first_index, std::span<const std::int32_t> pages);
  void push_clear(std::int32_t slot, std::int32_t first_index, std::int32_t count);

  std::int32_t size() const noexcept { return num_commands_; }
  bool empty() const noexcept { return num_commands_ == 0; }
  std::int32_t page_id_count() const noexcept { return num_page_ids_; }
  std::int32_t max_commands() const noexcept { return static_cast<std::int32_t>(commands_.size()); }
  std::int32_t max_page_ids() const noexcept { return static_cast<std::int32_t>(page_ids_.size()); }
  std::span<const TableCommand> commands() const noexcept {
    return {commands_.data(), static_cast<std::size_t>(num_commands_)};
  }
  std::span<const std::int32_t> page_ids() const noexcept {
    return {page_ids_.data(), static_cast<std::size_t>(num_page_ids_)};
  }

 private:
  std::vector<TableCommand> commands_;  // [max_commands], first num_commands_ used
  std::vector<std::int32_t> page_ids_;  // [max_page_ids], first num_page_ids_ used
  std::int32_t num_commands_ = 0;
  std::int32_t num_page_ids_ = 0;
};

// Checks every command against the geometry and the page-id array (slot is a request slot, op
// known, index range inside the row, page ids inside the array and usable pages of this pool);
// throws naming the first bad field.
void validate_table_commands(std::span<const TableCommand> commands,
                             std::span<const std::int32_t> page_ids, const PoolGeometry& geometry);

// Reference semantics of the device apply kernel, on a host copy of the table
// ([max_slots][max_pages_per_slot]). Validates every command first (slot, op, index range,
// page-id range) and throws naming the bad field, leaving `table` unchanged.
void apply_table_commands_host(std::span<const TableCommand> commands,
                               std::span<const std::int32_t> page_ids, const PoolGeometry& geometry,
                               std::span<std::int32_t> table);

// The table of a fresh pool: the padding slot's row is all kReservedPage (so a padding row at any
// position lands on the dummy page), every other entry kInvalidPage.
void init_page_table_host(const PoolGeometry& geometry, std::span<std::int32_t> table);

}  // namespace graphdecode
