# stop 61 final 2: the new wrap test and the sanitizer's long paged case
export PYTHONPATH=.
O=$OUT/final2; mkdir -p $O
t=$(date +%s); python -m pytest -q -x tests/test_kvcache_gpu.py > $O/tests_kvcache.log 2>&1; echo "tests $(( $(date +%s) - t )) s: $(tail -1 $O/tests_kvcache.log)"
t=$(date +%s); timeout 200 compute-sanitizer --tool memcheck python tools/sanitize.py decode > $O/memcheck_decode.log 2>&1; echo "memcheck $(( $(date +%s) - t )) s: $(tail -1 $O/memcheck_decode.log)"
t=$(date +%s); timeout 200 compute-sanitizer --tool racecheck python tools/sanitize.py decode > $O/racecheck_decode.log 2>&1; echo "racecheck $(( $(date +%s) - t )) s: $(tail -1 $O/racecheck_decode.log)"
