#!/usr/bin/env bash
# scripts/sanitize.sh against a mock compute-sanitizer (no GPU needed): the verdict of each kind of
# log, the environment each tool's jobs get (racecheck: plain GEMM and blocking launches; memcheck:
# neither), jobs spread over GPUs, one job per test with GD_SANITIZE_SPLIT, the time guard, and
# the exit status. The sanitizer sweeps of issue 41 are read from this script's summary, so a
# mislabelled verdict would hide a finding.
#   tests/scripts/test_sanitize_sh.sh SCRIPTS_DIR
set -uo pipefail
scripts=${1:?scripts dir}
for tool in ps setsid timeout xargs awk; do
  command -v "$tool" > /dev/null || { echo "SKIPPED: $tool missing"; exit 77; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/tests"

# The mock sanitizer: its behaviour depends on the test binary's name; it records the environment.
cat > "$work/bin/compute-sanitizer" << 'EOF'
#!/usr/bin/env bash
all="$*" tool="" bin=""
while [ $# -gt 0 ]; do  # --tool T [options] --error-exitcode N BIN [test arguments]
  case $1 in
    --tool) tool=$2; shift 2 ;;
    --error-exitcode) bin=$3; shift 3; break ;;
    *) shift ;;
  esac
done
echo "env blocking=${CUDA_LAUNCH_BLOCKING-unset} plain=${GRAPHDECODE_PLAIN_GEMM-unset} gpu=${CUDA_VISIBLE_DEVICES-unset} args=$all"
summary() {  # errors
  if [ "$tool" = racecheck ]; then
    echo "========= RACECHECK SUMMARY: $1 hazards displayed ($1 errors, 0 warnings)"
  else
    echo "========= ERROR SUMMARY: $1 errors"
  fi
}
case "$(basename "$bin")" in
  test_clean_gpu | test_split_gpu) summary 0 ;;
  test_lib_gpu)
    if [ "$tool" = racecheck ]; then
      echo "========= Error: Race reported between Read access at nvjet_sm90_tss_64x8+0xb00"
      echo "=========     and Write access at nvjet_sm90_tss_64x8+0x2840 [32 hazards]"
      summary 1
      exit 99
    fi
    summary 0 ;;
  test_ours_gpu)
    if [ "$tool" = racecheck ]; then
      echo "========= Error: Race reported between Write access at graphdecode::attn::attention_kernel+0x10"
      echo "=========     and Read access at graphdecode::attn::attention_kernel+0x20 [2 hazards]"
      summary 1
      exit 99
    fi
    summary 0 ;;
  test_failing_gpu)
    echo "[  FAILED  ] Suite.Case"
    summary 0
    exit 1 ;;
  test_hog_gpu) sleep 60 ;;
esac
EOF
chmod +x "$work/bin/compute-sanitizer"

# Test binaries: only --gtest_list_tests is ever run directly (GD_SANITIZE_SPLIT).
for name in test_clean_gpu test_lib_gpu test_ours_gpu test_failing_gpu test_hog_gpu test_split_gpu; do
  cat > "$work/tests/$name" << 'EOF'
#!/usr/bin/env bash
[ "${1:-}" = --gtest_list_tests ] || exit 2
echo "Running main() from gtest_main.cc"
echo "Suite."
echo "  A"
echo "Params/Suite."
echo "  B/eager  # GetParam() = false"
EOF
  chmod +x "$work/tests/$name"
  echo "$work/tests/$name"
done > "$work/list.txt"

PATH="$work/bin:$PATH" GD_SANITIZE_TOOLS="memcheck racecheck" GD_SANITIZE_HEAVY= \
  GD_SANITIZE_SPLIT=split GD_SANITIZE_GPUS=2 GD_SANITIZE_TIMEOUT=8 GD_SANITIZE_PARALLEL=6 \
  bash "$scripts/sanitize.sh" "$work/list.txt" "$work/out" > "$work/stdout.txt" 2>&1
status=$?
summary="$work/out/sanitize-summary.txt"
failures=0
expect() {  # name tool verdict
  if ! grep -qE "^$1 +$2 +$3 " "$summary"; then
    echo "FAIL: expected $1 $2 $3; summary line: $(grep -E "^$1 +$2 " "$summary" || echo none)"
    failures=$((failures + 1))
  fi
}
expect_log() {  # log-file-glob pattern what
  if ! grep -qE "$2" $1; then
    echo "FAIL: $3 (no /$2/ in $1)"
    failures=$((failures + 1))
  fi
}
expect test_clean_gpu memcheck ok
expect test_clean_gpu racecheck ok
expect test_lib_gpu memcheck ok
expect test_lib_gpu racecheck LIBRARY
expect test_ours_gpu racecheck FAIL
expect test_failing_gpu memcheck FAIL
expect test_hog_gpu racecheck KILLED
expect "test_split_gpu:Suite.A" racecheck ok
expect "test_split_gpu:Params/Suite.B/eager" memcheck ok
[ "$(grep -c '^test_split_gpu:' "$summary")" -eq 4 ] ||
  { echo "FAIL: test_split_gpu should run as 2 tests x 2 tools"; failures=$((failures + 1)); }
grep -q "ours 1 " <(grep -E "^test_ours_gpu +racecheck" "$summary") ||
  { echo "FAIL: test_ours_gpu's race is not counted as ours"; failures=$((failures + 1)); }
logs="$work/out/sanitize"
expect_log "$logs/test_clean_gpu.racecheck.log" "blocking=unset plain=1 .*args=--tool racecheck --force-blocking-launches " \
  "racecheck runs with blocking launches and the plain GEMM"
expect_log "$logs/test_clean_gpu.memcheck.log" "blocking=unset plain=0 .*args=--tool memcheck --print-limit" \
  "memcheck keeps asynchronous launches and cuBLAS"
expect_log "$logs/test_split_gpu:Params_Suite.B_eager.racecheck.log" \
  "args=.*--gtest_filter=Params/Suite.B/eager" "a split job runs its one test"
expect_log "$logs/*.log" "gpu=0 " "jobs on GPU 0"
expect_log "$logs/*.log" "gpu=1 " "jobs on GPU 1"
[ "$status" -eq 1 ] || { echo "FAIL: exit status $status, want 1 (FAIL and KILLED jobs)"; failures=$((failures + 1)); }
if [ "$failures" -ne 0 ]; then
  echo "--- summary"
  cat "$summary"
  echo "--- stdout"
  cat "$work/stdout.txt"
  exit 1
fi
echo "sanitize.sh: $(wc -l < "$summary") verdicts as expected"
