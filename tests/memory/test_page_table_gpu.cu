// The device table apply kernel against the host reference (apply_table_commands_host) and the
// host bookkeeping, with shuffled non-monotonic pages; inside a captured graph; bad batches.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "common/buffers.h"
#include "common/request_rules.h"
#include "common/stream.h"
#include "memory/device_page_table.h"
#include "memory/kv_pool.h"
#include "memory/request_slots.h"
#include "memory_test_util.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using testing::expect_error_field;

class PageTableGpu : public testing::GpuTest {};

PoolGeometry geom(AttentionKind kind, std::int32_t page, std::int32_t window_left) {
  PoolGeometry g;
  g.kind = kind;
  g.page_size = page;
  g.max_slots = 9;
  g.max_pages_per_slot = 300 / page + 8;  // room for prefills up to ~300 tokens
  g.num_pages = kind == AttentionKind::kSliding ? 6 * (g.max_pages_per_slot / 3) + 8
                                                : 4 * g.max_pages_per_slot + 8;
  g.window_left = window_left;
  return g;
}

std::vector<std::int32_t> download(const DevicePageTable& t, const Stream& s) {
  std::vector<std::int32_t> h(static_cast<std::size_t>(t.geometry().max_slots) *
                              t.geometry().max_pages_per_slot);
  t.download(h, s);
  return h;
}

// One random step's worth of operations, including release + acquire + extend of the same slot
// in one batch (the apply kernel must keep batch order per slot).
void random_batch(RequestSlots& s, TableCommandBatch& b, std::mt19937_64& rng) {
  const std::int32_t P = s.geometry().page_size;
  const int ops = 1 + static_cast<int>(rng() % 12);
  for (int i = 0; i < ops; ++i) {
    const int kind = static_cast<int>(rng() % 8);
    const auto slot = static_cast<std::int32_t>(1 + rng() % (s.geometry().max_slots - 1));
    if (!b.has_room(RequestSlots::kMaxCommandsPerOp, s.geometry().max_pages_per_slot)) return;
    try {
      if (kind == 0 || !s.is_active(slot)) {
        if (s.active_slots() < s.geometry().max_slots - 1) {
          const std::int32_t r = s.acquire();
          s.extend(r, static_cast<std::int32_t>(rng() % (12 * P + 3)), b);
        }
      } else if (kind <= 4) {
        s.extend(slot, static_cast<std::int32_t>(1 + rng() % (P + 4)), b);
      } else if (kind == 5 && s.geometry().kind != AttentionKind::kCross) {
        const std::int32_t t = s.tokens(slot);
        s.truncate(slot, t - static_cast<std::int32_t>(rng() % (t / 4 + 1)), b);
      } else {
        s.release(slot, b);
        const std::int32_t r = s.acquire();  // often the same slot again
        s.extend(r, static_cast<std::int32_t>(1 + rng() % (3 * P)), b);
      }
    } catch (const Error&) {
      // Refused (pool full, window, cross written once): nothing changed, by contract (tested on
      // the CPU); the batch stays consistent with the host mirror.
    }
  }
}

TEST_F(PageTableGpu, ApplyMatchesHostReferenceShuffledPages) {
  const std::uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Stream stream;
  for (std::int32_t P : {1, 16, 64}) {
    for (AttentionKind kind :
         {AttentionKind::kFull, AttentionKind::kSliding, AttentionKind::kCross}) {
      const std::int32_t wl = kind == AttentionKind::kSliding ? 3 * P + 5 : -1;
      const PoolGeometry g = geom(kind, P, wl);
      SCOPED_TRACE(std::string(attention_kind_name(kind)) + " page " + std::to_string(P));
      std::mt19937_64 rng(seed + P * 7 + static_cast<int>(kind));
      PageAllocator alloc(g.num_pages);
      RequestSlots slots(g, alloc);
      testing::scramble_free_pages(alloc, rng);
      DevicePageTable table(g, 32, 16 * g.max_pages_per_slot, stream);
      TableCommandBatch batch(32, 16 * g.max_pages_per_slot);
      std::vector<std::int32_t> host(slots.table().size());
      init_page_table_host(g, host);
      ASSERT_EQ(download(table, stream), host);
      bool saw_non_monotonic = false;
      for (int step = 0; step < 60; ++step) {
        batch.clear();
        random_batch(slots, batch, rng);
        const auto ids = batch.page_ids();
        for (std::size_t i = 1; i < ids.size(); ++i) saw_non_monotonic |= ids[i] < ids[i - 1];
        table.apply(batch, stream);
        apply_table_commands_host(batch.commands(), batch.page_ids(), g, host);
        const auto dev = download(table, stream);
        ASSERT_EQ(dev, host) << "step " << step;
        ASSERT_TRUE(std::equal(dev.begin(), dev.end(), slots.table().begin())) << "step " << step;
      }
      EXPECT_TRUE(saw_non_monotonic);
    }
  }
}

// Captured once, replayed with different batches: the count and commands are read from device
// memory at replay, so one graph serves any batch up to capacity (including an empty one).
TEST_F(PageTableGpu, ApplyInsideCapturedGraph) {
  const std::uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed ^ 0x9e37);
  const PoolGeometry g = geom(AttentionKind::kSliding, 16, 15);
  constexpr std::int32_t kMaxCommands = 40, kMaxIds = 600;
  Stream stream;
  PageAllocator alloc(g.num_pages);
  RequestSlots slots(g, alloc);
  testing::scramble_free_pages(alloc, rng);
  DevicePageTable table(g, kMaxCommands, kMaxIds, stream);
  DeviceBuffer<TableCommand> d_cmds(kMaxCommands);
  DeviceBuffer<std::int32_t> d_count(1), d_ids(kMaxIds);

  TableApplyParams p;
  p.commands = d_cmds.data();
  p.num_commands = d_count.data();
  p.page_ids = d_ids.data();
  p.page_table = table.data();
  p.max_commands = kMaxCommands;
  p.max_page_ids = kMaxIds;
  p.max_slots = g.max_slots;
  p.max_pages_per_slot = g.max_pages_per_slot;
  p.num_pages = g.num_pages;

  cudaGraph_t graph = nullptr;
  GD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    launch_apply_table_commands(p, stream);
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    throw;
  }
  GD_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  GD_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  std::vector<std::int32_t> host(slots.table().size());
  init_page_table_host(g, host);
  TableCommandBatch batch(kMaxCommands, kMaxIds);
  for (int step = 0; step < 25; ++step) {
    batch.clear();
    if (step % 5 != 2) random_batch(slots, batch, rng);  // some replays apply nothing
    const std::int32_t n = batch.size();
    d_count.upload(&n, 1, stream);
    if (n > 0) d_cmds.upload(batch.commands().data(), static_cast<std::size_t>(n), stream);
    if (batch.page_id_count() > 0)
      d_ids.upload(batch.page_ids().data(), static_cast<std::size_t>(batch.page_id_count()),
                   stream);
    GD_CUDA(cudaGraphLaunch(exec, stream));
    apply_table_commands_host(batch.commands(), batch.page_ids(), g, host);
    ASSERT_EQ(download(table, stream), host) << "replay " << step;
  }
  GD_CUDA(cudaGraphExecDestroy(exec));
  GD_CUDA(cudaGraphDestroy(graph));
}

// A bad batch throws naming the field before anything is copied or launched.
TEST_F(PageTableGpu, BadBatchThrowsAndLeavesTable) {
  const PoolGeometry g = geom(AttentionKind::kFull, 16, -1);
  Stream stream;
  DevicePageTable table(g, 4, 8, stream);
  TableCommandBatch ok(4, 8);
  const std::int32_t pages[] = {5, 3};
  ok.push_set(2, 0, pages);
  table.apply(ok, stream);
  const auto before = download(table, stream);
  EXPECT_EQ(before[2 * g.max_pages_per_slot + 1], 3);

  TableCommandBatch big(5, 8);
  for (int i = 0; i < 5; ++i) big.push_clear(2, 0, 1);
  expect_error_field([&] { table.apply(big, stream); }, "commands");
  TableCommandBatch many_ids(4, 9);
  const std::int32_t nine[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  many_ids.push_set(3, 0, nine);
  expect_error_field([&] { table.apply(many_ids, stream); }, "page_ids");
  TableCommandBatch foreign(4, 8);
  const std::int32_t outside[] = {4, g.num_pages};
  foreign.push_clear(2, 0, 2);
  foreign.push_set(3, 0, outside);
  expect_error_field([&] { table.apply(foreign, stream); }, "page_id");
  TableCommandBatch padding(4, 8);
  padding.push_clear(kPaddingSlot, 0, 1);
  expect_error_field([&] { table.apply(padding, stream); }, "slot");
  TableCommandBatch past_row(4, 8);
  past_row.push_clear(1, g.max_pages_per_slot - 1, 2);
  expect_error_field([&] { table.apply(past_row, stream); }, "first_index");
  EXPECT_EQ(download(table, stream), before);

  TableApplyParams p;  // null pointers are refused at the launch site
  expect_error_field([&] { launch_apply_table_commands(p, stream); }, "commands");
}

TEST_F(PageTableGpu, KvPoolStartsWithPaddingRowOnReservedPage) {
  KvPoolConfig c;
  c.geometry = geom(AttentionKind::kFull, 16, -1);
  c.shape = KvShape{3, 2, 64, DType::kFP16};
  Stream stream;
  KvPool pool(c, stream);
  EXPECT_EQ(pool.num_pages(), c.geometry.num_pages);
  EXPECT_EQ(pool.token_capacity(), static_cast<std::int64_t>(c.geometry.num_pages - 1) * 16);
  EXPECT_EQ(pool.kv_bytes(),
            static_cast<std::size_t>(c.geometry.num_pages) * kv_page_bytes(c.shape, 16));
  std::vector<std::int32_t> expect(static_cast<std::size_t>(c.geometry.max_slots) *
                                   c.geometry.max_pages_per_slot);
  init_page_table_host(c.geometry, expect);
  EXPECT_EQ(download(pool.table(), stream), expect);
  const PagedKvView v0 = pool.view(0), v2 = pool.view(2);
  EXPECT_EQ(v0.page_table, pool.table().data());
  EXPECT_EQ(v0.page_size, 16);
  EXPECT_EQ(v0.num_kv_heads, 2);
  EXPECT_EQ(v0.head_dim, 64);
  EXPECT_EQ(v0.num_pages, c.geometry.num_pages);
  EXPECT_EQ(v0.max_pages_per_slot, c.geometry.max_pages_per_slot);
  const std::size_t layer_bytes = pool.kv_bytes() / 3 / 2;
  EXPECT_EQ(static_cast<char*>(v0.v) - static_cast<char*>(v0.k),
            static_cast<std::ptrdiff_t>(layer_bytes));
  EXPECT_EQ(static_cast<char*>(v2.k) - static_cast<char*>(v0.k),
            static_cast<std::ptrdiff_t>(4 * layer_bytes));
  expect_error_field([&] { pool.view(3); }, "layer");
  KvPoolConfig bad = c;
  bad.shape.head_dim = 68;
  expect_error_field([&] { KvPool p(bad, stream); }, "head_dim");
  EXPECT_EQ(pool.make_batch().max_commands(), 4 * c.geometry.max_slots);
}

}  // namespace
}  // namespace graphdecode
