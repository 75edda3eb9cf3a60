#!/usr/bin/env bash
# A/B on the device: the working tree against the same tree with ./ab-old.patch (a `git diff`
# saved at the repo root, untracked) reversed; builds bench_attention for both, then runs every
# argument string on both.   git diff > ab-old.patch; scripts/ab-patch.sh "--shape 8,8192" ...
# GD_AB_VARIANTS="-DX=1|-DY=2": also the working tree built with those definitions.
# GD_AB_TESTS="test_a test_b": also build those GPU tests of the working tree (in parallel with the
# benchmarks' builds) and run them before the benchmarks.
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH
rm -rf /tmp/old && mkdir /tmp/old && cp -r $(ls -A | grep -v '^build') /tmp/old/ && (cd /tmp/old && patch -R -p1 -s < ab-old.patch) || { echo patch failed; exit 1; }
IFS='|' read -ra variants <<< "${GD_AB_VARIANTS:-}"
dirs=(/tmp/old/build-ab build-ab)
defs=("" "")
for i in "${!variants[@]}"; do dirs+=("build-abv$i"); defs+=("${variants[$i]}"); done
jobs=$(( $(nproc) / (${#dirs[@]} + 1) + 1 ))
for i in "${!dirs[@]}"; do
  d=${dirs[$i]} src=$( [ $i -eq 0 ] && echo /tmp/old || echo . )
  ( cmake -S $src -B $d -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DGRAPHDECODE_BUILD_TESTS=OFF -DGRAPHDECODE_BUILD_EXAMPLES=OFF "-DCMAKE_CUDA_FLAGS=${defs[$i]}" > $d.log 2>&1 && ninja -j$jobs -C $d bench_attention >> $d.log 2>&1 || echo "build failed $d" ) &
done
if [ -n "${GD_AB_TESTS:-}" ]; then
  ( cmake -S . -B build-abt -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > build-abt.log 2>&1 && ninja -j$jobs -C build-abt $GD_AB_TESTS >> build-abt.log 2>&1 || echo "test build failed (build-abt.log)"; tail -3 build-abt.log ) &
fi
wait
for t in ${GD_AB_TESTS:-}; do
  b=$(find build-abt -name "$t" -type f | head -1)
  [ -n "$b" ] || { echo "$t: not built"; continue; }
  GRAPHDECODE_REQUIRE_GPU=1 "$b" > "build-abt/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|SKIPPED \]' "build-abt/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure|error" "build-abt/$t.log" | head -20
done
for args in "$@"; do
  for i in "${!dirs[@]}"; do
    echo "=== ${dirs[$i]} ${defs[$i]} $args"; ${dirs[$i]}/bench/bench_attention $args | grep -E "^decode|^verify"
  done
done
