#include "engine/request_tables.h"

#include <string>

#include "common/error.h"
#include "common/request_rules.h"

namespace graphdecode {
namespace {
constexpr int kCross = static_cast<int>(AttentionKind::kCross);
}

RequestTables::RequestTables(const StepCapacity& cap) {
  for (int k = 0; k < kNumPoolKinds; ++k) {
    const StepPoolCapacity& pc = cap.pools[k];
    if (!pc.present) continue;
    alloc_[k] = std::make_unique<PageAllocator>(pc.geometry.num_pages);
    slots_[k] = std::make_unique<RequestSlots>(pc.geometry, *alloc_[k]);
    cmds_[k] = std::make_unique<TableCommandBatch>(pc.max_commands, pc.max_page_ids);
    if (first_pool_ < 0) first_pool_ = k;
  }
  GD_REQUIRE(first_pool_ >= 0, "capacity.pools", "none", "a model needs at least one KV pool");
}

std::int32_t RequestTables::acquire() {
  // Slot books of a model's pools are created together and always acquired and released
  // together, so they hand out the same id; checked anyway.
  std::int32_t slot = -1;
  for (int k = 0; k < kNumPoolKinds; ++k) {
    if (!slots_[k]) continue;
    const std::int32_t s = slots_[k]->acquire();
    GD_REQUIRE(slot < 0 || s == slot, "slot", s, "pools handed out different slots");
    slot = s;
  }
  return slot;
}

void RequestTables::extend(std::int32_t slot, std::int32_t tokens) {
  // Room for the commands of this extend and of a rollback, in every pool, before any change:
  // after this, a pool can only refuse for want of pages, and a rollback cannot fail.
  for (int k = 0; k < kNumPoolKinds; ++k) {
    if (!slots_[k] || k == kCross) continue;
    const std::int32_t page = slots_[k]->geometry().page_size;
    cmds_[k]->require_room(2 * RequestSlots::kMaxCommandsPerOp, pages_for_tokens(tokens, page) + 1);
  }
  std::array<std::int32_t, kNumPoolKinds> before{};
  int done = 0;
  try {
    for (; done < kNumPoolKinds; ++done) {
      if (!slots_[done] || done == kCross) continue;
      before[done] = slots_[done]->tokens(slot);
      slots_[done]->extend(slot, tokens, *cmds_[done]);
    }
  } catch (...) {
    for (int k = 0; k < done; ++k) {  // undo the pools that took the extend
      if (slots_[k] && k != kCross) slots_[k]->truncate(slot, before[k], *cmds_[k]);
    }
    throw;
  }
}

void RequestTables::set_encoder(std::int32_t slot, std::int32_t encoder_len) {
  GD_REQUIRE(slots_[kCross] != nullptr, "pools.cross", "absent", "the model has no cross pool");
  slots_[kCross]->extend(slot, encoder_len, *cmds_[kCross]);
}

void RequestTables::release(std::int32_t slot) {
  for (int k = 0; k < kNumPoolKinds; ++k) {
    if (!slots_[k]) continue;
    GD_REQUIRE(slots_[k]->is_active(slot), "slot", slot, "is not an active request slot");
    cmds_[k]->require_room(RequestSlots::kMaxCommandsPerOp, 0);
  }
  for (int k = 0; k < kNumPoolKinds; ++k) {
    if (slots_[k]) slots_[k]->release(slot, *cmds_[k]);
  }
}

void RequestTables::attach(StepDesc& step) const {
  for (int k = 0; k < kNumPoolKinds; ++k) step.tables[k] = cmds_[k].get();
}

void RequestTables::clear_commands() {
  for (auto& c : cmds_) {
    if (c) c->clear();
  }
}

std::int32_t RequestTables::tokens(std::int32_t slot) const {
  return slots_[first_pool_]->tokens(slot);
}

}  // namespace graphdecode
