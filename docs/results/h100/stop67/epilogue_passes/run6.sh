#!/bin/bash
# stop 67 call 6: A/B of the plain epilogue's 64-column passes (tree) against 128-column passes (old)
export PYTHONPATH=. SUSTAIN_S=2 ROUNDS=5
nvidia-smi -L | tee $OUT/gpu.txt
timeout 560 python scratch/s67/epi_ab.py > $OUT/epi_ab.log 2>&1; echo "ab rc $?"
grep -v "^\s*$" $OUT/epi_ab.log | tail -30
