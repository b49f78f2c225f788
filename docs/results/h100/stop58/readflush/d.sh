#!/bin/bash
export PYTHONPATH=.
O=$OUT/readflush; mkdir -p $O
nvidia-smi -L | tee $O/gpu.txt
t0=$(date +%s)
timeout 120 python -m pytest -q -s tests/test_engine_gpu.py > $O/tests_engine.log 2>&1
echo "engine tests rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $O/tests_engine.log; grep "16 MB read\|copy:" $O/tests_engine.log
timeout 120 python scratch/s58/flush_probe.py $O/flush_probe.json 3 > $O/flush_probe.log 2>&1
echo "probe rc=$? $(( $(date +%s) - t0 ))s"; tail -10 $O/flush_probe.log
timeout 150 python -m moe.bench --suite decode --json $O/moe_decode.json > $O/moe_decode.log 2>&1
echo "moe decode rc=$? $(( $(date +%s) - t0 ))s"
timeout 200 python -m attention.bench --suite decode --case b1_ --budget-ms 100 --rounds 2 --json $O/attn_decode_b1.json > $O/attn_decode_b1.log 2>&1
echo "attn b1 rc=$? $(( $(date +%s) - t0 ))s"
