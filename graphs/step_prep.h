// Step preparation: from the raw step input (step_input.h) to every piece of metadata attention
// and the model read, in static buffers at fixed addresses.
//
// GPU path (StepPrep::enqueue, captured inside the step graph):
//   1. one launch_apply_table_commands per present pool kind, with pointers into the device image
//      (the command count is read on the device);
//   2. one single-block kernel (CUB BlockScan / BlockReduce, rounds of kPrepThreads rows) that
//      writes the metadata below for ALL max_batch rows and max_tokens token rows: rows past
//      num_requests and tokens past num_tokens get inert padding values (slot kPaddingSlot, lengths
//      0), so the result depends only on the step, never on the graph bucket.
// CPU path (prep_step_host): the same derivations in plain C++ through the same GD_HD rules
// (graphs/step_rules.h, common/request_rules.h), into the same layout; tests compare the two word
// for word.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "attention/paged_attention.h"
#include "common/buffers.h"
#include "graphs/step_input.h"

namespace graphdecode {

// Word offsets of the metadata block (one int32 buffer).
struct StepMetaLayout {
  // Scalars.
  static constexpr std::size_t kNumRequests = 0;
  static constexpr std::size_t kNumTokens = 1;      // = q_start[max_batch]
  static constexpr std::size_t kMaxQLen = 2;        // max over live rows of extend_len
  static constexpr std::size_t kMaxKvLen = 3;       // max over live rows of prefix + extend
  static constexpr std::size_t kMaxEncoderLen = 4;  // max over live rows of encoder_len
  static constexpr std::size_t kMode = 5;
  static constexpr std::size_t kTokensPerRequest = 6;
  static constexpr std::size_t kTotalKv = 7;       // = cu_seqlens_k[max_batch]
  static constexpr std::size_t kNumLogitRows = 8;  // rows selected for logits
  static constexpr std::size_t kLogitRows = 9;     // the step's LogitRows
  static constexpr std::size_t kScalarWords = 16;

  std::size_t slot = 0;            // [max_batch]      live: slot; padding: kPaddingSlot
  std::size_t q_start = 0;         // [max_batch + 1]  cu_seqlens_q; padding rows add 0
  std::size_t kv_len = 0;          // [max_batch]      prefix + extend; padding 0
  std::size_t encoder_len = 0;     // [max_batch]      cross keys; padding 0
  std::size_t cu_seqlens_k = 0;    // [max_batch + 1]  exclusive scan of kv_len
  std::size_t cu_encoder = 0;      // [max_batch + 1]  exclusive scan of encoder_len
  std::size_t token_request = 0;   // [max_tokens]     row of each new token; padding -1
  std::size_t token_slot = 0;      // [max_tokens]     slot of each new token; padding 0
  std::size_t token_position = 0;  // [max_tokens]     absolute position; padding 0
  std::size_t token_id = 0;        // [max_tokens]     token id; padding 0
  std::size_t logit_row = 0;       // [max_logit_rows] token row of each logits row; padding 0
  std::size_t total_words = 0;

  static StepMetaLayout compute(std::int32_t max_batch, std::int32_t max_tokens,
                                std::int32_t max_logit_rows);
  static StepMetaLayout compute(const StepCapacity& cap) {
    return compute(cap.max_batch, cap.max_tokens, cap.resolved_max_logit_rows());
  }
};

// Trivially copyable pointers into one metadata block (host or device).
struct StepMetaView {
  std::int32_t* scalars = nullptr;
  std::int32_t* slot = nullptr;
  std::int32_t* q_start = nullptr;
  std::int32_t* kv_len = nullptr;
  std::int32_t* encoder_len = nullptr;
  std::int32_t* cu_seqlens_k = nullptr;
  std::int32_t* cu_encoder = nullptr;
  std::int32_t* token_request = nullptr;
  std::int32_t* token_slot = nullptr;
  std::int32_t* token_position = nullptr;
  std::int32_t* token_id = nullptr;
  std::int32_t* logit_row = nullptr;

  static StepMetaView over(std::int32_t* block, const StepMetaLayout& layout);
};

// CPU path: `input` points at a HOST image (StepInputView::over a host array), `out` is a host
// block of layout.total_words words. Only the metadata is derived here; the table commands are
// applied on the host with apply_table_commands_host (memory/table_commands.h) when needed.
// `feedback` ([max_slots] host, or nullptr) resolves step_rules::kTokenFromDevice token ids;
// `chosen` ([max_batch] host, or nullptr) is the kChosenPerRequest row offsets.
void prep_step_host(const StepInputView& input, const StepCapacity& cap,
                    std::span<std::int32_t> out, const std::int32_t* feedback = nullptr,
                    const std::int32_t* chosen = nullptr);

// Attention batch over a metadata block: self (kv_len, window_left a [1] device int or nullptr
// for full) or cross (encoder_len). The step's prep block, or any block of the same layout (the
// phases of a speculative step).
AttentionBatch self_batch(const StepMetaView& meta, const std::int32_t* window_left) noexcept;
AttentionBatch cross_batch(const StepMetaView& meta) noexcept;

class StepPrep {
 public:
  // Allocates the metadata block. `input` must outlive this object.
  explicit StepPrep(const StepInput& input);
  StepPrep(const StepPrep&) = delete;
  StepPrep& operator=(const StepPrep&) = delete;

  // The device page table ([max_slots][max_pages_per_slot]) that pool `pool` of the step
  // capacity applies its commands to. Every present pool is bound before the first enqueue
  // (the pointers are baked into graphs).
  void bind_table(std::int32_t pool, std::int32_t* table);
  // Capture-safe: applies the table commands of every present pool, then derives the metadata.
  void enqueue(cudaStream_t stream) const;
  // The metadata kernel alone (no table commands); for benchmarks and tests.
  void enqueue_metadata(cudaStream_t stream) const;
  // Device buffer [max_slots] of the token each slot sampled last: token ids equal to
  // step_rules::kTokenFromDevice read it. Set before capture (the pointer is baked into graphs).
  void set_token_feedback(const std::int32_t* per_slot) noexcept { feedback_ = per_slot; }
  // Device buffer [max_batch] of row offsets that LogitRows::kChosenPerRequest selects (row
  // q_start[r] + chosen[r], clamped to the request's rows); nullptr = the last row. Set before
  // capture.
  void set_chosen_rows(const std::int32_t* per_request) noexcept { chosen_ = per_request; }

  // Device pointers into the metadata block.
  const StepMetaView& device() const noexcept { return view_; }
  const StepInput& input() const noexcept { return input_; }
  const StepMetaLayout& layout() const noexcept { return layout_; }
  // Synchronous download of the whole block (tests).
  void download(std::span<std::int32_t> host, cudaStream_t stream) const;

 private:
  const StepInput& input_;
  std::array<std::int32_t*, kMaxStepPools> tables_{};  // device page table per pool
  StepMetaLayout layout_;
  DeviceBuffer<std::int32_t> block_;  // [layout_.total_words]
  StepMetaView view_;
  const std::int32_t* feedback_ = nullptr;
  const std::int32_t* chosen_ = nullptr;
};

}  // namespace graphdecode
