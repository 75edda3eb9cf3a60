// A decode layer's MLP block in one grid at rows <= 8 (LlamaModel takes it at rows <= 2 where the
// stream GEMVs run, as a cooperative launch; GRAPHDECODE_STREAM_MLP=0 keeps the four kernels):
//   normed = rmsnorm(x)                                  (from the o projection's squares)
//   act    = swiglu(normed W_gate^T, normed W_up^T)      (each rounded to bf16, as the kernels)
//   y      = act W_down^T;  residual += y, and its squares for the next layer's qkv GEMV
// The same bits as the stream GEMV with its norm prologue into gate_up, the swiglu kernel, and
// the stream GEMV with its residual epilogue (stream_gemv.h): it runs their tile code
// (stream_ring.cuh) on the same tiles, CTA by CTA.
//
// Why one grid: at B = 1 the four kernels add ~34 us a layer on the 1B shape for ~21 us of weight
// bytes; each stream GEMV's CTAs become resident only as the kernel before exits (each takes an
// SM's shared memory), so the DRAM idles through every hand-off. Here each CTA's producer warp
// streams its gate/up tiles and then its down tiles through one ring without a pause: the down
// weights fill the ring while the gate_up tiles finish and the grid waits for every CTA's act.
//
// The gate/up tiles past each CTA's first ring fill are claimed by the CTAs as they stream (a
// counter in `sync`), the down tiles are fixed. The hand-off between the halves is a grid barrier
// in global memory (`sync`, zeroed once; each launch leaves it ready for the next, so a replayed
// graph needs no reset; launches on one `sync` may follow each other directly, since a launch
// touches it only after the prior grid's end, but must have the same hidden, so the same grid):
// every CTA must be resident at once, which the cooperative launch guarantees (and otherwise one
// CTA an SM and grid <= SMs give when nothing else holds the SMs). A barrier that does not complete
// within kStreamMlpBarrierTimeoutNs sets kStreamMlpStallBit in *error_flag and goes on (the outputs
// are then wrong; the host reads the flag after the step), never a hang. Graph-safe: fixed grid, no
// allocation, no host sync.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/kernels/skinny_gemm.h"  // SkinnyGemmDevice

namespace graphdecode {

constexpr std::int32_t kStreamMlpStallBit = 2;  // *error_flag bit (beside the embedding's 1)
constexpr std::uint64_t kStreamMlpBarrierTimeoutNs = 20'000'000'000;  // 20 s: sanitizer runs too

constexpr int kStreamMlpStamps = 10;
constexpr int kStreamMlpSyncWords = 4;  // arrivals (64 bits), claims, timeouts

struct StreamMlpArgs {
  const std::uint16_t* x = nullptr;            // [rows][hidden] the residual stream, 16B aligned
  const std::uint16_t* norm_weight = nullptr;  // [hidden] the post-attention RMSNorm's weight
  const float* sum_sq_in = nullptr;            // [parts][rows] squares of x (a residual epilogue)
  std::int32_t parts = 0;
  float eps = 1e-5f;
  const std::uint16_t* w_gate_up = nullptr;  // [2 inter][hidden]: gate rows, then up rows
  const std::uint16_t* w_down = nullptr;     // [hidden][inter]
  std::uint16_t* act = nullptr;              // [rows][inter] scratch: the SwiGLU's output
  std::uint16_t* y = nullptr;                // [rows][hidden] the down projection, bf16
  // Optional (both or neither): residual += y (bf16, as the rmsnorm kernel's add) and each CTA's
  // sum of squares of the new residual over its columns, sum_sq_out[cta][row].
  std::uint16_t* residual = nullptr;   // [rows][hidden]; may alias x
  float* sum_sq_out = nullptr;         // [stream_mlp_grid(dev, hidden)][rows]
  std::uint32_t* sync = nullptr;       // [kStreamMlpSyncWords] zeroed before first use
  std::int32_t* error_flag = nullptr;  // [1] kStreamMlpStallBit on a barrier timeout
  // Diagnosis (bench/probes/stream_mlp_trace.cu): each CTA's %globaltimer at kStreamMlpStamps
  // points of its run (stream_mlp.cu names them), or nullptr.
  std::uint64_t* trace = nullptr;  // [grid][kStreamMlpStamps]
  std::int32_t rows = 0;
  std::int32_t hidden = 0;
  std::int32_t inter = 0;
  // Launch with cudaLaunchAttributeCooperative beside the programmatic dependency, so the driver
  // places every CTA at once (what the grid barrier needs) instead of relying on nothing else
  // holding the SMs. The same bits as the plain launch (test_stream_mlp_gpu); the kernel alone
  // takes the same time (probe_stream_mlp_trace --coop: 34.48 against 34.18 us at rows 1, H200,
  // t136), but in a step it costs ~0.7 us a launch (bench/NOTES.md 115).
  bool cooperative = false;
  // Rows 1..2: consumers on CUDA cores (fp32 FMA, a warp a W row) instead of m16n8k16, whose 16
  // rows are 15 zeros at B = 1. Deterministic, within float64 bounds, but not the four kernels'
  // bits. 33.58 against 34.18 us at rows 1, 38.70 against 34.62 at rows 2
  // (probe_stream_mlp_trace --fma, H200, t136).
  bool fma = false;
};

// True when stream_mlp takes (rows, hidden, inter) on `dev`: 1 <= rows <= 8, hidden and inter
// multiples of 8, x of the wider of the two plus kMinStages stages in shared memory.
bool stream_mlp_supported(const SkinnyGemmDevice& dev, std::int32_t rows, std::int32_t hidden,
                          std::int32_t inter);

// CTAs of a launch: stream_gemv_grid(dev, hidden), so the squares it leaves have the parts the
// stream GEMV's would (the next qkv GEMV's prologue reads either).
std::int32_t stream_mlp_grid(const SkinnyGemmDevice& dev, std::int32_t hidden);

// Validates `args` (graphdecode::Error names the field) and launches on `stream` as a
// programmatic dependent (weights stream before the wait for the kernel before).
void stream_mlp(const SkinnyGemmDevice& dev, const StreamMlpArgs& args, cudaStream_t stream);

}  // namespace graphdecode
