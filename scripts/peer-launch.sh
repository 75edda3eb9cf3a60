#!/usr/bin/env bash
# Launch configuration of the SDPA-flash peer's kernels (grid, block, registers, shared memory,
# waves, duration) for decode shapes: what bench_attention is compared with, seen by ncu.
#   scripts/peer-launch.sh 8,8192 8,32768 ...
set -uo pipefail
shapes="$*"
ncu --section LaunchStats --section Occupancy --metrics gpu__time_duration.sum \
  --kernel-name regex:'flash|fmha|splitkv|combine' python3 - $shapes <<'PY' 2>&1 |
import sys, torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
for spec in sys.argv[1:]:
    b, l = map(int, spec.split(","))
    q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, 8, l, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.cuda.synchronize()
    print("shape", spec, flush=True)
PY
  grep -E "shape |^  [a-z_:]+.*\(|Grid Size|Block Size|Registers Per|Shared Memory Config|Dynamic Shared|Static Shared|Waves Per SM|Theoretical Occupancy|Achieved Occupancy|gpu__time_duration|Threads  "
