#!/bin/bash
# stop 60 run h: the dynamic schedule, every reader frees its slot: tests, racecheck, A/B, ncu
export PYTHONPATH=.
t0=$(date +%s)
timeout 150 python -m pytest -q -x tests/test_grouped_gemm_gpu.py -k "dynamic or scatter" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $OUT/tests.log
timeout 120 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py gemm > $OUT/racecheck_gemm.log 2>&1
echo "racecheck rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $OUT/racecheck_gemm.log
M=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,gpu__time_duration.sum,lts__t_sector_hit_rate.pct
timeout 90 ncu --metrics $M -k regex:moe_grouped_gemm_tma --launch-skip 4 --launch-count 2 python scratch/s60/layer_once.py seed004_b16x2048 > $OUT/ncu_dyn.log 2>&1
echo "ncu rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^  void|dram__|gpu__time|hit_rate" $OUT/ncu_dyn.log | cut -c1-110
ROUNDS=3 timeout 230 python scratch/s60/dyn_ab.py $OUT/dyn_ab.json > $OUT/dyn_ab.log 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 ))s"; grep "static /" $OUT/dyn_ab.log
