#!/usr/bin/env bash
# Issue 38's measurement in one device call (<= 600 s): decode step (1B and 8B shapes, greedy and
# sampled engine steps, floor), prefill (TTFT, tokens/s, % of the dense bf16 peak), the
# transformers peer, and the combined tables (bench/NOTES.md "Issue 38 tables").
#
#   scripts/perf/bench38.sh                   (on the device, from the repository root)
#   GD38_PARTS="peer table" scripts/perf/bench38.sh     (a subset; earlier results in $OUT are kept)
#   GD38_GPUS=4 scripts/perf/bench38.sh       (a host of 4+ identical GPUs: everything at once, below)
#   GD38_GPUS=2 scripts/perf/bench38.sh       (2-3 GPUs: one lane per shape, below)
#
# With GD38_GPUS >= 4 (default 1) the parts run side by side, one lane per GPU: ours for the 1B
# shape (decode, then prefill) on GPU 0, for the 8B shape on GPU 1, and the peer on the others, cut
# into shards by shape and batch (shard 0 of a shape also runs its prefill); decode_table.py merges
# the shards. Each lane owns its GPU; the host is shared (torch.compile is CPU-heavy, so host-timed
# figures, TTFT, may move a little: compare with a one-GPU run). Every cell then fits one call.
# With GD38_GPUS 2 or 3: two lanes, ours then the peer of the 1B shape on GPU 0 and of the 8B shape
# on GPU 1 (t62 of 2026-11-28 ran ours this way: the 8B lane, decode and prefill at one chunk size,
# in ~280 s); the 8B peer gets what its lane leaves of the budget.
#
# $OUT gets three files: <gpu>_bench38_tables.md (the tables),
# bench38_summary.txt (what ran, rc and seconds per part) and bench38.tar.gz (every .txt / .json in
# the bench/results naming, e.g. h200_bench_decode_8b.json, and the build log). Each part runs
# under `timeout`, so one that hangs cannot take the others' time; the peer gets what is left.
#
# Time budget (estimates, H100/H200, fresh machine; a warm one with build-gpu skips most of the
# build):
#   build        ~150 s  libgraphdecode + bench_decode + bench_prefill, 16 cores, no ccache
#   decode 1b     ~60 s  10 cells x (4 x 110 steps of ~1-5 ms + weight upload, KV fill, capture)
#   decode 8b    ~230 s  --reps 30: 228 s for the 10 cells on the H200 on 2026-11-29 (t166; ~160 s
#                        on 2026-11-27); 8B synthetic weights ~10 s on the host, 16 GB upload per cell;
#                        B=128 L=4096 (69 GB of K/V) is skipped on an H100 by the fit check
#   prefill 1b    ~30 s  chunks 512, 2048 (the default) and 8192, 6 cells each, >= 2 runs a cell
#   prefill 8b   ~115 s  chunks 512, 2048 and 8192; 16 x 8k is ~2.4 PFLOP, ~5-10 s a run, 2 runs
#   peer         rest    --budget-s = 560 - elapsed - 60 (a compile started just before the budget
#                        runs over by up to ~60 s); torch.compile costs ~30-90 s per shape for the
#                        first cell and again for the first recompile (B, L become dynamic), so the
#                        headline cells (B 1/8/64) come first and B 32/128 are the ones cut
#   table          ~1 s
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
# Results and logs are written outside $OUT (the device tool returns few files) and packed at the
# end; under build-gpu/ so that a later call on the same warm machine (GD38_PARTS) finds them.
WORK=${GD38_WORK:-$PWD/build-gpu/bench38}
mkdir -p "$WORK"
PARTS=${GD38_PARTS:-"build decode prefill peer table"}
BUILD=build-gpu
TOTAL_S=${GD38_TOTAL_S:-560}  # the device call's 600 s less a margin for packing the results
GPUS=${GD38_GPUS:-1}
has() { [[ " $PARTS " == *" $1 "* ]]; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$gpu" in
  *H200*) tag=h200 ;;
  *H100*) tag=h100 ;;
  *) tag=gpu ;;
esac
summary=$WORK/bench38_summary.txt
echo "device: ${gpu:-unknown}; parts: $PARTS; $(git rev-parse --short HEAD 2>/dev/null)" > "$summary"
# part NAME LIMIT_S CMD...: runs CMD under timeout, logs rc and seconds.
part() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@"
  local rc=$?
  # To stderr: a part whose stdout is redirected (the table) must not get this line in its file.
  printf '%-12s rc %3d  %4d s  (limit %d s)\n' "$name" "$rc" $((SECONDS - t0)) "$limit" |
    tee -a "$summary" >&2
  return $rc
}
left() { echo $((TOTAL_S - SECONDS)); }

if has build; then
  part build 300 bash -c "cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90a > '$WORK/build.log' 2>&1 &&
    ninja -C $BUILD bench_decode bench_prefill >> '$WORK/build.log' 2>&1" ||
    { tail -30 "$WORK/build.log"; tar -C "$WORK" -czf "$OUT/bench38.tar.gz" .;
      cp "$summary" "$OUT/"; exit 1; }
fi

# Ours: decode then prefill of one shape. 100 decode reps for 1B (the earlier runs'), 30 for 8B
# (steps of 5-30 ms: 30 keeps it in budget; bench_decode writes its JSON after every cell, so a cut
# run keeps what it measured).
ours() {
  local shape=$1 reps=100 dlimit=90 plimit=90
  [ "$shape" = 8b ] && reps=30 dlimit=280 plimit=200
  if has decode; then
    part "decode $shape" "$dlimit" "$BUILD/bench/bench_decode" --shape "$shape" \
      --batches 1,8,32,64,128 --context 1024,4096 --reps "$reps" \
      --json "$WORK/${tag}_bench_decode_$shape.json" > "$WORK/${tag}_bench_decode_$shape.txt" 2>&1
    grep -v "^rounds " "$WORK/${tag}_bench_decode_$shape.txt" | tail -14
  fi
  if has prefill; then
    part "prefill $shape" "$plimit" "$BUILD/bench/bench_prefill" --shape "$shape" \
      --prompts 512,2048,8192 --requests 1,16 --step-tokens 512,2048,8192 \
      --json "$WORK/${tag}_bench_prefill_$shape.json" > "$WORK/${tag}_bench_prefill_$shape.txt" 2>&1
    tail -14 "$WORK/${tag}_bench_prefill_$shape.txt"
  fi
}

# The peer, one shard: peer NAME LIMIT_S BUDGET_S ARGS... (its JSON is rewritten after every cell,
# so a timeout keeps what it measured).
peer() {
  local name=$1 limit=$2 budget=$3
  shift 3
  part "peer $name" "$limit" python3 bench/hf_decode_peer.py --contexts 1024,4096 \
    --prompts 512,2048,8192 --requests 1,16 --reps 30 --budget-s "$budget" "$@" \
    --json "$WORK/${tag}_hf_decode_peer_$name.json" > "$WORK/${tag}_hf_decode_peer_$name.txt" 2>&1
  tail -12 "$WORK/${tag}_hf_decode_peer_$name.txt"
}
peer_ok() {
  python3 -c 'import torch, transformers; assert torch.cuda.is_available()' > /dev/null 2>&1 ||
    { echo "peer         skipped: no torch/transformers with CUDA" | tee -a "$summary"; return 1; }
}

if [ "$GPUS" -ge 4 ]; then
  # Peer shards over GPUs 2..GPUS-1: by shape, then by batch groups as GPUs allow.
  shards=()
  peer_gpus=$((GPUS - 2))
  if [ "$peer_gpus" -ge 6 ]; then groups=("1,8" "32,64" "128")
  elif [ "$peer_gpus" -ge 4 ]; then groups=("1,8,64" "32,128")
  else groups=("1,8,32,64,128"); fi
  for shape in 1b 8b; do
    for i in "${!groups[@]}"; do shards+=("$shape $i ${groups[$i]}"); done
  done
  ( CUDA_VISIBLE_DEVICES=0 ours 1b ) &
  ( CUDA_VISIBLE_DEVICES=1 ours 8b ) &
  if has peer && peer_ok; then
    budget=$(($(left) - 60))
    for j in "${!shards[@]}"; do
      read -r shape i batches <<< "${shards[$j]}"
      extra=()
      [ "$i" != 0 ] && extra=(--no-prefill)
      ( CUDA_VISIBLE_DEVICES=$((2 + j % peer_gpus)) peer "${shape}_$i" $(($(left) - 10)) "$budget" \
          --shapes "$shape" --batches "$batches" "${extra[@]}" ) &
    done
  fi
  wait
elif [ "$GPUS" -ge 2 ]; then
  lane() {  # lane GPU SHAPE: ours, then the peer of that shape on what is left
    export CUDA_VISIBLE_DEVICES=$1
    ours "$2"
    if has peer && peer_ok; then
      local budget=$(($(left) - 60))
      if [ "$budget" -gt 30 ]; then
        peer "$2" $(($(left) - 10)) "$budget" --shapes "$2" --batches 1,8,32,64,128
      else
        echo "peer $2      skipped: ${budget} s of budget left" | tee -a "$summary"
      fi
    fi
  }
  ( lane 0 1b ) &
  ( lane 1 8b ) &
  wait
else
  for shape in 1b 8b; do ours "$shape"; done
  if has peer && peer_ok; then
    budget=$(($(left) - 60))
    if [ "$budget" -gt 30 ]; then
      peer all $(($(left) - 10)) "$budget" --shapes 1b,8b --batches 1,8,32,64,128
    else
      echo "peer         skipped: ${budget} s of budget left" | tee -a "$summary"
    fi
  fi
fi

if has table; then
  dec=() pf=() targs=()
  for s in 1b 8b; do
    [ -f "$WORK/${tag}_bench_decode_$s.json" ] && dec+=("$WORK/${tag}_bench_decode_$s.json")
    [ -f "$WORK/${tag}_bench_prefill_$s.json" ] && pf+=("$WORK/${tag}_bench_prefill_$s.json")
  done
  [ ${#dec[@]} -gt 0 ] && targs+=(--decode "${dec[@]}")
  [ ${#pf[@]} -gt 0 ] && targs+=(--prefill "${pf[@]}")
  peers=("$WORK/${tag}"_hf_decode_peer_*.json)
  [ -f "${peers[0]}" ] && targs+=(--peer "${peers[@]}")
  part table 30 python3 bench/decode_table.py "${targs[@]}" > "$WORK/${tag}_bench38_tables.md" 2>&1
  cp "$WORK/${tag}_bench38_tables.md" "$OUT/"
  cat "$WORK/${tag}_bench38_tables.md"
fi
echo "total        $SECONDS s" | tee -a "$summary"
cp "$summary" "$OUT/"
tar -C "$WORK" -czf "$OUT/bench38.tar.gz" .
