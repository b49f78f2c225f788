#!/bin/bash
# stop 66 review: compute-sanitizer on the skinny (decode-sized) family with the .L2::256B weight loads
export PYTHONPATH=.
t0=$(date +%s)
nvidia-smi -L
timeout 200 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py skinny > $OUT/memcheck_skinny.log 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $OUT/memcheck_skinny.log
timeout 200 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py skinny > $OUT/racecheck_skinny.log 2>&1
echo "racecheck rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $OUT/racecheck_skinny.log
