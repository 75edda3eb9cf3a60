// Host bookkeeping of a model's requests across its KV pools (full, sliding window, cross): one
// slot id per request, the same row in every pool's page table, and the page-table commands of
// the step being built. Pure host code (no CUDA), so it is tested on the CPU.
//
// Every operation is all-or-nothing across pools: when a later pool refuses (exhausted, bad
// slot), the pools already changed are rolled back, so the pools never disagree about a request.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "graphs/step_input.h"
#include "memory/page_allocator.h"
#include "memory/request_slots.h"
#include "memory/table_commands.h"

namespace graphdecode {

class RequestTables {
 public:
  // One allocator, slot book and command batch per pool present in `capacity`.
  explicit RequestTables(const StepCapacity& capacity);

  // A free slot, the same in every pool. Error "max_slots" when none is free.
  std::int32_t acquire();
  // Reserves `tokens` more positions for the request in its self-attention pools (full and
  // sliding window: page allocation, window eviction) and records the step's table commands.
  void extend(std::int32_t slot, std::int32_t tokens);
  // The cross/encoder pool is written once per request: its encoder length.
  void set_encoder(std::int32_t slot, std::int32_t encoder_len);
  // Returns every page of the request in every pool and frees the slot.
  void release(std::int32_t slot);

  // Points the step's table batches at this step's commands; clear_commands() once submitted.
  void attach(StepDesc& step) const;
  void clear_commands();

  std::int32_t tokens(std::int32_t slot) const;  // KV extent held (the same in every pool)
  bool has_pool(int kind) const noexcept { return slots_[kind] != nullptr; }
  const RequestSlots& pool(int kind) const { return *slots_[kind]; }

 private:
  std::array<std::unique_ptr<PageAllocator>, kNumPoolKinds> alloc_;
  std::array<std::unique_ptr<RequestSlots>, kNumPoolKinds> slots_;
  std::array<std::unique_ptr<TableCommandBatch>, kNumPoolKinds> cmds_;
  int first_pool_ = -1;
};

}  // namespace graphdecode
