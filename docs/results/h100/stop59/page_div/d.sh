#!/bin/bash
export PYTHONPATH=.
python -m pytest -q -x tests/test_kvcache_gpu.py > $OUT/tests_kvcache.log 2>&1; tail -1 $OUT/tests_kvcache.log
python scratch/s59/paged_ab.py --rounds 5 --macro DECODE_FAST_PAGE_DIV --variants 0,1 --json $OUT/paged_ab.json 2>&1 | grep -v plan: | tee $OUT/paged_ab.log
