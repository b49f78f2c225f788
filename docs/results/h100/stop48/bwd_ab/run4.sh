export PYTHONPATH=.
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $W/gpu.txt
O=scratch/oldbwd/attention/kernels
CASES=seed004_b16_s2048_h16_d64,seed004_b16_s2048_h16_d64:causal VARIANTS=old=$O@2:128,new=.@2:128,n64s2=.@2:64,n64s3=.@3:64 timeout 200 python scratch/bwd_ab.py > $W/ab64.log 2>&1; cut -c1-200 $W/ab64.log
CASES=llama8b_long,seed004_b32_s4096_h32_d128 DTYPES=bf16 VARIANTS=old2=$O@2,new2=.@2,new3=.@3 timeout 200 python scratch/bwd_ab.py > $W/ab128.log 2>&1; cut -c1-200 $W/ab128.log
timeout 240 python -m pytest -q -x tests/test_attention_bwd_gpu.py tests/test_varlen_gpu.py > $W/tests.log 2>&1; echo "tests rc $?" >> $W/tests.log; tail -2 $W/tests.log
timeout 100 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py tma-backward > $W/memcheck.log 2>&1; tail -1 $W/memcheck.log
timeout 150 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py tma-backward > $W/racecheck.log 2>&1; tail -1 $W/racecheck.log
cd $OUT && tar czf w.tgz w && rm -rf w
