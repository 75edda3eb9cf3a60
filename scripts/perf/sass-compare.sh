#!/usr/bin/env bash
# Proof that a change left the shipped attention kernels alone: builds the attention objects of the
# library (attention/*.cu, default build flags: Release, sm_90a) from two revisions and compares
# the SASS of every kernel in them, and each kernel's resources (registers, shared memory, stack).
# No GPU needed; cuobjdump must be on PATH or in $CUOBJDUMP (CUDA toolkit, or the PyPI wheel
# nvidia-cuda-cuobjdump).
#   scripts/perf/sass-compare.sh OLD_REV [NEW_REV]     (NEW_REV: default the working tree)
# Both revisions are built in the same scratch path, so names that hash the source path (anonymous
# namespaces) match. Prints one line per kernel; exits 1 if any kernel's SASS differs.
# GD_SASS_FLAGS: extra nvcc flags for both builds (e.g. "-DGD_ATTN_TRACE=1", "-DGD_ATTN_STAGES=2").
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
objdump=${CUOBJDUMP:-cuobjdump}
command -v "$objdump" > /dev/null || { echo "cuobjdump not found (set CUOBJDUMP)"; exit 2; }
old=$(git rev-parse --verify "${1:?usage: sass-compare.sh OLD_REV [NEW_REV]}^{commit}")
new=${2:-}
[ -z "$new" ] || new=$(git rev-parse --verify "$new^{commit}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# SASS of REV into $work/NAME.sass (addresses stripped) and resources into $work/NAME.res.
dump() {
  local rev=$1 name=$2 src=$work/src build=$work/src/build-sass
  rm -rf "$src" && mkdir -p "$src"
  if [ -n "$rev" ]; then
    git archive "$rev" | tar -x -C "$src"
  else  # the working tree: tracked and untracked files, less what .gitignore names
    git ls-files -co --exclude-standard -z | xargs -0 tar -c | tar -x -C "$src"
  fi
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DGRAPHDECODE_BUILD_TESTS=OFF -DGRAPHDECODE_BUILD_BENCH=OFF \
    -DGRAPHDECODE_BUILD_EXAMPLES=OFF "-DCMAKE_CUDA_FLAGS=${GD_SASS_FLAGS:-}" \
    > "$work/$name.log" 2>&1
  mapfile -t objs < <(ninja -C "$build" -t targets all |
    grep -oE '^CMakeFiles/graphdecode\.dir/attention/[^:]+\.cu\.o' | sort)
  ninja -C "$build" "${objs[@]}" >> "$work/$name.log" 2>&1 ||
    { tail -20 "$work/$name.log"; exit 2; }
  : > "$work/$name.sass"
  : > "$work/$name.res"
  for o in "${objs[@]}"; do
    "$objdump" -sass "$build/$o" | sed -E 's@/\*[0-9a-f]{4,}\*/@@' >> "$work/$name.sass"
    "$objdump" -res-usage "$build/$o" | grep -E 'Function|REG' >> "$work/$name.res"
  done
}
# One file per kernel: $work/NAME.k/<mangled name>.
split() {
  mkdir -p "$work/$1.k"
  awk -v dir="$work/$1.k" '/Function :/ { f = dir "/" $3 } f { print > f }' "$work/$1.sass"
}
dump "$old" old
dump "$new" new
split old
split new
label="working tree"
[ -z "$new" ] || label=$(git rev-parse --short "$new")
label+=${GD_SASS_FLAGS:+ ($GD_SASS_FLAGS)}
echo "SASS of the attention kernels, $(git rev-parse --short "$old") -> $label"
status=0
for f in $(ls "$work/old.k" "$work/new.k" | grep -v ':$' | sort -u); do
  if [ ! -f "$work/old.k/$f" ] || [ ! -f "$work/new.k/$f" ]; then
    echo "only in one: $f"; status=1
  elif cmp -s "$work/old.k/$f" "$work/new.k/$f"; then
    echo "identical ($(grep -c ' ;' "$work/new.k/$f") instructions): $f"
  else
    echo "DIFFERS: $f"; status=1
    diff "$work/old.k/$f" "$work/new.k/$f" | head -40
  fi
done
if cmp -s "$work/old.res" "$work/new.res"; then
  echo "resource usage (registers, shared, stack, local): identical for every kernel"
else
  echo "resource usage DIFFERS:"; diff "$work/old.res" "$work/new.res"; status=1
fi
exit $status
