#!/bin/bash
# stop 60 final check on the tree as committed
export PYTHONPATH=.
t0=$(date +%s)
timeout 120 python -m pytest -q -x tests/test_grouped_gemm_gpu.py -k "scatter or gather" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $OUT/tests.log
timeout 100 python tools/layer_ab.py --case E64top8:1 --variant base --variant probe:-DSTOP60_UNUSED_PROBE=1 --rounds 1 > $OUT/layer_ab_define.log 2>&1
echo "layer_ab rc=$? $(( $(date +%s) - t0 ))s"; tail -4 $OUT/layer_ab_define.log
