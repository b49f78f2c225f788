export PYTHONPATH=.
W=$OUT/w; mkdir -p $W
nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $W/gpu.txt
s=$(date +%s); timeout 220 python -m pytest -q -x tests/test_attention_bwd_gpu.py tests/test_varlen_gpu.py tests/test_tma_gpu.py > $W/tests.log 2>&1; echo "tests rc $? $(( $(date +%s) - s )) s"; tail -2 $W/tests.log
s=$(date +%s); timeout 120 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py tma-backward > $W/memcheck.log 2>&1; echo "memcheck $(( $(date +%s) - s )) s"; tail -1 $W/memcheck.log
s=$(date +%s); timeout 170 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py tma-backward > $W/racecheck.log 2>&1; echo "racecheck $(( $(date +%s) - s )) s"; tail -1 $W/racecheck.log
VARIANTS=old=scratch/oldk/attention/kernels,new=. CASES=seed004_b16_s2048_h16_d64,hb125m,hb125m:nocausal,hd256,seed004_b16_s2048_h16_d64:causal ROUNDS=5 NPROF=8 DTYPES=bf16 timeout 150 python scratch/rc/bwd_prof_ab.py > $W/ab.log 2>&1; grep -v "rounds\|Warn\|warn_once" $W/ab.log | cut -c1-200
