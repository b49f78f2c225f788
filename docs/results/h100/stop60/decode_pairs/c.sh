#!/bin/bash
export PYTHONPATH=.
nvidia-smi -L > $OUT/gpu.txt
timeout 300 python scratch/s60/pair_ab.py $OUT/pair_ab.json > $OUT/pair_ab.log 2>&1; echo rc=$?
cat $OUT/pair_ab.log
timeout 200 python -m pytest -q -x tests/test_grouped_gemm_gpu.py -k "tma_gather or tma_scatter" > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log
