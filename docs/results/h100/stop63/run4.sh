#!/bin/bash
# stop 63 on an H100: the MoE decode suite with our held device time beside the common host-time timing
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
python -m pytest -q -p no:cacheprovider tests/test_engine_gpu.py tests/test_overhead_cpu.py tests/test_call_path_gpu.py > $OUT/tests.log 2>&1
tail -2 $OUT/tests.log
python -m moe.bench --suite decode --json $OUT/moe_decode.json > $OUT/moe_decode.txt 2>&1
echo "moe decode rc $?"
grep -A14 "^decode layers" $OUT/moe_decode.txt
