#!/bin/bash
export PYTHONPATH=.
O=$OUT/readflush2; mkdir -p $O
t0=$(date +%s)
python -c "import triton, inspect, triton.testing as t; src=inspect.getsource(t.do_bench); print(triton.__version__); print([l for l in src.splitlines() if 'cache' in l])" > $O/triton_do_bench.txt 2>&1
timeout 150 python scratch/s58/xcheck.py $O/xcheck.json > $O/xcheck.log 2>&1
echo "xcheck rc=$? $(( $(date +%s) - t0 ))s"; cat $O/xcheck.log | tail -5
timeout 300 python -m attention.bench --suite decode --case b8_ --budget-ms 100 --rounds 2 --json $O/attn_decode_b8.json > $O/attn_decode_b8.log 2>&1
echo "attn b8 rc=$? $(( $(date +%s) - t0 ))s"
