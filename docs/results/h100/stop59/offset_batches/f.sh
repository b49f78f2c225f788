#!/bin/bash
# stop 59 run f: the paged chunk offsets read in batches (DECODE_OFFSET_BATCH 1 = the old order, 4 = new)
export PYTHONPATH=.
python -m pytest -q -x tests/test_kvcache_gpu.py > $OUT/tests_kvcache.log 2>&1; tail -1 $OUT/tests_kvcache.log
python scratch/s59/paged_ab.py --rounds 5 --macro DECODE_OFFSET_BATCH --variants 1,4 --json $OUT/paged_ab.json 2>&1 | grep -v plan: | tee $OUT/paged_ab.log
python scratch/s59/paged_sweep.py --rounds 3 --json $OUT/paged_sweep.json > $OUT/paged_sweep.log 2>&1; cat $OUT/paged_sweep.log
