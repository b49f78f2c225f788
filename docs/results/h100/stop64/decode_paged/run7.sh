#!/bin/bash
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
timeout 400 python scratch/s64/table_warm.py > $OUT/table_warm.log 2>&1; echo "rc $?"; cat $OUT/table_warm.log
