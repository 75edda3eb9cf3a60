// Pool geometry of a stack of attention layers: one KvPool per attention kind present (full,
// sliding window, cross), sized from an AttentionStackConfig, and the per-step table capacities
// the step input carries for each. Shared by AttentionStack and the model (engine/llama_model.h),
// so both size their pools, and the step input that feeds them, from one definition.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <memory>

#include "graphs/attention_stack.h"
#include "graphs/step_input.h"
#include "graphs/step_prep.h"
#include "memory/kv_pool.h"

namespace graphdecode {

using StackPools = std::array<std::unique_ptr<KvPool>, kNumPoolKinds>;

// The pool of one attention kind: full pools hold max_kv_len per slot (or full_pages in all),
// sliding pools the window plus max_new_tokens per request, cross pools max_encoder_len per slot.
KvPoolConfig stack_pool_config(const AttentionStackConfig& config, AttentionKind kind);

// Table commands and page ids one step may carry for the pool of `kind`.
StepPoolCapacity stack_step_pool_capacity(const AttentionStackConfig& config, AttentionKind kind);

// Validates `config` and allocates the pools of every kind it uses (others stay null).
StackPools make_stack_pools(const AttentionStackConfig& config, cudaStream_t stream);

// The device page tables of the present pools, for StepPrep.
StepPrepTables stack_prep_tables(const StackPools& pools);

}  // namespace graphdecode
