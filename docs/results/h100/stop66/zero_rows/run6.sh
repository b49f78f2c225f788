#!/bin/bash
# stop 66 run 6: rows past a group zeroed (tree) against not (-DGEMM_ZERO_PAST_ROWS=0): gemm rows at the cap, layers
export PYTHONPATH=.
t0=$(date +%s)
nvidia-smi -L | tee $OUT/gpu.txt
timeout 260 python scratch/s66/zero_ab.py > $OUT/zero_ab.log 2>&1
echo "zero_ab rc=$? $(( $(date +%s) - t0 ))s"; cat $OUT/zero_ab.log | grep -v "^{"
timeout 250 python tools/layer_ab.py --case seed004_b4x512 --case seed004_b16x2048 --variant tree --variant nozero:-DGEMM_ZERO_PAST_ROWS=0 --rounds 3 --json $OUT/layer_ab.json > $OUT/layer_ab.log 2>&1
echo "layer_ab rc=$? $(( $(date +%s) - t0 ))s"; grep "^|\|bitwise" $OUT/layer_ab.log | cut -c1-400
