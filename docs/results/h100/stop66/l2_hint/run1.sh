#!/bin/bash
# stop 66 run 1 (H100): the skinny weight loads with .L2::256B (now the default): GPU tests, tiles re-checked, decode suite
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
timeout 240 python -m pytest -q -x -p no:cacheprovider tests/test_grouped_gemm_gpu.py tests/test_moe_gpu.py > $OUT/tests.log 2>&1
echo "tests rc $?"; tail -2 $OUT/tests.log
timeout 200 python tools/layer_ab.py --case E64top8:1 --case E64top8:4 --case seed004:1 --case seed004:4 \
  --variant tree --variant nohint:-DSKINNY_L2_PREFETCH=0 --variant u168:up=8/16/8 --variant u162:up=8/16/2 \
  --variant d164:down=8/16/4 --rounds 5 --json $OUT/tiles_ab.json > $OUT/tiles_ab.log 2>&1
echo "tiles rc $?"; grep "^|" $OUT/tiles_ab.log
timeout 200 python -m moe.bench --suite decode --json $OUT/moe_decode.json > $OUT/moe_decode.txt 2>&1
echo "moe decode rc $?"
grep -A14 "^decode layers" $OUT/moe_decode.txt
