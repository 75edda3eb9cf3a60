#!/usr/bin/env bash
# A/B of attention tuning knobs on the device: builds bench_attention once per variant (compile
# definitions such as GD_ATTN_MIN_SPLIT, GD_ATTN_TARGET_WAVES; builds run in parallel) into
# build-ab0, build-ab1, ... and runs each on the given bench arguments.
#   scripts/perf/ab-attention.sh "--small-batch" "" "-DGD_ATTN_MIN_SPLIT=512" ...
# ARGS may hold several runs separated by ';' ("--shape 8,8192;--shape 8,32768").
# GD_AB_DECODE="--context 1024": also build and run bench_decode (the model step) per variant.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
args=$1
shift
bash scripts/perf/build-variants.sh build-ab "bench_attention ${GD_AB_DECODE:+bench_decode}" "$@"
i=0
for defs in "$@"; do
  echo "=== variant: ${defs:-default}"
  IFS=';' read -ra runs <<< "$args"
  for run in "${runs[@]}"; do
    [ -x build-ab$i/bench/bench_attention ] &&
      build-ab$i/bench/bench_attention $run | grep -E "floor|decode|verify"
  done
  [ -n "${GD_AB_DECODE:-}" ] && [ -x build-ab$i/bench/bench_decode ] &&
    build-ab$i/bench/bench_decode $GD_AB_DECODE | grep -vE "^$"
  i=$((i + 1))
done
