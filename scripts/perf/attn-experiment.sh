#!/usr/bin/env bash
# One device call for attention tuning: the attention GPU tests on the current code, an A/B of
# compile-time variants on bench_attention, and ncu stall profiles of chosen shapes.
#   GD_AB_ARGS="--small-batch" GD_PROFILE="0:1,512 1:1,512" \
#     scripts/perf/attn-experiment.sh "" "-DGD_ATTN_MIN_SPLIT=64" ...
# GD_PROFILE entries are VARIANT_INDEX:B,L[,N]. GD_TEST_DEFS: compile definitions of the test
# build (e.g. "-DGD_ATTN_STAGES=2"). Everything lands in $OUT (logs packed in a tar).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
logs=$(mktemp -d)
tests="test_attention_decode_gpu test_attention_extend_gpu test_attention_cross_gpu
  test_attention_merge_gpu test_attention_determinism_gpu test_attention_graph_gpu test_attention_planning_gpu test_attention_early_gpu"
( cmake -S . -B build-t -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    "-DCMAKE_CUDA_FLAGS=${GD_TEST_DEFS:-}" > "$logs/tests-build.log" 2>&1 && ninja -j8 -C build-t $tests >> "$logs/tests-build.log" 2>&1 ||
    echo "test build FAILED" ) &
bash scripts/perf/ab-attention.sh "${GD_AB_ARGS:---small-batch}" "$@" > "$logs/ab.txt" 2>&1
wait
cat "$logs/ab.txt"
export GRAPHDECODE_REQUIRE_GPU=1
for t in $tests; do
  b=$(find build-t -name "$t" -type f | head -1)
  [ -n "$b" ] || { echo "$t: not built"; continue; }
  "$b" > "$logs/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|SKIPPED \]' "$logs/$t.log" | tr '\n' ' ')"
done
for spec in ${GD_PROFILE:-}; do
  v=${spec%%:*} shape=${spec#*:}
  echo "=== profile variant $v shape $shape"
  bash scripts/perf/profile-attention.sh build-ab$v "$logs" "$shape" "v${v}_${shape//,/x}"
done
rm -f "$logs"/*.ncu-rep.tmp
tar -C "$logs" -czf "$OUT/attn-experiment.tgz" .
