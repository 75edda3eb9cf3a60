#!/usr/bin/env bash
# The README's test command, from a fresh Debian/Ubuntu machine with the CUDA toolkit:
# installs the Debian packages the build needs that are missing (it names them first), then
# configures, builds and runs every test (`cmake --workflow --preset default`; GPU tests are
# reported as skipped where there is no GPU). .ci/run calls this same script.
#
#   scripts/setup.sh                  # install what is missing, then configure, build, test
#   GD_SETUP_INSTALL=0 scripts/setup.sh   # never install: say what is missing and stop
#
# The CUDA toolkit (nvcc >= 12.4) is not a Debian package this script installs: it is found on
# PATH, at $CUDACXX, or at /usr/local/cuda.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the build uses, and nothing more: CMake >= 3.25 and Ninja (the preset), the C++ compiler
# nvcc drives, GoogleTest (tests/) and nlohmann-json (config.json and safetensors headers).
packages=(cmake ninja-build g++ libgtest-dev nlohmann-json3-dev)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

if command -v dpkg-query > /dev/null; then
  missing=()
  for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: Debian packages present: ${packages[*]}"
  elif [ "${GD_SETUP_INSTALL:-1}" = 0 ]; then
    echo "setup: missing Debian packages: ${missing[*]} (GD_SETUP_INSTALL=0: not installing)" >&2
    exit 1
  else
    SUDO=()
    if [ "$(id -u)" -ne 0 ]; then
      command -v sudo > /dev/null || {
        echo "setup: not root and no sudo; install as root: apt-get install ${missing[*]}" >&2
        exit 1
      }
      SUDO=(sudo)
    fi
    echo "setup: installing missing Debian packages with apt-get: ${missing[*]}"
    "${SUDO[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends \
      "${missing[@]}"
    echo "setup: installed: ${missing[*]}"
  fi
else
  echo "setup: no dpkg here; make sure these (or their equivalents) are installed: ${packages[*]}"
fi

# nvcc: PATH first, then the toolkit's usual home.
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc > /dev/null; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
  else
    echo "setup: no CUDA toolkit found (nvcc on PATH, \$CUDACXX, or /usr/local/cuda/bin/nvcc);" \
      "install CUDA 12.4 or newer from NVIDIA first" >&2
    exit 1
  fi
fi
echo "setup: nvcc: $(command -v "${CUDACXX:-nvcc}")"

cmake --workflow --preset default
