#!/bin/bash
export PYTHONPATH=.
timeout 150 python scratch/s60/called_probe.py seed004_b32x2048 > $OUT/called_probe.log 2>&1; echo rc=$?
cat $OUT/called_probe.log
timeout 200 python -m moe.bench --suite seed004 --case b32x2048 --case b4x512 --impl ours,torch-loop --json $OUT/seed004_sub.json > $OUT/seed004_sub.log 2>&1; echo rc=$?
grep -E "layer +\| (ours|torch-loop)" $OUT/seed004_sub.log | cut -c1-140
