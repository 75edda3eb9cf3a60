#include "engine/runtime/step_context.h"

#include <string>

#include "common/error.h"

namespace graphdecode {

StepContext::StepContext(const StepCapacity& capacity, std::span<const LedgerPool> pools)
    : input_(capacity), prep_(input_), ledger_(pools) {
  GD_REQUIRE(ledger_.num_pools() == capacity.num_pools(), "pools", pools.size(),
             "the ledger needs exactly the step capacity's pools");
  for (std::int32_t i = 0; i < ledger_.num_pools(); ++i) {
    const PoolGeometry& a = capacity.pools[i].geometry;
    const PoolGeometry& b = ledger_.config(i).geometry;
    GD_REQUIRE(a.kind == b.kind && a.page_size == b.page_size && a.num_pages == b.num_pages &&
                   a.max_slots == b.max_slots && a.max_pages_per_slot == b.max_pages_per_slot &&
                   a.window_left == b.window_left,
               "pools[" + std::to_string(i) + "].geometry", "differs",
               "the ledger's pool differs from the step capacity's");
  }
}

void StepContext::attach_commands(StepDesc& desc) const {
  desc.tables = {};
  for (std::int32_t i = 0; i < ledger_.num_pools(); ++i) desc.tables[i] = &ledger_.commands(i);
}

}  // namespace graphdecode
