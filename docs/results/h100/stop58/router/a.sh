#!/bin/bash
# stop 58 run A: router units (+ rank top-k variant): tests, then layer A/B
export PYTHONPATH=.
O=$OUT/router; mkdir -p $O
nvidia-smi -L | tee $O/gpu.txt
t0=$(date +%s)
timeout 240 python -m pytest -q -x tests/test_grouped_gemm_gpu.py -k "layer or fused or skinny or decode or graph" tests/test_moe_gpu.py > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s"; tail -2 $O/tests.log
timeout 330 python tools/layer_ab.py --case E64top8:1 --case E64top8:4 --case seed004:1 --case seed004:4 \
  --variant new --variant items:-DDECODE_ROUTER_ITEMS=1 --variant rank:-DDECODE_RANK_TOPK=1 --rounds 7 \
  --json $O/layer_ab.json > $O/layer_ab.log 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 ))s"; tail -7 $O/layer_ab.log
