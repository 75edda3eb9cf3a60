#!/usr/bin/env bash
# Builds TARGETS once per variant (compile definitions), the variants in parallel, into PREFIX0,
# PREFIX1, ... (logs beside them as PREFIXi.log). Tests and examples are not configured.
#   scripts/perf/build-variants.sh build-ab "bench_attention bench_decode" "" "-DGD_ATTN_STAGES=2" ...
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
prefix=$1 targets=$2
shift 2
[ $# -gt 0 ] || { echo "no variants given"; exit 2; }
jobs=$(( $(nproc) / $# + 1 ))
i=0
for defs in "$@"; do
  dir=$prefix$i
  ( cmake -S . -B $dir -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DGRAPHDECODE_BUILD_TESTS=OFF -DGRAPHDECODE_BUILD_EXAMPLES=OFF "-DCMAKE_CUDA_FLAGS=$defs" \
      > $dir.log 2>&1 && ninja -j$jobs -C $dir $targets >> $dir.log 2>&1 ||
      echo "build failed: $defs (see $dir.log)" ) &
  i=$((i + 1))
done
wait
