#!/usr/bin/env bash
# A/B on the device: the working tree against the same tree with ./ab-old.patch (a `git diff`
# saved at the repo root, untracked) reversed; builds bench_attention for both, then runs every
# argument string on both.   git diff > ab-old.patch; scripts/perf/ab-patch.sh "--small-batch" ...
# GD_AB_DECODE="--context 1024": also build bench_decode and run it twice per tree (old, new, old,
# new: the model step moves with code layout, so one run of each says little).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
rm -rf /tmp/old && mkdir /tmp/old && cp -r $(ls -A | grep -v '^build') /tmp/old/ && (cd /tmp/old && patch -R -p1 -s < ab-old.patch) || { echo patch failed; exit 1; }
for d in . /tmp/old; do
  ( cmake -S $d -B $d/build-ab -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DGRAPHDECODE_BUILD_TESTS=OFF -DGRAPHDECODE_BUILD_EXAMPLES=OFF > $d/ab.log 2>&1 && ninja -j8 -C $d/build-ab bench_attention ${GD_AB_DECODE:+bench_decode} >> $d/ab.log 2>&1 || echo build failed $d ) &
done
wait
for args in "$@"; do
  for d in /tmp/old .; do
    echo "=== $d $args"; $d/build-ab/bench/bench_attention $args | grep -E "^decode|^verify"
  done
done
if [ -n "${GD_AB_DECODE:-}" ]; then
  for rep in 1 2; do
    for d in /tmp/old .; do
      echo "=== $d bench_decode $GD_AB_DECODE (run $rep)"
      $d/build-ab/bench/bench_decode $GD_AB_DECODE | grep -vE "^$"
    done
  done
fi
