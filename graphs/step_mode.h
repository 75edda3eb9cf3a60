// What kind of step runs, and which of its rows produce logits. Plain enums usable in host and
// device code (the image stores their values as int32 words).
#pragma once

#include <cstdint>
#include <string_view>

namespace graphdecode {

enum class StepMode : std::int32_t {
  kDecode = 0,         // extend_len = 1 for every request
  kExtend = 1,         // prefill / chunked prefill: any extend_len >= 1
  kTargetVerify = 2,   // extend_len = N (tokens per request of the graph key) for every request
  kDraftExtendV2 = 3,  // extend_len in [1, N] per request (the accepted count), N of the key
  // One whole speculative step of N = k draft tokens per request (engine/spec/): each row is the
  // draft model's extend over the c tokens committed since the request's last speculative step
  // (extend_len = c in [1, max_draft_tokens + 1]), the last of which sits at position
  // P = prefix_len + c - 1; the k draft decodes (positions P+1 ..) and the target's verify of k+1
  // rows from P are derived on the device. The image's rows are the draft-extend's.
  kSpeculative = 4,
};
inline constexpr int kNumStepModes = 5;

// Which new-token rows of a step get a logits row (the LM head runs over these rows only):
//   kLastPerRequest   row q_start[r+1] - 1 of each request r (prefill, decode, draft-extend-v2
//                     whose extend is the committed count): one logits row per request;
//   kEveryRow         every new token, request-major (target verify: N rows per request);
//   kChosenPerRequest row q_start[r] + chosen[r] of each request, chosen[] a device array the
//                     program binds before capture (StepPrep::set_chosen_rows), clamped to the
//                     request's rows; one logits row per request.
enum class LogitRows : std::int32_t { kLastPerRequest = 0, kEveryRow = 1, kChosenPerRequest = 2 };
inline constexpr int kNumLogitRows = 3;

constexpr std::string_view step_mode_name(StepMode m) {
  switch (m) {
    case StepMode::kDecode:
      return "decode";
    case StepMode::kExtend:
      return "extend";
    case StepMode::kTargetVerify:
      return "target-verify";
    case StepMode::kDraftExtendV2:
      return "draft-extend-v2";
    case StepMode::kSpeculative:
      return "speculative";
  }
  return "unknown";
}

constexpr std::string_view logit_rows_name(LogitRows l) {
  switch (l) {
    case LogitRows::kLastPerRequest:
      return "last-per-request";
    case LogitRows::kEveryRow:
      return "every-row";
    case LogitRows::kChosenPerRequest:
      return "chosen-per-request";
  }
  return "unknown";
}

}  // namespace graphdecode
