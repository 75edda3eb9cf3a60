// A decode layer's MLP block in one grid (rows <= 8). See stream_mlp.h.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "common/align.h"
#include "common/atomics.cuh"
#include "common/cuda_check.h"
#include "common/error.h"
#include "common/pdl.cuh"
#include "engine/kernels/stream_gemv.h"
#include "engine/kernels/stream_mlp.h"
#include "engine/kernels/stream_ring.cuh"

namespace graphdecode {
namespace {

using detail::float_to_bf16_bits;
using detail::mbar_arrive;
using detail::mbar_init;
using detail::mbar_wait;
using detail::round_bf16;
using detail::swiglu_value;
using namespace detail::ring;

// k per stage and W row: the widest that leaves kMinStages stages beside x. Any multiple of 512
// gives the stream GEMV's bits (stream_ring.cuh tile_products); 2048 halves the stages a byte
// against the stream GEMV's 1024 (bench_gemm: gate_up 22.35 -> 19.39 us alone, lm_head 153 ->
// 131: per-stage costs), and in one grid there is no first stage to wait for per GEMM.
constexpr int kChunkKs[] = {2048, 1024};
constexpr int kMinStages = 4;
// Shared memory: stream_ring.cuh's fixed part, then each stage's tag (what it holds: an act tile,
// or kDownTag), then x and the ring.
constexpr int kTagBytes = kMaxStages * 4;
constexpr int kMlpFixedBytes = kFixedBytes + kTagBytes;  // a multiple of 16 (x's alignment)
static_assert(kMlpFixedBytes % 16 == 0);
constexpr int kDownTag = -1;
// The grid's words (StreamMlpArgs::sync).
// (kArrivals: 64 bits, two words; StreamMlpArgs::sync is 8-byte aligned.)
enum SyncWord { kArrivals = 0, kClaims = 2, kTimeouts = 3 };

struct Params {
  const std::uint16_t* x;  // [rows][hidden]
  const std::uint16_t* norm_w;
  const float* sum_sq_in;  // [parts][rows]
  std::int32_t parts;
  float eps;
  const std::uint16_t* w_gate_up;  // [2 inter][hidden]
  const std::uint16_t* w_down;     // [hidden][inter]
  std::uint16_t* act;              // [rows][inter]
  std::uint16_t* y;                // [rows][hidden]
  std::uint16_t* residual;         // [rows][hidden] or nullptr
  float* sum_sq_out;               // [gridDim.x][rows]
  std::uint32_t* sync;             // [kStreamMlpSyncWords]: SyncWord
  std::int32_t* error_flag;
  std::uint64_t* trace;  // [gridDim.x][kStreamMlpStamps] or nullptr
  std::int32_t rows, hidden, inter;
  std::int32_t act_tiles;    // ceil(inter / 8): gate/up tile pairs
  std::int32_t out_tiles;    // ceil(hidden / 8): down tiles
  std::int32_t gu_chunks;    // stages per gate or up tile (k = hidden)
  std::int32_t down_chunks;  // stages per down tile (k = inter)
  RingShape ring;
  std::int32_t x_row_bytes;  // 2 max(hidden, inter) + kRowPad: x, then act, in one region
};

__device__ __forceinline__ unsigned long long load_acquire64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every CTA's act is written (the grid barrier of stream_mlp.h), by one thread of each CTA after
// the CTA's own writes (ordered before it by the consumers' barrier). The arrivals only grow (64
// bits: each launch adds gridDim.x), so a launch's target is the next multiple of the grid above
// what its arrival returned, and passing takes two round trips to L2 under the stream's load (the
// arrival, then the poll that sees the last one): with a generation word bumped by the last
// arrival after resetting the count (a fence, an exchange and a release store more), the barrier
// passed ~2-3 us after the last arrival (probe_stream_mlp_trace, B = 1). The last arrival resets
// the claim counter for the next launch (every claim of this one is made by then: a producer's
// last claim precedes its consumers' arrival).
__device__ void grid_barrier(std::uint32_t* sync, std::int32_t* error_flag) {
  auto* arrivals = reinterpret_cast<unsigned long long*>(sync + kArrivals);
  const unsigned long long old = atomic_add_acq_rel_gpu(arrivals, 1ull);
  const unsigned long long target = (old / gridDim.x + 1) * gridDim.x;
  if (old + 1 == target) {
    atomicExch(sync + kClaims, 0u);
    return;
  }
  const std::uint64_t start = global_ns();
  for (std::uint32_t polls = 1; load_acquire64(arrivals) < target; ++polls) {
    if ((polls & 1023u) == 0 && global_ns() - start > kStreamMlpBarrierTimeoutNs) {
      atomicAdd(sync + kTimeouts, 1u);
      if (error_flag != nullptr) atomicOr(error_flag, kStreamMlpStallBit);
      return;
    }
  }
}

// The trace's points (StreamMlpArgs::trace): the producer's entry, last gate/up copy issued and
// last copy issued; the consumers' (thread ct 0) wait done, x staged, first tile summed, act tiles
// done, barrier passed, act staged, end.
enum Stamp {
  kEntry,
  kGateUpIssued,
  kAllIssued,
  kWaited,
  kXStaged,
  kFirstTile,
  kActDone,
  kBarrierPassed,
  kActStaged,
  kEnd
};
__device__ __forceinline__ void stamp(const Params& p, Stamp at) {
  if (p.trace != nullptr) p.trace[blockIdx.x * kStreamMlpStamps + at] = global_ns();
}

// The CUDA-core consumers (StreamMlpArgs::fma, rows <= kFmaMaxRows): warp cw takes W row cw of
// each stage of a tile, lane l its 16-byte chunks l, l + 32, ..., and multiplies them by x with
// fp32 FMAs: no mma that multiplies 15 zero rows of x at B = 1 (a 32 KB stage took ~0.72 us on
// the tensor cores, bench/NOTES.md 114) and no barrier of the consumers a tile, since each warp
// owns whole outputs. Four partial sums a row (odd / even chunk, odd / even element), then a
// fixed xor tree over the warp: every lane gets sum[m], x row m's dot product with W row cw.
// Not the mma path's order, so not its bits; deterministic (graph == eager).
constexpr int kFmaMaxRows = 2;

__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ void fma_row_sums(const RingShape& r, const unsigned char* ring,
                                             std::uint64_t* full, std::uint64_t* empty,
                                             RingCursor& cur, const unsigned char* xs,
                                             int x_row_bytes, int k, int chunks, int rows, int cw,
                                             int lane, float (&sum)[kFmaMaxRows]) {
  float lo[kFmaMaxRows][2] = {}, hi[kFmaMaxRows][2] = {};
  for (int c = 0; c < chunks; ++c) {
    const int nch = min(r.chunk_k, k - c * r.chunk_k) / 8;  // 16-byte chunks of the stage rows
    mbar_wait(&full[cur.s], cur.phase);
    const unsigned char* wrow = ring + cur.s * r.stage_bytes + cw * r.stage_row_bytes;
    const unsigned char* xk = xs + c * r.chunk_k * 2;
    // Chunks ch and ch + 32 into separate sums (compile-time indices: no local memory).
    const auto chunk = [&](int ch, float(&a)[kFmaMaxRows][2]) {
      float wf[8];
      unpack8(*reinterpret_cast<const uint4*>(wrow + ch * 16), wf);
#pragma unroll
      for (int m = 0; m < kFmaMaxRows; ++m) {
        if (m >= rows) break;
        float xf[8];
        unpack8(*reinterpret_cast<const uint4*>(xk + m * x_row_bytes + ch * 16), xf);
#pragma unroll
        for (int e = 0; e < 8; ++e) a[m][e & 1] = fmaf(wf[e], xf[e], a[m][e & 1]);
      }
    };
    for (int ch = lane; ch < nch; ch += 64) {
      chunk(ch, lo);
      if (ch + 32 < nch) chunk(ch + 32, hi);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[cur.s]);  // this warp is done with stage s
    cur.advance(r.stages);
  }
#pragma unroll
  for (int m = 0; m < kFmaMaxRows; ++m) {
    float v = (lo[m][0] + lo[m][1]) + (hi[m][0] + hi[m][1]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    sum[m] = v;
  }
}

// sum[lane] for lanes < kFmaMaxRows (registers, not a local-memory index).
__device__ __forceinline__ float row_of(const float (&sum)[kFmaMaxRows], int lane) {
  float v = 0.f;
#pragma unroll
  for (int m = 0; m < kFmaMaxRows; ++m)
    if (m == lane) v = sum[m];
  return v;
}

template <bool kFma>
__global__ void __launch_bounds__(kThreads, 1) stream_mlp_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(smem);
  std::uint64_t* empty = full + kMaxStages;
  float* red = reinterpret_cast<float*>(smem + kBarrierBytes);
  unsigned char* xs = smem + kMlpFixedBytes;
  unsigned char* ring = xs + p.rows * p.x_row_bytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // The act tiles (a gate and an up tile each) past the ring's first fill are claimed from
  // sync[kClaims] by the producers while they stream (one CTA's copies land slower than another's;
  // with a fixed share the grid waited ~3 us on its slowest CTA at B = 1: probe_stream_mlp_trace).
  // The down tiles are the stream GEMV's over the same grid, [db, de), so the squares' parts match
  // its.
  const int db = static_cast<int>(static_cast<std::int64_t>(blockIdx.x) * p.out_tiles / gridDim.x);
  const int de =
      static_cast<int>(static_cast<std::int64_t>(blockIdx.x + 1) * p.out_tiles / gridDim.x);
  int* stage_tag = reinterpret_cast<int*>(smem + kFixedBytes);

  // stream_ring.cuh's init_ring, written out: through the helper this kernel's SASS changed
  // beyond the prologue (the tile loop's scheduling), which moves its time (bench/NOTES.md 117).
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.ring.stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == 0) {  // producer: the gate and up tiles of each act tile claimed, then the down tiles
    if (lane == 0) stamp(p, kEntry);
    int i = 0;  // items issued: the ring's stage and phase
    bool waited = false;
    const auto wait_for_prior_grid = [&] {
      if (waited) return;
      pdl_wait_for_prior_grid();
      pdl_launch_dependents();
      waited = true;
    };
    const auto issue = [&](const std::uint16_t* w, int k, int row0, int valid, int c, int tag) {
      if (i == p.ring.stages)
        wait_for_prior_grid();  // the first fill before it, as the stream GEMV
      produce_item(p.ring, ring, full, empty, i++, w, k, row0, valid, c * p.ring.chunk_k,
                   min(p.ring.chunk_k, k - c * p.ring.chunk_k), lane, stage_tag, tag);
    };
    const auto issue_act_tile = [&](int a) {
      const int col0 = a * kTileRows, valid = min(kTileRows, p.inter - col0);
      for (int up = 0; up < 2; ++up)
        for (int c = 0; c < p.gu_chunks; ++c)
          issue(p.w_gate_up, p.hidden, up * p.inter + col0, valid, c, a);
    };
    // The ring's first fill is fixed act tiles (blockIdx.x + j grid), issued before the prior grid
    // is waited for; the claims start after it. The last arrival of a launch's barrier resets the
    // counter (every claim of that launch, the failing one included, precedes its CTA's arrival),
    // and a launch's claims follow the prior grid's end, so launches back to back on one `sync`
    // (a CTA of the next may be resident early when the grid is under the SMs) never claim from a
    // count that is still the last launch's.
    const int fixed = max(1, p.ring.stages / (2 * p.gu_chunks));
    for (int j = 0; j < fixed; ++j) {
      const int a = static_cast<int>(blockIdx.x) + j * static_cast<int>(gridDim.x);
      if (a < p.act_tiles) issue_act_tile(a);
    }
    wait_for_prior_grid();
    // The next claim is in flight while a tile's copies are issued.
    const std::uint32_t claimed0 = static_cast<std::uint32_t>(fixed) * gridDim.x;
    std::uint32_t next = 0;
    if (lane == 0) next = atomicAdd(p.sync + kClaims, 1u);
    for (;;) {
      const std::uint32_t a = claimed0 + __shfl_sync(0xffffffffu, next, 0);
      if (a >= static_cast<std::uint32_t>(p.act_tiles)) break;
      if (lane == 0) next = atomicAdd(p.sync + kClaims, 1u);
      issue_act_tile(static_cast<int>(a));
    }
    if (lane == 0) stamp(p, kGateUpIssued);
    for (int tile = db; tile < de; ++tile)
      for (int c = 0; c < p.down_chunks; ++c)
        issue(p.w_down, p.inter, tile * kTileRows, min(kTileRows, p.hidden - tile * kTileRows), c,
              kDownTag);
    if (lane == 0) stamp(p, kAllIssued);
    return;
  }

  const int cw = warp - 1, ct = threadIdx.x - 32;
  for (int ch = ct; ch < p.hidden / 8; ch += kConsumerThreads)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p.norm_w + ch * 8));
  pdl_wait_for_prior_grid();
  pdl_launch_dependents();
  if (ct == 0) stamp(p, kWaited);
  ResidualAhead ahead;  // down's epilogue entries (o's kernel wrote them), in flight from here
  if constexpr (!kFma) ahead.load(p.residual, p.rows, p.hidden, db, de, ct);
  stage_x(xs, p.x_row_bytes, p.x, p.rows, p.hidden, p.norm_w, p.sum_sq_in, p.parts, p.eps, red, cw,
          lane, ct, [](const std::uint16_t* at) { return *reinterpret_cast<const uint4*>(at); });
  if (ct == 0) stamp(p, kXStaged);

  const bool x_row = (lane >> 2) < p.rows;
  const int m = ct / kTileRows, tc = ct % kTileRows;  // the cell a tile's sum leaves in ct < 64
  const bool cell_row = ct < kTileCells && m < p.rows;
  RingCursor cur;
  int tiles_done = 0;  // picks the partials buffer of tile_sum
  bool first = true;
  // The act tiles the producer claimed, told by the ring's tags; the first down stage ends them.
  for (;;) {
    mbar_wait(&full[cur.s], cur.phase);
    const int a = stage_tag[cur.s];
    if (a == kDownTag) break;
    if constexpr (kFma) {
      float gate[kFmaMaxRows], up[kFmaMaxRows];
      fma_row_sums(p.ring, ring, full, empty, cur, xs, p.x_row_bytes, p.hidden, p.gu_chunks, p.rows,
                   cw, lane, gate);
      fma_row_sums(p.ring, ring, full, empty, cur, xs, p.x_row_bytes, p.hidden, p.gu_chunks, p.rows,
                   cw, lane, up);
      const int col = a * kTileRows + cw;
      if (lane < p.rows && col < p.inter)
        p.act[static_cast<std::size_t>(lane) * p.inter + col] = float_to_bf16_bits(
            swiglu_value(round_bf16(row_of(gate, lane)), round_bf16(row_of(up, lane))));
      if (ct == 0 && first) stamp(p, kFirstTile);
      first = false;
      continue;
    }
    float acc0, acc1;
    tile_products(p.ring, ring, full, empty, cur, xs, p.x_row_bytes, p.hidden, p.gu_chunks, cw,
                  lane, x_row, acc0, acc1);
    const float gate = round_bf16(tile_sum(red, tiles_done++ & 1, cw, lane, ct, acc0, acc1));
    tile_products(p.ring, ring, full, empty, cur, xs, p.x_row_bytes, p.hidden, p.gu_chunks, cw,
                  lane, x_row, acc0, acc1);
    const float up = round_bf16(tile_sum(red, tiles_done++ & 1, cw, lane, ct, acc0, acc1));
    if (ct == 0 && first) stamp(p, kFirstTile);
    first = false;
    const int col = a * kTileRows + tc;
    if (cell_row && col < p.inter)
      p.act[static_cast<std::size_t>(m) * p.inter + col] =
          float_to_bf16_bits(swiglu_value(gate, up));
  }
  // Every consumer is done with x and this CTA's act is stored; then the grid's act is.
  consumers_sync();
  if (ct == 0) {
    stamp(p, kActDone);
    grid_barrier(p.sync, p.error_flag);
    stamp(p, kBarrierPassed);
  }
  consumers_sync();
  // act from L2 (__ldcg): other SMs wrote it during this grid, so no line of it may come from L1.
  stage_x(xs, p.x_row_bytes, p.act, p.rows, p.inter, nullptr, nullptr, 0, 0.f, red, cw, lane, ct,
          [](const std::uint16_t* at) { return __ldcg(reinterpret_cast<const uint4*>(at)); });
  if (ct == 0) stamp(p, kActStaged);

  if constexpr (kFma) {
    float sq = 0.f;  // lane r < rows: x row r's squares over this warp's columns
    for (int tile = db; tile < de; ++tile) {
      float sum[kFmaMaxRows];
      fma_row_sums(p.ring, ring, full, empty, cur, xs, p.x_row_bytes, p.inter, p.down_chunks,
                   p.rows, cw, lane, sum);
      const int col = tile * kTileRows + cw;
      if (lane < p.rows && col < p.hidden) {
        const std::size_t at = static_cast<std::size_t>(lane) * p.hidden + col;
        const std::uint16_t yb = float_to_bf16_bits(row_of(sum, lane));
        p.y[at] = yb;
        if (p.residual != nullptr) sq += add_residual(p.residual, at, p.residual[at], yb);
      }
    }
    if (p.residual != nullptr) {  // the CTA's part: the 8 warps' squares in warp order
      if (lane < p.rows) red[cw * kFmaMaxRows + lane] = sq;
      consumers_sync();
      if (ct < p.rows) {
        float t = 0.f;
        for (int w = 0; w < kConsumerWarps; ++w) t += red[w * kFmaMaxRows + ct];
        p.sum_sq_out[blockIdx.x * p.rows + ct] = t;
      }
    }
    if (ct == 0) stamp(p, kEnd);
    return;
  }
  float sq = 0.f;
  for (int tile = db; tile < de; ++tile) {
    float acc0, acc1;
    tile_products(p.ring, ring, full, empty, cur, xs, p.x_row_bytes, p.inter, p.down_chunks, cw,
                  lane, x_row, acc0, acc1);
    const float sum = tile_sum(red, tiles_done++ & 1, cw, lane, ct, acc0, acc1);
    const int col = tile * kTileRows + tc;
    if (cell_row && col < p.hidden) {
      const std::size_t at = static_cast<std::size_t>(m) * p.hidden + col;
      const std::uint16_t yb = float_to_bf16_bits(sum);
      p.y[at] = yb;
      if (p.residual != nullptr) sq += ahead.add(p.residual, at, tile - db, yb);
    }
  }
  if (p.residual != nullptr) store_squares(sq, p.sum_sq_out, p.rows, ct);
  if (ct == 0) stamp(p, kEnd);
}

std::int64_t x_region_bytes(std::int32_t rows, std::int32_t hidden, std::int32_t inter) {
  return static_cast<std::int64_t>(rows) * (2LL * std::max(hidden, inter) + kRowPad);
}

std::int32_t ring_stages(const SkinnyGemmDevice& dev, std::int32_t rows, std::int32_t hidden,
                         std::int32_t inter, std::int32_t chunk_k) {
  const std::int64_t left = dev.max_smem - kMlpFixedBytes - x_region_bytes(rows, hidden, inter);
  return static_cast<std::int32_t>(
      std::clamp<std::int64_t>(left / (kTileRows * (2LL * chunk_k + kRowPad)), 0, kMaxStages));
}

// The widest chunk that leaves kMinStages stages, else 0.
std::int32_t chunk_k_for(const SkinnyGemmDevice& dev, std::int32_t rows, std::int32_t hidden,
                         std::int32_t inter) {
  for (const int c : kChunkKs)
    if (ring_stages(dev, rows, hidden, inter, c) >= kMinStages) return c;
  return 0;
}

}  // namespace

bool stream_mlp_supported(const SkinnyGemmDevice& dev, std::int32_t rows, std::int32_t hidden,
                          std::int32_t inter) {
  return rows >= 1 && rows <= kSkinnyMaxRows && hidden > 0 && hidden % 8 == 0 && inter > 0 &&
         inter % 8 == 0 && chunk_k_for(dev, rows, hidden, inter) > 0;
}

std::int32_t stream_mlp_grid(const SkinnyGemmDevice& dev, std::int32_t hidden) {
  return stream_gemv_grid(dev, hidden);
}

void stream_mlp(const SkinnyGemmDevice& dev, const StreamMlpArgs& a, cudaStream_t stream) {
  GD_REQUIRE(a.rows >= 1 && a.rows <= kSkinnyMaxRows, "rows", a.rows,
             "the MLP block takes 1.." + std::to_string(kSkinnyMaxRows) + " rows");
  GD_REQUIRE(a.hidden > 0 && a.hidden % 8 == 0, "hidden", a.hidden,
             "must be a positive multiple of 8");
  GD_REQUIRE(a.inter > 0 && a.inter % 8 == 0, "inter", a.inter, "must be a positive multiple of 8");
  GD_REQUIRE(stream_mlp_supported(dev, a.rows, a.hidden, a.inter), "rows", a.rows,
             "x of " + std::to_string(std::max(a.hidden, a.inter)) +
                 " and four stages do not fit in shared memory");
  const std::pair<const void*, const char*> aligned[] = {{a.x, "x"},
                                                         {a.norm_weight, "norm_weight"},
                                                         {a.w_gate_up, "w_gate_up"},
                                                         {a.w_down, "w_down"},
                                                         {a.act, "act"},
                                                         {a.y, "y"}};
  for (const auto& [ptr, name] : aligned) {
    GD_REQUIRE(ptr != nullptr, name, "nullptr", "is required");
    GD_REQUIRE(aligned16(ptr), name, ptr, "must be 16-byte aligned");
  }
  GD_REQUIRE(a.sum_sq_in != nullptr, "sum_sq_in", "nullptr", "the norm reads x's squares there");
  GD_REQUIRE(a.parts >= 1 && a.parts <= dev.sm_count, "parts", a.parts,
             "must be the grid of the GEMV that left the squares (1.." +
                 std::to_string(dev.sm_count) + ")");
  GD_REQUIRE(a.eps > 0.f, "eps", a.eps, "must be positive");
  GD_REQUIRE((a.residual == nullptr) == (a.sum_sq_out == nullptr), "sum_sq_out",
             a.sum_sq_out == nullptr ? "nullptr" : "set",
             "the residual epilogue needs both residual and sum_sq_out, or neither");
  GD_REQUIRE(!a.fma || a.rows <= kFmaMaxRows, "rows", a.rows,
             "the CUDA-core consumers (fma) take 1.." + std::to_string(kFmaMaxRows) + " rows");
  GD_REQUIRE(a.sync != nullptr, "sync", "nullptr", "the grid's four zeroed words");
  GD_REQUIRE(reinterpret_cast<std::uintptr_t>(a.sync) % 8 == 0, "sync", a.sync,
             "must be 8-byte aligned (a 64-bit arrival count)");
  static const bool opted_in = [&] {
    GD_CUDA(cudaFuncSetAttribute(stream_mlp_kernel<false>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, dev.max_smem));
    GD_CUDA(cudaFuncSetAttribute(stream_mlp_kernel<true>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, dev.max_smem));
    return true;
  }();
  static_cast<void>(opted_in);
  Params p{};
  p.x = a.x;
  p.norm_w = a.norm_weight;
  p.sum_sq_in = a.sum_sq_in;
  p.parts = a.parts;
  p.eps = a.eps;
  p.w_gate_up = a.w_gate_up;
  p.w_down = a.w_down;
  p.act = a.act;
  p.y = a.y;
  p.residual = a.residual;
  p.sum_sq_out = a.sum_sq_out;
  p.sync = a.sync;
  p.error_flag = a.error_flag;
  p.trace = a.trace;
  p.rows = a.rows;
  p.hidden = a.hidden;
  p.inter = a.inter;
  p.act_tiles = (a.inter + kTileRows - 1) / kTileRows;
  p.out_tiles = (a.hidden + kTileRows - 1) / kTileRows;
  p.ring.chunk_k = chunk_k_for(dev, a.rows, a.hidden, a.inter);
  p.ring.stage_row_bytes = 2 * p.ring.chunk_k + kRowPad;
  p.ring.stage_bytes = kTileRows * p.ring.stage_row_bytes;
  p.ring.stages = ring_stages(dev, a.rows, a.hidden, a.inter, p.ring.chunk_k);
  p.gu_chunks = (a.hidden + p.ring.chunk_k - 1) / p.ring.chunk_k;
  p.down_chunks = (a.inter + p.ring.chunk_k - 1) / p.ring.chunk_k;
  p.x_row_bytes = static_cast<std::int32_t>(x_region_bytes(1, a.hidden, a.inter));
  const std::size_t smem =
      static_cast<std::size_t>(kMlpFixedBytes + x_region_bytes(a.rows, a.hidden, a.inter)) +
      static_cast<std::size_t>(p.ring.stages) * p.ring.stage_bytes;
  const dim3 grid(static_cast<unsigned>(stream_mlp_grid(dev, a.hidden)));
  void (*kernel)(Params) = a.fma ? stream_mlp_kernel<true> : stream_mlp_kernel<false>;
  if (!a.cooperative) {
    launch_pdl(kernel, grid, dim3(kThreads), smem, stream, p);
    return;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 2 : 1;
  GD_CUDA(cudaLaunchKernelEx(&cfg, kernel, p));
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
