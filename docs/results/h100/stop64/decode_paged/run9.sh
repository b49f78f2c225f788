#!/bin/bash
# stop 64, H100: the paged early stage: KV-cache GPU tests, sanitizers on the decode family, A/B against HEAD
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
s=$(date +%s); python -m pytest -q -p no:cacheprovider tests/test_kvcache_gpu.py > $OUT/tests.log 2>&1; echo "tests $(( $(date +%s) - s )) s: $(tail -1 $OUT/tests.log)"
s=$(date +%s); timeout 120 compute-sanitizer --tool memcheck python tools/sanitize.py decode > $OUT/memcheck_decode.log 2>&1; echo "memcheck $(( $(date +%s) - s )) s: $(tail -1 $OUT/memcheck_decode.log)"
s=$(date +%s); timeout 150 compute-sanitizer --tool racecheck python tools/sanitize.py decode > $OUT/racecheck_decode.log 2>&1; echo "racecheck $(( $(date +%s) - s )) s: $(tail -1 $OUT/racecheck_decode.log)"
s=$(date +%s); timeout 240 python scratch/s64/paged_ab.py > $OUT/paged_ab.log 2>&1; echo "ab rc $? $(( $(date +%s) - s )) s"; cat $OUT/paged_ab.log
