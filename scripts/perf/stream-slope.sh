#!/usr/bin/env bash
# Separates the per-key stream rate from the fixed cost of a decode call: bench_attention (ours)
# and SDPA-flash (the peer) at several context lengths L for B in GD_SLOPE_BATCHES, then a least
# squares line time = fixed + per_key * L per method and column (bench/NOTES.md 64).
# Ours runs on each K/V layout of GD_SLOPE_LAYOUTS ("shuffled page 16" is the table's).
#   scripts/perf/stream-slope.sh            (on the device; logs and slope.txt in $OUT)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
batches=${GD_SLOPE_BATCHES:-1 8}
lens=${GD_SLOPE_LENS:-4096 8192 16384 32768}
layouts=${GD_SLOPE_LAYOUTS:-"16:shuffled 16:ordered 64:ordered 32768:ordered"}
build=${GD_SLOPE_BUILD:-build-slope}
# Always configured and built (incremental): a build dir left by an earlier call must not time an
# older tree.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  ${GD_SLOPE_DEFS:+"-DCMAKE_CUDA_FLAGS=$GD_SLOPE_DEFS"} > "$OUT/slope-build.log" 2>&1 &&
  ninja -C "$build" bench_attention >> "$OUT/slope-build.log" 2>&1 ||
  { echo "build FAILED"; tail -30 "$OUT/slope-build.log"; exit 1; }
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
# Least-squares line per method and column: us = fixed + ns_per_key * L / 1000; TB/s at the
# margin counts 4096 bytes per key and request (8 KV heads x 128 dims x bf16, K and V).
python3 - "$raw" "$OUT/slope-peer.txt" > "$OUT/slope.txt" <<'PY'
import re, sys
rows = {}  # (method, B) -> {column: [(L, us)]}
key = None
for line in open(sys.argv[1]):
    m = re.match(r"ours page=(\d+) (\w+) B=(\d+) L=(\d+)", line)
    if m:
        key, b, l = f"ours page {m[1]} {m[2]}", int(m[3]), int(m[4])
    elif line.startswith("decode") and key:
        f = line.split()
        for col, v in (("call", f[5]), ("layer", f[6]), ("step", f[7])):
            if v != "-":
                rows.setdefault((key, b), {}).setdefault(col, []).append((l, float(v)))
for line in open(sys.argv[2]):
    f = line.split()
    if len(f) >= 7 and f[0] in ("flash", "cudnn") and f[3] != "skipped:":
        for col, v in (("call", f[5]), ("step", f[6])):  # graph replay, per layer of a step
            if v != "-":
                rows.setdefault((f"SDPA-{f[0]}", int(f[1])), {}).setdefault(col, []).append(
                    (int(f[2]), float(v)))
def fit(pts):
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else 0.0
    return my - slope * mx, slope * 1e3  # fixed us, ns per key
for (method, b), cols in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    parts = []
    for col in ("call", "layer", "step"):
        if len(cols.get(col, [])) >= 2:
            fixed, ns = fit(cols[col])
            parts.append(f"{col} {fixed:6.1f} us + {ns:7.3f} ns/key ({b * 4096 / ns / 1e3:.3f} TB/s)")
    print(f"B={b:<4} {method:28} " + " | ".join(parts))
PY
cat "$raw" "$OUT/slope-peer.txt" "$OUT/slope.txt"
