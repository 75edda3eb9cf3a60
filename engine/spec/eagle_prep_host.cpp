// CPU twin of the EAGLE prep kernel (tests compare the two word for word).
#include <vector>

#include "common/error.h"
#include "engine/spec/eagle_prep.h"
#include "engine/spec/eagle_rules.h"
#include "engine/spec/spec_phase.h"

namespace graphdecode {

void eagle_prep_host(const StepMetaView& x, const StepCapacity& cap, std::int32_t carry_rows,
                     std::int32_t carry_stride, std::int32_t k, const StepMetaView& extend,
                     std::span<std::int32_t> hidden_source, std::span<const StepMetaView> decodes,
                     std::span<const std::int32_t> starts_at_hit) {
  GD_REQUIRE(static_cast<std::int32_t>(hidden_source.size()) >= cap.max_tokens, "hidden_source",
             hidden_source.size(), "needs max_tokens words");
  GD_REQUIRE(static_cast<std::int32_t>(decodes.size()) >= k - 1, "decodes", decodes.size(),
             "needs a block for each head decode 1 .. k - 1");
  GD_REQUIRE(
      starts_at_hit.empty() || static_cast<std::int32_t>(starts_at_hit.size()) >= cap.max_batch,
      "starts_at_hit", starts_at_hit.size(), "needs a word per request (max_batch)");
  eagle_rules::ShiftShape s;
  s.max_batch = cap.max_batch;
  s.max_tokens = cap.max_tokens;
  s.max_logit_rows = cap.resolved_max_logit_rows();
  s.carry_rows = carry_rows;
  s.carry_stride = carry_stride;
  s.starts_at_hit = starts_at_hit.empty() ? nullptr : starts_at_hit.data();
  s.starts_at_hit_stride = 1;
  std::vector<std::int32_t> z(static_cast<std::size_t>(cap.max_batch) + 1);
  const std::int32_t max_q = eagle_rules::skip_scan(x, s, z.data());
  eagle_rules::fill_shifted(x, extend, hidden_source.data(), z.data(), max_q, s, 0, 1);
  spec_rules::PhaseShape p;
  p.max_batch = cap.max_batch;
  p.max_tokens = cap.max_tokens;
  p.max_logit_rows = cap.resolved_max_logit_rows();
  p.width = 1;
  p.mode = StepMode::kDecode;
  for (std::int32_t j = 1; j < k; ++j) {
    p.offset = j;
    spec_rules::fill_phase(extend, decodes[static_cast<std::size_t>(j - 1)], p, 0, 1);
  }
}

}  // namespace graphdecode
