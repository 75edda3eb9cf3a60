#!/usr/bin/env bash
# A/B of attention tuning knobs on the device: builds bench_attention once per variant
# (compile definitions GD_ATTN_MIN_SPLIT, GD_ATTN_TARGET_WAVES) and runs each on the given shapes.
#   scripts/ab-attention.sh "--small-batch" "" "-DGD_ATTN_MIN_SPLIT=512" ...
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
args=$1
shift
i=0
for defs in "$@"; do
  dir=build-ab$i
  cmake -S . -B $dir -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DGRAPHDECODE_BUILD_TESTS=OFF -DGRAPHDECODE_BUILD_EXAMPLES=OFF "-DCMAKE_CUDA_FLAGS=$defs" \
    > /dev/null && ninja -C $dir bench_attention > /dev/null || { echo "build failed: $defs"; exit 1; }
  i=$((i + 1))
done
i=0
for defs in "$@"; do
  echo "=== variant: ${defs:-default}"
  build-ab$i/bench/bench_attention $args | grep -E "floor|decode|verify"
  i=$((i + 1))
done
