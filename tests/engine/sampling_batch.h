// Test support for device sampling: a batch of logits rows and per-row parameters on the device,
// with its workspace, poisoned outputs and random logits of several shapes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "attention/reference.h"
#include "attention_check.h"
#include "common/buffers.h"
#include "common/cuda_check.h"
#include "engine/kernels/sampling.h"
#include "sampling_reference.h"

namespace graphdecode::testing {

using Params = SampleParams;

constexpr std::int32_t kPoisonToken = -7;
constexpr std::int32_t kPoisonPath = -9;

// Logits [max_rows][row_stride] (fp32, or bf16 rounded from the same values: the host copy then
// holds the rounded values), per-row parameters, tokens and paths poisoned before a run.
struct Batch {
  int max_rows, vocab;
  std::int64_t stride;
  LogitsType type;
  std::vector<float> logits;  // [max_rows][vocab]: the values the kernel sees
  std::vector<Params> params;
  DeviceBuffer<float> d_logits_f, d_temp, d_top_p;
  DeviceBuffer<std::uint16_t> d_logits_b;
  DeviceBuffer<std::int32_t> d_top_k, d_tokens, d_rows, d_path;
  DeviceBuffer<std::uint64_t> d_seed, d_step;
  DeviceBuffer<std::uint8_t> d_ws;

  // stride: elements between device rows (0 = vocab); the padding holds huge logits that must
  // never be read.
  Batch(int rows, int v, LogitsType t, std::int64_t row_stride = 0)
      : max_rows(rows),
        vocab(v),
        stride(row_stride == 0 ? v : row_stride),
        type(t),
        logits(static_cast<std::size_t>(rows) * v),
        params(rows),
        d_temp(rows),
        d_top_p(rows),
        d_top_k(rows),
        d_tokens(rows),
        d_rows(1),
        d_path(rows),
        d_seed(rows),
        d_step(rows),
        d_ws(sampling_workspace_bytes(rows, v)) {
    const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(stride);
    if (t == LogitsType::kFloat32)
      d_logits_f = DeviceBuffer<float>(n);
    else
      d_logits_b = DeviceBuffer<std::uint16_t>(n);
    d_ws.fill_bytes(0);
    GD_CUDA(cudaDeviceSynchronize());
  }
  float* row(int r) { return logits.data() + static_cast<std::size_t>(r) * vocab; }
  SamplingArgs args() {
    SamplingArgs a;
    a.logits = type == LogitsType::kFloat32 ? static_cast<const void*>(d_logits_f.data())
                                            : static_cast<const void*>(d_logits_b.data());
    a.logits_type = type;
    a.temperature = d_temp.data();
    a.top_k = d_top_k.data();
    a.top_p = d_top_p.data();
    a.seed = d_seed.data();
    a.step = d_step.data();
    a.tokens = d_tokens.data();
    a.num_rows = d_rows.data();
    a.max_rows = max_rows;
    a.vocab = vocab;
    a.row_stride = stride;
    a.workspace = d_ws.data();
    a.workspace_bytes = d_ws.bytes();
    a.path = d_path.data();
    return a;
  }
  // Uploads everything (bf16: rounds the host logits in place first), poisons the outputs.
  void upload(int live, cudaStream_t s) {
    const std::size_t n = static_cast<std::size_t>(max_rows) * static_cast<std::size_t>(stride);
    if (type == LogitsType::kBF16) {
      std::vector<std::uint16_t> b(n, reference::float_to_bf16(3e38f));
      for (int r = 0; r < max_rows; ++r)
        for (int i = 0; i < vocab; ++i) {
          float& x = row(r)[i];
          b[static_cast<std::size_t>(r) * stride + i] = reference::float_to_bf16(x);
          x = reference::bf16_to_float(reference::float_to_bf16(x));
        }
      d_logits_b.upload(b.data(), n, s);
      GD_CUDA(cudaStreamSynchronize(s));
    } else {
      std::vector<float> f(n, 3e38f);
      for (int r = 0; r < max_rows; ++r)
        std::copy(row(r), row(r) + vocab, f.begin() + static_cast<std::ptrdiff_t>(r * stride));
      d_logits_f.upload(f.data(), n, s);
      GD_CUDA(cudaStreamSynchronize(s));
    }
    upload_params(live, s);
  }
  void upload_params(int live, cudaStream_t s) {
    std::vector<float> t(max_rows), p(max_rows);
    std::vector<std::int32_t> k(max_rows), poison(max_rows, kPoisonToken),
        poison_path(max_rows, kPoisonPath);
    std::vector<std::uint64_t> seed(max_rows), step(max_rows);
    for (int r = 0; r < max_rows; ++r) {
      t[r] = params[r].temperature;
      p[r] = params[r].top_p;
      k[r] = params[r].top_k;
      seed[r] = params[r].seed;
      step[r] = params[r].step;
    }
    d_temp.upload(t.data(), max_rows, s);
    d_top_p.upload(p.data(), max_rows, s);
    d_top_k.upload(k.data(), max_rows, s);
    d_seed.upload(seed.data(), max_rows, s);
    d_step.upload(step.data(), max_rows, s);
    d_tokens.upload(poison.data(), max_rows, s);
    d_path.upload(poison_path.data(), max_rows, s);
    d_rows.upload(&live, 1, s);
    GD_CUDA(cudaStreamSynchronize(s));
  }
  std::vector<std::int32_t> tokens(cudaStream_t s) {
    std::vector<std::int32_t> t(max_rows);
    d_tokens.download(t.data(), max_rows, s);
    GD_CUDA(cudaStreamSynchronize(s));
    return t;
  }
  std::vector<std::int32_t> paths(cudaStream_t s) {
    std::vector<std::int32_t> t(max_rows);
    d_path.download(t.data(), max_rows, s);
    GD_CUDA(cudaStreamSynchronize(s));
    return t;
  }
};

inline void random_logits(Rng& rng, float* row, int vocab, float spread) {
  std::normal_distribution<float> n(0.f, spread);
  for (int i = 0; i < vocab; ++i) row[i] = n(rng);
}

// A trained-model-like row: a normal background and a few tokens 10-15 above it.
inline void peaked_logits(Rng& rng, float* row, int vocab) {
  random_logits(rng, row, vocab, 1.f);
  std::uniform_int_distribution<int> at(0, vocab - 1);
  std::uniform_real_distribution<float> lift(10.f, 15.f);
  const int spikes = std::min(vocab, 8);
  for (int j = 0; j < spikes; ++j) row[at(rng)] = lift(rng);
}

}  // namespace graphdecode::testing
