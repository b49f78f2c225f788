#!/bin/bash
# stop 67 call 4: where the tma GEMM's epilogue time goes: no epilogue / no TMA stores / no staging writes, cool only
export PYTHONPATH=. SUSTAIN_S=0 ROUNDS=5 VARIANTS=tree,noepi,nostore,nostage
export CASES=gemm_8192x11008x4096_1group,gemm_8192x11008x4096_E8_equal,gemm_8192x11008x4096_E32_equal
nvidia-smi -L | tee $OUT/gpu.txt
timeout 500 python scratch/s67/epi_probe.py > $OUT/epi_probe2.log 2>&1; echo "probe rc $?"
grep -v "^\s*$" $OUT/epi_probe2.log | tail -30
