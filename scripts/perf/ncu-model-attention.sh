#!/usr/bin/env bash
# ncu of the attention kernel inside the model step (bench_decode), for build variants: each
# kernel node profiled serialized with warm caches (--cache-control none), so the numbers are the
# kernel's own in the model's context (no overlap). Builds bench_decode per variant.
#   scripts/perf/ncu-model-attention.sh "B" "L" "" "-DGD_ATTN_NARROW_MIN_DIM=64" ...
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
b=$1 l=$2
shift 2
bash scripts/perf/build-variants.sh build-nm bench_decode "$@"
i=0
for defs in "$@"; do
  echo "=== variant: ${defs:-default}"
  ncu --graph-profiling node -k regex:attention_kernel --launch-skip 200 --launch-count 2 \
    --cache-control none --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section LaunchStats --section Occupancy --section InstructionStats --metrics \
smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio \
    build-nm$i/bench/bench_decode --batches "$b" --context "$l" --reps 5 2>&1 |
    grep -E "Duration|Warp Cycles Per Issued|Executed Instructions  |Registers Per|stalled|Grid Size" | head -24
  i=$((i + 1))
done
# GD_NCU_STALLS=1: also the warp-stall samples per SASS instruction of one launch per variant.
if [ -n "${GD_NCU_STALLS:-}" ]; then
  i=0
  for defs in "$@"; do
    echo "=== stalls, variant: ${defs:-default}"
    out=${OUT:-/tmp}/nm$i
    ncu --set full --import-source yes --warp-sampling-interval 0 --clock-control none \
      --cache-control none --graph-profiling node -k regex:attention_kernel --launch-skip 200 \
      --launch-count 1 -f -o "$out" build-nm$i/bench/bench_decode --batches "$b" --context "$l" \
      --reps 5 > "$out.log" 2>&1 || echo "ncu failed"
    ncu -i "$out.ncu-rep" --page source --csv --print-source sass > "$out.sass.csv" 2>&1
    python3 scripts/perf/ncu-stalls.py "$out.sass.csv" "${GD_NCU_TOP:-30}"
    i=$((i + 1))
  done
fi
