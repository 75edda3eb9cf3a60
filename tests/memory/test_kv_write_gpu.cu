// The K/V write kernel against a CPU copy: every element that should be written is, nothing else
// changes (outputs poisoned with 0xFF bytes first). Shuffled non-monotonic pages and token order,
// page sizes 1/16/64, bf16 and fp16, head dims 64/128/256, both destination forms, padding rows,
// skipped destinations (kInvalidPage, out of range), tokens past num_tokens, graph replay.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "common/buffers.h"
#include "common/request_rules.h"
#include "common/stream.h"
#include "memory/kv_pool.h"
#include "memory/kv_write.h"
#include "memory/request_slots.h"
#include "memory_test_util.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using testing::expect_error_field;

constexpr std::int32_t kHeads = 2;
constexpr std::uint16_t kPoison = 0xFFFF;  // never produced by converting a finite float

class KvWriteGpu : public testing::GpuTest {};

std::vector<std::uint16_t> random_values(std::size_t n, DType dtype, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.f, 2.f);
  std::vector<std::uint16_t> out(n);
  for (auto& x : out) {
    const float f = dist(rng);
    if (dtype == DType::kBF16) {
      const __nv_bfloat16 b = __float2bfloat16(f);
      std::memcpy(&x, &b, 2);
    } else {
      const __half h = __float2half(f);
      std::memcpy(&x, &h, 2);
    }
  }
  return out;
}

// A pool with live requests on shuffled pages, and one step's token list.
struct Scene {
  KvPoolConfig config;
  std::int32_t page_size = 0, head_dim = 0;
  std::size_t layer_elems = 0;
  std::vector<std::int32_t> slot, position;  // [max_tokens]
  std::int32_t num_tokens = 0;               // tokens [num_tokens, max_tokens) must not land
  std::int32_t max_tokens() const { return static_cast<std::int32_t>(slot.size()); }
};

// Builds the requests through RequestSlots + the device table, then the token list.
Scene make_scene(KvPool& pool, RequestSlots& slots, std::mt19937_64& rng, const Stream& stream) {
  Scene sc;
  sc.config = pool.config();
  const PoolGeometry& g = sc.config.geometry;
  const std::int32_t P = g.page_size;
  sc.page_size = P;
  sc.head_dim = sc.config.shape.head_dim;
  sc.layer_elems = static_cast<std::size_t>(g.num_pages) * kHeads * P * sc.head_dim;
  TableCommandBatch batch = pool.make_batch();
  std::vector<std::int32_t> live, prefix, extend;
  for (int r = 0; r < 4; ++r) {
    live.push_back(slots.acquire());
    prefix.push_back(r == 0 ? 50 : static_cast<std::int32_t>(rng() % 101));
    slots.extend(live.back(), prefix.back(), batch);  // prefill (written earlier, not now)
  }
  pool.table().apply(batch, stream);
  batch.clear();
  for (std::size_t r = 0; r < live.size(); ++r) {
    extend.push_back(1 + static_cast<std::int32_t>(rng() % 8));  // decode 1, verify up to 8
    slots.extend(live[r], extend[r], batch);
  }
  pool.table().apply(batch, stream);

  std::vector<std::pair<std::int32_t, std::int32_t>> tokens;
  for (std::size_t r = 0; r < live.size(); ++r)
    for (std::int32_t i = 0; i < extend[r]; ++i)
      tokens.emplace_back(live[r], new_token_position(prefix[r], i));
  // Padding rows: slot 0, distinct offsets in the reserved page (so the expected copy is exact).
  for (std::int32_t j = 0; j < std::min(P, 2); ++j)
    tokens.emplace_back(kPaddingSlot, j + P * static_cast<std::int32_t>(rng() % 3));
  // Skipped: past the request's pages (kInvalidPage entry), a slot never acquired, bad ids.
  const std::int32_t past = pages_for_tokens(prefix[1] + extend[1], P) * P + 1 % P;
  if (past / P < g.max_pages_per_slot) tokens.emplace_back(live[1], past);
  tokens.emplace_back(g.max_slots - 1, 3);  // never acquired: its row is all kInvalidPage
  tokens.emplace_back(g.max_slots + 4, 0);
  tokens.emplace_back(live[2], -5);
  tokens.emplace_back(live[2], g.max_pages_per_slot * P + 7);
  std::shuffle(tokens.begin(), tokens.end(), rng);
  sc.num_tokens = static_cast<std::int32_t>(tokens.size());
  // Capacity rows past num_tokens: valid destinations (request 0's prefill) that must stay poison.
  for (std::int32_t pos = 0; pos < 4; ++pos) tokens.emplace_back(live[0], pos);
  for (auto& [s, p] : tokens) {
    sc.slot.push_back(s);
    sc.position.push_back(p);
  }
  return sc;
}

// Page id and offset for a token, resolved on the host from the bookkeeping; -1 when skipped.
std::int32_t host_flat_dest(const RequestSlots& slots, std::int32_t s, std::int32_t pos) {
  const PoolGeometry& g = slots.geometry();
  if (s < 0 || s >= g.max_slots || pos < 0 || pos / g.page_size >= g.max_pages_per_slot) return -1;
  const std::int32_t page = slots.row(s)[pos / g.page_size];
  return page == kInvalidPage ? -1 : page * g.page_size + pos % g.page_size;
}

// Expected layer contents: poison, then tokens [0, n) copied to their destinations.
void expect_write(const Scene& sc, const std::vector<std::int32_t>& dest, std::int32_t n,
                  const std::vector<std::uint16_t>& src, std::vector<std::uint16_t>& out) {
  out.assign(sc.layer_elems, kPoison);
  const std::int32_t P = sc.page_size, D = sc.head_dim;
  for (std::int32_t t = 0; t < n; ++t) {
    if (dest[t] < 0) continue;
    const std::int32_t page = dest[t] / P, off = dest[t] % P;
    for (std::int32_t h = 0; h < kHeads; ++h)
      for (std::int32_t d = 0; d < D; ++d)
        out[((static_cast<std::size_t>(page) * kHeads + h) * P + off) * D + d] =
            src[(static_cast<std::size_t>(t) * kHeads + h) * D + d];
  }
}

void poison(KvPool& pool, const Scene& sc, const Stream& stream) {
  for (std::int32_t l = 0; l < sc.config.shape.num_layers; ++l) {
    GD_CUDA(cudaMemsetAsync(pool.view(l).k, 0xFF, sc.layer_elems * 2, stream));
    GD_CUDA(cudaMemsetAsync(pool.view(l).v, 0xFF, sc.layer_elems * 2, stream));
  }
}

std::vector<std::uint16_t> read(void* dev, std::size_t elems, const Stream& stream) {
  std::vector<std::uint16_t> h(elems);
  GD_CUDA(cudaMemcpyAsync(h.data(), dev, elems * 2, cudaMemcpyDeviceToHost, stream));
  stream.synchronize();
  return h;
}

void compare(const std::vector<std::uint16_t>& got, const std::vector<std::uint16_t>& want,
             const char* what) {
  ASSERT_EQ(got.size(), want.size());
  std::size_t bad = 0, first = 0, written = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    written += want[i] != kPoison;
    if (got[i] != want[i] && bad++ == 0) first = i;
  }
  EXPECT_GT(written, 0u) << what;
  ASSERT_EQ(bad, 0u) << what << ": first mismatch at element " << first << " got " << got[first]
                     << " want " << want[first];
}

KvPoolConfig pool_config(AttentionKind kind, std::int32_t P, std::int32_t D, DType dtype,
                         std::int32_t window_left = -1) {
  KvPoolConfig c;
  c.geometry.kind = kind;
  c.geometry.page_size = P;
  c.geometry.max_slots = 6;
  c.geometry.max_pages_per_slot = pages_for_tokens(160, P) + 1;
  c.geometry.num_pages = 5 * c.geometry.max_pages_per_slot + 4;
  c.geometry.window_left = window_left;
  c.shape = KvShape{2, kHeads, D, dtype};
  return c;
}

TEST_F(KvWriteGpu, MatchesCpuCopyBothDestinationForms) {
  const std::uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Stream stream;
  for (std::int32_t P : {1, 16, 64})
    for (DType dtype : {DType::kBF16, DType::kFP16})
      for (std::int32_t D : {64, 128, 256}) {
        SCOPED_TRACE("page " + std::to_string(P) + " " + std::string(dtype_name(dtype)) +
                     " head_dim " + std::to_string(D));
        std::mt19937_64 rng(seed + P * 1000 + D + static_cast<int>(dtype));
        KvPool pool(pool_config(AttentionKind::kFull, P, D, dtype), stream);
        PageAllocator alloc(pool.num_pages());
        RequestSlots slots(pool.config().geometry, alloc);
        testing::scramble_free_pages(alloc, rng);
        const Scene sc = make_scene(pool, slots, rng, stream);
        const std::size_t n_in = static_cast<std::size_t>(sc.max_tokens()) * kHeads * D;
        std::vector<std::int32_t> dest(sc.slot.size());
        for (std::size_t t = 0; t < dest.size(); ++t)
          dest[t] = host_flat_dest(slots, sc.slot[t], sc.position[t]);
        std::vector<std::int32_t> flat = dest;
        flat.back() = -1;
        flat[static_cast<std::size_t>(sc.num_tokens) - 1] = pool.num_pages() * P;  // out of range
        std::vector<std::int32_t> expect_flat = flat;
        expect_flat[static_cast<std::size_t>(sc.num_tokens) - 1] = -1;

        const auto k0 = random_values(n_in, dtype, rng), v0 = random_values(n_in, dtype, rng);
        const auto k1 = random_values(n_in, dtype, rng), v1 = random_values(n_in, dtype, rng);
        DeviceBuffer<std::uint16_t> dk0(n_in), dv0(n_in), dk1(n_in), dv1(n_in);
        dk0.upload(k0.data(), n_in, stream);
        dv0.upload(v0.data(), n_in, stream);
        dk1.upload(k1.data(), n_in, stream);
        dv1.upload(v1.data(), n_in, stream);
        DeviceBuffer<std::int32_t> d_slot(sc.slot.size()), d_pos(sc.slot.size()),
            d_flat(sc.slot.size()), d_n(1);
        d_slot.upload(sc.slot.data(), sc.slot.size(), stream);
        d_pos.upload(sc.position.data(), sc.slot.size(), stream);
        d_flat.upload(flat.data(), flat.size(), stream);
        d_n.upload(&sc.num_tokens, 1, stream);
        poison(pool, sc, stream);

        KvWriteArgs a;  // layer 0: (slot, position) through the device table
        a.cache = pool.view(0);
        a.max_slots = pool.config().geometry.max_slots;
        a.dtype = dtype;
        a.k_new = dk0.data();
        a.v_new = dv0.data();
        a.num_tokens = d_n.data();
        a.max_tokens = sc.max_tokens();
        a.slot = d_slot.data();
        a.position = d_pos.data();
        write_new_kv(a, stream);
        KvWriteArgs b = a;  // layer 1: given flat destinations
        b.cache = pool.view(1);
        b.k_new = dk1.data();
        b.v_new = dv1.data();
        b.slot = b.position = nullptr;
        b.flat_dest = d_flat.data();
        write_new_kv(b, stream);
        GD_CUDA(cudaGetLastError());

        std::vector<std::uint16_t> want;
        expect_write(sc, dest, sc.num_tokens, k0, want);
        compare(read(pool.view(0).k, sc.layer_elems, stream), want, "layer 0 K");
        expect_write(sc, dest, sc.num_tokens, v0, want);
        compare(read(pool.view(0).v, sc.layer_elems, stream), want, "layer 0 V");
        expect_write(sc, expect_flat, sc.num_tokens, k1, want);
        compare(read(pool.view(1).k, sc.layer_elems, stream), want, "layer 1 K");
        expect_write(sc, expect_flat, sc.num_tokens, v1, want);
        compare(read(pool.view(1).v, sc.layer_elems, stream), want, "layer 1 V");
      }
}

// Sliding window: positions in released pages (kInvalidPage entries) are skipped, even though
// their page ids now belong to another request.
TEST_F(KvWriteGpu, SlidingWindowSkipsReleasedPages) {
  const std::uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Stream stream;
  for (std::int32_t P : {1, 16, 64}) {
    SCOPED_TRACE("page " + std::to_string(P));
    std::mt19937_64 rng(seed + 77 * P);
    const std::int32_t wl = P + 3;
    KvPool pool(pool_config(AttentionKind::kSliding, P, 128, DType::kBF16, wl), stream);
    PageAllocator alloc(pool.num_pages());
    RequestSlots slots(pool.config().geometry, alloc);
    testing::scramble_free_pages(alloc, rng);
    TableCommandBatch batch = pool.make_batch();
    const std::int32_t a = slots.acquire(), b = slots.acquire();
    for (std::int32_t step = 0; step < 40; ++step) {  // one batch per step, as an engine does
      slots.extend(a, step < 35 ? 4 : 1, batch);
      pool.table().apply(batch, stream);
      batch.clear();
    }
    slots.extend(b, 3 * P, batch);  // takes the page ids request a released
    pool.table().apply(batch, stream);
    const std::int32_t first = slots.first_resident_page(a);
    ASSERT_GT(first, 0);
    std::vector<std::int32_t> s_slot, s_pos;
    for (std::int32_t pos = 0; pos < first * P; pos += std::max(1, P / 4)) {  // released
      s_slot.push_back(a);
      s_pos.push_back(pos);
    }
    for (std::int32_t pos = slots.tokens(a) - 2; pos < slots.tokens(a); ++pos) {  // resident
      s_slot.push_back(a);
      s_pos.push_back(pos);
    }
    std::vector<std::size_t> order(s_slot.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    Scene sc;
    sc.config = pool.config();
    sc.page_size = P;
    sc.head_dim = 128;
    sc.layer_elems = static_cast<std::size_t>(pool.num_pages()) * kHeads * P * 128;
    for (std::size_t i : order) {
      sc.slot.push_back(s_slot[i]);
      sc.position.push_back(s_pos[i]);
    }
    sc.num_tokens = sc.max_tokens();
    std::vector<std::int32_t> dest(sc.slot.size());
    for (std::size_t t = 0; t < dest.size(); ++t)
      dest[t] = host_flat_dest(slots, sc.slot[t], sc.position[t]);
    ASSERT_GT(std::count(dest.begin(), dest.end(), -1), 0);
    const std::size_t n_in = sc.slot.size() * kHeads * 128;
    const auto k = random_values(n_in, DType::kBF16, rng),
               v = random_values(n_in, DType::kBF16, rng);
    DeviceBuffer<std::uint16_t> dk(n_in), dv(n_in);
    dk.upload(k.data(), n_in, stream);
    dv.upload(v.data(), n_in, stream);
    DeviceBuffer<std::int32_t> d_slot(sc.slot.size()), d_pos(sc.slot.size()), d_n(1);
    d_slot.upload(sc.slot.data(), sc.slot.size(), stream);
    d_pos.upload(sc.position.data(), sc.slot.size(), stream);
    d_n.upload(&sc.num_tokens, 1, stream);
    poison(pool, sc, stream);
    KvWriteArgs w;
    w.cache = pool.view(0);
    w.max_slots = pool.config().geometry.max_slots;
    w.k_new = dk.data();
    w.v_new = dv.data();
    w.num_tokens = d_n.data();
    w.max_tokens = sc.max_tokens();
    w.slot = d_slot.data();
    w.position = d_pos.data();
    write_new_kv(w, stream);
    std::vector<std::uint16_t> want;
    expect_write(sc, dest, sc.num_tokens, k, want);
    compare(read(pool.view(0).k, sc.layer_elems, stream), want, "K");
    expect_write(sc, dest, sc.num_tokens, v, want);
    compare(read(pool.view(0).v, sc.layer_elems, stream), want, "V");
  }
}

// Captured once for a capacity; replays read the token count from device memory.
TEST_F(KvWriteGpu, GraphReplayWithVaryingTokenCount) {
  const std::uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed ^ 0x51ab);
  Stream stream;
  KvPool pool(pool_config(AttentionKind::kFull, 16, 128, DType::kFP16), stream);
  PageAllocator alloc(pool.num_pages());
  RequestSlots slots(pool.config().geometry, alloc);
  testing::scramble_free_pages(alloc, rng);
  const Scene sc = make_scene(pool, slots, rng, stream);
  const std::size_t n_in = static_cast<std::size_t>(sc.max_tokens()) * kHeads * 128;
  const auto k = random_values(n_in, DType::kFP16, rng), v = random_values(n_in, DType::kFP16, rng);
  DeviceBuffer<std::uint16_t> dk(n_in), dv(n_in);
  dk.upload(k.data(), n_in, stream);
  dv.upload(v.data(), n_in, stream);
  DeviceBuffer<std::int32_t> d_slot(sc.slot.size()), d_pos(sc.slot.size()), d_n(1);
  d_slot.upload(sc.slot.data(), sc.slot.size(), stream);
  d_pos.upload(sc.position.data(), sc.slot.size(), stream);
  KvWriteArgs w;
  w.cache = pool.view(1);
  w.max_slots = pool.config().geometry.max_slots;
  w.dtype = DType::kFP16;
  w.k_new = dk.data();
  w.v_new = dv.data();
  w.num_tokens = d_n.data();
  w.max_tokens = sc.max_tokens();
  w.slot = d_slot.data();
  w.position = d_pos.data();
  stream.synchronize();

  cudaGraph_t graph = nullptr;
  GD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    write_new_kv(w, stream);
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    throw;
  }
  GD_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  GD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<std::int32_t> dest(sc.slot.size());
  for (std::size_t t = 0; t < dest.size(); ++t)
    dest[t] = host_flat_dest(slots, sc.slot[t], sc.position[t]);
  for (std::int32_t n : {0, 3, sc.num_tokens, sc.max_tokens()}) {
    SCOPED_TRACE("num_tokens " + std::to_string(n));
    d_n.upload(&n, 1, stream);
    poison(pool, sc, stream);
    GD_CUDA(cudaGraphLaunch(exec, stream));
    std::vector<std::uint16_t> want;
    expect_write(sc, dest, n, k, want);
    const auto got = read(pool.view(1).k, sc.layer_elems, stream);
    if (n == 0 || std::all_of(dest.begin(), dest.begin() + n, [](int d) { return d < 0; })) {
      EXPECT_EQ(got, want);  // nothing written
    } else {
      compare(got, want, "K");
    }
    expect_write(sc, dest, n, v, want);
    EXPECT_EQ(read(pool.view(1).v, sc.layer_elems, stream), want);
  }
  GD_CUDA(cudaGraphExecDestroy(exec));
  GD_CUDA(cudaGraphDestroy(graph));
}

// Each bad argument throws naming its field, launches nothing, and the pool stays as it was.
TEST_F(KvWriteGpu, BadArgsNameFieldAndLeavePoolUntouched) {
  Stream stream;
  KvPool pool(pool_config(AttentionKind::kFull, 16, 64, DType::kBF16), stream);
  Scene sc;
  sc.config = pool.config();
  sc.layer_elems = static_cast<std::size_t>(pool.num_pages()) * kHeads * 16 * 64;
  poison(pool, sc, stream);
  DeviceBuffer<std::uint16_t> k(8 * kHeads * 64 + 8), v(8 * kHeads * 64);
  DeviceBuffer<std::int32_t> idx(8), n(1);
  idx.fill_bytes(0, stream);  // every token -> slot 0 / position 0 / flat 0: would write page 0
  const std::int32_t eight = 8;
  n.upload(&eight, 1, stream);
  KvWriteArgs good;
  good.cache = pool.view(0);
  good.max_slots = pool.config().geometry.max_slots;
  good.k_new = k.data();
  good.v_new = v.data();
  good.num_tokens = n.data();
  good.max_tokens = 8;
  good.slot = idx.data();
  good.position = idx.data();
  auto bad = [&](auto edit, const char* field) {
    KvWriteArgs a = good;
    edit(a);
    expect_error_field([&] { write_new_kv(a, stream); }, field);
  };
  bad([](KvWriteArgs& a) { a.dtype = static_cast<DType>(7); }, "dtype");
  bad([](KvWriteArgs& a) { a.cache.k = nullptr; }, "cache.k");
  bad([](KvWriteArgs& a) { a.cache.v = static_cast<char*>(a.cache.v) + 2; }, "cache.v");
  bad([](KvWriteArgs& a) { a.cache.page_size = 0; }, "cache.page_size");
  bad([](KvWriteArgs& a) { a.cache.num_pages = 0; }, "cache.num_pages");
  bad([](KvWriteArgs& a) { a.cache.num_kv_heads = 0; }, "cache.num_kv_heads");
  bad([](KvWriteArgs& a) { a.cache.head_dim = 60; }, "cache.head_dim");
  bad([](KvWriteArgs& a) { a.max_tokens = -1; }, "max_tokens");
  bad([](KvWriteArgs& a) { a.num_tokens = nullptr; }, "num_tokens");
  bad([](KvWriteArgs& a) { a.k_new = nullptr; }, "k_new");
  bad([&](KvWriteArgs& a) { a.k_new = k.data() + 1; }, "k_new");  // 2 bytes off: not 16-aligned
  bad([](KvWriteArgs& a) { a.v_new = nullptr; }, "v_new");
  bad([](KvWriteArgs& a) { a.slot = a.position = nullptr; }, "destination");
  bad([&](KvWriteArgs& a) { a.flat_dest = idx.data(); }, "destination");
  bad([](KvWriteArgs& a) { a.position = nullptr; }, "position");
  bad([](KvWriteArgs& a) { a.slot = nullptr; }, "slot");
  bad([](KvWriteArgs& a) { a.cache.page_table = nullptr; }, "cache.page_table");
  bad([](KvWriteArgs& a) { a.max_slots = 0; }, "max_slots");
  bad([](KvWriteArgs& a) { a.cache.max_pages_per_slot = 0; }, "cache.max_pages_per_slot");
  GD_CUDA(cudaGetLastError());
  const std::vector<std::uint16_t> poisoned(sc.layer_elems, kPoison);
  EXPECT_EQ(read(pool.view(0).k, sc.layer_elems, stream), poisoned);
  EXPECT_EQ(read(pool.view(0).v, sc.layer_elems, stream), poisoned);
  KvWriteArgs none = good;  // a capacity of 0 launches nothing
  none.max_tokens = 0;
  write_new_kv(none, stream);
  EXPECT_EQ(read(pool.view(0).k, sc.layer_elems, stream), poisoned);
}

}  // namespace
}  // namespace graphdecode
