// The state of one step that every model in it shares: the step input (the one image the host
// writes per step), the prep that derives the metadata on the device, and the page ledger of
// every pool of every model (the host's book of slots and pages, whose commands the image
// carries). A target and its draft run on one StepContext, each with its own pools
// (ModelRuntime).
#pragma once

#include <span>

#include "graphs/step_input.h"
#include "graphs/step_prep.h"
#include "memory/kv_ledger.h"

namespace graphdecode {

class StepContext {
 public:
  // `capacity` from step_capacity() (plus the program's aux words / token feedback), `pools`
  // from ledger_pools() of the same capacity. Allocates the image and the metadata block.
  StepContext(const StepCapacity& capacity, std::span<const LedgerPool> pools);
  StepContext(const StepContext&) = delete;
  StepContext& operator=(const StepContext&) = delete;

  StepInput& input() noexcept { return input_; }
  const StepInput& input() const noexcept { return input_; }
  StepPrep& prep() noexcept { return prep_; }
  const StepPrep& prep() const noexcept { return prep_; }
  KvLedger& ledger() noexcept { return ledger_; }
  const KvLedger& ledger() const noexcept { return ledger_; }
  const StepCapacity& capacity() const noexcept { return input_.capacity(); }

  // Points desc.tables at the ledger's commands of the step being built (clear them with
  // ledger().clear_commands() once the step is written).
  void attach_commands(StepDesc& desc) const;

 private:
  StepInput input_;
  StepPrep prep_;
  KvLedger ledger_;
};

}  // namespace graphdecode
