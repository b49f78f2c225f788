# stop 61 final: the committed decode kernel (block lookups, no macro) - GPU tests, memcheck, racecheck
export PYTHONPATH=.
O=$OUT/final; mkdir -p $O; git log -1 --format=%h > $O/tree.txt; git diff --stat >> $O/tree.txt
t=$(date +%s); python -m pytest -q -x tests/test_kvcache_gpu.py tests/test_kvcache_cpu.py > $O/tests_kvcache.log 2>&1; echo "tests $(( $(date +%s) - t )) s: $(tail -1 $O/tests_kvcache.log)"
t=$(date +%s); timeout 150 compute-sanitizer --tool memcheck python tools/sanitize.py decode > $O/memcheck_decode.log 2>&1; echo "memcheck $(( $(date +%s) - t )) s: $(tail -1 $O/memcheck_decode.log)"
t=$(date +%s); timeout 150 compute-sanitizer --tool racecheck python tools/sanitize.py decode > $O/racecheck_decode.log 2>&1; echo "racecheck $(( $(date +%s) - t )) s: $(tail -1 $O/racecheck_decode.log)"
