// PagedAttention: validation, capacity-sized buffers, and the launches of run():
// planner (1 block) -> attention kernel (grid = one wave of resident CTAs, which claim the work
// past it; split-KV merge fused in), or, for max_batch <= 128, the attention kernel alone, each CTA
// planning the batch itself.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "attention/attention_kernel.cuh"
#include "attention/attention_plan.cuh"
#include "attention/paged_attention.h"
#include "common/cuda_check.h"
#include "common/error.h"

namespace graphdecode {
namespace attn {

#if GD_ATTN_TRACE
void clear_trace() {
  static std::vector<unsigned long long> zeros(kTraceCtas * kTraceFields, 0);
  GD_CUDA(cudaMemcpyToSymbol(g_attn_trace, zeros.data(), zeros.size() * 8));
}
std::vector<unsigned long long> read_trace() {
  std::vector<unsigned long long> t(kTraceCtas * kTraceFields);
  GD_CUDA(cudaMemcpyFromSymbol(t.data(), g_attn_trace, t.size() * 8));
  return t;
}
#endif

// Allows the kernel its dynamic shared memory; returns how many of its CTAs fit on one SM.
template <typename T, int kHeadDim, bool kWide = false, bool kDense = false>
int enable_smem() {
  const auto kernel = attention_kernel<T, kHeadDim, kWide, kDense>;
  constexpr std::size_t bytes = KernelTiles<kHeadDim, kWide, kDense>::kSmemBytes;
  GD_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(bytes)));
  int resident = 0;
  GD_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kThreads, bytes));
  return resident;
}

// Every launch is a programmatic dependent (PDL) of the kernel before it in the stream (the
// planner, or a layer's other kernels): its CTAs are scheduled while that kernel finishes, and it
// waits (griddepcontrol.wait) for that kernel's completion and memory before its first global
// read or write, so the order of the stream is kept (bench/NOTES.md 13, 26). With p.early_kv
// (run_planned(..., PriorWrites::kQueryAndNewKv)) it reads the work item and the older K/V tiles
// before that wait (NOTES 49). common/pdl.cuh's launch_pdl: GRAPHDECODE_PDL=0 launches it plainly.
template <typename T, int kHeadDim, bool kWide, bool kDense = false>
void launch(const KernelParams& kp, int grid, cudaStream_t stream) {
  launch_pdl(attention_kernel<T, kHeadDim, kWide, kDense>, dim3(static_cast<unsigned>(grid)),
             dim3(kThreads), KernelTiles<kHeadDim, kWide, kDense>::kSmemBytes, stream, kp);
}

// The one place that maps (dtype, head_dim) to a kernel instantiation; returns fn's result.
template <typename Fn>
auto dispatch(DType dtype, int head_dim, Fn&& fn) {
  GD_REQUIRE(head_dim == 64 || head_dim == 128 || head_dim == 256, "head_dim", head_dim,
             "unsupported head dim (64, 128, 256)");
  auto by_dim = [&](auto tag) {
    if (head_dim == 64) return fn(tag, std::integral_constant<int, 64>{});
    if (head_dim == 128) return fn(tag, std::integral_constant<int, 128>{});
    return fn(tag, std::integral_constant<int, 256>{});
  };
  return dtype == DType::kBF16 ? by_dim(__nv_bfloat16{}) : by_dim(__half{});
}

}  // namespace attn

PagedAttention::PagedAttention(const AttentionConfig& c) : config_(c) {
  using namespace attn;
  GD_REQUIRE(c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256, "head_dim", c.head_dim,
             "unsupported head dim (supported: 64, 128, 256)");
  GD_REQUIRE(c.dtype == DType::kBF16 || c.dtype == DType::kFP16, "dtype", static_cast<int>(c.dtype),
             "unsupported dtype (bf16 or fp16)");
  GD_REQUIRE(c.num_kv_heads > 0, "num_kv_heads", c.num_kv_heads, "must be positive");
  GD_REQUIRE(c.num_q_heads > 0 && c.num_q_heads % c.num_kv_heads == 0, "num_q_heads", c.num_q_heads,
             "must be a positive multiple of num_kv_heads");
  const int group = c.num_q_heads / c.num_kv_heads;
  GD_REQUIRE(group <= kDecodeRows, "group_size", group,
             "GQA group larger than 16 query heads per KV head is not supported");
  GD_REQUIRE(c.max_batch > 0, "max_batch", c.max_batch, "must be positive");
  GD_REQUIRE(c.max_q_tokens > 0, "max_q_tokens", c.max_q_tokens, "must be positive");
  GD_REQUIRE(c.max_kv_len > 0, "max_kv_len", c.max_kv_len, "must be positive");
  GD_REQUIRE(c.mode == AttentionMode::kCausal || c.mode == AttentionMode::kCross, "mode",
             static_cast<int>(c.mode), "unknown attention mode");
  GD_REQUIRE(c.split_tokens >= 0 && c.split_tokens % kBlockN == 0, "split_tokens", c.split_tokens,
             "must be a non-negative multiple of 64");
  split_tokens_ = c.split_tokens > 0 ? c.split_tokens : kDefaultSplitTokens;
  GD_REQUIRE(c.wave_split_chunks >= 0 && c.wave_split_chunks <= kMaxWaveSplitChunks,
             "wave_split_chunks", c.wave_split_chunks, "must be 0 (default) to 4");
  GD_REQUIRE(c.wave_split_min_keys >= 0 && c.wave_split_min_keys % kBlockN == 0,
             "wave_split_min_keys", c.wave_split_min_keys,
             "must be 0 (default) or a positive multiple of 64");
  wave_chunks_ = c.wave_split_chunks > 0 ? c.wave_split_chunks : kWaveSplitChunks;
  wave_min_keys_ = c.wave_split_min_keys > 0 ? c.wave_split_min_keys : kWaveSplitMinKeys;
  if (c.wave_split_chunks == 0 && c.wave_split_min_keys == 0) {
    if (const char* env = std::getenv("GRAPHDECODE_ATTN_WAVE_SPLIT")) {  // "chunks,min_keys"
      int chunks = 0, keys = 0;
      GD_REQUIRE(std::sscanf(env, "%d,%d", &chunks, &keys) == 2 && chunks >= 1 &&
                     chunks <= kMaxWaveSplitChunks && keys > 0 && keys % kBlockN == 0,
                 "GRAPHDECODE_ATTN_WAVE_SPLIT", env,
                 "must be \"chunks,min_keys\": chunks 1-4, min_keys a positive multiple of 64");
      wave_chunks_ = chunks;
      wave_min_keys_ = keys;
    }
  }
  // The split grows the work list, which is the grid where the grid is not persistent.
  if (!dispatch(c.dtype, c.head_dim, [](auto, auto d) { return kPersistent<d.value>; }))
    wave_chunks_ = 1;

  int device = 0, sms = 0;
  GD_CUDA(cudaGetDevice(&device));
  GD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // Adaptive split-KV aims at one wave of resident CTAs (kTargetWaves, attention_policy.h): 2 per
  // SM at d128, 3 at d64, 1 at d256.
  const int resident = dispatch(c.dtype, c.head_dim,
                                [](auto t, auto d) { return enable_smem<decltype(t), d.value>(); });
  GD_REQUIRE(resident > 0, "head_dim", c.head_dim, "the attention kernel does not fit on an SM");
  target_ctas_ = (kTargetWaves > 0 ? kTargetWaves : resident) * sms;
  // The wide-tile kernel (kWideExtend head dims): its own residency and target.
  const int resident_wide = dispatch(c.dtype, c.head_dim, [](auto t, auto d) {
    if constexpr (kWideExtend<d.value>) return enable_smem<decltype(t), d.value, true>();
    return 0;
  });
  target_ctas_wide_ = (kTargetWaves > 0 ? kTargetWaves : resident_wide) * sms;
  if (resident_wide <= 0) target_ctas_wide_ = 0;
  // The dense decode kernel (kDenseDecode head dims): its own residency and target.
  const int resident_dense = dispatch(c.dtype, c.head_dim, [](auto t, auto d) {
    if constexpr (kDenseDecode<d.value>) return enable_smem<decltype(t), d.value, false, true>();
    return 0;
  });
  target_ctas_dense_ = (kTargetWaves > 0 ? kTargetWaves : resident_dense) * sms;
  if (resident_dense <= 0) target_ctas_dense_ = 0;
  const std::int64_t target_max = std::max({target_ctas_, target_ctas_wide_, target_ctas_dense_});
  // Past the base kernel's wave (kDenseMinItems 0), else the fixed count.
  dense_min_items_ = kDenseMinItems > 0 ? kDenseMinItems : target_ctas_ + 1;
  if (const char* env = std::getenv("GRAPHDECODE_ATTN_DENSE_MIN_ITEMS")) {  // A/B runs, tests
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    GD_REQUIRE(end != env && *end == '\0' && v >= 0 && v <= INT32_MAX,
               "GRAPHDECODE_ATTN_DENSE_MIN_ITEMS", env,
               "must be an integer >= 0 (requests x KV heads; 0: never the dense decode kernel)");
    dense_min_items_ = static_cast<std::int32_t>(v);
  }

  // Query tiles of a call at most, with tiles of `rows` rows: a request's partial tile each.
  const auto tiles_cap_of = [&](int rows) {
    const int tokens = rows / group;
    return static_cast<long long>(c.max_batch) + (c.max_q_tokens + tokens - 1) / tokens;
  };
  const long long tiles_cap = tiles_cap_of(kMaxRows);
  if (c.deterministic) {
    max_chunks_ = c.max_kv_len / split_tokens_ + 2;
    max_work_ = tiles_cap * c.num_kv_heads * max_chunks_;
    max_partials_ = static_cast<long long>(c.max_q_tokens) * c.num_q_heads * max_chunks_;
  } else {
    max_chunks_ = kMaxAdaptiveChunks + 1;
    // Splitting a batch of `base` (tile, head) items under a wave into floor(target / base)
    // chunks per span gives at most that many plus one anchored extra per item: <= target + base
    // work items (wide tiles: half the tiles, a smaller target). A batch of more than a wave cut
    // into wave_chunks_ chunks per request: at most that many plus one anchored extra per item.
    // The wave split is off where the capacity never holds a wave: the larger workspace alone
    // (it moves the allocations after it) moved the 1B step at B = 32 L = 1024 by 3% (NOTES 97).
    const long long base_items = tiles_cap * c.num_kv_heads;
    const long long wide_items = tiles_cap_of(kWideRows) * c.num_kv_heads;
    if (base_items < target_ctas_ &&
        !(wide_for_tokens(c.max_q_tokens) && wide_items >= target_ctas_wide_))
      wave_chunks_ = 1;
    max_work_ = base_items * (wave_chunks_ > 1 ? wave_chunks_ + 1 : 1) + target_max;
    max_partials_ = 3LL * std::max(target_ctas_, target_ctas_dense_) * kMaxRows;
  }
  GD_REQUIRE(max_work_ < (1LL << 31) && max_partials_ < (1LL << 31), "max_q_tokens", c.max_q_tokens,
             "capacities too large for one attention call");

  plan_ = DeviceBuffer<std::int32_t>(7 * static_cast<std::size_t>(c.max_batch) + 2 +
                                     static_cast<std::size_t>(max_work_));
  counters_ = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(max_work_) + 1);
  // Zeroed once here (and synchronized: run() may come on any stream); the kernel leaves every
  // counter at 0 again after use, so replays need no reset.
  counters_.fill_bytes(0, nullptr);
  plan_.fill_bytes(0, nullptr);  // item_request is read (not used) past the step's items
  GD_CUDA(cudaStreamSynchronize(nullptr));
  partial_o_ = DeviceBuffer<float>(static_cast<std::size_t>(max_partials_) * c.head_dim);
  partial_lse_ = DeviceBuffer<float>(static_cast<std::size_t>(max_partials_));
}

std::size_t PagedAttention::workspace_bytes() const noexcept {
  return plan_.bytes() + partial_o_.bytes() + partial_lse_.bytes() + counters_.bytes();
}

attn::PlanView PagedAttention::plan_view() const {
  const int n = config_.max_batch;
  std::int32_t* b = plan_.data();
  // Designated initializers: the layout cannot silently shift when a field is added.
  return attn::PlanView{.item_start = b,
                        .num_tiles = b + (n + 1),
                        .num_chunks = b + (2 * n + 1),
                        .chunk_size = b + (3 * n + 1),
                        .first_key = b + (4 * n + 1),
                        .key_end = b + (5 * n + 1),
                        .total_items = b + (6 * n + 1),
                        .part_off = b + (6 * n + 2),       // [n]: ends at 7n + 2
                        .item_request = b + (7 * n + 2)};  // [max_work]
}

std::vector<std::int32_t> PagedAttention::planned_chunks(std::int32_t num_requests,
                                                         cudaStream_t stream) const {
  GD_REQUIRE(num_requests >= 0 && num_requests <= config_.max_batch, "num_requests", num_requests,
             "exceeds max_batch");
  std::vector<std::int32_t> chunks(static_cast<std::size_t>(num_requests));
  if (num_requests == 0) return chunks;
  GD_CUDA(cudaMemcpyAsync(chunks.data(), plan_view().num_chunks,
                          chunks.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream));
  GD_CUDA(cudaStreamSynchronize(stream));
  return chunks;
}

bool PagedAttention::wide_for_tokens(std::int32_t tokens) const noexcept {
  const long long rows =
      static_cast<long long>(tokens) * (config_.num_q_heads / config_.num_kv_heads);
  return target_ctas_wide_ > 0 && rows >= attn::kWideMinRows;
}

attn::KernelChoice PagedAttention::choose(const AttentionBatch& batch) const noexcept {
  if (wide_for_tokens(batch.query_tokens_hint)) return attn::KernelChoice::kWide;
  return dense_decode_for(batch.requests_hint) ? attn::KernelChoice::kDense
                                               : attn::KernelChoice::kBase;
}

bool PagedAttention::dense_decode_for(std::int32_t requests) const noexcept {
  const long long items = static_cast<long long>(requests) * config_.num_kv_heads;
  return target_ctas_dense_ > 0 && dense_min_items_ > 0 && items >= dense_min_items_;
}

bool PagedAttention::decode_layout_for(std::int32_t tokens_per_request) const noexcept {
  const long long rows =
      static_cast<long long>(tokens_per_request) * (config_.num_q_heads / config_.num_kv_heads);
  return tokens_per_request >= 1 && rows <= attn::kDecodeRows;
}

std::int32_t PagedAttention::target_of(attn::KernelChoice kernel) const noexcept {
  switch (kernel) {
    case attn::KernelChoice::kWide:
      return target_ctas_wide_;
    case attn::KernelChoice::kDense:
      return target_ctas_dense_;
    case attn::KernelChoice::kBase:
      break;
  }
  return target_ctas_;
}

attn::PlanParams PagedAttention::plan_params(const AttentionBatch& batch,
                                             attn::KernelChoice kernel) const {
  const bool wide = kernel == attn::KernelChoice::kWide;
  using namespace attn;
  const AttentionConfig& c = config_;
  GD_REQUIRE(batch.num_requests && batch.slot && batch.q_start && batch.kv_len, "batch", "null",
             "AttentionBatch pointers must be set");
  const int group = c.num_q_heads / c.num_kv_heads;
  PlanParams pp{};
  pp.batch = batch;
  pp.plan = plan_view();
  pp.max_batch = c.max_batch;
  pp.max_q_tokens = c.max_q_tokens;
  pp.max_kv_len = c.max_kv_len;
  pp.num_kv_heads = c.num_kv_heads;
  pp.num_q_heads = c.num_q_heads;
  pp.group = group;
  pp.tokens_per_tile = (wide ? kWideRows : kMaxRows) / group;
  pp.causal = c.mode == AttentionMode::kCausal;
  pp.deterministic = c.deterministic;
  pp.split_tokens = split_tokens_;
  pp.target_ctas = target_of(kernel);
  pp.wave_chunks = wave_chunks_;
  pp.wave_min_keys = wave_min_keys_;
  pp.max_partials = max_partials_;
  pp.max_work = static_cast<std::int32_t>(max_work_);
  return pp;
}

void PagedAttention::plan(const AttentionBatch& batch, cudaStream_t stream) const {
  const attn::KernelChoice kernel = choose(batch);
  attn::plan_kernel<<<1, attn::kPlanThreads, 0, stream>>>(plan_params(batch, kernel));
  GD_CHECK_LAUNCH();
  planned_ = kernel;  // the plan's tiles and wave; run_planned() launches the kernel for them
}

void PagedAttention::run_planned(const AttentionBatch& batch, const PagedKvView& kv, const void* q,
                                 void* out, float* lse, cudaStream_t stream,
                                 PriorWrites prior) const {
  launch_attention(batch, kv, q, out, lse, /*self_plan=*/false, planned_, prior, stream);
}

void PagedAttention::launch_attention(const AttentionBatch& batch, const PagedKvView& kv,
                                      const void* q, void* out, float* lse, bool self_plan,
                                      attn::KernelChoice kernel, PriorWrites prior,
                                      cudaStream_t stream) const {
  using namespace attn;
  const AttentionConfig& c = config_;
  // Host-side checks of shapes only (no device reads): the step path stays sync-free.
  KernelParams kp{};
  kp.call = plan_params(batch, kernel);  // checks the batch pointers
  GD_REQUIRE(q != nullptr && out != nullptr, "q/out", "null", "query and output must be set");
  GD_REQUIRE(kv.num_kv_heads == c.num_kv_heads, "kv.num_kv_heads", kv.num_kv_heads,
             "does not match the attention config");
  GD_REQUIRE(kv.head_dim == c.head_dim, "kv.head_dim", kv.head_dim,
             "does not match the attention config");
  GD_REQUIRE(kv.page_size > 0 && kv.k && kv.v && kv.page_table, "kv.page_size", kv.page_size,
             "KV view is incomplete");
  GD_REQUIRE(static_cast<long long>(kv.max_pages_per_slot) * kv.page_size >= c.max_kv_len,
             "kv.max_pages_per_slot", kv.max_pages_per_slot,
             "page table rows are shorter than max_kv_len");
  // The K/V tile copies offset a page in 32 bits (kv_tile_copy.cuh, load_kv_tile).
  GD_REQUIRE(static_cast<long long>(kv.num_kv_heads) * kv.page_size * kv.head_dim *
                     static_cast<long long>(dtype_bytes(c.dtype)) <=
                 INT32_MAX,
             "kv.page_size", kv.page_size, "one page of all KV heads must stay under 2^31 bytes");
  GD_REQUIRE(prior == PriorWrites::kAnything || prior == PriorWrites::kQueryAndNewKv, "prior",
             static_cast<int>(prior), "unknown PriorWrites value");

  kp.q = q;
  kp.out = out;
  kp.lse = lse;
  kp.kv = kv;
  kp.partial_o = partial_o_.data();
  kp.partial_lse = partial_lse_.data();
  kp.merge_count = counters_.data();
  kp.work_counter = counters_.data() + max_work_;
  const float sm_scale = c.sm_scale > 0.f ? c.sm_scale : 1.f / std::sqrt(float(c.head_dim));
  kp.page_div = FastDivmod::make(static_cast<std::uint32_t>(kv.page_size));
  kp.group_div = FastDivmod::make(static_cast<std::uint32_t>(kp.call.group));
  kp.kv_heads_div = FastDivmod::make(static_cast<std::uint32_t>(kv.num_kv_heads));
  kp.scale_log2 = sm_scale * 1.4426950408889634f;
  kp.self_plan = self_plan;
  kp.early_kv = prior == PriorWrites::kQueryAndNewKv && c.mode == AttentionMode::kCausal;
  dispatch(c.dtype, c.head_dim, [&](auto t, auto d) {
    // One wave of resident CTAs at most; CTAs that finish claim the items past it (kPersistent).
    // A grid of the work capacity would launch CTAs that find no work, each of which still pays
    // its launch and the plan read (bench/NOTES.md 54).
    const std::int64_t target = target_of(kernel);
    const std::int64_t grid =
        kPersistent<d.value> ? std::min<std::int64_t>(max_work_, target) : max_work_;
    if constexpr (kWideExtend<d.value>) {
      if (kernel == KernelChoice::kWide) {
        launch<decltype(t), d.value, true>(kp, static_cast<int>(grid), stream);
        return;
      }
    }
    if constexpr (kDenseDecode<d.value>) {
      if (kernel == KernelChoice::kDense) {
        launch<decltype(t), d.value, false, true>(kp, static_cast<int>(grid), stream);
        return;
      }
    }
    launch<decltype(t), d.value, false>(kp, static_cast<int>(grid), stream);
  });
}

void PagedAttention::run(const AttentionBatch& batch, const PagedKvView& kv, const void* q,
                         void* out, float* lse, cudaStream_t stream) const {
  if (config_.max_batch <= attn::kThreads) {  // every CTA plans the batch itself (NOTES 18)
    planned_ = choose(batch);
    launch_attention(batch, kv, q, out, lse, /*self_plan=*/true, planned_, PriorWrites::kAnything,
                     stream);
    return;
  }
  plan(batch, stream);
  launch_attention(batch, kv, q, out, lse, /*self_plan=*/false, planned_, PriorWrites::kAnything,
                   stream);
}

}  // namespace graphdecode
