// The raw per-step input: the ONLY data the host produces for a step.
//
// One contiguous, fixed-capacity image of int32 words (layout computed once from the capacities)
// lives in pinned host memory and in one device buffer. A step is
//   StepInput::write(desc)   host: validate everything, then fill the pinned image
//   StepInput::upload(s)     one cudaMemcpyAsync of the image to the device buffer
// and the prep kernels (step_prep.h), captured in the graph, derive all attention metadata from
// the device image.
//
// The copy is issued on the stream JUST BEFORE the graph launch, not recorded as a memcpy node in
// the graph: the pinned side is a ring of two images (so the host can fill step t+1 while the copy
// of step t is in flight), and a memcpy node would freeze one source address into the graph. The
// device image has one fixed address, which is what the graph reads.
//
// Semantics (DESIGN.md): prefix_len = tokens already cached; extend_len = tokens this step adds;
// KV extent = prefix_len + extend_len; new tokens sit at positions prefix_len .. extent-1.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/buffers.h"
#include "common/stream.h"
#include "graphs/step_mode.h"
#include "memory/pool_config.h"
#include "memory/table_commands.h"

namespace graphdecode {

// A step's KV pools: one per attention kind of each model in the step (a target and its draft
// each have their own), at most kMaxStepPools. Pool i's commands and page ids are section i.
inline constexpr int kMaxStepPools = 6;

// One request of a step. One slot id per request, shared by every pool kind (the engine acquires
// the same slot in each of its pools).
struct StepRequest {
  std::int32_t slot = 0;         // request slot in [1, max_slots); never kPaddingSlot
  std::int32_t prefix_len = 0;   // tokens already in the KV cache
  std::int32_t extend_len = 0;   // new tokens this step
  std::int32_t encoder_len = 0;  // cross-attention keys of this request (0 = none)
};

struct StepPoolCapacity {
  bool present = false;
  PoolGeometry geometry;          // commands are validated against it (max_slots must match)
  std::int32_t model = 0;         // which model of the step owns the pool (0 = the target)
  std::int32_t max_commands = 0;  // table commands per step
  std::int32_t max_page_ids = 0;  // page ids per step
};

struct StepCapacity {
  std::int32_t max_batch = 0;        // requests per step
  std::int32_t max_tokens = 0;       // new tokens per step (sum of extend_len)
  std::int32_t max_slots = 0;        // page-table rows, padding slot included
  std::int32_t max_kv_len = 0;       // longest prefix_len + extend_len
  std::int32_t max_encoder_len = 0;  // longest encoder_len (0: no cross-attention)
  // Logits rows one step may select (LogitRows): >= max_batch; kEveryRow needs one per token.
  // 0 = max_batch.
  std::int32_t max_logit_rows = 0;
  // Speculative steps (StepMode::kSpeculative): most draft tokens per request; 0 = none.
  std::int32_t max_draft_tokens = 0;
  // Words of program-defined data per request carried in the same copy (e.g. the engine's
  // sampling parameters); the prep kernels do not read them. 0 = none.
  std::int32_t aux_words = 0;
  // Token ids may be step_rules::kTokenFromDevice (taken from the device feedback buffer).
  bool token_feedback = false;
  std::array<StepPoolCapacity, kMaxStepPools> pools{};  // present ones first, in model order

  // Throws Error naming the first bad field. No CUDA call.
  void validate() const;
  std::int32_t resolved_max_logit_rows() const {
    return max_logit_rows > 0 ? max_logit_rows : max_batch;
  }
  std::int32_t num_pools() const;
};

// Word offsets of each section of the image. Computed once; identical on host and device.
struct StepLayout {
  // Header words.
  static constexpr std::size_t kMode = 0;
  static constexpr std::size_t kNumRequests = 1;
  static constexpr std::size_t kNumTokens = 2;
  static constexpr std::size_t kTokensPerRequest = 3;  // N of the key (decode 1, extend 0)
  static constexpr std::size_t kLogitRows = 4;         // LogitRows
  static constexpr std::size_t kNumCommands = 8;       // [kMaxStepPools]
  static constexpr std::size_t kNumPageIds = 16;       // [kMaxStepPools]
  static constexpr std::size_t kHeaderWords = 32;      // sections start 64-byte aligned

  std::size_t slot = 0;                               // [max_batch]
  std::size_t prefix_len = 0;                         // [max_batch]
  std::size_t extend_len = 0;                         // [max_batch]
  std::size_t encoder_len = 0;                        // [max_batch]
  std::size_t token_ids = 0;                          // [max_tokens]
  std::size_t aux = 0;                                // [max_batch][aux_words]
  std::array<std::size_t, kMaxStepPools> commands{};  // [max_commands] TableCommand (5 words)
  std::array<std::size_t, kMaxStepPools> page_ids{};  // [max_page_ids]
  std::size_t total_words = 0;

  static StepLayout compute(const StepCapacity& cap);
};

// Trivially copyable pointers into one image (host or device), passed to kernels by value.
struct StepInputView {
  const std::int32_t* header = nullptr;       // [kHeaderWords]
  const std::int32_t* slot = nullptr;         // [max_batch]
  const std::int32_t* prefix_len = nullptr;   // [max_batch]
  const std::int32_t* extend_len = nullptr;   // [max_batch]
  const std::int32_t* encoder_len = nullptr;  // [max_batch]
  const std::int32_t* token_ids = nullptr;    // [max_tokens]
  const std::int32_t* aux = nullptr;          // [max_batch][aux_words]
  const TableCommand* commands[kMaxStepPools] = {};
  const std::int32_t* page_ids[kMaxStepPools] = {};

  static StepInputView over(const std::int32_t* image, const StepLayout& layout);
};

// What the host hands in for one step (host memory; spans are read during write() only).
struct StepDesc {
  StepMode mode = StepMode::kDecode;
  // N of the graph key: verify (every extend_len == N), draft-extend-v2 (1 <= extend_len <= N),
  // speculative (N = k draft tokens, 0 <= k <= max_draft_tokens). Decode: must be 0 or 1 (stored
  // as 1). Extend: ignored (stored as 0).
  std::int32_t tokens_per_request = 0;
  // Which rows get logits (part of the graph key). kEveryRow needs sum(extend_len) <=
  // capacity.max_logit_rows.
  LogitRows logits = LogitRows::kLastPerRequest;
  std::span<const StepRequest> requests;
  std::span<const std::int32_t> token_ids;  // [sum extend_len], request-major
  // [requests][capacity.aux_words] program data per request (empty when aux_words is 0).
  std::span<const std::int32_t> aux;
  // Table commands of this step per pool (index as in capacity.pools), applied on the device
  // before anything reads the tables; nullptr = none.
  std::array<const TableCommandBatch*, kMaxStepPools> tables{};
};

// The host-side writer: plain C++, no CUDA call (tested on a CPU-only machine). Fills an image
// laid out by StepLayout. Allocates nothing per step (error messages are built only on failure).
class StepImageWriter {
 public:
  explicit StepImageWriter(const StepCapacity& cap);

  // Validates every field (mode, slot range / padding slot / duplicates, lengths against the
  // mode and the capacities, encoder length range, token count and ids, table commands) and
  // throws Error naming the field and value.
  void validate(const StepDesc& desc) const;
  // validate(), then fills `image` ([layout().total_words]); on error `image` is unchanged.
  // Only the used part of each section is written; the prep kernels never read past the counts.
  void write(const StepDesc& desc, std::span<std::int32_t> image) const;
  // write() without the validation, for a desc that validate() just accepted.
  void fill(const StepDesc& desc, std::int32_t* image) const;

  const StepCapacity& capacity() const noexcept { return cap_; }
  const StepLayout& layout() const noexcept { return layout_; }

 private:
  StepCapacity cap_;
  StepLayout layout_;
  mutable std::vector<std::int32_t> seen_;  // [max_slots] duplicate-slot check, epoch stamps
  mutable std::int32_t epoch_ = 0;
};

// Pinned ring + device image + the writer. A step: write(desc) then upload(stream).
class StepInput {
 public:
  explicit StepInput(const StepCapacity& cap);
  StepInput(const StepInput&) = delete;
  StepInput& operator=(const StepInput&) = delete;

  // StepImageWriter::write into the next pinned image of the ring; throws (image unchanged) on a
  // bad field. May wait (host) for the copy issued two uploads ago before reusing its image.
  void write(const StepDesc& desc);
  void validate(const StepDesc& desc) const { writer_.validate(desc); }

  // One async copy of the last written image to the device image on `stream`.
  void upload(cudaStream_t stream);

  StepInputView device_view() const noexcept {
    return StepInputView::over(device_.data(), layout_);
  }
  // The last written pinned image (for the CPU prep path and tests).
  StepInputView host_view() const noexcept {
    return StepInputView::over(host_[written_].data(), layout_);
  }
  const std::int32_t* device_image() const noexcept { return device_.data(); }
  std::size_t bytes() const noexcept { return layout_.total_words * sizeof(std::int32_t); }
  const StepCapacity& capacity() const noexcept { return writer_.capacity(); }
  const StepLayout& layout() const noexcept { return writer_.layout(); }
  // Header of the last written image.
  StepMode mode() const noexcept;
  std::int32_t num_requests() const noexcept;
  std::int32_t num_tokens() const noexcept;
  std::int32_t tokens_per_request() const noexcept;
  LogitRows logit_rows() const noexcept;

 private:
  StepImageWriter writer_;
  const StepLayout& layout_;
  std::array<PinnedBuffer<std::int32_t>, 2> host_;  // ring of pinned images
  std::array<Event, 2> copied_{Event(cudaEventDisableTiming), Event(cudaEventDisableTiming)};
  std::array<bool, 2> pending_{false, false};
  int written_ = 0;  // image filled by the last write()
  int next_ = 0;     // image the next write() fills
  DeviceBuffer<std::int32_t> device_;
};

}  // namespace graphdecode
