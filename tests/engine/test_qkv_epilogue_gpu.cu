// GPU: the fused QKV epilogue against the unfused kernels it replaces, bitwise: add_bias, the
// q/k/v split (cudaMemcpy2DAsync, a pure copy), per-head rmsnorm (Qwen3), rope, write_new_kv.
// Head dims 64/128/256, GQA 4:1 and 1:1, with/without bias and q/k norm, page size 16 and 1,
// shuffled page tables with holes, positions crossing pages (and one near 1e5 for large angles),
// fewer live rows than max_rows. Outputs start as a sentinel: rows past the live count and cache
// entries no live token owns must keep it. A third of the cases replay a captured graph. Fresh
// random data per run; GRAPHDECODE_SEED reproduces.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "attention/reference.h"
#include "attention_check.h"
#include "common/buffers.h"
#include "common/request_rules.h"
#include "common/stream.h"
#include "engine/kernels/model_kernels.h"
#include "engine/kernels/qkv_epilogue.h"
#include "engine/kernels/rope_freqs.h"
#include "graphs/cuda_graph.h"
#include "memory/kv_write.h"
#include "support/device_vectors.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;
using reference::bf16_to_float;
using reference::float_to_bf16;
using Bits = std::vector<std::uint16_t>;
using Ints = std::vector<std::int32_t>;

class QkvEpilogue : public GpuTest {};

constexpr std::uint16_t kSentinel = 0x7fbf;  // a bf16 NaN: no finite input produces it
constexpr int kMaxRows = 24, kSlots = 4;
// A prefill-sized step (ManyRowsMatchUnfusedKernelsBitwise): rows of three requests, one near 1e5.
constexpr int kManyRows = 301;
// Every token its own page (page size 1), and spares.
int pages_for(int max_rows) {
  return max_rows + 16;
}
// Request B's positions sit near 1e5 (large rotary angles), up to kManyRows of them.
constexpr int kMaxPos = 100100 + kManyRows;

Bits random_bf16(Rng& rng, std::size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  Bits v(n);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}
struct Case {
  int hd, hq, hkv;
  bool bias, norm;
  int page_size;
};

// One step's tokens: three requests (slots drawn from kSlots) of consecutive positions, rows
// past `live` aimed at real pages (so a write there would show), a live token with slot -1 and a
// released page (kInvalidPage) inside request B.
struct Step {
  int live = 0;
  Ints pos, slot, table;  // [max_rows], [max_rows], [kSlots][mpps]
};
Step make_step(Rng& rng, int ps, int mpps, int max_rows) {
  const int pages = pages_for(max_rows);
  Step st;
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  st.live = uni(max_rows / 2, max_rows - 1);
  Ints slots(kSlots);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  const int e0 = uni(7, st.live - 2), e1 = uni(1, st.live - e0 - 1), e2 = st.live - e0 - e1;
  const int starts[3] = {16 * uni(0, 2) + uni(10, 15), 100000 + uni(0, 40), 1000 + uni(0, 40)};
  const int lens[3] = {e0, e1, e2};
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < lens[r]; ++i) {
      st.slot.push_back(slots[r]);
      st.pos.push_back(starts[r] + i);
    }
  for (int t = st.live; t < max_rows; ++t) {  // padding: request 0's next positions
    st.slot.push_back(slots[0]);
    st.pos.push_back(starts[0] + e0 + (t - st.live));
  }
  st.slot[uni(0, st.live - 1)] = -1;
  Ints perm(pages);  // shuffled, non-monotonic physical pages
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  st.table.assign(static_cast<std::size_t>(kSlots) * mpps, kInvalidPage);
  std::size_t next = 0;
  for (int t = 0; t < max_rows; ++t) {
    if (st.slot[t] < 0) continue;
    std::int32_t& e = st.table[static_cast<std::size_t>(st.slot[t]) * mpps + st.pos[t] / ps];
    if (e == kInvalidPage) e = perm.at(next++);
  }
  if (e1 > 1) {  // release request B's first page (as a sliding window would)
    const int t = e0;
    if (st.slot[t] >= 0)
      st.table[static_cast<std::size_t>(st.slot[t]) * mpps + st.pos[t] / ps] = kInvalidPage;
  }
  return st;
}

void run_case(Rng& rng, cudaStream_t s, const Case& c, bool graph, int max_rows = kMaxRows) {
  const int pages = pages_for(max_rows);
  SCOPED_TRACE("head_dim " + std::to_string(c.hd) + " hq " + std::to_string(c.hq) + " hkv " +
               std::to_string(c.hkv) + (c.bias ? " bias" : "") + (c.norm ? " norm" : "") +
               " page " + std::to_string(c.page_size) + (graph ? " graph" : "") + " max_rows " +
               std::to_string(max_rows));
  const int qw = c.hq * c.hd, kvw = c.hkv * c.hd, cols = qw + 2 * kvw;
  const int ps = c.page_size, mpps = kMaxPos / ps + 1;
  const std::size_t rows = max_rows, cache_n = static_cast<std::size_t>(pages) * c.hkv * ps * c.hd;
  RopeConfig rc;
  rc.head_dim = c.hd;
  rc.theta = c.norm ? 1000000.0 : 500000.0;
  if (!c.norm) rc.scaling = {RopeScalingType::kLlama3, 32.0, 1.0, 4.0, 8192};
  RopeTable table(rc, s);
  const Bits bias = random_bf16(rng, cols, -1.f, 1.f);
  const Bits qn = random_bf16(rng, c.hd, 0.5f, 1.5f), kn = random_bf16(rng, c.hd, 0.5f, 1.5f);
  auto d_bias = to_device(bias, s), d_qn = to_device(qn, s), d_kn = to_device(kn, s);
  DeviceBuffer<std::uint16_t> qkv(rows * cols), qkv_ref(rows * cols), q(rows * qw),
      q_ref(rows * qw), k_ref(rows * kvw), v_ref(rows * kvw);
  DeviceBuffer<std::uint16_t> kc(cache_n), vc(cache_n), kc_ref(cache_n), vc_ref(cache_n);
  DeviceBuffer<std::int32_t> pos(rows), slot(rows), page_table(std::size_t{kSlots} * mpps), n(1),
      nq(1), nk(1);
  auto view = [&](DeviceBuffer<std::uint16_t>& k, DeviceBuffer<std::uint16_t>& v) {
    return PagedKvView{k.data(), v.data(), page_table.data(), mpps, ps, c.hkv, c.hd, pages};
  };
  QkvEpilogueArgs a;
  a.qkv = qkv.data();
  a.bias = c.bias ? d_bias.data() : nullptr;
  a.q_norm = c.norm ? d_qn.data() : nullptr;
  a.k_norm = c.norm ? d_kn.data() : nullptr;
  a.eps = 1e-6f;
  a.positions = pos.data();
  a.inv_freq = table.data();
  a.num_rows = n.data();
  a.max_rows = max_rows;
  a.num_q_heads = c.hq;
  a.num_kv_heads = c.hkv;
  a.head_dim = c.hd;
  a.q_out = q.data();
  a.cache = view(kc, vc);
  a.max_slots = kSlots;
  a.slot = slot.data();
  CudaGraph g;
  if (graph) g = CudaGraph::capture(s, [&] { qkv_epilogue(a, s); });

  for (int it = 0; it < 2; ++it) {
    SCOPED_TRACE("iteration " + std::to_string(it));
    const Step st = make_step(rng, ps, mpps, max_rows);
    const Bits x = random_bf16(rng, rows * cols, -4.f, 4.f);
    const Ints counts{st.live, st.live * c.hq, st.live * c.hkv};  // tokens, q rows, k rows
    const Bits poison_q(rows * qw, kSentinel), poison_c(cache_n, kSentinel);
    qkv.upload(x.data(), x.size(), s);
    qkv_ref.upload(x.data(), x.size(), s);
    pos.upload(st.pos.data(), rows, s);
    slot.upload(st.slot.data(), rows, s);
    page_table.upload(st.table.data(), st.table.size(), s);
    n.upload(&counts[0], 1, s);
    nq.upload(&counts[1], 1, s);
    nk.upload(&counts[2], 1, s);
    for (auto* b : {&q, &q_ref}) b->upload(poison_q.data(), poison_q.size(), s);
    for (auto* b : {&kc, &vc, &kc_ref, &vc_ref}) b->upload(poison_c.data(), cache_n, s);

    // The old path: bias in place, split, per-head norms, rope, write_new_kv.
    if (c.bias) add_bias({qkv_ref.data(), d_bias.data(), n.data(), max_rows, cols, 0}, s);
    const std::size_t pitch = std::size_t(cols) * 2;
    GD_CUDA(cudaMemcpy2DAsync(q_ref.data(), qw * 2, qkv_ref.data(), pitch, qw * 2, rows,
                              cudaMemcpyDeviceToDevice, s));
    GD_CUDA(cudaMemcpy2DAsync(k_ref.data(), kvw * 2, qkv_ref.data() + qw, pitch, kvw * 2, rows,
                              cudaMemcpyDeviceToDevice, s));
    GD_CUDA(cudaMemcpy2DAsync(v_ref.data(), kvw * 2, qkv_ref.data() + qw + kvw, pitch, kvw * 2,
                              rows, cudaMemcpyDeviceToDevice, s));
    if (c.norm) {
      rmsnorm({q_ref.data(), nullptr, d_qn.data(), q_ref.data(), nq.data(), max_rows * c.hq, c.hd,
               a.eps},
              s);
      rmsnorm({k_ref.data(), nullptr, d_kn.data(), k_ref.data(), nk.data(), max_rows * c.hkv, c.hd,
               a.eps},
              s);
    }
    rope({q_ref.data(), k_ref.data(), pos.data(), table.data(), n.data(), max_rows, c.hq, c.hkv,
          c.hd, 0, 0},
         s);
    KvWriteArgs w;
    w.cache = view(kc_ref, vc_ref);
    w.max_slots = kSlots;
    w.k_new = k_ref.data();
    w.v_new = v_ref.data();
    w.num_tokens = n.data();
    w.max_tokens = max_rows;
    w.slot = slot.data();
    w.position = pos.data();
    write_new_kv(w, s);
    if (graph)
      g.launch(s);
    else
      qkv_epilogue(a, s);

    ASSERT_EQ(to_host(qkv, s), x) << "qkv is an input only";
    const Bits gq = to_host(q, s), rq = to_host(q_ref, s);
    const std::size_t live_q = std::size_t(st.live) * qw;
    for (std::size_t i = 0; i < gq.size(); ++i)
      ASSERT_EQ(gq[i], i < live_q ? rq[i] : kSentinel)
          << "q row " << i / qw << " head " << i % qw / c.hd << " dim " << i % c.hd;
    const Bits gk = to_host(kc, s), gv = to_host(vc, s), rk = to_host(kc_ref, s),
               rv = to_host(vc_ref, s);
    // The live token owning each (page, row in page): those whose destination resolves.
    std::vector<int> owner(std::size_t(pages) * ps, -1);
    for (int t = 0; t < st.live; ++t) {
      if (st.slot[t] < 0) continue;
      const int page = st.table[std::size_t(st.slot[t]) * mpps + st.pos[t] / ps];
      if (page == kInvalidPage) continue;
      owner[std::size_t(page) * ps + st.pos[t] % ps] = t;
    }
    for (std::size_t i = 0; i < cache_n; ++i) {
      const int e = static_cast<int>(i % c.hd), in_page = static_cast<int>(i / c.hd % ps);
      const int head = static_cast<int>(i / (std::size_t(c.hd) * ps) % c.hkv);
      const int page = static_cast<int>(i / (std::size_t(c.hd) * ps * c.hkv));
      const int t = owner[std::size_t(page) * ps + in_page];
      auto at = [&] {
        return "page " + std::to_string(page) + " head " + std::to_string(head) + " row " +
               std::to_string(in_page) + " dim " + std::to_string(e) + " token " +
               std::to_string(t);
      };
      ASSERT_EQ(gk[i], rk[i]) << "K " << at();
      ASSERT_EQ(gv[i], rv[i]) << "V " << at();
      if (t < 0) {
        ASSERT_EQ(gk[i], kSentinel) << "K written at " << at();
        ASSERT_EQ(gv[i], kSentinel) << "V written at " << at();
        continue;
      }
      ASSERT_NE(gk[i], kSentinel) << "K missing at " << at();
      const std::size_t col = qw + kvw + std::size_t(head) * c.hd + e;  // v: bias only
      const std::uint16_t raw = x[std::size_t(t) * cols + col];
      ASSERT_EQ(gv[i], c.bias ? float_to_bf16(bf16_to_float(raw) + bf16_to_float(bias[col])) : raw)
          << "V value at " << at();
    }
  }
}

TEST_F(QkvEpilogue, MatchesUnfusedKernelsBitwise) {
  std::printf("%s\n", seed_note().c_str());
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  int index = 0;
  for (int hd : {64, 128, 256})
    for (auto [hq, hkv] : {std::pair{16, 4}, {6, 6}})
      for (bool bias : {false, true})
        for (bool norm : {false, true})
          for (int ps : {16, 1})
            ASSERT_NO_FATAL_FAILURE(
                run_case(rng, s, {hd, hq, hkv, bias, norm, ps}, index++ % 3 == 1));
}

// Prefill-sized steps (hundreds of rows, as a prompt chunk): the same bits as the unfused kernels.
TEST_F(QkvEpilogue, ManyRowsMatchUnfusedKernelsBitwise) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  int index = 0;
  for (int hd : {64, 128})
    for (bool norm : {false, true})
      for (int ps : {16, 1})
        ASSERT_NO_FATAL_FAILURE(
            run_case(rng, s, {hd, 16, 4, index % 2 == 0, norm, ps}, index++ % 3 == 1, kManyRows));
}

template <typename F>
::testing::AssertionResult refuses(F&& fn, const std::string& field) {
  try {
    fn();
  } catch (const Error& e) {
    if (e.field() == field) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "field() is '" << e.field() << "': " << e.what();
  }
  return ::testing::AssertionFailure() << "accepted";
}

TEST_F(QkvEpilogue, BadArgumentsNameTheField) {
  Stream s;
  DeviceBuffer<std::uint16_t> buf(1 << 16);
  DeviceBuffer<std::int32_t> ints(64);
  DeviceBuffer<float> inv(128);
  std::uint16_t* p = buf.data();
  QkvEpilogueArgs ok;
  ok.qkv = p;
  ok.positions = ints.data();
  ok.inv_freq = inv.data();
  ok.num_rows = ints.data();
  ok.max_rows = 2;
  ok.num_q_heads = 4;
  ok.num_kv_heads = 2;
  ok.head_dim = 64;
  ok.q_out = p + 8192;
  ok.cache = PagedKvView{p + 16384, p + 32768, ints.data(), 4, 16, 2, 64, 4};
  ok.max_slots = 2;
  ok.slot = ints.data();
  auto with = [&](auto edit) {
    QkvEpilogueArgs a = ok;
    edit(a);
    return [a, &s] { qkv_epilogue(a, s); };
  };
  EXPECT_TRUE(refuses(with([](auto& a) { a.head_dim = 96; }), "head_dim"));
  EXPECT_TRUE(refuses(with([](auto& a) { a.num_rows = nullptr; }), "num_rows"));
  EXPECT_TRUE(refuses(with([&](auto& a) { a.q_norm = p; }), "k_norm"));
  EXPECT_TRUE(refuses(with([&](auto& a) { a.bias = p + 1; }), "bias"));
  EXPECT_TRUE(refuses(with([&](auto& a) { a.q_out = p + 64; }), "q_out"));
  EXPECT_TRUE(refuses(with([](auto& a) { a.slot = nullptr; }), "slot"));
  EXPECT_TRUE(refuses(with([](auto& a) { a.cache.num_kv_heads = 4; }), "cache.num_kv_heads"));
  EXPECT_TRUE(refuses(with([](auto& a) { a.cache.head_dim = 128; }), "cache.head_dim"));
  EXPECT_TRUE(refuses(with([](auto& a) { a.cache.page_table = nullptr; }), "cache.page_table"));
  EXPECT_TRUE(refuses(with([](auto& a) { a.max_slots = 0; }), "max_slots"));
  GD_CUDA(cudaStreamSynchronize(s));  // nothing was launched
}

}  // namespace
}  // namespace graphdecode
