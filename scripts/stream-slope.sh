#!/usr/bin/env bash
# Separates the per-key stream rate from the fixed cost of a decode call: bench_attention (ours)
# and SDPA-flash (the peer) at several context lengths L for B in GD_SLOPE_BATCHES, then a least
# squares line time = fixed + per_key * L per method and column (bench/NOTES.md 64).
# Ours runs on each K/V layout of GD_SLOPE_LAYOUTS ("shuffled page 16" is the table's).
#   scripts/stream-slope.sh            (on the device; logs and slope.txt in $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
batches=${GD_SLOPE_BATCHES:-1 8}
lens=${GD_SLOPE_LENS:-4096 8192 16384 32768}
layouts=${GD_SLOPE_LAYOUTS:-"16:shuffled 16:ordered 64:ordered 32768:ordered"}
build=${GD_SLOPE_BUILD:-build-slope}
if [ ! -x "$build/bench/bench_attention" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    ${GD_SLOPE_DEFS:+"-DCMAKE_CUDA_FLAGS=$GD_SLOPE_DEFS"} > "$OUT/slope-build.log" 2>&1 &&
    ninja -C "$build" bench_attention >> "$OUT/slope-build.log" 2>&1 ||
    { echo "build FAILED"; tail -30 "$OUT/slope-build.log"; exit 1; }
fi
raw="$OUT/slope-raw.txt"
: > "$raw"
for b in $batches; do
  for layout in $layouts; do
    page=${layout%%:*} order=${layout#*:}
    flags="--page $page"
    [ "$order" = ordered ] && flags="$flags --ordered-pages"
    for l in $lens; do
      # The decode row of --shape: "... B L ... us (call) ... layer ... step ...".
      "$build/bench/bench_attention" --shape "$b,$l" $flags > "$OUT/tmp.txt" 2>&1
      echo "ours page=$page $order B=$b L=$l" >> "$raw"
      grep -E "decode|floor" "$OUT/tmp.txt" >> "$raw"
    done
  done
done
python3 bench/sdpa_peer.py --backend flash --batches "${batches// /,}" --lens "${lens// /,}" \
  --json "$OUT/slope-peer.json" > "$OUT/slope-peer.txt" 2>&1
rm -f "$OUT/tmp.txt"
cat "$raw" "$OUT/slope-peer.txt"
