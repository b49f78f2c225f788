#!/bin/bash
export PYTHONPATH=.
O=$OUT/b64; mkdir -p $O
t0=$(date +%s)
timeout 560 python -m attention.bench --suite decode --case b64_ --budget-ms 100 --rounds 2 --json $O/attn_decode_b64.json > $O/attn_decode_b64.log 2>&1
echo "b64 rc=$? $(( $(date +%s) - t0 ))s"
