#!/bin/bash
# stop 67 call 7: tools/gemm_ab.py checked on a GPU (v8.2 against the old passes, a forced tile, torch._grouped_mm)
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
timeout 560 python tools/gemm_ab.py --case E32_equal --case 1group --case 65536x4096x11008/32 --variant tree \
  --variant old:-DGEMM_EPI_HALF_PASSES=0 --variant pair:config=TMA_PAIR --baseline --rounds 3 --sustained 2 \
  --json $OUT/gemm_ab.json > $OUT/gemm_ab.log 2>&1; echo "gemm_ab rc $?"
sed -n '/^| case/,$p' $OUT/gemm_ab.log; grep -i "error\|Traceback" $OUT/gemm_ab.log | head
