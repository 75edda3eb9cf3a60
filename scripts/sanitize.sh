#!/usr/bin/env bash
# compute-sanitizer over GPU test binaries, several at a time, each under a host-memory and time
# guard, with a one-line verdict per (binary, tool) and a summary table.
#
#   scripts/sanitize.sh LIST_FILE OUT_DIR        (LIST_FILE: one binary path per line, e.g.
#                                                 build-gpu/gpu_tests.txt)
#   GD_SANITIZE_TOOLS="memcheck racecheck initcheck"  tools (default: all three)
#   GD_SANITIZE_FILTER='engine|cross'                 binaries whose name matches (default: all)
#   GD_SANITIZE_PARALLEL=8                            jobs at once (the tools are host-bound)
#   GD_SANITIZE_TIMEOUT=300                           seconds per job
#   GD_SANITIZE_RSS_GB=24                             host memory per job (process group)
#   GD_SANITIZE_DEADLINE=0                            seconds for the whole sweep (0: none)
#   GD_SANITIZE_HEAVY='engine|soak|spec|eagle|cross|replay_fuzz|prefix_cache'
#                                                     racecheck jobs of these binaries run after
#                                                     the others, one at a time,
#   GD_SANITIZE_HEAVY_RSS_GB=100                      under this host-memory guard (racecheck of
#                                                     an engine binary takes 20-60+ GB: engine/
#                                                     NOTES.md "Next steps" 6); '' = no heavy phase
#   GD_SANITIZE_HEAVY_PARALLEL=1                      heavy jobs at once; above 1 the heavy phase
#                                                     runs beside the light one, not after it (a
#                                                     host with 512 GB: 4 x 110 GB)
#   GD_SANITIZE_GPUS=1                                spread jobs over this many GPUs
#                                                     (CUDA_VISIBLE_DEVICES, round robin)
#   GD_SANITIZE_LAUNCH_BLOCKING=1                     racecheck with --force-blocking-launches (below)
#   GD_SANITIZE_RACECHECK_ARGS=''                     more compute-sanitizer options for racecheck
#                                                     (word-split)
#   GD_SANITIZE_SPLIT=''                              binaries matching this regex run as one
#                                                     job per test (--gtest_filter), to spread a
#                                                     long binary over several jobs
#   GD_SANITIZE_TESTS=''                              with GD_SANITIZE_SPLIT: only the tests whose
#                                                     full name (Suite.Test/param) matches this regex
#
# Verdicts: ok (0 errors), LIBRARY (racecheck hazards only inside cuBLAS kernels, listed by name),
# FAIL (errors in our kernels, an internal sanitizer error, a failed test), KILLED (time or memory
# guard; no verdict). Exit status 1 when any job is FAIL or KILLED.
#
# racecheck runs with GRAPHDECODE_PLAIN_GEMM=1: the engine's GEMMs then run a plain kernel of ours
# (engine/kernels/plain_gemm.h) instead of cuBLAS, whose kernels cannot be excluded (below) and cost
# host memory. Tests that call cuBLAS directly (test_skinny_gemm_gpu's reference) still report its
# hazards as LIBRARY. It also runs with --force-blocking-launches (sanitize_one says why): without it
# the engine binaries passed 105 GB of host memory each (engine/NOTES.md, "Next steps" 6).
#
# Why racecheck runs unfiltered: with `--kernel-name kns=graphdecode` (check only our kernels) the
# 2025.3 sanitizer stops with "Internal Sanitizer Error: failed to handle a hardware exception" at
# the first cuBLAS kernel of every binary that uses cuBLAS (H200, 2026-11-27), and the tests fail.
# Unfiltered, cuBLAS's Hopper kernels (nvjet_sm90_*) report shared-memory hazards that racecheck
# cannot order (they synchronise through the async proxy); those are counted apart.
set -uo pipefail
list=${1:?list file}
out=${2:?output folder}
mkdir -p "$out/sanitize"
tools=${GD_SANITIZE_TOOLS:-"memcheck racecheck initcheck"}
filter=${GD_SANITIZE_FILTER:-.}
parallel=${GD_SANITIZE_PARALLEL:-8}
timeout_s=${GD_SANITIZE_TIMEOUT:-300}
rss_gb=${GD_SANITIZE_RSS_GB:-24}
deadline=${GD_SANITIZE_DEADLINE:-0}
heavy=${GD_SANITIZE_HEAVY-engine|soak|spec|eagle|cross|replay_fuzz|prefix_cache}
heavy_rss_gb=${GD_SANITIZE_HEAVY_RSS_GB:-100}
heavy_parallel=${GD_SANITIZE_HEAVY_PARALLEL:-1}
gpus=${GD_SANITIZE_GPUS:-1}
split=${GD_SANITIZE_SPLIT:-}
tests_filter=${GD_SANITIZE_TESTS:-.}
launch_blocking=${GD_SANITIZE_LAUNCH_BLOCKING:-1}
racecheck_args=${GD_SANITIZE_RACECHECK_ARGS:-}
here=$(cd "$(dirname "$0")" && pwd)

# Light jobs run $parallel at a time; heavy ones (racecheck of the engine binaries) with their own
# guard, $heavy_parallel at a time, after the light ones (beside them when more than one: a large
# host). Beside six others they were killed at 16 GB; alone test_spec_gpu finished at 20 GB.
jobs_file=$(mktemp)
heavy_file=$(mktemp)
n_light=0 n_heavy=0
while read -r bin; do
  [ -x "$bin" ] || continue
  [[ "$(basename "$bin")" =~ $filter ]] || continue
  tests="-"
  if [ -n "$split" ] && [[ "$(basename "$bin")" =~ $split ]]; then
    # "Suite." lines, then "  Test  # GetParam() = ..." lines: full names Suite.Test.
    tests=$("$bin" --gtest_list_tests 2> /dev/null |
      awk '/^[^ ]/ {suite = $1} /^  / {print suite $1}' | grep -E -- "$tests_filter")
    [ -z "$tests" ] && tests="-"
  fi
  for tool in $tools; do
    for t in $tests; do
      if [ "$tool" = racecheck ] && [ -n "$heavy" ] && [[ "$(basename "$bin")" =~ $heavy ]]; then
        echo "$tool $bin $heavy_rss_gb $((n_heavy++ % gpus)) $t" >> "$heavy_file"
      else
        echo "$tool $bin $rss_gb $((n_light++ % gpus)) $t"
      fi
    done
  done
done < "$list" > "$jobs_file"

# One job: the tool over one binary under a host-memory guard of rss GB, then its verdict line.
sanitize_one() {
  local tool=$1 bin=$2 rss=$3 gpu=$4 test=${5:--} name log filter=()
  name=$(basename "$bin")
  if [ "$test" != - ]; then
    name="$name:$test"
    filter=(--gtest_filter="$test")
  fi
  log="$SAN_OUT/sanitize/${name//\//_}.$tool.log"
  : > "$log"
  # racecheck only: the engine's GEMMs on our plain kernel, not cuBLAS (engine/kernels/plain_gemm.h
  # says why), and --force-blocking-launches: its host memory grows with the launches queued ahead
  # of the host (times their shared memory): probe_racecheck_memory's 264-CTA kernel with 16 KB
  # reaches 17 GB within 100 launches and stays at 1.0 GB when the host waits for each launch
  # (bench/results/h200_racecheck_probe_2026-11-27.txt). CUDA_LAUNCH_BLOCKING=1 does not make the
  # sanitizer wait (9 GB after 200 launches, as without it); --force-blocking-launches does (1 GB).
  # memcheck and initcheck keep cuBLAS and asynchronous launches.
  local plain=0 extra=()
  if [ "$tool" = racecheck ]; then
    plain=1
    [ "$SAN_LAUNCH_BLOCKING" = 1 ] && extra+=(--force-blocking-launches)
    read -r -a more <<< "$SAN_RACECHECK_ARGS"
    extra+=("${more[@]}")
  fi
  [ "$SAN_GPUS" -gt 1 ] && export CUDA_VISIBLE_DEVICES=$gpu
  GRAPHDECODE_SANITIZE=1 GRAPHDECODE_SANITIZE_TOOL=$tool GRAPHDECODE_PLAIN_GEMM=$plain \
    "$SAN_HERE/run-guarded.sh" "$rss" "$SAN_TIMEOUT" "$log" \
    compute-sanitizer --tool "$tool" "${extra[@]}" --print-limit 100 --error-exitcode 99 "$bin" \
    --gtest_brief=1 "${filter[@]}"
  local guard summary errors ours library internal failed verdict
  guard=$(grep '^GUARD ' "$log" | tail -1)
  summary=$(grep -oE '(ERROR|RACECHECK) SUMMARY: [0-9]+ [a-z]+( displayed)? \([0-9]+ errors?' "$log" |
    tail -1)
  errors=$(grep -oE '\([0-9]+ error' <<< "$summary" | grep -oE '[0-9]+')
  [ -z "$errors" ] && errors=$(grep -oE 'ERROR SUMMARY: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$')
  # Hazard and error lines name the kernel as "at <kernel>+<offset>" or "in <kernel>".
  library=$(grep -E 'Race reported|Error' "$log" | grep -cE '(at|in) (nvjet_|sm90_xmma|cutlass|gemv|gemmSN|splitKreduce)')
  ours=$(grep -E 'Race reported' "$log" | grep -cvE 'at (nvjet_|sm90_xmma|cutlass|gemv|gemmSN|splitKreduce)')
  internal=$(grep -c 'Internal Sanitizer Error' "$log")
  failed=$(grep -cE '^\[  FAILED  \]' "$log")
  if [[ "$guard" == *KILLED* ]]; then
    verdict=KILLED
  elif [ "$internal" -gt 0 ] || [ "$failed" -gt 0 ] || [ -z "$errors" ]; then
    verdict=FAIL
  elif [ "$errors" -eq 0 ]; then
    verdict=ok
  elif [ "$tool" = racecheck ] && [ "$ours" -eq 0 ] && [ "$library" -gt 0 ]; then
    verdict=LIBRARY
  else
    verdict=FAIL
  fi
  printf '%-34s %-9s %-7s errors %-5s ours %-4s library %-4s failed tests %-3s %s\n' "$name" "$tool" \
    "$verdict" "${errors:-?}" "$ours" "$library" "$failed" "${guard#GUARD }"
}
export -f sanitize_one
export SAN_OUT=$out SAN_HERE=$here SAN_TIMEOUT=$timeout_s SAN_GPUS=$gpus SAN_LAUNCH_BLOCKING=$launch_blocking
export SAN_RACECHECK_ARGS=$racecheck_args

# The sweep runs in its own process group, so the deadline can stop every job it started.
results="$out/sanitize-summary.txt"
# run_jobs FILE P: the command that runs FILE's jobs P at a time, appending their verdict lines.
run_jobs() {
  echo "xargs -r -P $2 -L 1 bash -c 'sanitize_one \$0 \$1 \$2 \$3 \$4' < '$1' >> '$results'"
}
light=$(run_jobs "$jobs_file" "$parallel")
heavy_jobs=$(run_jobs "$heavy_file" "$heavy_parallel")
: > "$results"
if [ "$heavy_parallel" -gt 1 ]; then
  setsid bash -c "$light & $heavy_jobs & wait" &
else
  setsid bash -c "$light; $heavy_jobs" &
fi
sweep=$!
start=$SECONDS
while kill -0 "$sweep" 2> /dev/null; do
  if [ "$deadline" -gt 0 ] && [ $((SECONDS - start)) -ge "$deadline" ]; then
    # TERM first: each guard then stops its own process group (the tool and the test).
    kill -TERM -- -"$sweep" 2> /dev/null
    sleep 3
    kill -9 -- -"$sweep" 2> /dev/null
    echo "deadline: stopped after $deadline s; jobs without a line did not finish" >> "$results"
    break
  fi
  sleep 2
done
wait "$sweep" 2> /dev/null
rm -f "$jobs_file" "$heavy_file"
sort -o "$results" "$results"
cat "$results"
! grep -qE ' (FAIL|KILLED) |^deadline' "$results"
