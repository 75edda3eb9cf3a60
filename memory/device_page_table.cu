#include <algorithm>
#include <cstring>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "common/request_rules.h"
#include "memory/device_page_table.h"

namespace graphdecode {
namespace {

constexpr int kApplyThreads = 128;
constexpr int kApplyWarps = kApplyThreads / 32;
constexpr std::size_t kHeaderWords = 4;  // count + padding: commands start 16-byte aligned
constexpr std::size_t kCommandWords = sizeof(TableCommand) / sizeof(std::int32_t);

static_assert(kInvalidPage == -1 && kReservedPage == 0,
              "reset() writes the table with memset: 0xFF bytes = -1, 0x00 bytes = 0");

// Entry e of the row is always written by thread e % kApplyThreads, whichever command writes it.
// Two commands of the same slot touching the same entry therefore run in batch order on one thread,
// which is what makes "a later command wins" hold without a barrier between commands.
__device__ void apply_one(const TableCommand& c, std::int32_t* row, const TableApplyParams& p) {
  const bool range_ok =
      c.count >= 0 && c.first_index >= 0 && c.first_index <= p.max_pages_per_slot - c.count;
  const bool set = c.op == kTableSetPages;
  const bool ops_ok = set ? (c.page_offset >= 0 && c.page_offset <= p.max_page_ids - c.count)
                          : c.op == kTableClearPages;
  if (!range_ok || !ops_ok) return;
  const int end = c.first_index + c.count;
  const int lag = (static_cast<int>(threadIdx.x) - c.first_index % kApplyThreads + kApplyThreads) %
                  kApplyThreads;
  for (int e = c.first_index + lag; e < end; e += kApplyThreads) {
    std::int32_t v = kInvalidPage;
    if (set) {
      v = p.page_ids[c.page_offset + (e - c.first_index)];
      if (v <= kReservedPage || v >= p.num_pages) continue;  // never publish a foreign page
    }
    row[e] = v;
  }
}

__global__ void __launch_bounds__(kApplyThreads)
    apply_table_commands_kernel(const __grid_constant__ TableApplyParams p) {
  __shared__ TableCommand chunk[kApplyThreads];
  __shared__ unsigned matches[kApplyWarps];
  const int slot = static_cast<int>(blockIdx.x);
  if (slot == kPaddingSlot) return;  // the padding row is fixed at reset
  const int n = min(max(*p.num_commands, 0), p.max_commands);
  std::int32_t* row = p.page_table + static_cast<std::int64_t>(slot) * p.max_pages_per_slot;
  for (int base = 0; base < n; base += kApplyThreads) {
    const int i = base + static_cast<int>(threadIdx.x);
    bool mine = false;
    if (i < n) {
      const TableCommand c = p.commands[i];
      chunk[threadIdx.x] = c;
      mine = c.slot == slot;
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    if ((threadIdx.x & 31) == 0) matches[threadIdx.x >> 5] = ballot;
    __syncthreads();
    for (int w = 0; w < kApplyWarps; ++w) {
      for (unsigned m = matches[w]; m != 0; m &= m - 1) {
        apply_one(chunk[w * 32 + __ffs(static_cast<int>(m)) - 1], row, p);
      }
    }
    __syncthreads();  // chunk and matches are overwritten by the next round
  }
}

}  // namespace

void launch_apply_table_commands(const TableApplyParams& p, cudaStream_t stream) {
  GD_REQUIRE(p.commands != nullptr, "commands", "null", "device command array missing");
  GD_REQUIRE(p.num_commands != nullptr, "num_commands", "null", "device command count missing");
  GD_REQUIRE(p.page_ids != nullptr || p.max_page_ids == 0, "page_ids", "null",
             "device page-id array missing");
  GD_REQUIRE(p.page_table != nullptr, "page_table", "null", "device page table missing");
  GD_REQUIRE(p.max_commands >= 1, "max_commands", p.max_commands, "capacity must be positive");
  GD_REQUIRE(p.max_page_ids >= 0, "max_page_ids", p.max_page_ids, "capacity cannot be negative");
  GD_REQUIRE(p.max_slots >= 2, "max_slots", p.max_slots, "need the padding slot and one more");
  GD_REQUIRE(p.max_pages_per_slot >= 1, "max_pages_per_slot", p.max_pages_per_slot,
             "rows need at least one entry");
  GD_REQUIRE(p.num_pages >= 2, "num_pages", p.num_pages, "need the reserved page and one more");
  apply_table_commands_kernel<<<p.max_slots, kApplyThreads, 0, stream>>>(p);
  GD_CHECK_LAUNCH();
}

DevicePageTable::DevicePageTable(const PoolGeometry& geometry, std::int32_t max_commands,
                                 std::int32_t max_page_ids, cudaStream_t stream)
    : geometry_(geometry), max_commands_(max_commands), max_page_ids_(max_page_ids) {
  geometry_.validate();
  GD_REQUIRE(max_commands >= 1, "max_commands", max_commands, "capacity must be positive");
  GD_REQUIRE(max_page_ids >= 0, "max_page_ids", max_page_ids, "capacity cannot be negative");
  table_ = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(geometry_.max_slots) *
                                      static_cast<std::size_t>(geometry_.max_pages_per_slot));
  page_ids_word_ = kHeaderWords + kCommandWords * static_cast<std::size_t>(max_commands);
  const std::size_t words = page_ids_word_ + static_cast<std::size_t>(max_page_ids);
  staging_host_ = PinnedBuffer<std::int32_t>(words);
  staging_dev_ = DeviceBuffer<std::int32_t>(words);
  reset(stream);
}

void DevicePageTable::reset(cudaStream_t stream) {
  const std::size_t row_bytes =
      static_cast<std::size_t>(geometry_.max_pages_per_slot) * sizeof(std::int32_t);
  GD_CUDA(cudaMemsetAsync(table_.data(), 0xFF, table_.bytes(), stream));  // kInvalidPage
  GD_CUDA(cudaMemsetAsync(table_.data(), 0x00, row_bytes, stream));       // padding row: page 0
}

void DevicePageTable::apply(const TableCommandBatch& batch, cudaStream_t stream) {
  GD_REQUIRE(batch.size() <= max_commands_, "commands", batch.size(),
             "batch larger than the table's max_commands (" + std::to_string(max_commands_) + ")");
  GD_REQUIRE(batch.page_id_count() <= max_page_ids_, "page_ids", batch.page_id_count(),
             "batch larger than the table's max_page_ids (" + std::to_string(max_page_ids_) + ")");
  validate_table_commands(batch.commands(), batch.page_ids(), geometry_);
  if (batch.empty()) return;

  // The previous copy out of the pinned staging may still be in flight.
  if (staged_pending_) staged_.synchronize();
  std::int32_t* h = staging_host_.data();
  h[0] = batch.size();
  std::memcpy(h + kHeaderWords, batch.commands().data(), batch.commands().size_bytes());
  std::memcpy(h + page_ids_word_, batch.page_ids().data(), batch.page_ids().size_bytes());
  const std::size_t words = page_ids_word_ + static_cast<std::size_t>(batch.page_id_count());
  GD_CUDA(cudaMemcpyAsync(staging_dev_.data(), h, words * sizeof(std::int32_t),
                          cudaMemcpyHostToDevice, stream));
  staged_.record(stream);
  staged_pending_ = true;

  TableApplyParams p;
  p.commands = reinterpret_cast<const TableCommand*>(staging_dev_.data() + kHeaderWords);
  p.num_commands = staging_dev_.data();
  p.page_ids = staging_dev_.data() + page_ids_word_;
  p.page_table = table_.data();
  p.max_commands = max_commands_;
  p.max_page_ids = max_page_ids_;
  p.max_slots = geometry_.max_slots;
  p.max_pages_per_slot = geometry_.max_pages_per_slot;
  p.num_pages = geometry_.num_pages;
  launch_apply_table_commands(p, stream);
}

void DevicePageTable::download(std::span<std::int32_t> host, cudaStream_t stream) const {
  GD_REQUIRE(host.size() == table_.size(), "host", host.size(),
             "download needs [max_slots][max_pages_per_slot] entries");
  table_.download(host.data(), host.size(), stream);
  GD_CUDA(cudaStreamSynchronize(stream));
}

}  // namespace graphdecode
