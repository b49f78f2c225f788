# stop 61: block page lookups + the d64 paged ring rule - GPU tests, memcheck/racecheck, decode suite b1
export PYTHONPATH=.
O=$OUT/decode_status; mkdir -p $O
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt; cat $O/gpu.txt
t=$(date +%s); python -m pytest -q -x tests/test_kvcache_gpu.py tests/test_kvcache_cpu.py > $O/tests_kvcache.log 2>&1; echo "tests $(( $(date +%s) - t )) s: $(tail -1 $O/tests_kvcache.log)"
t=$(date +%s); timeout 150 compute-sanitizer --tool memcheck python tools/sanitize.py decode > $O/memcheck_decode.log 2>&1; echo "memcheck $(( $(date +%s) - t )) s: $(tail -1 $O/memcheck_decode.log)"
t=$(date +%s); timeout 150 compute-sanitizer --tool racecheck python tools/sanitize.py decode > $O/racecheck_decode.log 2>&1; echo "racecheck $(( $(date +%s) - t )) s: $(tail -1 $O/racecheck_decode.log)"
t=$(date +%s); timeout 300 python -m attention.bench --suite decode --case b1_ --budget-ms 100 --rounds 2 --json $O/attn_decode_b1.json > $O/attn_decode_b1.log 2>&1; echo "b1 suite rc $? $(( $(date +%s) - t )) s"
