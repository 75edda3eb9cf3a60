// GPU: the engine's row kernels against float64 references — RMSNorm (plain, fused residual, in
// place), RoPE (head dims 64/128/256, default and Llama-3 tables, fused qkv strides), SwiGLU,
// embedding gather (with bad token ids), bias add; bad arguments; and one CUDA graph of the
// sequence replayed with different live row counts and positions, bitwise equal to eager.
// Fresh random data per run (GRAPHDECODE_SEED reproduces); outputs are poisoned with NaN first, so
// unwritten elements fail, and rows past the live count must keep the poison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attention/reference.h"
#include "attention_check.h"
#include "common/buffers.h"
#include "common/stream.h"
#include "engine/kernels/model_kernels.h"
#include "engine/kernels/rope_freqs.h"
#include "graphs/cuda_graph.h"
#include "support/device_vectors.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using namespace graphdecode::testing;
using reference::bf16_to_float;
using reference::float_to_bf16;
using Bits = std::vector<std::uint16_t>;

class EngineKernels : public GpuTest {};

constexpr std::uint16_t kPoison = 0x7fff;  // a bf16 NaN

Bits random_bf16(Rng& rng, std::size_t n, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  Bits v(n);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}
DeviceBuffer<std::int32_t> device_int(std::int32_t v, cudaStream_t s) {
  return to_device(std::vector<std::int32_t>{v}, s);
}
double f(std::uint16_t b) {
  return bf16_to_float(b);
}

// Element i (of row i / row_len) against want: NaN fails; |got - want| <= rel |want| + abs.
::testing::AssertionResult close_rows(const Bits& got, const std::vector<double>& want,
                                      std::size_t live, double rel, double abs) {
  for (std::size_t i = 0; i < live; ++i) {
    const double g = f(got[i]);
    if (!(std::abs(g - want[i]) <= rel * std::abs(want[i]) + abs))
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << g << ", want " << want[i];
  }
  for (std::size_t i = live; i < got.size(); ++i)
    if (got[i] != kPoison)
      return ::testing::AssertionFailure() << "element " << i << " past the live rows written";
  return ::testing::AssertionSuccess();
}

// The float64 RMSNorm of rows [0, live) of x (plus res when `fused`, rounded to bf16 as the kernel
// does): want[row][j], and the new residual stream res_want (res past the updated rows).
void rmsnorm_reference(const Bits& x, const Bits& res, const Bits& w, int hidden, int live,
                       bool fused, float eps, std::vector<double>& want, Bits& res_want) {
  want.assign(x.size(), 0.0);
  res_want = res;
  for (int r = 0; r < live; ++r) {
    double ss = 0;
    std::vector<double> v(hidden);
    for (int j = 0; j < hidden; ++j) {
      const std::size_t i = static_cast<std::size_t>(r) * hidden + j;
      if (fused) res_want[i] = float_to_bf16(bf16_to_float(res[i]) + bf16_to_float(x[i]));
      v[j] = f(fused ? res_want[i] : x[i]);
      ss += v[j] * v[j];
    }
    const double inv = 1.0 / std::sqrt(ss / hidden + eps);
    for (int j = 0; j < hidden; ++j)
      want[static_cast<std::size_t>(r) * hidden + j] = v[j] * inv * f(w[j]);
  }
}

TEST_F(EngineKernels, RmsNormPlainFusedAndInPlace) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  for (int hidden : {8, 1016, 2048, 4096, 5120, 8192}) {
    for (int mode = 0; mode < 3; ++mode) {  // 0 plain, 1 fused residual, 2 plain in place
      SCOPED_TRACE("hidden " + std::to_string(hidden) + " mode " + std::to_string(mode));
      const int max_rows = 9, live = std::uniform_int_distribution<int>(1, max_rows)(rng);
      const std::size_t n = static_cast<std::size_t>(max_rows) * hidden;
      const Bits x = random_bf16(rng, n, -3.f, 3.f), res = random_bf16(rng, n, -2.f, 2.f);
      const Bits w = random_bf16(rng, hidden, 0.5f, 1.5f);
      auto dx = to_device(x, s), dres = to_device(res, s), dw = to_device(w, s);
      DeviceBuffer<std::uint16_t> dy(n);
      dy.upload(Bits(n, kPoison).data(), n, s);
      auto rows = device_int(live, s);
      const float eps = 1e-5f;
      RmsNormArgs a{dx.data(),   mode == 1 ? dres.data() : nullptr,
                    dw.data(),   mode == 2 ? dx.data() : dy.data(),
                    rows.data(), max_rows,
                    hidden,      eps};
      if (mode == 2) dx.upload(x.data(), n, s);
      rmsnorm(a, s);
      const Bits y = to_host(mode == 2 ? dx : dy, s);
      std::vector<double> want;
      Bits res_want;
      rmsnorm_reference(x, res, w, hidden, live, mode == 1, eps, want, res_want);
      if (mode == 2) {  // in place: rows past the live count keep x, not the poison
        for (std::size_t i = static_cast<std::size_t>(live) * hidden; i < n; ++i)
          ASSERT_EQ(y[i], x[i]);
        Bits head(y.begin(), y.begin() + static_cast<std::ptrdiff_t>(live) * hidden);
        EXPECT_TRUE(close_rows(head, want, head.size(), 1.2e-2, 1e-6));
      } else {
        EXPECT_TRUE(close_rows(y, want, static_cast<std::size_t>(live) * hidden, 1.2e-2, 1e-6));
      }
      if (mode == 1) EXPECT_EQ(to_host(dres, s), res_want);  // bitwise, untouched past live
    }
  }
}

// A row's output must not depend on how many rows the launch has (batch invariance: a prompt
// chunk's rows against a decode step's): the rows of a 601-row launch against the float64
// reference, and bitwise against the same rows normalized by a 9-row launch.
TEST_F(EngineKernels, RmsNormManyRowsEqualFewRowsBitwise) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  for (int hidden : {1016, 2048, 4096, 8192}) {
    for (int mode = 0; mode < 2; ++mode) {  // 0 plain, 1 fused residual
      SCOPED_TRACE("hidden " + std::to_string(hidden) + " mode " + std::to_string(mode));
      const int max_rows = 601, few = 9;
      int live = std::uniform_int_distribution<int>(300, max_rows)(rng);
      if (live % 4 == 0) --live;
      const std::size_t n = static_cast<std::size_t>(max_rows) * hidden;
      const std::size_t n_few = static_cast<std::size_t>(few) * hidden;
      const Bits x = random_bf16(rng, n, -3.f, 3.f), res = random_bf16(rng, n, -2.f, 2.f);
      const Bits w = random_bf16(rng, hidden, 0.5f, 1.5f);
      auto dx = to_device(x, s), dres = to_device(res, s), dw = to_device(w, s);
      auto dres_few = to_device(Bits(res.begin(), res.begin() + n_few), s);
      DeviceBuffer<std::uint16_t> dy(n), dy_few(n_few);
      dy.upload(Bits(n, kPoison).data(), n, s);
      dy_few.upload(Bits(n_few, kPoison).data(), n_few, s);
      auto rows = device_int(live, s), rows_few = device_int(few, s);
      const float eps = 1e-5f;
      rmsnorm({dx.data(), mode == 1 ? dres.data() : nullptr, dw.data(), dy.data(), rows.data(),
               max_rows, hidden, eps},
              s);
      rmsnorm({dx.data(), mode == 1 ? dres_few.data() : nullptr, dw.data(), dy_few.data(),
               rows_few.data(), few, hidden, eps},
              s);
      const Bits y = to_host(dy, s), y_few = to_host(dy_few, s);
      std::vector<double> want;
      Bits res_want;
      rmsnorm_reference(x, res, w, hidden, live, mode == 1, eps, want, res_want);
      EXPECT_TRUE(close_rows(y, want, static_cast<std::size_t>(live) * hidden, 1.2e-2, 1e-6));
      ASSERT_TRUE(std::equal(y_few.begin(), y_few.end(), y.begin()))
          << "the first rows differ between 9-row and " << max_rows << "-row launches";
      if (mode == 1) {
        EXPECT_EQ(to_host(dres, s), res_want);  // bitwise, untouched past live
        const Bits res_few = to_host(dres_few, s);
        ASSERT_TRUE(std::equal(res_few.begin(), res_few.end(), res_want.begin()));
      }
    }
  }
}

// q, k inside one fused [rows][(hq + 2 hkv) hd] buffer (v untouched) or in separate buffers.
void rope_case(Rng& rng, cudaStream_t s, int hd, int hq, int hkv, bool fused,
               const RopeConfig& cfg) {
  SCOPED_TRACE("head_dim " + std::to_string(hd) + " hq " + std::to_string(hq) + " hkv " +
               std::to_string(hkv) + (fused ? " fused" : ""));
  const int max_rows = 13, live = std::uniform_int_distribution<int>(1, max_rows)(rng);
  const int qw = hq * hd, kw = hkv * hd, stride = fused ? qw + 2 * kw : 0;
  const std::size_t qn = static_cast<std::size_t>(max_rows) * (fused ? stride : qw);
  const Bits q = random_bf16(rng, qn), k = random_bf16(rng, fused ? 0 : max_rows * kw);
  std::vector<std::int32_t> pos(max_rows);
  std::uniform_int_distribution<int> pd(0, 131071);
  for (auto& p : pos) p = pd(rng);
  pos[0] = 0;
  pos[max_rows - 1] = 131071;
  RopeTable table(cfg, s);
  const std::vector<double> inv64 = rope_inv_freq(cfg);
  std::vector<float> inv(inv64.begin(), inv64.end());
  std::vector<float> table_back(inv.size());
  GD_CUDA(cudaMemcpy(table_back.data(), table.data(), inv.size() * sizeof(float),
                     cudaMemcpyDeviceToHost));
  ASSERT_EQ(table_back, inv);  // float64 on the host, rounded once
  auto dq = to_device(q, s), dk = to_device(k.empty() ? Bits(8) : k, s);
  auto dpos = to_device(pos, s);
  auto rows = device_int(live, s);
  RopeArgs a{dq.data(),   fused ? dq.data() + qw : dk.data(),
             dpos.data(), table.data(),
             rows.data(), max_rows,
             hq,          hkv,
             hd,          stride,
             stride};
  rope(a, s);
  const Bits gq = to_host(dq, s), gk = fused ? Bits{} : to_host(dk, s);
  const int half = hd / 2;
  auto check = [&](const Bits& in, const Bits& out, std::size_t row_base, int heads, int r) {
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < hd; ++i) {
        const int j = i % half;
        const double angle = static_cast<float>(inv[j] * static_cast<float>(pos[r]));
        const double c = std::cos(angle), sn = std::sin(angle);
        const std::size_t b = row_base + static_cast<std::size_t>(h) * hd;
        const double lo = f(in[b + j]), hi = f(in[b + j + half]);
        const double want = i < half ? lo * c - hi * sn : hi * c + lo * sn;
        const double got = f(out[b + i]);
        if (!(std::abs(got - want) <= std::abs(want) / 256 + 1e-4))
          return ::testing::AssertionFailure()
                 << "row " << r << " head " << h << " dim " << i << " pos " << pos[r] << ": got "
                 << got << ", want " << want;
      }
    return ::testing::AssertionSuccess();
  };
  const int qs = fused ? stride : qw, ks = fused ? stride : kw;
  for (int r = 0; r < max_rows; ++r) {
    const std::size_t qb = static_cast<std::size_t>(r) * qs, kb = static_cast<std::size_t>(r) * ks;
    if (r < live) {
      ASSERT_TRUE(check(q, gq, qb, hq, r));
      ASSERT_TRUE(fused ? check(q, gq, qb + qw, hkv, r) : check(k, gk, kb, hkv, r));
      if (fused)  // v untouched
        ASSERT_EQ(0, std::memcmp(&gq[qb + qw + kw], &q[qb + qw + kw], kw * 2));
    } else {  // rows past the live count untouched
      ASSERT_EQ(0, std::memcmp(&gq[qb], &q[qb], qs * 2));
      if (!fused) ASSERT_EQ(0, std::memcmp(&gk[kb], &k[kb], ks * 2));
    }
  }
}

TEST_F(EngineKernels, RopeDefaultAndLlama3) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  RopeConfig plain;
  plain.theta = 10000.0;
  RopeConfig llama3;
  llama3.theta = 500000.0;
  llama3.scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 8192};
  for (int hd : {64, 128, 256}) {
    plain.head_dim = llama3.head_dim = hd;
    rope_case(rng, s, hd, 8, 2, false, plain);
    rope_case(rng, s, hd, 4, 1, true, llama3);
    rope_case(rng, s, hd, 2, 2, true, plain);
    rope_case(rng, s, hd, 7, 1, false, llama3);
  }
}

TEST_F(EngineKernels, SwiGlu) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  for (int inter : {8, 1008, 2056, 14336}) {
    SCOPED_TRACE("inter " + std::to_string(inter));
    const int max_rows = 6, live = std::uniform_int_distribution<int>(1, max_rows)(rng);
    const Bits gu = random_bf16(rng, static_cast<std::size_t>(max_rows) * 2 * inter, -8.f, 8.f);
    const std::size_t n = static_cast<std::size_t>(max_rows) * inter;
    auto dgu = to_device(gu, s);
    auto dout = to_device(Bits(n, kPoison), s);
    auto rows = device_int(live, s);
    swiglu({dgu.data(), dout.data(), rows.data(), max_rows, inter}, s);
    std::vector<double> want(n);
    for (int r = 0; r < live; ++r)
      for (int j = 0; j < inter; ++j) {
        const double g = f(gu[static_cast<std::size_t>(r) * 2 * inter + j]);
        const double u = f(gu[static_cast<std::size_t>(r) * 2 * inter + inter + j]);
        want[static_cast<std::size_t>(r) * inter + j] = g / (1.0 + std::exp(-g)) * u;
      }
    EXPECT_TRUE(
        close_rows(to_host(dout, s), want, static_cast<std::size_t>(live) * inter, 1.2e-2, 1e-6));
  }
}

TEST_F(EngineKernels, EmbeddingGatherAndBadTokenIds) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  for (int hidden : {8, 64, 4096}) {
    for (bool with_bad : {false, true}) {
      const int vocab = 1000, max_rows = 12, live = with_bad ? max_rows - 1 : 7;
      const Bits table = random_bf16(rng, static_cast<std::size_t>(vocab) * hidden);
      std::vector<std::int32_t> ids(max_rows);
      for (auto& id : ids) id = std::uniform_int_distribution<int>(0, vocab - 1)(rng);
      ids[1] = 0;
      ids[2] = vocab - 1;
      if (with_bad) {
        ids[3] = -1;
        ids[5] = vocab;
        ids[7] = INT32_MAX;
        ids[8] = INT32_MIN;
      }
      ids[max_rows - 1] = -5;  // past the live rows: never read
      const std::size_t n = static_cast<std::size_t>(max_rows) * hidden;
      auto dtable = to_device(table, s);
      auto dids = to_device(ids, s);
      auto dout = to_device(Bits(n, kPoison), s);
      auto flag = device_int(0, s);
      auto rows = device_int(live, s);
      embedding({dtable.data(), dids.data(), dout.data(), flag.data(), rows.data(), max_rows, vocab,
                 hidden},
                s);
      const Bits out = to_host(dout, s);
      for (int r = 0; r < max_rows; ++r) {
        const bool bad = ids[r] < 0 || ids[r] >= vocab;
        for (int j = 0; j < hidden; ++j) {
          const std::uint16_t want = r >= live ? kPoison
                                     : bad     ? 0
                                           : table[static_cast<std::size_t>(ids[r]) * hidden + j];
          ASSERT_EQ(out[static_cast<std::size_t>(r) * hidden + j], want) << "row " << r;
        }
      }
      EXPECT_EQ(to_host(flag, s)[0], with_bad ? kEmbeddingBadTokenBit : 0);
    }
  }
}

TEST_F(EngineKernels, AddBiasDenseAndStrided) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  for (auto [cols, stride] : {std::pair{8, 0}, {1536, 0}, {1280, 1536}, {4096 + 2 * 512, 0}}) {
    const int max_rows = 10, live = std::uniform_int_distribution<int>(1, max_rows)(rng);
    const int rs = stride == 0 ? cols : stride;
    const Bits y = random_bf16(rng, static_cast<std::size_t>(max_rows) * rs, -4.f, 4.f);
    const Bits b = random_bf16(rng, cols);
    auto dy = to_device(y, s), db = to_device(b, s);
    auto rows = device_int(live, s);
    add_bias({dy.data(), db.data(), rows.data(), max_rows, cols, stride}, s);
    const Bits got = to_host(dy, s);
    for (int r = 0; r < max_rows; ++r)
      for (int j = 0; j < rs; ++j) {
        const std::size_t i = static_cast<std::size_t>(r) * rs + j;
        if (r >= live || j >= cols) {
          ASSERT_EQ(got[i], y[i]) << "row " << r << " col " << j << " should be untouched";
          continue;
        }
        ASSERT_EQ(got[i], float_to_bf16(bf16_to_float(y[i]) + bf16_to_float(b[j])));
        const double want = f(y[i]) + f(b[j]);
        ASSERT_LE(std::abs(f(got[i]) - want), std::abs(want) / 256 + 1e-6);
      }
  }
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

TEST_F(EngineKernels, BadArgumentsNameTheField) {
  Stream s;
  DeviceBuffer<std::uint16_t> buf(1 << 16);
  DeviceBuffer<std::int32_t> ints(64);
  DeviceBuffer<float> inv(128);
  std::uint16_t* p = buf.data();
  const std::int32_t* rows = ints.data();
  EXPECT_TRUE(refuses([&] { rmsnorm({p, nullptr, p, p, rows, 4, 8200, 1e-5f}, s); }, "hidden"));
  EXPECT_TRUE(refuses([&] { rmsnorm({p, nullptr, p, p, nullptr, 4, 64, 1e-5f}, s); }, "num_rows"));
  EXPECT_TRUE(refuses([&] { rmsnorm({p + 1, nullptr, p, p, rows, 4, 64, 1e-5f}, s); }, "x"));
  EXPECT_TRUE(refuses([&] { rmsnorm({p, p, p, p + 64, rows, 4, 64, 1e-5f}, s); }, "residual"));
  EXPECT_TRUE(refuses(
      [&] {
        rope({p, p, ints.data(), inv.data(), rows, 4, 8, 2, 96, 0, 0}, s);
      },
      "head_dim"));
  EXPECT_TRUE(refuses(
      [&] {
        rope({p, p, ints.data(), inv.data(), rows, 4, 8, 2, 64, 100, 0}, s);
      },
      "q_row_stride"));
  EXPECT_TRUE(refuses(
      [&] {
        rope({p, p, nullptr, inv.data(), rows, 4, 8, 2, 64, 0, 0}, s);
      },
      "positions"));
  EXPECT_TRUE(refuses([&] { swiglu({p, p, rows, 4, 12}, s); }, "inter"));
  EXPECT_TRUE(refuses([&] { swiglu({p, p, rows, 70000, 64}, s); }, "max_rows"));
  EXPECT_TRUE(refuses(
      [&] {
        embedding({p, ints.data(), p, nullptr, rows, 4, 10, 64}, s);
      },
      "error_flag"));
  EXPECT_TRUE(refuses(
      [&] {
        embedding({p, ints.data(), p, ints.data(), rows, 4, 0, 64}, s);
      },
      "vocab"));
  EXPECT_TRUE(refuses([&] { add_bias({p, p, rows, 4, 64, 32}, s); }, "row_stride"));
  GD_CUDA(cudaStreamSynchronize(s));  // nothing was launched
}

// embedding -> bias -> add & norm -> rope (q, k inside the normed row) -> swiglu (the normed row
// as gate|up), captured once for max_rows and replayed with fresh live counts, ids, positions
// and residuals: every output bitwise equal to an eager run of the same inputs, rows past the
// live count still poisoned.
TEST_F(EngineKernels, GraphReplayMatchesEagerBitwise) {
  SCOPED_TRACE(seed_note());
  Rng rng = test_rng();
  Stream s;
  constexpr int kMaxRows = 16, kVocab = 500, kHq = 4, kHkv = 2, kHd = 64;
  constexpr int kHidden = (kHq + kHkv) * kHd, kInter = kHidden / 2;
  constexpr std::size_t kN = static_cast<std::size_t>(kMaxRows) * kHidden;
  RopeConfig rc;
  rc.head_dim = kHd;
  rc.theta = 500000.0;
  rc.scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 8192};
  RopeTable table(rc, s);
  auto emb_table = to_device(random_bf16(rng, static_cast<std::size_t>(kVocab) * kHidden), s);
  auto bias = to_device(random_bf16(rng, kHidden), s);
  auto w = to_device(random_bf16(rng, kHidden, 0.5f, 1.5f), s);
  DeviceBuffer<std::int32_t> ids(kMaxRows), pos(kMaxRows), rows(1), flag(1);
  DeviceBuffer<std::uint16_t> emb(kN), res(kN), y(kN),
      out(static_cast<std::size_t>(kMaxRows) * kInter);

  auto enqueue = [&] {
    embedding({emb_table.data(), ids.data(), emb.data(), flag.data(), rows.data(), kMaxRows, kVocab,
               kHidden},
              s);
    add_bias({emb.data(), bias.data(), rows.data(), kMaxRows, kHidden, 0}, s);
    rmsnorm({emb.data(), res.data(), w.data(), y.data(), rows.data(), kMaxRows, kHidden, 1e-6f}, s);
    rope({y.data(), y.data() + kHq * kHd, pos.data(), table.data(), rows.data(), kMaxRows, kHq,
          kHkv, kHd, kHidden, kHidden},
         s);
    swiglu({y.data(), out.data(), rows.data(), kMaxRows, kInter}, s);
  };
  struct Inputs {
    int live;
    std::vector<std::int32_t> ids, pos;
    Bits res;
  };
  struct Outputs {
    Bits emb, res, y, out;
    std::int32_t flag;
  };
  auto load = [&](const Inputs& in) {
    rows.upload(&in.live, 1, s);
    ids.upload(in.ids.data(), kMaxRows, s);
    pos.upload(in.pos.data(), kMaxRows, s);
    res.upload(in.res.data(), kN, s);
    const Bits poison(kN, kPoison);
    emb.upload(poison.data(), kN, s);
    y.upload(poison.data(), kN, s);
    out.upload(poison.data(), out.size(), s);
    flag.fill_bytes(0, s);
    GD_CUDA(cudaStreamSynchronize(s));  // pageable sources: keep them alive until copied
  };
  auto fetch = [&] {
    return Outputs{to_host(emb, s), to_host(res, s), to_host(y, s), to_host(out, s),
                   to_host(flag, s)[0]};
  };

  Inputs first{kMaxRows, std::vector<std::int32_t>(kMaxRows, 0),
               std::vector<std::int32_t>(kMaxRows, 0), Bits(kN, 0)};
  load(first);
  CudaGraph graph = CudaGraph::capture(s, enqueue);
  const int iterations = sanitize_mode() ? 3 : 8;
  for (int it = 0; it < iterations; ++it) {
    Inputs in;
    in.live = it == 0   ? kMaxRows
              : it == 1 ? 1
                        : std::uniform_int_distribution<int>(1, kMaxRows)(rng);
    in.ids.resize(kMaxRows);
    in.pos.resize(kMaxRows);
    for (auto& id : in.ids) id = std::uniform_int_distribution<int>(0, kVocab - 1)(rng);
    for (auto& p : in.pos) p = std::uniform_int_distribution<int>(0, 100000)(rng);
    in.res = random_bf16(rng, kN, -2.f, 2.f);
    load(in);
    enqueue();
    const Outputs eager = fetch();
    load(in);
    graph.launch(s);
    const Outputs replay = fetch();
    SCOPED_TRACE("iteration " + std::to_string(it) + " live " + std::to_string(in.live));
    EXPECT_EQ(eager.emb, replay.emb);
    EXPECT_EQ(eager.res, replay.res);
    EXPECT_EQ(eager.y, replay.y);
    EXPECT_EQ(eager.out, replay.out);
    EXPECT_EQ(eager.flag, 0);
    EXPECT_EQ(replay.flag, 0);
    const std::size_t live_n = static_cast<std::size_t>(in.live) * kHidden;
    for (std::size_t i = 0; i < kN; ++i) {
      const bool live = i < live_n;
      ASSERT_EQ(std::isnan(f(replay.y[i])), !live) << "y element " << i;
      ASSERT_EQ(std::isnan(f(replay.emb[i])), !live) << "emb element " << i;
      if (!live) ASSERT_EQ(replay.res[i], in.res[i]) << "residual element " << i;
    }
    for (std::size_t i = 0; i < out.size(); ++i)
      ASSERT_EQ(std::isnan(f(replay.out[i])), i >= static_cast<std::size_t>(in.live) * kInter)
          << "out element " << i;
  }
}

}  // namespace
}  // namespace graphdecode
