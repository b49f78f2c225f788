export PYTHONPATH=. PYTHONUNBUFFERED=1
W=$OUT/t17; mkdir -p $W; nvidia-smi -L > $W/gpus.txt; git diff HEAD --stat > $W/tree.txt
s=$(date +%s)
timeout 400 python -m pytest -q -x tests/test_attention_gpu.py -k tma tests/test_tma_gpu.py tests/test_varlen_gpu.py > $W/tests.log 2>&1; echo "tests rc $? $(( $(date +%s) - s )) s" | tee -a $W/tests.log; tail -3 $W/tests.log
timeout 150 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py tma > $W/memcheck.log 2>&1; echo "memcheck rc $?"; tail -2 $W/memcheck.log
cd $OUT && tar czf t17.tgz t17 && rm -rf t17
