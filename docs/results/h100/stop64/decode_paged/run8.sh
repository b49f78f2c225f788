#!/bin/bash
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
timeout 400 python scratch/s64/decode_tl.py > $OUT/decode_tl.log 2>&1; echo "rc $?"; cat $OUT/decode_tl.log
