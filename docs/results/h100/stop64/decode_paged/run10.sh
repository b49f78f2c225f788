#!/bin/bash
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
s=$(date +%s); timeout 240 python scratch/s64/paged_ab.py > $OUT/paged_ab.log 2>&1; echo "ab rc $? $(( $(date +%s) - s )) s"; cat $OUT/paged_ab.log
