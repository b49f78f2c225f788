export PYTHONPATH=.
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader > $W/gpu.txt
timeout 200 python -m pytest -q -x tests/test_attention_gpu.py tests/test_tma_gpu.py > $W/tests.log 2>&1; echo "tests rc $?" >> $W/tests.log; tail -2 $W/tests.log
timeout 100 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py tma > $W/memcheck.log 2>&1; tail -1 $W/memcheck.log
timeout 100 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py tma > $W/racecheck.log 2>&1; tail -1 $W/racecheck.log
OUT=$W CAUSAL=1 ROUNDS=5 timeout 120 python scratch/fwd2sm.py > $W/ab_causal_bf16.log 2>&1; cut -c1-200 $W/ab_causal_bf16.log
OUT=$W CAUSAL=1 ROUNDS=3 FP16=1 TAG=_fp16 timeout 80 python scratch/fwd2sm.py > $W/ab_causal_fp16.log 2>&1; cut -c1-200 $W/ab_causal_fp16.log
for dt in bf16 fp16; do timeout 60 python -m attention.bench --suite seed004 --causal --impl ours,torch-flash,torch-cudnn --dtype $dt --json $W/fwd_seed004_causal_$dt.json > $W/fwd_seed004_causal_$dt.log 2>&1; done
cd $OUT && tar czf w.tgz w && rm -rf w
