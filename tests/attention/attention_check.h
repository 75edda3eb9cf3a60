// Test support: seeds, the comparison against the float64 reference, and one-call cases.
//
// Seeds: every run draws fresh data. The base seed comes from GRAPHDECODE_SEED when set, else
// std::random_device; each test derives its own stream from the base seed and its name, and
// SCOPED_TRACE(seed_note()) prints "GRAPHDECODE_SEED=<base>" on failure to reproduce it.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attention/paged_attention.h"
#include "attention/reference.h"
#include "device_batch.h"
#include "host_batch.h"

namespace graphdecode::testing {

std::uint64_t base_seed();
Rng test_rng();  // seeded from base_seed() and the running test's full name
std::string seed_note();

// GRAPHDECODE_SANITIZE=1 (set for compute-sanitizer runs): cases shrink (see shrink_for_sanitizer).
bool sanitize_mode();
// In sanitize mode: at most `max_batch` requests, kv_len <= 2048, q_len <= 256 (and <= kv_len in
// causal mode). Otherwise returns `reqs` unchanged.
std::vector<Req> shrink_for_sanitizer(std::vector<Req> reqs, AttentionMode mode,
                                      std::size_t max_batch = 8);

// Random request lists. Causal: kv_len = prefix + q_len.
std::vector<Req> decode_reqs(Rng& rng, std::int32_t batch, std::int32_t min_ctx,
                             std::int32_t max_ctx);
std::vector<Req> extend_reqs(Rng& rng, std::int32_t batch, std::int32_t min_q, std::int32_t max_q,
                             std::int32_t min_prefix, std::int32_t max_prefix);

struct Tolerance {
  double rel_l2 = 1e-2;   // ||out - ref|| / ||ref||
  double max_abs = 2e-2;  // outputs are convex combinations of values in [-1, 1]
  double lse_abs = 1e-2;
};

// Compares rows [0, ref.total_q) of out (dtype bits, [rows][heads][head_dim]) and, when lse is
// non-null, lse ([rows][heads]) with the reference. NaN (the poison) never passes; a row whose
// reference lse is -inf must be exactly 0 with lse -inf.
::testing::AssertionResult matches_reference(const reference::AttentionResult& ref,
                                             const std::vector<std::uint16_t>& out,
                                             const std::vector<float>* lse, DType dtype,
                                             const Tolerance& tol = {});

struct Outputs {
  std::vector<std::uint16_t> out;  // [total_q][hq][d]
  std::vector<float> lse;          // [total_q][hq], empty when run without lse
};

// Poisons the outputs, runs attn eagerly on `dev`, downloads the first total_q rows.
// query_tokens_hint: AttentionBatch::query_tokens_hint (0: 64-row extend tiles); requests_hint:
// AttentionBatch::requests_hint (0: no dense decode kernel).
Outputs run_eager(const PagedAttention& attn, DevicePagedBatch& dev, std::int32_t total_q,
                  cudaStream_t stream, bool with_lse = true, bool with_window_ptr = true,
                  std::int32_t query_tokens_hint = 0, std::int32_t requests_hint = 0);

// Bitwise equality of rows [a_row, a_row + rows) of `a` and [b_row, ...) of `b` (out and lse).
::testing::AssertionResult bitwise_equal(const Outputs& a, std::int32_t a_row, const Outputs& b,
                                         std::int32_t b_row, std::int32_t rows,
                                         std::int32_t row_elems, std::int32_t heads);

struct CaseOptions {
  FillOptions fill;
  bool deterministic = false;
  std::int32_t split_tokens = 0;
  bool with_window_ptr = true;  // false: AttentionBatch::window_left = nullptr
  bool with_lse = true;
  // Also run with AttentionBatch::query_tokens_hint set (128-row extend tiles at head dim 64):
  // against the reference too, and bitwise against the 64-row run when deterministic (the same
  // chunks; a row's key tiles and their order do not depend on the tile's height).
  bool wide_tiles = false;
  // Also run with AttentionBatch::requests_hint set (the dense decode kernel at head dim 64):
  // against the reference too, and bitwise against the base run when deterministic and every
  // request is a decode-layout tile (the same code and chunks; extend tiles take mma.sync there).
  bool dense_decode = false;
  Tolerance tol;
};

// Builds a random batch for `reqs` (shrunk in sanitize mode), runs PagedAttention and compares
// with the float64 reference. The message names the case on failure.
::testing::AssertionResult run_case(const Shape& shape, std::vector<Req> reqs,
                                    const CaseOptions& opts, Rng& rng);

std::string describe(const Shape& shape, const std::vector<Req>& reqs, const CaseOptions& opts);

}  // namespace graphdecode::testing
