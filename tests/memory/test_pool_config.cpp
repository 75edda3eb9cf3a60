// Pool sizing and validation, command batches and the host reference of the apply kernel. No GPU.
#include <gtest/gtest.h>

#include <vector>

#include "common/request_rules.h"
#include "memory/kv_pool.h"
#include "memory/pool_config.h"
#include "memory/table_commands.h"
#include "memory_test_util.h"

namespace graphdecode {
namespace {

using testing::expect_error_field;

PoolGeometry good() {
  PoolGeometry g;
  g.page_size = 16;
  g.num_pages = 100;
  g.max_slots = 8;
  g.max_pages_per_slot = 32;
  return g;
}

TEST(PoolConfig, GeometryValidationNamesField) {
  good().validate();
  auto bad = [](auto edit, const char* field) {
    PoolGeometry g = good();
    edit(g);
    expect_error_field([&] { g.validate(); }, field);
  };
  bad([](PoolGeometry& g) { g.page_size = 0; }, "page_size");
  bad([](PoolGeometry& g) { g.num_pages = 1; }, "num_pages");
  bad([](PoolGeometry& g) { g.max_slots = 1; }, "max_slots");
  bad([](PoolGeometry& g) { g.max_pages_per_slot = 0; }, "max_pages_per_slot");
  bad([](PoolGeometry& g) { g.kind = static_cast<AttentionKind>(9); }, "kind");
  bad([](PoolGeometry& g) { g.window_left = 0; }, "window_left");  // full pool
  bad(
      [](PoolGeometry& g) {
        g.kind = AttentionKind::kSliding;
        g.window_left = -1;
      },
      "window_left");
  bad(
      [](PoolGeometry& g) {
        g.kind = AttentionKind::kSliding;
        g.window_left = 32 * 16;
      },
      "window_left");
  bad(
      [](PoolGeometry& g) {
        g.kind = AttentionKind::kCross;
        g.window_left = 4;
      },
      "window_left");
  bad([](PoolGeometry& g) { g.max_pages_per_slot = 1 << 28; }, "max_pages_per_slot");
  bad([](PoolGeometry& g) { g.num_pages = 1 << 28; }, "num_pages");
  PoolGeometry w = good();
  w.kind = AttentionKind::kSliding;
  w.window_left = 32 * 16 - 1;
  w.validate();
  EXPECT_EQ(good().token_capacity(), 99 * 16);
  EXPECT_EQ(good().max_tokens_per_slot(), 512);
}

TEST(PoolConfig, SizingFromBytesAndTokens) {
  KvShape s{32, 8, 128, DType::kBF16};
  // K and V, 32 layers, 8 heads, 16 tokens, 128 dims, 2 bytes.
  EXPECT_EQ(kv_page_bytes(s, 16), 2LL * 32 * 8 * 16 * 128 * 2);
  const std::int64_t page = kv_page_bytes(s, 16);
  EXPECT_EQ(pages_for_byte_budget(s, 16, 10 * page + page - 1), 10);
  expect_error_field([&] { pages_for_byte_budget(s, 16, page); }, "budget_bytes");
  EXPECT_EQ(pages_for_token_budget(16, 16), 2);  // one usable page + the reserved one
  EXPECT_EQ(pages_for_token_budget(17, 16), 3);
  EXPECT_EQ(pages_for_token_budget(5, 1), 6);
  expect_error_field([&] { pages_for_token_budget(0, 16); }, "tokens");
  expect_error_field([&] { pages_for_token_budget(16, 0); }, "page_size");
  KvShape bad_dim{1, 1, 60, DType::kFP16};
  expect_error_field([&] { kv_page_bytes(bad_dim, 16); }, "head_dim");
  KvShape bad_layers{0, 1, 64, DType::kFP16};
  expect_error_field([&] { bad_layers.validate(); }, "num_layers");
  KvShape bad_heads{1, 0, 64, DType::kFP16};
  expect_error_field([&] { bad_heads.validate(); }, "num_kv_heads");
  KvShape bad_dtype{1, 1, 64, static_cast<DType>(5)};
  expect_error_field([&] { bad_dtype.validate(); }, "dtype");
}

TEST(PoolConfig, SlidingWindowSizing) {
  // window_left + new tokens spans at most ceil(that / page) + 1 pages.
  EXPECT_EQ(swa_pages_per_request(0, 1, 16), 2);
  EXPECT_EQ(swa_pages_per_request(15, 1, 16), 2);
  EXPECT_EQ(swa_pages_per_request(16, 1, 16), 3);
  EXPECT_EQ(swa_pages_per_request(53, 4, 16), 5);
  EXPECT_EQ(swa_pages_per_request(7, 1, 1), 9);
  EXPECT_EQ(swa_pool_pages(10, 15, 1, 16), 21);
  expect_error_field([] { swa_pages_per_request(-1, 1, 16); }, "window_left");
  expect_error_field([] { swa_pages_per_request(4, 0, 16); }, "max_new_tokens");
  expect_error_field([] { swa_pool_pages(0, 4, 1, 16); }, "max_requests");
}

TEST(PoolConfig, KvPoolConfigValidatesWithoutCuda) {
  KvPoolConfig c;
  c.geometry = good();
  c.shape = KvShape{2, 4, 128, DType::kFP16};
  c.validate();
  EXPECT_EQ(c.resolved_max_commands(), 32);
  EXPECT_EQ(c.resolved_max_page_ids(), 100);
  c.shape.head_dim = 100;
  expect_error_field([&] { c.validate(); }, "head_dim");
  c.shape.head_dim = 128;
  c.max_commands = -1;
  expect_error_field([&] { c.validate(); }, "max_commands");
}

TEST(TableCommands, BatchRoomAndContent) {
  TableCommandBatch b(2, 3);
  const std::int32_t pages[] = {5, 7};
  b.push_set(1, 4, pages);
  EXPECT_EQ(b.size(), 1);
  EXPECT_EQ(b.page_id_count(), 2);
  const std::int32_t three[] = {1, 2, 3};
  expect_error_field([&] { b.push_set(1, 0, three); }, "page_ids");
  EXPECT_EQ(b.page_id_count(), 2);
  b.push_clear(2, 0, 3);
  expect_error_field([&] { b.push_clear(2, 0, 1); }, "commands");
  EXPECT_EQ(b.size(), 2);
  EXPECT_EQ(b.commands()[0].page_offset, 0);
  EXPECT_EQ(b.commands()[1].op, kTableClearPages);
  b.clear();
  EXPECT_TRUE(b.empty());
  expect_error_field([] { TableCommandBatch x(0, 1); }, "max_commands");
}

TEST(TableCommands, HostApplyOrderAndErrors) {
  PoolGeometry g = good();
  std::vector<std::int32_t> table(8 * 32);
  init_page_table_host(g, table);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(table[i], kReservedPage);
  for (int i = 32; i < 8 * 32; ++i) EXPECT_EQ(table[i], kInvalidPage);
  TableCommandBatch b(8, 16);
  const std::int32_t a[] = {9, 4, 77};
  const std::int32_t c[] = {12};
  b.push_set(3, 0, a);
  b.push_clear(3, 1, 2);  // later command wins on the same entries
  b.push_set(3, 2, c);
  apply_table_commands_host(b.commands(), b.page_ids(), g, table);
  EXPECT_EQ(table[3 * 32 + 0], 9);
  EXPECT_EQ(table[3 * 32 + 1], kInvalidPage);
  EXPECT_EQ(table[3 * 32 + 2], 12);
  EXPECT_EQ(table[3 * 32 + 3], kInvalidPage);

  const std::vector<std::int32_t> before = table;
  auto bad = [&](TableCommand cmd, std::vector<std::int32_t> ids, const char* field) {
    const std::vector<TableCommand> cmds = {TableCommand{2, kTableClearPages, 0, 1, 0}, cmd};
    expect_error_field([&] { apply_table_commands_host(cmds, ids, g, table); }, field);
    EXPECT_EQ(table, before);
  };
  bad({0, kTableClearPages, 0, 1, 0}, {}, "slot");  // the padding row is never changed
  bad({8, kTableClearPages, 0, 1, 0}, {}, "slot");
  bad({1, 7, 0, 1, 0}, {}, "op");
  bad({1, kTableClearPages, 31, 2, 0}, {}, "first_index");
  bad({1, kTableClearPages, -1, 1, 0}, {}, "first_index");
  bad({1, kTableSetPages, 0, 2, 0}, {5}, "page_offset");
  bad({1, kTableSetPages, 0, 1, 0}, {kReservedPage}, "page_id");
  bad({1, kTableSetPages, 0, 1, 0}, {100}, "page_id");
}

}  // namespace
}  // namespace graphdecode
