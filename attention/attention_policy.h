// Tuning policy of the paged attention kernels: every measured choice, in one place. Each constant
// carries one line of provenance: the bench/NOTES.md entry that chose it and the figure that
// decided (H100 80GB HBM3; decode, 32 q / 8 KV heads, head dim 128, bf16, page 16, shuffled pages
// unless the line says otherwise; "call" = one standalone run(), "step" = per layer of a step
// graph; see docs/performance.md for the methods). Structural constants (tile sizes, threads per
// CTA, the layouts' row counts) are in attention_params.cuh: they are the kernel's shape, not a
// tuning.
//
// Sweeps: the constants whose default is a GD_ATTN_* macro below can be overridden by a compile
// definition of that name (e.g. -DGD_ATTN_STAGES=4) for the A/B scripts under scripts/perf/, which
// build variants side by side; the default build defines none of them. They are kept overridable
// because a new GPU (or a new model shape in bench_decode) is likely to move them. No other file
// of the library reads a GD_ATTN_* macro, except GD_ATTN_TRACE (attention_trace.cuh).
#pragma once

namespace graphdecode::attn {

// ---- pipeline and occupancy --------------------------------------------------------------------

// K/V tiles (64 keys) in flight per CTA, head dims <= 128.
// 3: NOTES 65, B=8 L=32768 call 367.7 us vs 369.2 at 2 stages waiting first, 372.9 at 2 (also 36).
#ifndef GD_ATTN_STAGES
#define GD_ATTN_STAGES 3
#endif
// d256 takes 2 (160 KB of shared memory, one CTA per SM); 3 was not measured there.
template <int kHeadDim>
inline constexpr int kPipelineStages = kHeadDim <= 128 ? GD_ATTN_STAGES : 2;

// __launch_bounds__ minimum CTAs per SM (a register cap; shared memory sets the residency).
// 2: NOTES 36, B=8 L=8192 call 103.8 us vs 134.2 at 1 per SM with 4 stages (48: 3 per SM worse).
#ifndef GD_ATTN_MIN_BLOCKS
#define GD_ATTN_MIN_BLOCKS 2
#endif
inline constexpr int kMinBlocksPerSm = GD_ATTN_MIN_BLOCKS;

// The dense decode kernel (head dim 64): 4 CTAs per SM (registers capped at 128) with 2 K/V stages
// (40 KB of shared memory), against 3 per SM at 151 registers and 3 stages. A batch of many
// (request, KV head) items fits more of them in one wave. 1: bench/NOTES.md 99, H200, 1B step
// (bench_decode, one binary, t76) B = 64 L = 1024 2008 -> 1816 us, B = 128 2638 -> 2540, L = 4096
// B = 64 3572 -> 3287; the whole kernel at 4 per SM (t75) made B = 1 1018 -> 1035 and B = 8
// 1163 -> 1196, so PagedAttention picks it per call (AttentionBatch::requests_hint).
#ifndef GD_ATTN_DENSE_DECODE
#define GD_ATTN_DENSE_DECODE 1
#endif
template <int kHeadDim>
inline constexpr bool kDenseDecode = GD_ATTN_DENSE_DECODE != 0 && kHeadDim == 64;
inline constexpr int kDenseBlocksPerSm = 4;
inline constexpr int kDenseStages = 2;
// A call takes the dense kernel when requests_hint x KV heads exceeds the base kernel's wave of
// resident CTAs (396 on 132 SMs at d64): only then does it hold more of the items at once. Below
// it, the dense kernel runs the same CTAs with fewer stages. NOTES 99, 1B step (t76, t78, t79): B =
// 64 (512 items) gained at every context (L = 256 1558 -> 1438 us, 1024 2009 -> 1816); B = 32 (256)
// lost at short contexts (L = 256 +24 us with its split in 2 chunks, +32 unsplit; the decode_loop
// example +1-2%) and gained at L = 4096 (-271 us, where its split fills the dense wave); B = 8-24
// lost (t77). GD_ATTN_DENSE_MIN_ITEMS > 0 replaces the rule by a fixed item count.
#ifndef GD_ATTN_DENSE_MIN_ITEMS
#define GD_ATTN_DENSE_MIN_ITEMS 0
#endif
inline constexpr int kDenseMinItems = GD_ATTN_DENSE_MIN_ITEMS;

// ---- adaptive split-KV -------------------------------------------------------------------------

// Waves of CTAs the adaptive split aims at; 0 = one wave of resident CTAs (occupancy x SMs).
// 0: NOTES 17 (d128 2 per SM: B=8 L=2048 call 36.7 us vs 45.8 at 3 waves), 51 (d64 3 per SM:
// Llama-1B step B=8 L=4096 1740.6 us vs 1818.5 at 2), 33 (6-24 waves worse everywhere).
#ifndef GD_ATTN_TARGET_WAVES
#define GD_ATTN_TARGET_WAVES 0
#endif
inline constexpr int kTargetWaves = GD_ATTN_TARGET_WAVES;

// The adaptive split never cuts finer than this many keys (a multiple of kBlockN).
// 64: NOTES 11, B=1 L=512 per layer 12.9 us vs 14.7 at 128 keys and 18.4 at 256.
#ifndef GD_ATTN_MIN_SPLIT
#define GD_ATTN_MIN_SPLIT 64
#endif
inline constexpr int kMinSplitTokens = GD_ATTN_MIN_SPLIT;

// ...and cuts a request into at most kMaxFineChunks chunks shorter than kFineChunkTokens keys,
// each of at least kFineFloorTokens keys unless kFewFineChunks chunks would already be shorter:
// past that, the extra CTAs and merge inputs cost more than the shorter chunks save. A B = 1 CTA
// takes ~3 us to issue its first K/V tiles, one page lookup per copy iteration (attention trace
// points 1 -> 6, NOTES 105, 106), so more CTAs stream a long span faster, while 1-tile chunks at
// L = 1024 (17 merge inputs) lost.
// 32 / 16 / 128: NOTES 105 (H200, t107: 32 chunks, 1B step B = 1 L = 4096 1071.7 -> 1047.2 us,
// 8B 4879 -> 4847; at L = 1024 its 64-key chunks cost +7 us, which the 128-key floor keeps off);
// before, 16 for all: NOTES 81 (8: B=1 L=2048 step 8.5 us vs 7.7), 93 (24: B=1 L=4096 call
// 17.6-17.8 vs 17.3-17.5). GD_ATTN_MAX_FINE_CHUNKS=16 is the old rule; GD_ATTN_FINE_FLOOR=64
// with 32 is t107's (1-tile chunks at L = 1024).
#ifndef GD_ATTN_MAX_FINE_CHUNKS
#define GD_ATTN_MAX_FINE_CHUNKS 32
#endif
inline constexpr int kMaxFineChunks = GD_ATTN_MAX_FINE_CHUNKS;
inline constexpr int kFewFineChunks = 16;
#ifndef GD_ATTN_FINE_FLOOR
#define GD_ATTN_FINE_FLOOR 128
#endif
inline constexpr int kFineFloorTokens = GD_ATTN_FINE_FLOOR;
static_assert(kFewFineChunks <= kMaxFineChunks);
// 256: NOTES 81, B=1 L=4096 step 10.3 us vs 11.8 at 128 keys (model step 1407.2 vs 1418.0 us).
#ifndef GD_ATTN_FINE_CHUNK_TOKENS
#define GD_ATTN_FINE_CHUNK_TOKENS 256
#endif
inline constexpr int kFineChunkTokens = GD_ATTN_FINE_CHUNK_TOKENS;

// A batch of more unsplit items than one wave of resident CTAs (B x KV heads >= SMs x CTAs per
// SM at decode) is cut into up to kWaveSplitChunks chunks per request where that shortens its
// rounds of CTAs by 1/kWaveSplitGain (attention_plan.cuh adaptive_split), into chunks of at least
// kWaveSplitMinKeys keys; 1 chunk = off. Head dims with the persistent grid only (the others'
// grid is the work capacity, which the split grows). AttentionConfig may override both.
// 3 / 1024: NOTES 54 (b) and 97: d64 B=64 L=4096 per layer of a step 205.3 -> 183.8 us (H100,
// t61, the rule's 2 chunks; 3 ran alike in t60); chunks of 384-512 keys leave d64's narrow layout
// (kNarrowMinKeys) and lost at L=1024 (54.0 -> 55.6 us at 3 x >= 512).
#ifndef GD_ATTN_WAVE_SPLIT_CHUNKS
#define GD_ATTN_WAVE_SPLIT_CHUNKS 3
#endif
inline constexpr int kWaveSplitChunks = GD_ATTN_WAVE_SPLIT_CHUNKS;
#ifndef GD_ATTN_WAVE_SPLIT_MIN_KEYS
#define GD_ATTN_WAVE_SPLIT_MIN_KEYS 1024
#endif
inline constexpr int kWaveSplitMinKeys = GD_ATTN_WAVE_SPLIT_MIN_KEYS;
// The rule's model: a last round of CTAs smaller than kWaveTailShare percent of a wave takes as
// long as that share. 55: NOTES 97 (t60, H100, d64): a last round of 0.29 wave (B=64, 512 items)
// took ~0.54 wave's time, one of 0.59 (B=128) ~0.64, one lone round of 0.65 (B=32) ~0.73; so B=128
// (2.59 waves) is left whole (split in 3 it ran 0.7% longer) and a batch of half a wave to one
// wave is not split (B=32 L=4096 in 3: 99.2 -> 94.4 us per layer, but 101.4 -> 103.5 per call).
inline constexpr int kWaveTailShare = 55;
// Structural bounds: chunks the rule may be set to, and the waves past which a batch's last round
// is a small share of its time and it is left alone.
inline constexpr int kMaxWaveSplitChunks = 4;
inline constexpr int kWaveSplitMaxWaves = 8;
// 10%: the split's merges cost what the model leaves out (B=64 L=4096: predicted -16%, ran -11%).
inline constexpr int kWaveSplitGain = 10;
static_assert(kWaveSplitChunks >= 1 && kWaveSplitChunks <= kMaxWaveSplitChunks);

// Deterministic mode's chunk size when AttentionConfig::split_tokens is 0 (keys).
// 1024: first version's, not swept (NOTES 92: verify B=64 L=8192 N=4 756.8 us vs 718.9 adaptive).
inline constexpr int kDefaultSplitTokens = 1024;

// ---- decode layouts ----------------------------------------------------------------------------

// The narrow decode layout (<= 8 rows, keys as the mma's M dimension) from this head dim up...
// 128: NOTES 50, at d64 it cost the Llama-1B step B=1 L=1024 1400.9 us vs 1362.7 (cold set-up).
#ifndef GD_ATTN_NARROW_MIN_DIM
#define GD_ATTN_NARROW_MIN_DIM 128
#endif
inline constexpr int kNarrowMinHeadDim = GD_ATTN_NARROW_MIN_DIM;
// ...and below it for work items of at least this many keys, whose loop outweighs the set-up
// (a sweep turns it off with a value above max_kv_len).
// 1024: NOTES 53, Llama-1B step B=64 L=4096 5030.6 us vs 5302.0 without; 512 lost at B=8 L=4096.
#ifndef GD_ATTN_NARROW_MIN_KEYS
#define GD_ATTN_NARROW_MIN_KEYS 1024
#endif
inline constexpr int kNarrowMinKeys = GD_ATTN_NARROW_MIN_KEYS;

// ---- per head dim: code that pays at d128 and up but not in the d64 model step -----------------
// (The d64 kernels run inside the Llama-1B step, where the kernel's code arrives cold between
// other kernels and its layout alone moves the step by ~1%: NOTES 53, 62.)

// The split merge loads the next batch of chunks while it sums the current one.
// >= 128: NOTES 30, d128 B=1 L=4096 call 19.6 us vs 20.2; at d64 the model step took 1389 vs 1362.
template <int kHeadDim>
inline constexpr bool kMergePrefetch = kHeadDim >= 128;

// A batch of one request is planned by its own thread, no block scans (self-planned calls).
// >= 128: NOTES 91, d128 B=1 L=4096 call 17.1-17.2 us vs 17.7-17.8; d64 step 1361.4 vs 1345.3.
template <int kHeadDim>
inline constexpr bool kAlonePlan = kHeadDim >= 128;

// A grid of at most one wave of resident CTAs that claim the items past it (else one CTA per
// work item of the capacity).
// <= 128: NOTES 54, d256 with the claim loop spilled 76 bytes: B=8 L=8192 call 222.7 us vs 211.3.
template <int kHeadDim>
inline constexpr bool kPersistent = kHeadDim <= 128;

// ---- extend layout -----------------------------------------------------------------------------

// The extend layout (query tiles of more than 16 rows) at head dim 64 on the warpgroup MMA (sm_90a
// builds; attend_wgmma.cuh), else on mma.sync. 1: bench/NOTES.md 95, H200, d64 extend q 2048 on
// 8192 keys 487.7 us vs 648.4; Llama-1B prefill 8192 tokens 39.7% -> 45.5% of the bf16 peak.
#ifndef GD_ATTN_WGMMA_EXTEND
#define GD_ATTN_WGMMA_EXTEND 1
#endif
// Head dim 128 (the 8B shape) on it too. 1: bench/NOTES.md 95, H200, d128 extend q 2048 on 8192
// keys 789.6 us vs 1129.4; Llama-8B prefill 8192 tokens 48.7% -> 53.1% of the bf16 peak.
#ifndef GD_ATTN_WGMMA_EXTEND_D128
#define GD_ATTN_WGMMA_EXTEND_D128 1
#endif
template <int kHeadDim>
inline constexpr bool kWgmmaExtend = GD_ATTN_WGMMA_EXTEND != 0 &&
                                     (kHeadDim == 64 ||
                                      (kHeadDim == 128 && GD_ATTN_WGMMA_EXTEND_D128 != 0));

// Wide tiles: 128 query rows per CTA as two warpgroup halves that share each K/V tile
// (attention_kernel<T, D, true>), head dim 64, for calls of at least kWideMinRows rows (query
// tokens x group, from AttentionBatch::query_tokens_hint). Not at d128: two halves' accumulators
// do not fit the registers. 1: bench/NOTES.md 96, H100, d64 q 2048 on 8192 keys 395 us vs 437
// narrow (both longest tiles first; main 495); Llama-1B prefill 8192 tokens 44.3% -> 47.3%.
#ifndef GD_ATTN_WIDE_EXTEND
#define GD_ATTN_WIDE_EXTEND 1
#endif
template <int kHeadDim>
inline constexpr bool kWideExtend =
    GD_ATTN_WIDE_EXTEND != 0 && kHeadDim == 64 && kWgmmaExtend<kHeadDim>;
// K/V stages of the wide kernel (its copies run kWideStages - 1 tiles ahead). 3: the first
// version's; 4 (80 KB of shared memory, still 2 CTAs an SM) compiles and is not measured yet.
#ifndef GD_ATTN_WIDE_STAGES
#define GD_ATTN_WIDE_STAGES 3
#endif
inline constexpr int kWideStages = GD_ATTN_WIDE_STAGES;
// Test builds only: the wide kernel runs every 128-row item as its two 64-row halves on mma.sync
// (the path of builds without sm_90a), so that path runs on a Hopper too.
#ifndef GD_ATTN_WIDE_FORCE_HALVES
#define GD_ATTN_WIDE_FORCE_HALVES 0
#endif
inline constexpr bool kWideForceHalves = GD_ATTN_WIDE_FORCE_HALVES != 0;
// The wide body waits for a tile's last O += P V at the next tile's copy wait (1) or right after
// the copies it issues behind it (0). 1: bench/NOTES.md 96, H100, q 2048 on 8192 keys 395.2 /
// 396.5 us vs 397.2 / 396.8; 16 x 2048 on 2048 1087.8 / 1093.4 vs 1094.3 / 1094.1 (noise level).
#ifndef GD_ATTN_WIDE_DEFER_PV
#define GD_ATTN_WIDE_DEFER_PV 1
#endif
inline constexpr bool kWideDeferPv = GD_ATTN_WIDE_DEFER_PV != 0;
// 8192: bench/NOTES.md 96, H100, d64 at group 4 (longest tiles first): q 2048 on 2048 keys 76.5 us
// wide vs 80.1 narrow; q 1024 on 1024 keys 37.4 wide vs 30.4 narrow (too few CTAs).
#ifndef GD_ATTN_WIDE_MIN_ROWS
#define GD_ATTN_WIDE_MIN_ROWS 8192
#endif
inline constexpr int kWideMinRows = GD_ATTN_WIDE_MIN_ROWS;

// Work items of a request in the order longest query tile first (heads inner), else heads outer
// and tiles in order. 1: bench/NOTES.md 96, H100, d64 narrow q 2048 on 2048 keys 80.0 us vs 97.9,
// q 1024 on 1024 30.4 vs 40.1; d128 q 2048 on 8192 734.7 vs 794.2.
#ifndef GD_ATTN_LPT
#define GD_ATTN_LPT 1
#endif
inline constexpr bool kLongestTilesFirst = GD_ATTN_LPT != 0;

// ---- split merge -------------------------------------------------------------------------------

// Partial states loaded per batch (all loads of a batch issued before any is used).
// 8: NOTES 14 (B=1 L=32768 layer 58.0 us vs 67.8 branching per chunk), 21 (16: L=512 13.6 vs 12.9).
inline constexpr int kMergeBatch = 8;

}  // namespace graphdecode::attn
