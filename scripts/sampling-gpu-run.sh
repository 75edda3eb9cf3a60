#!/usr/bin/env bash
# One device run of the sampling work (build, GPU tests, bench, sanitizers), logs under $OUT.
# Usage (from the checkout root on the device machine): bash scripts/sampling-gpu-run.sh STAGES
# STAGES: any of test bench ncu memcheck racecheck initcheck engine (run in that order).
set -u
export PATH=/usr/local/cuda/bin:$PATH GRAPHDECODE_REQUIRE_GPU=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
stages=" $* "
t0=$(date +%s)
BLOG=/tmp/build.log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $BLOG
cmake -S . -B b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DGRAPHDECODE_BUILD_EXAMPLES=OFF >> $BLOG 2>&1
targets="test_sampling_gpu test_sampling_cpu bench_sampling"
[[ $stages == *" engine "* ]] && targets="$targets test_engine_gpu"
cmake --build b -j 16 --target $targets >> $BLOG 2>&1 || { tail -30 $BLOG; exit 1; }
echo "build done $(( $(date +%s) - t0 )) s"
T=b/tests/engine/test_sampling_gpu
if [[ $stages == *" test "* ]]; then
  b/tests/engine/test_sampling_cpu --gtest_brief=1 > "$OUT/test.log" 2>&1
  timeout 150 $T --gtest_brief=1 >> "$OUT/test.log" 2>&1; echo "test rc=$? $(( $(date +%s) - t0 )) s"
  grep -E "FAILED|PASSED|rows .*sampled|Failure" "$OUT/test.log" | head -40
fi
if [[ $stages == *" bench "* ]]; then
  timeout 200 b/bench/bench_sampling --json "$OUT/bench_sampling.json" > "$OUT/bench.txt" 2>&1
  echo "bench rc=$? $(( $(date +%s) - t0 )) s"; cat "$OUT/bench.txt"
fi
if [[ $stages == *" ncu "* ]]; then
  for c in "64 flat p0.95" "256 flat T0.8" "1 flat p0.95"; do
    echo "=== ncu: $c" >> "$OUT/ncu.log"
    timeout 120 ncu --clock-control none --launch-skip 3 --launch-count 3 \
      --kernel-name regex:"scan_kernel|filter_kernel|resolve_kernel" --section SpeedOfLight \
      --section Occupancy --section WarpStateStats --section LaunchStats \
      b/bench/bench_sampling --profile $c >> "$OUT/ncu.log" 2>&1
  done
  echo "ncu rc=$? $(( $(date +%s) - t0 )) s"
  grep -E "^===|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|  [a-z_]+_kernel" "$OUT/ncu.log" | head -80
fi
for tool in memcheck racecheck initcheck; do
  [[ $stages == *" $tool "* ]] || continue
  GRAPHDECODE_SANITIZE=1 timeout ${SAN_TIMEOUT:-150} compute-sanitizer --tool $tool \
    --error-exitcode 99 $T --gtest_brief=1 > "$OUT/$tool.log" 2>&1
  echo "$tool rc=$? $(( $(date +%s) - t0 )) s"; grep -E "ERROR SUMMARY|FAILED|PASSED" "$OUT/$tool.log" | head -5
done
if [[ $stages == *" engine "* ]]; then
  timeout 120 b/tests/engine/test_engine_gpu --gtest_brief=1 > "$OUT/engine.log" 2>&1
  echo "engine rc=$? $(( $(date +%s) - t0 )) s"; grep -E "FAILED|PASSED" "$OUT/engine.log" | head
fi
