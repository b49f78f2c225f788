#!/bin/bash
export PYTHONPATH=.
O=$OUT/host; mkdir -p $O
nvidia-smi -L | tee $O/gpu.txt
t0=$(date +%s)
timeout 280 python tools/call_overhead.py --rounds 15 --json $O/call_overhead.json > $O/call_overhead.log 2>&1
echo "overhead rc=$? $(( $(date +%s) - t0 ))s"; grep "^| " $O/call_overhead.log | cut -c1-150 | head -24
timeout 300 python -m attention.bench --json $O/attn_default.json > $O/attn_default.log 2>&1
echo "attn default rc=$? $(( $(date +%s) - t0 ))s"
