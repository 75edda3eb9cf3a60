#!/usr/bin/env bash
# Memory-system counters of our attention kernel and of the SDPA-flash peer's split kernel on the
# same decode shape (ncu, clocks not locked): time, DRAM bytes and throughput, L2 traffic and hit
# rate, instructions; for the peer also its launch (grid, block, registers, shared memory, waves).
# Tells a difference in bytes moved from one in how well they stream; SM, L2 and DRAM clocks.
#   scripts/perf/ncu-memory.sh BUILD_DIR B L
set -uo pipefail
build=$1 b=$2 l=$3
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
metrics+=,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_op_read.sum
metrics+=,lts__t_sector_op_read_hit_rate.pct,lts__t_requests_srcunit_tex_op_read.sum
metrics+=,smsp__inst_executed.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed
metrics+=,l1tex__m_xbar2l1tex_read_bytes.sum,lts__average_gcomp_input_sector_success_rate.pct
# Clocks while the kernel runs (clocks are not locked): is either kernel power- or clock-limited?
metrics+=,sm__cycles_elapsed.avg.per_second,lts__cycles_elapsed.avg.per_second
metrics+=,dram__cycles_elapsed.avg.per_second
# How evenly the SMs are busy: an SM whose CTAs finish early idles until the last one ends.
metrics+=,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max
echo "=== ours: attention_kernel, B=$b L=$l (graph nodes)"
ncu --clock-control none --graph-profiling node --kernel-name regex:attention_kernel \
  --launch-skip 20 --launch-count 2 --metrics "$metrics" \
  "$build/bench/bench_attention" --shape "$b,$l" --reps 50 2>&1 | grep -E "^\s+(gpu__|dram__|lts__|smsp__|sm__|l1tex__)"
echo "=== SDPA-flash: flash_fwd_splitkv_kernel, B=$b L=$l"
ncu --clock-control none --kernel-name regex:flash_fwd_splitkv_kernel --launch-skip 2 \
  --launch-count 1 --section LaunchStats --section Occupancy --metrics "$metrics" \
  python3 - "$b" "$l" <<'PY' 2>&1 |
import sys, torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
b, l = int(sys.argv[1]), int(sys.argv[2])
q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(b, 8, l, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # ncu flushes the caches before each kernel
    for _ in range(5):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
torch.cuda.synchronize()
PY
  grep -E "^\s+(gpu__|dram__|lts__|smsp__|sm__|l1tex__)|Grid Size|Block Size|Registers Per|Dynamic Shared|Waves Per SM|Theoretical Occ"
