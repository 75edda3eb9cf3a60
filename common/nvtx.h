// NVTX ranges: name the host-side phases of a step so an Nsight Systems timeline reads without
// guessing (graphdecode.step > graphdecode.schedule / .prefill / .decode / .speculative >
// graphdecode.launch / .wait, then graphdecode.deliver).
//
// Header-only NVTX v3 from the CUDA toolkit. With no tool attached, the first push finds no
// injection library and every later push/pop is one indirect call to an empty function (a few
// ns against a step of microseconds); nothing allocates. Built with GRAPHDECODE_NVTX=0 (CMake
// option GRAPHDECODE_NVTX=OFF) the ranges compile to nothing.
//
// The payload (an int64 shown beside the range in nsys) carries the step's shape so a reader sees
// it without counting kernels: requests in the step on .prefill / .decode / .speculative, draft
// tokens k on a speculative step's .launch, tokens delivered on .deliver.
#pragma once

#include <cstdint>

#ifndef GRAPHDECODE_NVTX
#define GRAPHDECODE_NVTX 1
#endif

#if GRAPHDECODE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace graphdecode {

// ARGB colours, one per kind of phase, so the timeline's rows are told apart at a glance.
enum class NvtxColor : std::uint32_t {
  kStep = 0xFF4C72B0,     // the whole Engine::step
  kHost = 0xFF8C8C8C,     // host-only work: scheduling, delivering tokens
  kPrefill = 0xFFDD8452,  // a chunked-prefill step
  kDecode = 0xFF55A868,   // a plain decode step
  kSpec = 0xFF8172B3,     // a speculative step (draft, verify, accept in one graph)
  kLaunch = 0xFFC44E52,   // writing the step image, the copy and the graph launch
  kWait = 0xFFCCB974,     // the host waiting for the step's tokens
};

class NvtxRange {
 public:
  // `name` must outlive the range (string literals do).
  explicit NvtxRange(const char* name, NvtxColor color = NvtxColor::kHost,
                     std::int64_t payload = -1) noexcept {
    push(name, color, payload);
  }
  // Ends this range and opens a sibling in its place (one phase after another in one scope).
  void next(const char* name, NvtxColor color = NvtxColor::kHost,
            std::int64_t payload = -1) noexcept {
#if GRAPHDECODE_NVTX
    nvtxRangePop();
#endif
    push(name, color, payload);
  }
  ~NvtxRange() {
#if GRAPHDECODE_NVTX
    nvtxRangePop();
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  static void push(const char* name, NvtxColor color, std::int64_t payload) noexcept {
#if GRAPHDECODE_NVTX
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.colorType = NVTX_COLOR_ARGB;
    a.color = static_cast<std::uint32_t>(color);
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name;
    if (payload >= 0) {
      a.payloadType = NVTX_PAYLOAD_TYPE_INT64;
      a.payload.llValue = payload;
    }
    nvtxRangePushEx(&a);
#else
    static_cast<void>(name);
    static_cast<void>(color);
    static_cast<void>(payload);
#endif
  }
};

}  // namespace graphdecode
