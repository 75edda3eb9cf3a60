#include "memory/table_commands.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "common/request_rules.h"

namespace graphdecode {

TableCommandBatch::TableCommandBatch(std::int32_t max_commands, std::int32_t max_page_ids) {
  GD_REQUIRE(max_commands >= 1, "max_commands", max_commands, "a batch holds at least 1 command");
  GD_REQUIRE(max_page_ids >= 0, "max_page_ids", max_page_ids, "capacity cannot be negative");
  commands_.resize(static_cast<std::size_t>(max_commands));
  page_ids_.resize(static_cast<std::size_t>(max_page_ids));
}

void TableCommandBatch::require_room(std::int32_t commands, std::int32_t page_ids) const {
  GD_REQUIRE(commands <= max_commands() - num_commands_, "commands", num_commands_ + commands,
             "table command batch full (max_commands = " + std::to_string(max_commands()) + ")");
  GD_REQUIRE(page_ids <= max_page_ids() - num_page_ids_, "page_ids", num_page_ids_ + page_ids,
             "table command batch full (max_page_ids = " + std::to_string(max_page_ids()) + ")");
}

void TableCommandBatch::push_set(std::int32_t slot, std::int32_t first_index,
                                 std::span<const std::int32_t> pages) {
  const auto n = static_cast<std::int32_t>(pages.size());
  require_room(1, n);
  commands_[static_cast<std::size_t>(num_commands_++)] =
      TableCommand{slot, kTableSetPages, first_index, n, num_page_ids_};
  std::copy(pages.begin(), pages.end(), page_ids_.begin() + num_page_ids_);
  num_page_ids_ += n;
}

void TableCommandBatch::push_clear(std::int32_t slot, std::int32_t first_index,
                                   std::int32_t count) {
  require_room(1, 0);
  commands_[static_cast<std::size_t>(num_commands_++)] =
      TableCommand{slot, kTableClearPages, first_index, count, 0};
}

void validate_table_commands(std::span<const TableCommand> commands,
                             std::span<const std::int32_t> page_ids, const PoolGeometry& geometry) {
  const std::int64_t row_len = geometry.max_pages_per_slot;
  const auto num_page_ids = static_cast<std::int64_t>(page_ids.size());
  for (const TableCommand& c : commands) {
    GD_REQUIRE(c.slot > kPaddingSlot && c.slot < geometry.max_slots, "slot", c.slot,
               "command targets the padding slot or a slot out of range");
    GD_REQUIRE(c.op == kTableSetPages || c.op == kTableClearPages, "op", c.op, "unknown table op");
    GD_REQUIRE(c.count >= 0 && c.first_index >= 0 && c.first_index <= row_len - c.count,
               "first_index", c.first_index, "command range leaves the row");
    if (c.op == kTableSetPages) {
      GD_REQUIRE(
          c.page_offset >= 0 && static_cast<std::int64_t>(c.page_offset) + c.count <= num_page_ids,
          "page_offset", c.page_offset, "command reads past the page-id array");
      for (std::int32_t j = 0; j < c.count; ++j) {
        const std::int32_t page = page_ids[static_cast<std::size_t>(c.page_offset + j)];
        GD_REQUIRE(page > kReservedPage && page < geometry.num_pages, "page_id", page,
                   "set command carries a page id that is reserved or not in this pool");
      }
    }
  }
}

void apply_table_commands_host(std::span<const TableCommand> commands,
                               std::span<const std::int32_t> page_ids, const PoolGeometry& geometry,
                               std::span<std::int32_t> table) {
  geometry.validate();
  const std::int64_t row_len = geometry.max_pages_per_slot;
  GD_REQUIRE(static_cast<std::int64_t>(table.size()) == geometry.max_slots * row_len, "table",
             table.size(), "host table must be [max_slots][max_pages_per_slot]");
  validate_table_commands(commands, page_ids, geometry);
  for (const TableCommand& c : commands) {
    std::int32_t* row = table.data() + c.slot * row_len;
    for (std::int32_t j = 0; j < c.count; ++j) {
      row[c.first_index + j] = c.op == kTableSetPages
                                   ? page_ids[static_cast<std::size_t>(c.page_offset + j)]
                                   : kInvalidPage;
    }
  }
}

void init_page_table_host(const PoolGeometry& geometry, std::span<std::int32_t> table) {
  geometry.validate();
  const std::int64_t row_len = geometry.max_pages_per_slot;
  GD_REQUIRE(static_cast<std::int64_t>(table.size()) == geometry.max_slots * row_len, "table",
             table.size(), "host table must be [max_slots][max_pages_per_slot]");
  std::fill(table.begin(), table.end(), kInvalidPage);
  std::fill(table.begin(), table.begin() + row_len, kReservedPage);
}

}  // namespace graphdecode
