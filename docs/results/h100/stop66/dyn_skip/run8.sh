#!/bin/bash
# stop 66 run 8: the dynamic schedule and the idle-warpgroup skip, alone and together: gemm rows at the cap, layers
export PYTHONPATH=.
t0=$(date +%s)
nvidia-smi -L | tee $OUT/gpu.txt
timeout 280 python scratch/s66/dynskip_ab.py > $OUT/dynskip_ab.log 2>&1
echo "gemm ab rc=$? $(( $(date +%s) - t0 ))s"; cat $OUT/dynskip_ab.log
timeout 280 python tools/layer_ab.py --case seed004_b16x2048 --case seed004_b32x2048 --case seed004_b4x512 \
  --variant static:moe.grouped_gemm.TMA_DYNAMIC=False,-DGEMM_SKIP_IDLE=0 \
  --variant dyn:moe.grouped_gemm.TMA_DYNAMIC=True,-DGEMM_SKIP_IDLE=0 \
  --variant skip:moe.grouped_gemm.TMA_DYNAMIC=False,-DGEMM_SKIP_IDLE=1 \
  --variant dynskip:moe.grouped_gemm.TMA_DYNAMIC=True,-DGEMM_SKIP_IDLE=1 --rounds 3 --json $OUT/layer_ab.json > $OUT/layer_ab.log 2>&1
echo "layer ab rc=$? $(( $(date +%s) - t0 ))s"; grep "^|\|bitwise" $OUT/layer_ab.log | cut -c1-300
