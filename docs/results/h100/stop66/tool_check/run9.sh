#!/bin/bash
# stop 66 run 9 (final tree): on an H200 the MoE suites; on an H100 a check of tools/layer_ab.py on a seed 004 layer
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
if nvidia-smi -L | grep -q H200; then
  timeout 150 python -m moe.bench --suite decode --json $OUT/moe_decode.json > $OUT/moe_decode.txt 2>&1; echo "moe decode rc $?"
  grep -A14 "^decode layers" $OUT/moe_decode.txt
  timeout 200 python -m moe.bench --suite gemm --impl ours,cublas,torch-grouped --rounds 5 --json $OUT/moe_gemm.json > $OUT/moe_gemm.txt 2>&1; echo "gemm rc $?"
  timeout 200 python -m moe.bench --suite seed004 --case layer --json $OUT/moe_seed004.json > $OUT/moe_seed004.txt 2>&1; echo "seed004 rc $?"
  grep "gemm_8192\|layer " $OUT/moe_gemm.txt $OUT/moe_seed004.txt | grep "ours" | cut -c1-200
else
  timeout 200 python tools/layer_ab.py --case seed004_b4x512 --case E64top8:4 --variant tree --variant combine:moe.grouped_gemm.TMA_SCATTER=False --rounds 2 --json $OUT/layer_ab_check.json > $OUT/layer_ab_check.log 2>&1
  echo "layer_ab rc $?"; grep "^|" $OUT/layer_ab_check.log
fi
