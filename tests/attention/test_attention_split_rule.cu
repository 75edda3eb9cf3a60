// CPU: adaptive split-KV's rule (attention/attention_plan.cuh adaptive_split, chunk_size_for) on
// the batches its tuning constants were measured on (bench/NOTES.md 97), and its invariants over
// every batch of one to eight waves. The GPU tests check that plans made by the rule run correctly;
// this pins which plan the rule makes.
#include <gtest/gtest.h>

#include "attention/attention_plan.cuh"

namespace graphdecode::attn {
namespace {

// d64 on an H100 / H200: 132 SMs x 3 resident CTAs; the default wave split.
PlanParams d64_params() {
  PlanParams p{};
  p.target_ctas = 396;
  p.wave_chunks = kWaveSplitChunks;
  p.wave_min_keys = kWaveSplitMinKeys;
  return p;
}

RequestShape decode_request(int keys) {
  RequestShape s;
  s.q_len = 1;
  s.kv_len = keys;
  s.first_key = 0;
  s.last_key = keys - 1;
  s.tiles = 1;
  return s;
}

TEST(AttentionSplitRule, MeasuredBatches) {
  const PlanParams p = d64_params();
  const int kv_heads = 8;
  // B = 56 and 64 leave a last round of 52 and 116 CTAs: two chunks each.
  for (const int b : {56, 64}) {
    const AdaptiveSplit a = adaptive_split(p, b * kv_heads);
    EXPECT_EQ(a.chunks, 2) << "B = " << b;
    EXPECT_TRUE(a.wave) << "B = " << b;
    EXPECT_EQ(a.min_keys, kWaveSplitMinKeys);
  }
  // B = 96 (1.94 waves) and 128 (2.59 waves) already keep the memory busy in their last round.
  for (const int b : {96, 128}) {
    const AdaptiveSplit a = adaptive_split(p, b * kv_heads);
    EXPECT_EQ(a.chunks, 1) << "B = " << b;
    EXPECT_FALSE(a.wave) << "B = " << b;
  }
  // Under one wave: the fine split, unchanged (B = 1: 49 chunks of >= 64 keys; B = 32: none).
  EXPECT_EQ(adaptive_split(p, 1 * kv_heads).chunks, 49);
  EXPECT_FALSE(adaptive_split(p, 1 * kv_heads).wave);
  EXPECT_EQ(adaptive_split(p, 1 * kv_heads).min_keys, kMinSplitTokens);
  EXPECT_EQ(adaptive_split(p, 32 * kv_heads).chunks, 1);
  // Exactly one wave, and past kWaveSplitMaxWaves: left whole.
  EXPECT_EQ(adaptive_split(p, 396).chunks, 1);
  EXPECT_EQ(adaptive_split(p, kWaveSplitMaxWaves * 396 + 1).chunks, 1);
  // Off, and in deterministic mode (its own fixed chunks).
  PlanParams off = p;
  off.wave_chunks = 1;
  EXPECT_EQ(adaptive_split(off, 512).chunks, 1);
  PlanParams det = p;
  det.deterministic = true;
  det.split_tokens = 1024;
  EXPECT_EQ(adaptive_split(det, 512).chunks, 1);
  EXPECT_EQ(chunk_size_for(det, decode_request(4097), adaptive_split(det, 512)), 1024);
}

TEST(AttentionSplitRule, ChunkLengths) {
  const PlanParams p = d64_params();
  const AdaptiveSplit two = adaptive_split(p, 512);
  ASSERT_EQ(two.chunks, 2);
  // 4097 keys (L = 4096 + the new token): two chunks of 2112 and 1985 keys.
  EXPECT_EQ(chunk_size_for(p, decode_request(4097), two), 2112);
  // 2049 keys: two of 1088 and 961 (about min_keys: no short remainder).
  EXPECT_EQ(chunk_size_for(p, decode_request(2049), two), 1088);
  // 1025 keys hold one chunk of >= 1024 keys only: not cut (not 1024 + 1).
  EXPECT_EQ(chunk_size_for(p, decode_request(1025), two), kNoSplit);
  EXPECT_EQ(chunk_size_for(p, decode_request(64), two), kNoSplit);
  // A request that sees no key is one item.
  RequestShape none = decode_request(10);
  none.last_key = -1;
  EXPECT_EQ(chunk_size_for(p, none, two), kNoSplit);
}

// One request under one wave (B = 1 at d64: 49 chunks asked): the fine split's chunk lengths at the
// contexts it was measured on (bench/NOTES.md 105), with the new token's key.
TEST(AttentionSplitRule, FineChunksOfOneRequest) {
  const PlanParams p = d64_params();
  const AdaptiveSplit one = adaptive_split(p, 8);
  ASSERT_EQ(one.chunks, 49);
  const auto chunk = [&](int keys) { return chunk_size_for(p, decode_request(keys), one); };
  EXPECT_EQ(chunk(513), 64);    // 16 chunks would be shorter than the floor: 9 of 64 keys
  EXPECT_EQ(chunk(1025), 128);  // 9 of 128 (not 17 of 64: the floor)
  EXPECT_EQ(chunk(2049), 128);  // 17 of 128 (16 chunks: 11 of 192)
  EXPECT_EQ(chunk(4097), 192);  // 22 of 192 (16 chunks: 17 of 256)
  EXPECT_EQ(chunk(8193), kFineChunkTokens);  // 33 of 256: past the fine chunks
  for (int keys = 1; keys <= 20000; keys += 7) {
    const int c = chunk(keys);
    if (c == kNoSplit) continue;
    ASSERT_EQ(c % kBlockN, 0) << keys;
    const int pieces = (keys + c - 1) / c;
    ASSERT_TRUE(c >= kFineChunkTokens || pieces <= kMaxFineChunks) << keys;
    ASSERT_TRUE(c >= kFineFloorTokens || pieces <= kFewFineChunks) << keys;
  }
}

// Over every batch of one to kWaveSplitMaxWaves waves, for 2-4 chunk caps and two wave sizes: the
// choice is within the cap, never predicted slower than one chunk, a cut only when it gains at
// least 1/kWaveSplitGain, and every request's chunks are >= min_keys keys but for the rounding.
TEST(AttentionSplitRule, InvariantsPastOneWave) {
  for (const int target : {264, 396}) {
    for (int cap = 2; cap <= kMaxWaveSplitChunks; ++cap) {
      PlanParams p = d64_params();
      p.target_ctas = target;
      p.wave_chunks = cap;
      for (int base = target; base < kWaveSplitMaxWaves * target; ++base) {
        const AdaptiveSplit a = adaptive_split(p, base);
        ASSERT_GE(a.chunks, 1);
        ASSERT_LE(a.chunks, cap) << base;
        const int one = wave_rounds_time(base, target);
        const int chosen = wave_rounds_time(base * a.chunks, target);
        if (a.chunks > 1) {
          ASSERT_TRUE(a.wave);
          // time per chunk at least 1/kWaveSplitGain under one chunk's
          ASSERT_LT(chosen * kWaveSplitGain, one * a.chunks * (kWaveSplitGain - 1)) << base;
          for (const int keys : {1025, 2049, 4097, 8193, 32769}) {
            const int chunk = chunk_size_for(p, decode_request(keys), a);
            if (chunk == kNoSplit) {
              ASSERT_LT(keys / p.wave_min_keys, 2) << keys;
              continue;
            }
            ASSERT_EQ(chunk % kBlockN, 0);
            const int pieces = (keys + chunk - 1) / chunk;
            ASSERT_LE(pieces, a.chunks) << base << " " << keys;
            ASSERT_GE(keys - (pieces - 1) * chunk + kBlockN * pieces, p.wave_min_keys)
                << "last chunk far under min_keys: " << base << " " << keys;
          }
        } else {
          ASSERT_FALSE(a.wave);
        }
      }
    }
  }
}

}  // namespace
}  // namespace graphdecode::attn
