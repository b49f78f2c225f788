#!/bin/bash
# stop 63: who pays the queued cost, second form (a short kernel before the call); the engine GPU tests on the
# new default order; the MoE decode suite under it
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
python scratch/s63/who_pays.py 7 noop > $OUT/who_pays2.log 2>&1
python -m pytest -q -p no:cacheprovider tests/test_engine_gpu.py tests/test_engine_cpu.py > $OUT/engine_tests.log 2>&1
tail -3 $OUT/engine_tests.log
python -m moe.bench --suite decode --json $OUT/moe_decode.json > $OUT/moe_decode.txt 2>&1
tail -30 $OUT/moe_decode.txt | grep -v "^\s*$" | tail -22
cat $OUT/who_pays2.log | tail -16
