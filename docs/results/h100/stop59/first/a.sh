#!/bin/bash
# stop 59 run a: kvcache GPU tests, memcheck of decode, the paged prefetch A/B
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt
python -m pytest -q -x tests/test_kvcache_gpu.py > $OUT/tests_kvcache.log 2>&1; tail -2 $OUT/tests_kvcache.log
timeout 200 compute-sanitizer --tool memcheck python tools/sanitize.py decode > $OUT/memcheck_decode.log 2>&1; tail -3 $OUT/memcheck_decode.log
python scratch/s59/paged_ab.py --rounds 5 --json $OUT/paged_ab.json 2>&1 | tee $OUT/paged_ab.log
