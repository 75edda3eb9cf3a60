#!/usr/bin/env bash
# The device machine's full check: configure + build with ninja, run every test (GPU tests must
# run, not skip), compute-sanitizer over every GPU test binary, then the benchmarks.
# Full logs go under $OUT (default ./gpu-out); a summary table is printed last.
#
#   scripts/gpu-check.sh                 # everything
#   GD_STAGES="build test" scripts/gpu-check.sh
#   GD_SANITIZE_TOOLS="memcheck racecheck initcheck"   (default: all three)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
FINAL_OUT=$OUT
# The device tool returns at most 8 files: logs are written to a scratch folder and packed into
# $OUT/gpu-check-logs.tar.gz at the end; the summary and benchmark JSON are copied beside it.
OUT=$(mktemp -d)
mkdir -p "$FINAL_OUT"
STAGES=${GD_STAGES:-"build test fuzz example parity spec cross bench sanitize python"}
FUZZ_STEPS=${GD_FUZZ_STEPS:-10000}
BENCHES=${GD_BENCHES:-all}  # or a list such as "bench_attention sdpa_peer"
SANITIZE_TIMEOUT=${GD_SANITIZE_TIMEOUT:-600}  # racecheck of test_attention_planning_gpu: > 300 s with 16 jobs at once
TOOLS=${GD_SANITIZE_TOOLS:-"memcheck racecheck initcheck"}
BUILD=build-gpu
export PATH=/usr/local/cuda/bin:$PATH
export GRAPHDECODE_REQUIRE_GPU=1
declare -a SUMMARY
note() { SUMMARY+=("$(printf '%-28s %s' "$1" "$2")"); }
has() { [[ " $STAGES " == *" $1 "* ]]; }
finish() {
  {
    echo
    echo "================ gpu-check summary ================"
    printf '%s\n' "${SUMMARY[@]}"
  } | tee "$OUT/summary.txt"
  cp "$OUT/summary.txt" "$FINAL_OUT/" 2>/dev/null
  cp "$OUT"/*.json "$FINAL_OUT/" 2>/dev/null
  tar -C "$OUT" -czf "$FINAL_OUT/gpu-check-logs.tar.gz" .
  exit "$1"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
note "device" "$(head -1 "$OUT/gpu.txt")"

if has build; then
  start=$(date +%s)
  if cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
      > "$OUT/configure.log" 2>&1 && cmake --build $BUILD -j 16 > "$OUT/build.log" 2>&1; then
    note "build" "ok ($(( $(date +%s) - start )) s)"
  else
    note "build" "FAILED (see build.log)"; grep -E 'error|FAILED' "$OUT/build.log" | head -40; finish 1
  fi
fi

status=0
if has test; then
  ctest --test-dir $BUILD -j 8 --output-on-failure > "$OUT/ctest.log" 2>&1 || status=1
  line=$(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)
  skipped=$(grep -c '\*\*\*Skipped\|Not Run (Skipped)' "$OUT/ctest.log" || true)
  note "ctest (all)" "$line; skipped: $skipped"
  grep -E '\*\*\*Failed|\*\*\*Exception|Timeout' "$OUT/ctest.log" | head -20
fi

if has fuzz; then
  # The replay fuzzer: graph replay vs eager bitwise, vs the float64 reference, inert padding.
  for seed in 1 2; do
    log="$OUT/replay_fuzz_seed$seed.log"
    $BUILD/examples/replay_fuzz --seed $seed --steps $((FUZZ_STEPS / 2)) > "$log" 2>&1 || status=1
    note "replay_fuzz seed $seed" "$(tail -1 "$log")"
  done
fi

if has example; then
  # The main example: the engine on the 1B-class synthetic model, continuous batching to the end.
  log="$OUT/decode_loop.txt"
  if $BUILD/examples/decode_loop > "$log" 2>&1; then note "example decode_loop" "ok"; else
    note "example decode_loop" "FAILED"; status=1; fi
  cat "$log"
  note "  decode_loop" "$(grep -E '^throughput' "$log" | head -1)"
fi

if has parity; then
  # Hugging Face parity (scripts/hf_parity.py), when torch and transformers are importable.
  if python3 -c 'import torch, transformers; assert torch.cuda.is_available()' > /dev/null 2>&1; then
    log="$OUT/hf_parity.txt"
    # shellcheck disable=SC2086
    if python3 scripts/hf_parity.py --binary $BUILD/examples/model_parity \
        ${GD_PARITY_ARGS:---train-steps 2000} > "$log" 2>&1; then
      note "hf_parity" "PASS"; else note "hf_parity" "FAIL"; status=1; fi
    cat "$log"
  else
    note "hf_parity" "skipped (no torch/transformers with CUDA)"
  fi
fi

if has spec; then
  # Speculative decoding against transformers' assisted generation on a trained target/draft pair
  # (scripts/hf_spec_parity.py), then bench_spec on that pair: speculative vs plain decoding.
  if python3 -c 'import torch, transformers; assert torch.cuda.is_available()' > /dev/null 2>&1; then
    log="$OUT/hf_spec_parity.txt"
    work=$(mktemp -d)
    # shellcheck disable=SC2086
    if python3 scripts/hf_spec_parity.py --binary $BUILD/examples/model_parity --workdir "$work" \
        ${GD_SPEC_PARITY_ARGS:-} > "$log" 2>&1; then
      note "hf_spec_parity" "PASS"; else note "hf_spec_parity" "FAIL"; status=1; fi
    cat "$log"
    if [ -d "$work/target" ] && $BUILD/bench/bench_spec --target "$work/target" \
        --draft "$work/draft" --json "$OUT/bench_spec.json" ${GD_SPEC_BENCH_ARGS:-} \
        > "$OUT/bench_spec.txt" 2>&1; then
      note "bench bench_spec" "ok"; else note "bench bench_spec" "FAILED"; status=1; fi
    cat "$OUT/bench_spec.txt"
  else
    note "hf_spec_parity" "skipped (no torch/transformers with CUDA)"
  fi
fi

if has cross; then
  # Mllama's cross-attention layers: the graph-replay fuzz of the real model's layers (11B shape,
  # and the small model against the float64 reference), the serving example with encoder states
  # of mixed lengths, and parity with transformers' MllamaForCausalLM (its controls must fail).
  for shape in 11b small; do
    log="$OUT/cross_fuzz_$shape.log"
    $BUILD/examples/cross_fuzz --shape $shape --seed 1 --steps ${GD_CROSS_FUZZ_STEPS:-400} \
      > "$log" 2>&1 || status=1
    note "cross_fuzz $shape" "$(tail -1 "$log")"
  done
  log="$OUT/decode_loop_cross.txt"
  if $BUILD/examples/decode_loop --model cross-1b > "$log" 2>&1; then
    note "example decode_loop cross" "ok"; else note "example decode_loop cross" "FAILED"; status=1; fi
  cat "$log"
  note "  decode_loop cross" "$(grep -E '^throughput' "$log" | head -1)"
  if python3 -c 'import torch, transformers; assert torch.cuda.is_available()' > /dev/null 2>&1; then
    log="$OUT/hf_mllama_parity.txt"
    # shellcheck disable=SC2086
    if python3 scripts/hf_mllama_parity.py --binary $BUILD/examples/model_parity \
        ${GD_MLLAMA_PARITY_ARGS:-} > "$log" 2>&1; then
      note "hf_mllama_parity" "PASS"; else note "hf_mllama_parity" "FAIL"; status=1; fi
    cat "$log"
  else
    note "hf_mllama_parity" "skipped (no torch/transformers with CUDA)"
  fi
fi

if has bench; then
  for b in $BUILD/bench/bench_*; do
    [ -x "$b" ] || continue
    name=$(basename "$b")
    [ "$name" = bench_spec ] && continue  # the spec stage runs it on a trained pair
    [ "$BENCHES" = all ] || [[ " $BENCHES " == *" $name "* ]] || continue
    args=()  # bench_decode: 1B-class decode step vs its bandwidth floor, contexts 1024 and 4096
    [ "$name" = bench_decode ] && args=(--context "${GD_DECODE_CONTEXT:-1024,4096}")
    if "$b" --json "$OUT/$name.json" "${args[@]}" > "$OUT/$name.txt" 2>&1; then
      note "bench $name" "ok"
    else
      note "bench $name" "FAILED"; status=1
    fi
    cat "$OUT/$name.txt"
  done
  # Peer: PyTorch SDPA on contiguous K/V for the same decode shapes, when torch is importable.
  if { [ "$BENCHES" = all ] || [[ " $BENCHES " == *" sdpa_peer "* ]]; } &&
    python3 -c 'import torch; assert torch.cuda.is_available()' > /dev/null 2>&1; then
    if python3 bench/sdpa_peer.py --json "$OUT/sdpa_peer.json" > "$OUT/sdpa_peer.txt" 2>&1; then
      note "bench sdpa_peer" "ok"
    else
      note "bench sdpa_peer" "FAILED"; status=1
    fi
    cat "$OUT/sdpa_peer.txt"
    if [ -f "$OUT/bench_attention.json" ] && [ -f "$OUT/sdpa_peer.json" ]; then
      python3 bench/compare.py "$OUT/bench_attention.json" "$OUT/sdpa_peer.json" \
        | tee "$OUT/compare_attention.txt"
    fi
  else
    note "bench sdpa_peer" "skipped (not selected, or no torch with CUDA)"
  fi
  # PNG plots beside the tables (attention vs peers, decode step % of floor, ...), in the logs.
  python3 bench/plot.py "$OUT" --out "$OUT" > "$OUT/plot.txt" 2>&1 || true
  note "bench plots" "$(grep -c 'wrote' "$OUT/plot.txt") PNG ($(tail -1 "$OUT/plot.txt"))"
fi

if has sanitize; then
  # scripts/sanitize.sh: jobs in parallel under memory and time guards, one verdict line each.
  GD_SANITIZE_TIMEOUT=$SANITIZE_TIMEOUT GD_SANITIZE_TOOLS=$TOOLS \
    scripts/sanitize.sh $BUILD/gpu_tests.txt "$OUT" > "$OUT/sanitize.txt" 2>&1 || status=1
  while read -r line; do
    note "sanitize" "$line"
  done < <(grep -vE ' ok ' "$OUT/sanitize-summary.txt")
  note "sanitize" "$(grep -c ' ok ' "$OUT/sanitize-summary.txt") of $(wc -l < "$OUT/sanitize-summary.txt") jobs ok"
fi

if has python; then
  # The Python package: the wheel builds in $BUILD (the library's objects are reused; no network
  # here, so no build isolation and no dependency downloads), then its pytest suite with the GPU
  # tests required to run. Last: it reconfigures $BUILD without tests.
  if python3 -c 'import nanobind, scikit_build_core' > /dev/null 2>&1; then
    if python3 -m pip install -v --no-build-isolation --no-deps . -C build-dir=$BUILD \
        > "$OUT/pip-install.log" 2>&1; then
      # With pytest-xdist, tests run in a worker that is replaced if it crashes, so one crash
      # is reported as a failure instead of hiding every test after it.
      xdist=()
      python3 -c 'import xdist' > /dev/null 2>&1 && xdist=(-n 1)
      python3 -m pytest -q -rs "${xdist[@]}" python/tests > "$OUT/pytest.log" 2>&1 || status=1
      note "python pytest" "$(tail -1 "$OUT/pytest.log")"
    else
      note "python" "pip install FAILED (see pip-install.log)"; status=1
      tail -30 "$OUT/pip-install.log"
    fi
  else
    note "python" "skipped (nanobind or scikit-build-core not importable)"
  fi
fi

finish $status
