#!/bin/bash
# stop 67 call 3: the tma GEMM's epilogue cost (probe build without it) beside the tree and torch._grouped_mm
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
timeout 500 python scratch/s67/epi_probe.py > $OUT/epi_probe.log 2>&1; echo "probe rc $?"
grep -v "^\s*$" $OUT/epi_probe.log | tail -30
