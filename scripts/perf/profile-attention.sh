#!/usr/bin/env bash
# ncu profile of one attention-kernel launch of bench_attention at one shape: the details page
# (occupancy, warp states, memory) and the warp-stall samples per SASS instruction.
#   scripts/perf/profile-attention.sh BUILD_DIR OUT_DIR B,L[,N] [NAME]
# Writes OUT_DIR/NAME.{details.txt,sass.csv,stalls.txt}; the .ncu-rep stays for the ncu GUI.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=$1 out=$2 shape=$3 name=${4:-attn_prof}
ncu --set full --import-source yes --warp-sampling-interval 0 --clock-control none \
  --graph-profiling node -k regex:attention_kernel --launch-skip 8 --launch-count 1 \
  -f -o "$out/$name" "$build/bench/bench_attention" --shape "$shape" --reps 50 \
  > "$out/$name.run.log" 2>&1 || { echo "ncu failed: $(tail -3 "$out/$name.run.log")"; exit 1; }
ncu -i "$out/$name.ncu-rep" --page details > "$out/$name.details.txt" 2>&1
ncu -i "$out/$name.ncu-rep" --page source --csv --print-source sass > "$out/$name.sass.csv" 2>&1 ||
  ncu -i "$out/$name.ncu-rep" --page source --csv > "$out/$name.sass.csv" 2>&1
python3 scripts/perf/ncu-stalls.py "$out/$name.sass.csv" > "$out/$name.stalls.txt" 2>&1
grep -E "Duration|Registers Per|Achieved Occupancy|Block Limit|Theoretical Occ|Warp Cycles Per Issued" \
  "$out/$name.details.txt" | head -20
head -45 "$out/$name.stalls.txt"
