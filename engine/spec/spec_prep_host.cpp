// CPU twin of the spec prep kernel (tests compare the two word for word).
#include "common/error.h"
#include "engine/spec/spec_phase.h"
#include "engine/spec/spec_prep.h"

namespace graphdecode {

void spec_prep_host(const StepMetaView& x, const StepCapacity& cap, std::int32_t k,
                    const StepMetaView& verify, std::span<const StepMetaView> decodes) {
  GD_REQUIRE(k >= 0, "k", k, "cannot be negative");
  GD_REQUIRE(static_cast<std::int32_t>(decodes.size()) >= k - 1, "decodes", decodes.size(),
             "needs a block for each draft decode 1 .. k - 1");
  spec_rules::PhaseShape s;
  s.max_batch = cap.max_batch;
  s.max_tokens = cap.max_tokens;
  s.max_logit_rows = cap.resolved_max_logit_rows();
  s.width = k + 1;
  s.offset = 0;
  s.mode = StepMode::kTargetVerify;
  spec_rules::fill_phase(x, verify, s, 0, 1);
  for (std::int32_t j = 1; j < k; ++j) {
    s.width = 1;
    s.offset = j;
    s.mode = StepMode::kDecode;
    spec_rules::fill_phase(x, decodes[static_cast<std::size_t>(j - 1)], s, 0, 1);
  }
}

}  // namespace graphdecode
