#!/bin/bash
# stop 63 on an H100: the timer's new default order (flush-sync); engine tests, who pays the queued cost, the
# attention decode suite whole, the MoE decode suite
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
python -m pytest -q -p no:cacheprovider tests/test_engine_gpu.py tests/test_engine_cpu.py > $OUT/engine_tests.log 2>&1
tail -2 $OUT/engine_tests.log
python scratch/s63/who_pays.py 7 > $OUT/who_pays.log 2>&1
tail -7 $OUT/who_pays.log
python -m attention.bench --suite decode --budget-ms 100 --rounds 2 --json $OUT/attn_decode.json > $OUT/attn_decode.txt 2>&1
echo "attn decode rc $?"
python scratch/s63/summary.py new=$OUT/attn_decode.json | cut -c1-1500
python -m moe.bench --suite decode --json $OUT/moe_decode.json > $OUT/moe_decode.txt 2>&1
echo "moe decode rc $?"
grep -A14 "^decode layers" $OUT/moe_decode.txt
