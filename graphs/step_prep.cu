#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "graphs/step_prep.h"
#include "graphs/step_rules.h"
#include "memory/device_page_table.h"

namespace graphdecode {
namespace {

// One block prepares a whole step: scans over up to a few thousand rows take a few rounds, and a
// single block needs no grid-wide synchronisation (cheaper than a device-wide scan at these sizes).
constexpr int kPrepThreads = 256;

struct PrepParams {
  StepInputView in;              // device image
  StepMetaView out;              // device metadata block
  const std::int32_t* feedback;  // [max_slots] token per slot, or nullptr
  const std::int32_t* chosen;    // [max_batch] kChosenPerRequest row offsets, or nullptr
  std::int32_t max_batch;
  std::int32_t max_tokens;
  std::int32_t max_logit_rows;
};

struct MaxOp {
  __device__ std::int32_t operator()(std::int32_t a, std::int32_t b) const { return a > b ? a : b; }
};

__global__ void __launch_bounds__(kPrepThreads)
    prep_metadata_kernel(const __grid_constant__ PrepParams p) {
  using Scan = cub::BlockScan<std::int32_t, kPrepThreads>;
  using Reduce = cub::BlockReduce<std::int32_t, kPrepThreads>;
  __shared__ union {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } temp;

  const int tid = static_cast<int>(threadIdx.x);
  const std::int32_t n = min(max(p.in.header[StepLayout::kNumRequests], 0), p.max_batch);
  std::int32_t run_q = 0, run_k = 0, run_e = 0;  // running totals (identical in every thread)
  std::int32_t max_q = 0, max_k = 0, max_e = 0;  // valid in thread 0

  for (std::int32_t base = 0; base < p.max_batch; base += kPrepThreads) {
    const std::int32_t r = base + tid;
    const bool in_range = r < p.max_batch;
    const bool live = in_range && step_rules::row_live(r, n);
    const std::int32_t q = step_rules::row_q_len(live, live ? p.in.extend_len[r] : 0);
    const std::int32_t k = step_rules::row_self_kv_len(live, live ? p.in.prefix_len[r] : 0,
                                                       live ? p.in.extend_len[r] : 0);
    const std::int32_t e = step_rules::row_cross_kv_len(live, live ? p.in.encoder_len[r] : 0);

    std::int32_t q_excl, k_excl, e_excl, q_sum, k_sum, e_sum;
    Scan(temp.scan).ExclusiveSum(q, q_excl, q_sum);
    __syncthreads();
    Scan(temp.scan).ExclusiveSum(k, k_excl, k_sum);
    __syncthreads();
    Scan(temp.scan).ExclusiveSum(e, e_excl, e_sum);
    __syncthreads();
    const std::int32_t mq = Reduce(temp.reduce).Reduce(q, MaxOp{});
    __syncthreads();
    const std::int32_t mk = Reduce(temp.reduce).Reduce(k, MaxOp{});
    __syncthreads();
    const std::int32_t me = Reduce(temp.reduce).Reduce(e, MaxOp{});
    __syncthreads();

    if (in_range) {
      p.out.slot[r] = step_rules::row_slot(live, live ? p.in.slot[r] : 0);
      p.out.q_start[r] = run_q + q_excl;
      p.out.kv_len[r] = k;
      p.out.encoder_len[r] = e;
      p.out.cu_seqlens_k[r] = run_k + k_excl;
      p.out.cu_encoder[r] = run_e + e_excl;
    }
    run_q += q_sum;
    run_k += k_sum;
    run_e += e_sum;
    if (tid == 0) {
      max_q = max(max_q, mq);
      max_k = max(max_k, mk);
      max_e = max(max_e, me);
    }
  }
  const std::int32_t total_tokens = min(run_q, p.max_tokens);
  if (tid == 0) {
    p.out.q_start[p.max_batch] = run_q;
    p.out.cu_seqlens_k[p.max_batch] = run_k;
    p.out.cu_encoder[p.max_batch] = run_e;
    std::int32_t* s = p.out.scalars;
    s[StepMetaLayout::kNumRequests] = n;
    s[StepMetaLayout::kNumTokens] = total_tokens;
    s[StepMetaLayout::kMaxQLen] = max_q;
    s[StepMetaLayout::kMaxKvLen] = max_k;
    s[StepMetaLayout::kMaxEncoderLen] = max_e;
    s[StepMetaLayout::kMode] = p.in.header[StepLayout::kMode];
    s[StepMetaLayout::kTokensPerRequest] = p.in.header[StepLayout::kTokensPerRequest];
    s[StepMetaLayout::kTotalKv] = run_k;
  }
  __syncthreads();  // q_start (global, written by this block) is complete before the token map

  const auto rows = static_cast<LogitRows>(p.in.header[StepLayout::kLogitRows]);
  const std::int32_t num_logits =
      step_rules::num_logit_rows(rows, n, total_tokens, p.max_logit_rows);
  if (tid == 0) {
    p.out.scalars[StepMetaLayout::kNumLogitRows] = num_logits;
    p.out.scalars[StepMetaLayout::kLogitRows] = static_cast<std::int32_t>(rows);
  }
  for (std::int32_t i = tid; i < p.max_logit_rows; i += kPrepThreads) {
    p.out.logit_row[i] = i < num_logits
                             ? step_rules::logit_token_row(rows, i, p.out.q_start, p.chosen)
                             : step_rules::kPaddingLogitRow;
  }

  // Token rows: binary search of q_start per token (balanced whatever the extend lengths are).
  for (std::int32_t t = tid; t < p.max_tokens; t += kPrepThreads) {
    const bool live = t < total_tokens;
    std::int32_t r = step_rules::kPaddingTokenRequest;
    std::int32_t slot = kPaddingSlot;
    std::int32_t pos = step_rules::kPaddingTokenPosition;
    std::int32_t id = step_rules::kPaddingTokenId;
    if (live) {
      r = step_rules::request_of_token(p.out.q_start, n, t);
      slot = p.out.slot[r];
      pos = new_token_position(p.in.prefix_len[r], t - p.out.q_start[r]);
      id = step_rules::resolve_token_id(p.in.token_ids[t], slot, p.feedback);
    }
    p.out.token_request[t] = r;
    p.out.token_slot[t] = slot;
    p.out.token_position[t] = pos;
    p.out.token_id[t] = id;
  }
}

}  // namespace

StepPrep::StepPrep(const StepInput& input)
    : input_(input), layout_(StepMetaLayout::compute(input.capacity())) {
  block_ = DeviceBuffer<std::int32_t>(layout_.total_words);
  block_.fill_bytes(0, nullptr);
  GD_CUDA(cudaStreamSynchronize(nullptr));  // start-up only: zeroed before any stream reads it
  view_ = StepMetaView::over(block_.data(), layout_);
}

void StepPrep::bind_table(std::int32_t pool, std::int32_t* table) {
  GD_REQUIRE(pool >= 0 && pool < kMaxStepPools && input_.capacity().pools[pool].present, "pool",
             pool, "not a pool of the step capacity");
  GD_REQUIRE(table != nullptr, "table", "nullptr", "a pool needs its device page table");
  tables_[pool] = table;
}

void StepPrep::enqueue(cudaStream_t stream) const {
  const StepCapacity& cap = input_.capacity();
  const StepInputView in = input_.device_view();
  for (int k = 0; k < kMaxStepPools; ++k) {
    const StepPoolCapacity& pool = cap.pools[k];
    if (!pool.present) continue;
    GD_REQUIRE(tables_[k] != nullptr, "pools[" + std::to_string(k) + "]", "unbound",
               "every pool's page table is bound (bind_table) before a step runs");
    TableApplyParams a;
    a.commands = in.commands[k];
    a.num_commands = in.header + StepLayout::kNumCommands + k;
    a.page_ids = in.page_ids[k];
    a.page_table = tables_[k];
    a.max_commands = pool.max_commands;
    a.max_page_ids = pool.max_page_ids;
    a.max_slots = pool.geometry.max_slots;
    a.max_pages_per_slot = pool.geometry.max_pages_per_slot;
    a.num_pages = pool.geometry.num_pages;
    launch_apply_table_commands(a, stream);
  }
  enqueue_metadata(stream);
}

void StepPrep::enqueue_metadata(cudaStream_t stream) const {
  PrepParams p;
  p.in = input_.device_view();
  p.out = view_;
  p.feedback = feedback_;
  p.chosen = chosen_;
  p.max_batch = input_.capacity().max_batch;
  p.max_tokens = input_.capacity().max_tokens;
  p.max_logit_rows = input_.capacity().resolved_max_logit_rows();
  prep_metadata_kernel<<<1, kPrepThreads, 0, stream>>>(p);
  GD_CHECK_LAUNCH();
}

AttentionBatch self_batch(const StepMetaView& meta, const std::int32_t* window_left) noexcept {
  AttentionBatch b;
  b.num_requests = meta.scalars + StepMetaLayout::kNumRequests;
  b.slot = meta.slot;
  b.q_start = meta.q_start;
  b.kv_len = meta.kv_len;
  b.window_left = window_left;
  return b;
}

AttentionBatch cross_batch(const StepMetaView& meta) noexcept {
  AttentionBatch b = self_batch(meta, nullptr);
  b.kv_len = meta.encoder_len;
  return b;
}

void StepPrep::download(std::span<std::int32_t> host, cudaStream_t stream) const {
  GD_REQUIRE(host.size() == layout_.total_words, "host", host.size(),
             "download needs the whole metadata block");
  block_.download(host.data(), host.size(), stream);
  GD_CUDA(cudaStreamSynchronize(stream));
}

}  // namespace graphdecode
