// LlamaModel on its runtime on the device: prefill + decode logits against the float64 CPU
// reference (llama_reference.h) on the same bf16 weights; graph replay == eager (same shape)
// bitwise; a captured target-verify step of N = 4 tokens per request with logits for all 4N rows
// equal to 4 decode steps'.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attention/reference.h"
#include "attention_check.h"  // sanitize_mode
#include "common/stream.h"
#include "engine/generate.h"
#include "engine/llama_model.h"
#include "engine/model_step.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/step_context.h"
#include "engine/weights.h"
#include "graphs/step_graphs.h"
#include "llama_reference.h"
#include "support/gpu_test.h"
#include "support/scoped_env.h"

namespace graphdecode {
namespace {

class LlamaModelGpu : public testing::GpuTest {};

std::vector<std::vector<std::int32_t>> prompts_for(const ModelConfig& c) {
  std::vector<std::vector<std::int32_t>> p = {std::vector<std::int32_t>(5),
                                              std::vector<std::int32_t>(40)};
  for (std::size_t r = 0; r < p.size(); ++r)
    for (std::size_t i = 0; i < p[r].size(); ++i)
      p[r][i] = static_cast<std::int32_t>((r * 131 + i * 37 + 3) % c.vocab_size);
  return p;
}

TEST_F(LlamaModelGpu, PrefillAndDecodeMatchFloat64Reference) {
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, 7);
  const auto prompts = prompts_for(config);
  GenerateOptions opt;
  opt.new_tokens = 2;
  Stream stream;
  std::vector<std::vector<float>> logits;
  const GenerateResult r = generate_greedy(w, prompts, opt, stream.get(),
                                           [&](std::int32_t, std::span<const float> l, auto) {
                                             logits.emplace_back(l.begin(), l.end());
                                           });
  ASSERT_EQ(logits.size(), 2u);
  const auto V = static_cast<std::size_t>(config.vocab_size);
  for (std::size_t step = 0; step < 2; ++step) {
    for (std::size_t p = 0; p < prompts.size(); ++p) {
      std::vector<std::int32_t> seq = prompts[p];
      for (std::size_t s = 0; s < step; ++s) seq.push_back(r.tokens[p][s]);
      const std::vector<double> ref = testing::reference_last_logits(w, seq);
      double max_ref = 0, max_err = 0, err2 = 0, ref2 = 0;
      for (std::size_t i = 0; i < V; ++i) {
        const double got = logits[step][p * V + i];
        ASSERT_TRUE(std::isfinite(got)) << "step " << step << " prompt " << p << " vocab " << i;
        max_ref = std::max(max_ref, std::abs(ref[i]));
        max_err = std::max(max_err, std::abs(got - ref[i]));
        err2 += (got - ref[i]) * (got - ref[i]);
        ref2 += ref[i] * ref[i];
      }
      const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
      EXPECT_LT(rel, 0.03) << "step " << step << " prompt " << p << " max_err " << max_err
                           << " max_ref " << max_ref;
      EXPECT_LT(max_err, 0.05 * max_ref + 1e-4) << "step " << step << " prompt " << p;
    }
  }
}

// One model on its runtime, with decode graphs and target-verify graphs of N = 4 tokens per
// request whose logits cover every row.
struct Harness {
  static constexpr std::int32_t kVerifyTokens = 4;
  RuntimeOptions options;
  AttentionLayout layout;
  StepCapacity cap;
  Stream stream;
  std::unique_ptr<StepContext> step;
  std::unique_ptr<ModelRuntime> runtime;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<ModelStep> program;
  std::unique_ptr<StepGraphs> graphs;

  Harness(const HostWeights& w, const RuntimeOptions& o)
      : options(o), layout(llama_attention_layout(w.config)) {
    cap = step_capacity(options, std::span<const AttentionLayout>(&layout, 1));
    step = std::make_unique<StepContext>(cap, ledger_pools(cap, options));
    runtime = std::make_unique<ModelRuntime>(layout, options, *step, 0, stream.get());
    model = std::make_unique<LlamaModel>(w, options, stream.get());
    program = std::make_unique<ModelStep>(*runtime, *model);
    StepGraphsConfig gc;
    gc.modes = {GraphMode{StepMode::kDecode, 1},
                GraphMode{StepMode::kTargetVerify, kVerifyTokens, LogitRows::kEveryRow}};
    graphs = std::make_unique<StepGraphs>(step->input(), *program, gc);
    graphs->capture(stream.get());
  }

  // One step over `req` (extended in the ledger here) with `ids`; returns the logits rows.
  StepPath run(StepMode mode, std::int32_t n, LogitRows logits, std::vector<StepRequest>& req,
               const std::vector<std::int32_t>& ids, std::vector<float>& out) {
    for (StepRequest& r : req) step->ledger().extend(r.slot, r.extend_len);
    StepDesc d;
    d.mode = mode;
    d.tokens_per_request = n;
    d.logits = logits;
    d.requests = req;
    d.token_ids = ids;
    step->attach_commands(d);
    const StepPath path = graphs->step(d, stream.get());
    step->ledger().clear_commands();
    const std::size_t rows = logits == LogitRows::kEveryRow ? ids.size() : req.size();
    out.resize(rows * static_cast<std::size_t>(model->vocab()));
    GD_CUDA(cudaMemcpyAsync(out.data(), model->logits(), out.size() * sizeof(float),
                            cudaMemcpyDeviceToHost, stream.get()));
    GD_CUDA(cudaStreamSynchronize(stream.get()));
    for (StepRequest& r : req) r.prefix_len += r.extend_len;
    return path;
  }

  // The decode step just replayed over `req` (prefix_len already advanced by run()) again,
  // eagerly with the shape of the graph that replayed it (tables already applied; the K/V it
  // rewrites are the same values); returns its logits rows. False where no decode graph covers it.
  bool rerun_decode_eagerly(std::vector<StepRequest> req, const std::vector<std::int32_t>& ids,
                            std::vector<float>& out) {
    const GraphKey* key = graphs->find(StepMode::kDecode, 1, static_cast<std::int32_t>(req.size()));
    if (key == nullptr) return false;
    for (StepRequest& r : req) r.prefix_len -= 1;
    StepDesc d;
    d.mode = StepMode::kDecode;
    d.tokens_per_request = 1;
    d.requests = req;
    d.token_ids = ids;
    step->input().write(d);
    step->input().upload(stream.get());
    program->enqueue(key_shape(*key, cap), stream.get());
    out.resize(req.size() * static_cast<std::size_t>(model->vocab()));
    GD_CUDA(cudaMemcpyAsync(out.data(), model->logits(), out.size() * sizeof(float),
                            cudaMemcpyDeviceToHost, stream.get()));
    GD_CUDA(cudaStreamSynchronize(stream.get()));
    return true;
  }

  // Prefills `prompts` (one extend step) and returns their requests.
  std::vector<StepRequest> prefill(const std::vector<std::vector<std::int32_t>>& prompts) {
    std::vector<StepRequest> req(prompts.size());
    std::vector<std::int32_t> ids;
    for (std::size_t p = 0; p < prompts.size(); ++p) {
      req[p].slot = step->ledger().acquire();
      req[p].extend_len = static_cast<std::int32_t>(prompts[p].size());
      ids.insert(ids.end(), prompts[p].begin(), prompts[p].end());
    }
    std::vector<float> unused;
    run(StepMode::kExtend, 0, LogitRows::kLastPerRequest, req, ids, unused);
    return req;
  }
};

RuntimeOptions harness_options(std::int32_t max_batch) {
  RuntimeOptions o;
  o.max_batch = max_batch;
  o.max_tokens = 64;
  o.max_logit_rows = max_batch * Harness::kVerifyTokens;
  o.max_kv_len = 128;
  return o;
}

// A harness made while `name` is `value` (nullptr: unset): the library reads its switches then.
std::unique_ptr<Harness> harness_with(const HostWeights& w, std::int32_t max_batch,
                                      const char* name, const char* value) {
  const testing::ScopedEnv env(name, value);
  return std::make_unique<Harness>(w, harness_options(max_batch));
}

// One decode step replayed from a graph, then the same step run eagerly with the same shape
// (tables already applied; the K/V it rewrites are the same values): logits bitwise equal.
TEST_F(LlamaModelGpu, GraphReplayEqualsEagerBitwise) {
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, 11);
  const auto prompts = prompts_for(config);
  Harness h(w, harness_options(2));
  std::vector<StepRequest> req = h.prefill(prompts);
  std::vector<std::int32_t> ids;
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    req[p].extend_len = 1;
    ids.push_back(static_cast<std::int32_t>(p + 1));
  }
  std::vector<float> replay, eager;
  ASSERT_EQ(h.run(StepMode::kDecode, 1, LogitRows::kLastPerRequest, req, ids, replay),
            StepPath::kGraph);
  ASSERT_TRUE(h.rerun_decode_eagerly(req, ids, eager));
  ASSERT_EQ(eager.size(), replay.size());
  EXPECT_EQ(std::memcmp(replay.data(), eager.data(), replay.size() * sizeof(float)), 0);
  for (float x : replay) ASSERT_TRUE(std::isfinite(x));
}

// The dense decode attention kernel (AttentionBatch::requests_hint; forced here at 2 requests by
// GRAPHDECODE_ATTN_DENSE_MIN_ITEMS=1, the default takes it past the base kernel's wave) in the
// model's decode graphs, full and sliding layers: three replayed steps bitwise equal to a model
// on the base kernel (every context is under one 64-key chunk, so both run one item per request
// and head through the same decode-layout code), an eager run of the last step's shape bitwise
// equal to its replay, and a target-verify step (ModelRuntime::requests_hint) bitwise equal too.
TEST_F(LlamaModelGpu, DenseDecodeAttentionEqualsTheBaseKernelBitwise) {
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, 31);
  std::vector<std::vector<std::int32_t>> seqs = prompts_for(config);
  const std::unique_ptr<Harness> dense =
      harness_with(w, 2, "GRAPHDECODE_ATTN_DENSE_MIN_ITEMS", "1");
  const std::unique_ptr<Harness> base = harness_with(w, 2, "GRAPHDECODE_ATTN_DENSE_MIN_ITEMS", "0");
  std::vector<StepRequest> dreq = dense->prefill(seqs), breq = base->prefill(seqs);
  std::vector<std::int32_t> ids;
  std::vector<float> got, want;
  for (std::int32_t step = 0; step < 3; ++step) {
    ids.clear();
    for (std::size_t p = 0; p < seqs.size(); ++p) {
      dreq[p].extend_len = breq[p].extend_len = 1;
      ids.push_back(static_cast<std::int32_t>((p * 17 + static_cast<std::size_t>(step) * 5 + 2) %
                                              static_cast<std::size_t>(config.vocab_size)));
    }
    ASSERT_EQ(dense->run(StepMode::kDecode, 1, LogitRows::kLastPerRequest, dreq, ids, got),
              StepPath::kGraph);
    ASSERT_EQ(base->run(StepMode::kDecode, 1, LogitRows::kLastPerRequest, breq, ids, want),
              StepPath::kGraph);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << step;
    for (float x : got) ASSERT_TRUE(std::isfinite(x));
  }
  std::vector<float> eager;
  ASSERT_TRUE(dense->rerun_decode_eagerly(dreq, ids, eager));  // the last step again, eagerly
  ASSERT_EQ(eager.size(), got.size());
  EXPECT_TRUE(dense->runtime->layer(0).attention->dense_decode_chosen());
  EXPECT_TRUE(dense->runtime->layer(1).attention->dense_decode_chosen());  // the sliding layer
  EXPECT_FALSE(base->runtime->layer(0).attention->dense_decode_chosen());
  EXPECT_EQ(std::memcmp(got.data(), eager.data(), got.size() * sizeof(float)), 0);

  // A target verify of N = 4 tokens per request (8 rows at this group of 2: the decode layout)
  // takes the hint too, and stays bitwise the base kernel's; 9 tokens (18 rows) would not.
  const std::int32_t n = Harness::kVerifyTokens;
  const ModelRuntime& rt = *dense->runtime;
  EXPECT_EQ(rt.requests_hint(StepShape{StepMode::kDecode, 2, 2, 2, 1}), 2);
  EXPECT_EQ(rt.requests_hint(StepShape{StepMode::kTargetVerify, 2, 2 * n, 2 * n, n}), 2);
  EXPECT_EQ(rt.requests_hint(StepShape{StepMode::kTargetVerify, 2, 18, 18, 9}), 0);
  EXPECT_EQ(rt.requests_hint(StepShape{StepMode::kExtend, 2, 64, 2, 0}), 0);
  EXPECT_EQ(rt.requests_hint(StepShape{StepMode::kDraftExtendV2, 2, 2 * n, 2, n}), 0);
  ids.clear();
  for (std::size_t p = 0; p < seqs.size(); ++p) {
    dreq[p].extend_len = breq[p].extend_len = n;
    for (std::int32_t i = 0; i < n; ++i)
      ids.push_back(static_cast<std::int32_t>((p * 29 + static_cast<std::size_t>(i) * 13 + 7) %
                                              static_cast<std::size_t>(config.vocab_size)));
  }
  ASSERT_EQ(dense->run(StepMode::kTargetVerify, n, LogitRows::kEveryRow, dreq, ids, got),
            StepPath::kGraph);
  EXPECT_TRUE(dense->runtime->layer(0).attention->dense_decode_chosen());
  ASSERT_EQ(base->run(StepMode::kTargetVerify, n, LogitRows::kEveryRow, breq, ids, want),
            StepPath::kGraph);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  for (float x : got) ASSERT_TRUE(std::isfinite(x));
}

// Each request's last logits finite, within 2% of the largest of `want` (another path's logits)
// and within 5% of the largest float64 reference logit: the verify-vs-decode bounds.
void expect_logits_near(const HostWeights& w, const std::vector<std::vector<std::int32_t>>& seqs,
                        const std::vector<float>& got, const std::vector<float>& want,
                        std::size_t vocab, std::int32_t step) {
  for (std::size_t p = 0; p < seqs.size(); ++p) {
    const std::vector<double> ref = testing::reference_last_logits(w, seqs[p]);
    double max_want = 0, err_want = 0, top = 0, err_ref = 0;
    for (std::size_t v = 0; v < vocab; ++v) {
      const double g = got[p * vocab + v];
      ASSERT_TRUE(std::isfinite(g)) << "step " << step << " request " << p << " vocab " << v;
      max_want = std::max(max_want, std::abs(static_cast<double>(want[p * vocab + v])));
      err_want = std::max(err_want, std::abs(g - want[p * vocab + v]));
      top = std::max(top, std::abs(ref[v]));
      err_ref = std::max(err_ref, std::abs(g - ref[v]));
    }
    EXPECT_LE(err_want, 0.02 * max_want + 1e-4) << "step " << step << " request " << p;
    EXPECT_LE(err_ref, 0.05 * top + 1e-4) << "step " << step << " request " << p << " vs float64";
  }
}

// prompts_for's requests, then short ones up to `count` (3-4 tokens, ids (i mul + at add) %
// vocab): 7 for the stream GEMV's rows past 4, 12 for the warpgroup GEMM's.
std::vector<std::vector<std::int32_t>> short_requests(const ModelConfig& config, std::size_t mul,
                                                      std::size_t add, std::size_t count = 7) {
  std::vector<std::vector<std::int32_t>> seqs = prompts_for(config);
  while (seqs.size() < count) {
    const std::size_t at = seqs.size(), n = 3 + at % 2;
    seqs.emplace_back(n);
    for (std::size_t i = 0; i < n; ++i)
      seqs[at][i] = static_cast<std::int32_t>((i * mul + add * at) % config.vocab_size);
  }
  return seqs;
}

// Racecheck runs (GRAPHDECODE_PLAIN_GEMM=1) take no GEMV, so nothing is fused.
bool plain_gemm_forced() {
  const char* plain = std::getenv("GRAPHDECODE_PLAIN_GEMM");
  return plain != nullptr && std::strcmp(plain, "1") == 0;
}

// Three replayed decode steps of every request on `got` and `want` (request p's token at step s:
// (p mul + s step_mul + add) % vocab): got's logits near want's and float64 (expect_logits_near).
// `eager_too`: the last step of got_h again, eagerly, bitwise its replay.
void expect_decode_steps_near(const HostWeights& w, std::vector<std::vector<std::int32_t>> seqs,
                              Harness& got_h, Harness& want_h, std::size_t mul,
                              std::size_t step_mul, std::size_t add, bool eager_too = false) {
  std::vector<StepRequest> greq = got_h.prefill(seqs), wreq = want_h.prefill(seqs);
  const std::size_t vocab = static_cast<std::size_t>(w.config.vocab_size);
  for (std::int32_t step = 0; step < 3; ++step) {
    std::vector<std::int32_t> ids;
    for (std::size_t p = 0; p < seqs.size(); ++p) {
      greq[p].extend_len = wreq[p].extend_len = 1;
      ids.push_back(static_cast<std::int32_t>(
          (p * mul + static_cast<std::size_t>(step) * step_mul + add) % vocab));
      seqs[p].push_back(ids.back());
    }
    std::vector<float> got, want;
    ASSERT_EQ(got_h.run(StepMode::kDecode, 1, LogitRows::kLastPerRequest, greq, ids, got),
              StepPath::kGraph);
    ASSERT_EQ(want_h.run(StepMode::kDecode, 1, LogitRows::kLastPerRequest, wreq, ids, want),
              StepPath::kGraph);
    expect_logits_near(w, seqs, got, want, vocab, step);
    if (eager_too && step == 2) {
      std::vector<float> eager;
      ASSERT_TRUE(got_h.rerun_decode_eagerly(greq, ids, eager));
      ASSERT_EQ(eager.size(), got.size());
      EXPECT_EQ(std::memcmp(eager.data(), got.data(), got.size() * sizeof(float)), 0);
    }
  }
}

// Decode steps at rows <= 8 fold each layer's input RMSNorm into the stream GEMVs around it
// (LlamaModel::fuses_input_norm, engine/kernels/stream_gemv.h StreamGemvFusion); 7 requests here.
// Three replayed decode steps: the fused model's logits within the verify-vs-decode bound of the
// unfused model's (GRAPHDECODE_FUSE_NORM=0: the rmsnorm kernel; the squares add in another
// order) and of the float64 reference.
TEST_F(LlamaModelGpu, FusedInputNormMatchesTheRmsnormKernelAndFloat64) {
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, 29);
  const bool plain = plain_gemm_forced();
  Harness fused(w, harness_options(8));
  const std::unique_ptr<Harness> unfused = harness_with(w, 8, "GRAPHDECODE_FUSE_NORM", "0");
  for (std::int32_t rows : {1, 2, 4, 8})
    EXPECT_EQ(fused.model->fuses_input_norm(rows), !plain) << rows;
  EXPECT_FALSE(unfused->model->fuses_input_norm(4));
  // 5-8 rows: the stream GEMV's rows past 4; 62 of max_tokens 64.
  ASSERT_NO_FATAL_FAILURE(
      expect_decode_steps_near(w, short_requests(config, 41, 7), fused, *unfused, 13, 7, 1));
}

// Decode steps at 9-64 rows fold each layer's two RMSNorms into the warpgroup GEMMs around them
// (LlamaModel::fuses_wgmma_norm, WgmmaNormFusion in engine/kernels/wgmma_gemm.h); 12 requests
// here, the norm weights moved off 1 (each layer's own, so a weight of the wrong norm or layer
// shows). Three replayed decode steps: logits within the verify-vs-decode bound of the unfolded
// model's (GRAPHDECODE_WGMMA_NORM=0: the add + norm kernels) and of float64; the last step again
// eagerly, bitwise the replay. The SwiGLU epilogue with the row scale runs in the 64-row prefill,
// whose K/V the decode steps read; the verify steps of
// VerifyStepLogitsForEveryRowEqualFourDecodeSteps (16 rows) take the fold too. With the down
// projection on cuBLAS (as the 8B's at 33-64 rows; here GRAPHDECODE_WGMMA_AUTO's max_in 256
// puts the down's k 512 there) nothing folds.
TEST_F(LlamaModelGpu, WgmmaNormFoldMatchesTheNormKernelsAndFloat64) {
  if (!wgmma_gemm_available()) GTEST_SKIP() << "no sm_90a device code for this GPU";
  const ModelConfig config = small_test_config();
  HostWeights w = synthetic_weights(config, 37);
  for (auto& [name, t] : w.tensors) {
    if (name.find("layernorm") == std::string::npos) continue;
    const std::size_t salt = std::hash<std::string>{}(name);
    for (std::size_t i = 0; i < t.data.size(); ++i)  // 0.75 .. 1.25
      t.data[i] = reference::float_to_bf16(
          static_cast<float>(0.75 + 0.5 * static_cast<double>((i * 131 + salt) % 97) / 96.0));
  }
  const bool plain = plain_gemm_forced();
  std::vector<std::vector<std::int32_t>> seqs = short_requests(config, 43, 9, 12);
  seqs[1].resize(6);  // 46 prompt tokens in all: one prefill step of max_tokens 64
  Harness folded(w, harness_options(16));
  const std::unique_ptr<Harness> unfolded = harness_with(w, 16, "GRAPHDECODE_WGMMA_NORM", "0");
  for (std::int32_t rows : {9, 16, 33, 64})
    EXPECT_EQ(folded.model->fuses_wgmma_norm(rows), !plain) << rows;
  EXPECT_FALSE(folded.model->fuses_wgmma_norm(8)) << "8 rows: the stream GEMVs' fold";
  EXPECT_FALSE(unfolded->model->fuses_wgmma_norm(16));
  {
    const std::unique_ptr<Harness> down_on_cublas =
        harness_with(w, 16, "GRAPHDECODE_WGMMA_AUTO", "9,64,65536,256");
    EXPECT_FALSE(down_on_cublas->model->fuses_wgmma_norm(16));
  }
  ASSERT_NO_FATAL_FAILURE(
      expect_decode_steps_near(w, seqs, folded, *unfolded, 17, 3, 4, /*eager_too=*/true));
}

// GRAPHDECODE_STREAM_MLP=all (engine/kernels/stream_mlp.h): each decode layer's MLP block runs in
// one grid at rows <= 8 (the default: rows <= 2); the o projection adds the residual.
// Three replayed decode steps of 7 requests: logits within the verify-vs-decode bound of the
// four kernels' (the post-attention norm's squares add in another order) and of float64.
TEST_F(LlamaModelGpu, MlpBlockInOneGridMatchesTheFourKernelsAndFloat64) {
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, 31);
  const bool plain = plain_gemm_forced();
  const std::unique_ptr<Harness> one_grid = harness_with(w, 8, "GRAPHDECODE_STREAM_MLP", "all");
  const std::unique_ptr<Harness> four = harness_with(w, 8, "GRAPHDECODE_STREAM_MLP", "0");
  {
    const std::unique_ptr<Harness> by_default =
        harness_with(w, 8, "GRAPHDECODE_STREAM_MLP", nullptr);
    for (std::int32_t rows : {1, 2, 4, 8}) {
      EXPECT_EQ(one_grid->model->fuses_mlp_block(rows), !plain) << rows;
      EXPECT_EQ(by_default->model->fuses_mlp_block(rows), !plain && rows <= 2) << rows;
      EXPECT_FALSE(four->model->fuses_mlp_block(rows)) << rows;
    }
  }
  ASSERT_NO_FATAL_FAILURE(
      expect_decode_steps_near(w, short_requests(config, 37, 5), *one_grid, *four, 11, 5, 2));
  std::int32_t flag = -1;  // no grid barrier timed out (kStreamMlpStallBit)
  GD_CUDA(
      cudaMemcpy(&flag, one_grid->model->bad_token_flag(), sizeof(flag), cudaMemcpyDeviceToHost));
  EXPECT_EQ(flag, 0);
}

// The 8B width (hidden 4096, 32 q / 8 kv heads of 128, SwiGLU 14336; one layer, vocab 512): its
// qkv (6144 outputs) and o take the stream GEMV at rows <= 8, its down (k 14336) at rows <= 2
// only, so the model folds the input norm and runs the MLP block at rows <= 2. Three replayed
// decode steps of two requests (the block), then of six (the qkv and o GEMVs, no fold): logits
// within the verify-vs-decode bound of cuBLAS's (GRAPHDECODE_GEMV=off: no GEMV, no fold) and of
// float64; no grid barrier timed out.
TEST_F(LlamaModelGpu, EightBWidthTakesTheStreamGemvsAndTheMlpBlock) {
  if (testing::sanitize_mode())
    GTEST_SKIP() << "2 x 218 M weights a step: too slow under the sanitizers";
  ModelConfig config = small_test_config();
  config.hidden_size = 4096;
  config.intermediate_size = 14336;
  config.num_attention_heads = 32;
  config.num_key_value_heads = 8;
  config.head_dim = 128;
  config.num_hidden_layers = 1;
  config.layers.assign(1, LayerAttention{});
  config.validate();
  const HostWeights w = synthetic_weights(config, 43);
  const bool plain = plain_gemm_forced();
  const std::unique_ptr<Harness> fast = harness_with(w, 8, "GRAPHDECODE_GEMV", nullptr);
  const std::unique_ptr<Harness> cublas = harness_with(w, 8, "GRAPHDECODE_GEMV", "off");
  for (std::int32_t rows : {1, 2, 4}) {
    EXPECT_EQ(fast->model->fuses_input_norm(rows), !plain && rows <= 2) << rows;
    EXPECT_EQ(fast->model->fuses_mlp_block(rows), !plain && rows <= 2) << rows;
  }
  EXPECT_FALSE(cublas->model->fuses_input_norm(1));
  // Short prompts: the float64 reference reruns each sequence at every step.
  const std::vector<std::vector<std::int32_t>> seqs = {{3, 141, 59}, {26, 53, 58, 97, 93, 238}};
  ASSERT_NO_FATAL_FAILURE(expect_decode_steps_near(w, seqs, *fast, *cublas, 17, 5, 3));
  // Four more requests (6 of the 8 slots taken).
  const std::vector<std::vector<std::int32_t>> four = {{7}, {11, 13}, {17, 19, 23}, {29, 31}};
  ASSERT_NO_FATAL_FAILURE(expect_decode_steps_near(w, four, *fast, *cublas, 19, 7, 5));
  std::int32_t flag = -1;  // kStreamMlpStallBit
  GD_CUDA(cudaMemcpy(&flag, fast->model->bad_token_flag(), sizeof(flag), cudaMemcpyDeviceToHost));
  EXPECT_EQ(flag, 0);
}

// A target-verify step of N = 4 tokens per request, captured with logits for every row, gives
// the same 4N logits rows as 4 single-token decode steps over the same tokens (within bf16
// rounding: the two run GEMMs and attention of different shapes), and matches the float64
// reference. Three requests in a bucket of 4: the padding row is inert.
TEST_F(LlamaModelGpu, VerifyStepLogitsForEveryRowEqualFourDecodeSteps) {
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, 23);
  std::vector<std::vector<std::int32_t>> prompts = prompts_for(config);
  prompts.push_back(std::vector<std::int32_t>(17));
  for (std::size_t i = 0; i < prompts[2].size(); ++i)
    prompts[2][i] = static_cast<std::int32_t>((i * 53 + 11) % config.vocab_size);
  const std::int32_t n = Harness::kVerifyTokens;
  const std::size_t batch = prompts.size(), vocab = static_cast<std::size_t>(config.vocab_size);
  std::vector<std::vector<std::int32_t>> drafts(batch);  // the 4 tokens each request verifies
  for (std::size_t p = 0; p < batch; ++p)
    for (std::int32_t i = 0; i < n; ++i)
      drafts[p].push_back(static_cast<std::int32_t>((p * 97 + i * 31 + 5) % vocab));

  Harness verify(w, harness_options(4)), decode(w, harness_options(4));
  std::vector<StepRequest> vreq = verify.prefill(prompts), dreq = decode.prefill(prompts);
  std::vector<std::int32_t> ids;
  for (std::size_t p = 0; p < batch; ++p) {
    vreq[p].extend_len = n;
    ids.insert(ids.end(), drafts[p].begin(), drafts[p].end());
  }
  std::vector<float> all;
  ASSERT_EQ(verify.run(StepMode::kTargetVerify, n, LogitRows::kEveryRow, vreq, ids, all),
            StepPath::kGraph);
  ASSERT_EQ(all.size(), batch * n * vocab);
  ASSERT_NE(verify.graphs->find(StepMode::kTargetVerify, n, 3, LogitRows::kEveryRow), nullptr);

  for (std::int32_t i = 0; i < n; ++i) {
    std::vector<std::int32_t> one;
    for (std::size_t p = 0; p < batch; ++p) {
      dreq[p].extend_len = 1;
      one.push_back(drafts[p][i]);
    }
    std::vector<float> step;
    ASSERT_EQ(decode.run(StepMode::kDecode, 1, LogitRows::kLastPerRequest, dreq, one, step),
              StepPath::kGraph);
    for (std::size_t p = 0; p < batch; ++p) {
      const float* got = &all[(p * n + static_cast<std::size_t>(i)) * vocab];
      const float* want = &step[p * vocab];
      double max_ref = 0, max_err = 0;
      for (std::size_t v = 0; v < vocab; ++v) {
        ASSERT_TRUE(std::isfinite(got[v]));
        max_ref = std::max(max_ref, static_cast<double>(std::abs(want[v])));
        max_err = std::max(max_err, static_cast<double>(std::abs(got[v] - want[v])));
      }
      EXPECT_LE(max_err, 0.02 * max_ref + 1e-4)
          << "request " << p << " row " << i << ": verify vs decode, max_err " << max_err;
      if (i == n - 1 || p == 0) {  // and both against the float64 reference
        std::vector<std::int32_t> seq = prompts[p];
        seq.insert(seq.end(), drafts[p].begin(), drafts[p].begin() + i + 1);
        const std::vector<double> ref = testing::reference_last_logits(w, seq);
        double err = 0, top = 0;
        for (std::size_t v = 0; v < vocab; ++v) {
          top = std::max(top, std::abs(ref[v]));
          err = std::max(err, std::abs(got[v] - ref[v]));
        }
        EXPECT_LE(err, 0.05 * top + 1e-4) << "request " << p << " row " << i << " vs float64";
      }
    }
  }
}

}  // namespace
}  // namespace graphdecode
