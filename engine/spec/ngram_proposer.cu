// Prompt lookup on the device (spec_rules.h: ngram_*): one CTA per request searches the slot's
// token history for the latest earlier occurrence of its longest suffix, every thread a share of
// the start positions, and proposes what followed it. No host round trip: the history is written
// from the step prep's token rows.
#include <algorithm>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/spec/proposer.h"
#include "engine/spec/spec_rules.h"

namespace graphdecode {
namespace {

constexpr int kThreads = 256;

struct RecordParams {
  StepMetaView meta;  // token rows: slot, position, id
  std::int32_t* history;
  std::int32_t max_len, max_rows;
  PagedKvView pages;          // the target's full pool (page_table), when page_tokens is set
  std::int32_t* page_tokens;  // [num_pages][page_size] or nullptr
};

__global__ void record_history_kernel(const __grid_constant__ RecordParams p) {
  const std::int32_t t = static_cast<std::int32_t>(blockIdx.x * kThreads + threadIdx.x);
  if (t >= p.max_rows || t >= p.meta.scalars[StepMetaLayout::kNumTokens]) return;
  const std::int32_t pos = p.meta.token_position[t];
  const std::int32_t slot = p.meta.token_slot[t];
  if (pos < 0 || pos >= p.max_len) return;  // padding rows (inert) and positions past capacity
  p.history[static_cast<std::int64_t>(slot) * p.max_len + pos] = p.meta.token_id[t];
  if (p.page_tokens == nullptr) return;
  const std::int32_t page = page_at(p.pages, slot, pos / p.pages.page_size);
  if (page > 0 && page < p.pages.num_pages)  // page 0: the padding page
    p.page_tokens[static_cast<std::int64_t>(page) * p.pages.page_size + pos % p.pages.page_size] =
        p.meta.token_id[t];
}

struct HitFillParams {
  StepMetaView meta;  // a prefill chunk: request r starts at kv_len - q_len
  const std::int32_t* aux;
  std::int32_t aux_words, hit_word;
  std::int32_t* history;
  std::int32_t max_len;
  PagedKvView pages;
  const std::int32_t* page_tokens;
};

// One CTA per request: a chunk that starts at the request's prefix hit copies the tokens of the
// pages it shares ([0, hit), whole pages) into the slot's history.
__global__ void __launch_bounds__(kThreads)
    fill_hit_kernel(const __grid_constant__ HitFillParams p) {
  const std::int32_t r = static_cast<std::int32_t>(blockIdx.x);
  if (r >= p.meta.scalars[StepMetaLayout::kNumRequests]) return;
  if (p.aux[static_cast<std::int64_t>(r) * p.aux_words + p.hit_word] == 0) return;
  const std::int32_t q_len = p.meta.q_start[r + 1] - p.meta.q_start[r];
  const std::int32_t hit = min(p.meta.kv_len[r] - q_len, p.max_len);
  const std::int32_t slot = p.meta.slot[r];
  const std::int32_t P = p.pages.page_size;
  for (std::int32_t pos = static_cast<std::int32_t>(threadIdx.x); pos < hit; pos += kThreads) {
    const std::int32_t page = page_at(p.pages, slot, pos / P);
    p.history[static_cast<std::int64_t>(slot) * p.max_len + pos] =
        page > 0 && page < p.pages.num_pages
            ? p.page_tokens[static_cast<std::int64_t>(page) * P + pos % P]
            : -1;  // not expected (a full pool holds every page of a hit); proposes nothing
  }
}

struct ProposeParams {
  StepMetaView x;       // the draft-extend: the request's last committed position
  StepMetaView verify;  // out: token ids of the draft rows
  const std::int32_t* history;
  std::int32_t max_len, k, max_n, min_n;
};

__global__ void __launch_bounds__(kThreads) ngram_kernel(const __grid_constant__ ProposeParams p) {
  const std::int32_t r = static_cast<std::int32_t>(blockIdx.x);
  if (r >= p.x.scalars[StepMetaLayout::kNumRequests] || p.k == 0) return;
  __shared__ std::int32_t best;
  const std::int32_t last = min(p.x.kv_len[r] - 1, p.max_len - 1);
  const std::int32_t* h = p.history + static_cast<std::int64_t>(p.x.slot[r]) * p.max_len;
  std::int32_t from = -1;
  for (std::int32_t n = min(p.max_n, last); n >= p.min_n && n >= 1 && from < 0; --n) {
    if (threadIdx.x == 0) best = -1;
    __syncthreads();
    std::int32_t mine = -1;
    for (std::int32_t s = static_cast<std::int32_t>(threadIdx.x); s <= last - n; s += kThreads)
      if (spec_rules::ngram_occurs_at(h, last, n, s)) mine = s;  // increasing: the latest of mine
    if (mine >= 0) atomicMax(&best, mine);
    __syncthreads();
    if (best >= 0) from = best + n;
    __syncthreads();  // best is reset by the next round
  }
  if (threadIdx.x == 0) {
    std::int32_t* out = p.verify.token_id + r * (p.k + 1) + 1;
    spec_rules::ngram_fill(h, last, from, p.k, out);
  }
}

}  // namespace

NgramProposer::NgramProposer(const StepPrep& prep, const NgramConfig& config, cudaStream_t stream,
                             const KvPool* pages)
    : config_(config),
      input_(prep.input()),
      max_batch_(prep.input().capacity().max_batch),
      max_len_(prep.input().capacity().max_kv_len) {
  GD_REQUIRE(config.min_ngram >= 1, "ngram.min_ngram", config.min_ngram, "must be >= 1");
  GD_REQUIRE(config.max_ngram >= config.min_ngram, "ngram.max_ngram", config.max_ngram,
             "must be >= min_ngram");
  GD_REQUIRE(pages == nullptr || pages->config().geometry.kind == AttentionKind::kFull, "pages",
             "a sliding or cross pool", "the token array needs the target's full pool");
  GD_REQUIRE(pages == nullptr || input_.capacity().aux_words > SamplingWords::kStartsAtHit,
             "input.aux_words", input_.capacity().aux_words,
             "the hit marks are a word of the step's aux (SamplingWords)");
  const auto slots = static_cast<std::size_t>(prep.input().capacity().max_slots);
  history_ = DeviceBuffer<std::int32_t>(slots * static_cast<std::size_t>(max_len_));
  history_.fill_bytes(0, stream);
  if (pages != nullptr) {
    pages_ = pages->view(0);
    page_tokens_ = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(pages_.num_pages) *
                                              static_cast<std::size_t>(pages_.page_size));
    page_tokens_.fill_bytes(0xff, stream);  // -1: no token recorded
  }
}

void NgramProposer::record(const StepMetaView& meta, std::int32_t token_capacity,
                           cudaStream_t stream) {
  RecordParams p{meta, history_.data(), max_len_, token_capacity, pages_, page_tokens_.data()};
  record_history_kernel<<<static_cast<unsigned>((token_capacity + kThreads - 1) / kThreads),
                          kThreads, 0, stream>>>(p);
  GD_CHECK_LAUNCH();
}

void NgramProposer::prefill(const StepMetaView& meta, const StepShape& shape, cudaStream_t stream) {
  if (!page_tokens_.empty()) {  // before this chunk's rows are recorded (disjoint positions)
    HitFillParams p{meta,
                    input_.device_view().aux,
                    input_.capacity().aux_words,
                    SamplingWords::kStartsAtHit,
                    history_.data(),
                    max_len_,
                    pages_,
                    page_tokens_.data()};
    fill_hit_kernel<<<static_cast<unsigned>(max_batch_), kThreads, 0, stream>>>(p);
    GD_CHECK_LAUNCH();
  }
  record(meta, std::max(1, shape.token_capacity), stream);
}

void NgramProposer::propose(const SpecPrep& spec, const StepShape& shape, std::int32_t k,
                            cudaStream_t stream) {
  const StepMetaView& x = spec.prep().device();  // the committed tokens, ending at P
  record(x, std::max(1, shape.token_capacity), stream);
  if (k == 0) return;
  ProposeParams p{x, spec.verify(),     history_.data(),  max_len_,
                  k, config_.max_ngram, config_.min_ngram};
  ngram_kernel<<<static_cast<unsigned>(std::clamp(shape.bucket, 1, max_batch_)), kThreads, 0,
                 stream>>>(p);
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
