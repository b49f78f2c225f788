export PYTHONPATH=. PYTHONUNBUFFERED=1
bash scratch/status.sh fwd
W=$OUT/san; mkdir -p $W
timeout 100 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py tma > $W/memcheck.log 2>&1; tail -1 $W/memcheck.log
cd $OUT && tar czf san.tgz san && rm -rf san
