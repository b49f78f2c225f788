# stop 55: launch counts checked against graph captures; host us per call with the probe-sized bursts and the
# per-launch overhead line, on the MoE decode / layer suites and both overhead suites (ours only)
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L
W=$OUT/s55e; mkdir -p $W
git log -1 --format=%H > $W/tree.txt
timeout 90 python scratch/s55/launch_count_check.py 2>&1 | tee $W/launch_count_check.log
job() { t=$(date +%s); timeout $1 python -m $2 --suite $3 $4 --json $W/$5.json > $W/$5.log 2>&1; echo "$5 rc $? $(( $(date +%s) - t )) s"; grep -a "kernel launch overhead" $W/$5.log; }
job 150 moe.bench decode "--impl ours" moe_decode
job 120 moe.bench seed004 "--case layer --impl ours" moe_layer
job 60 moe.bench overhead "" moe_overhead
job 60 attention.bench overhead "" attention_overhead
for f in moe_decode moe_layer moe_overhead attention_overhead; do python - $W/$f.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    if not r["baseline"]:
        print(f"  {r['case'][:34]:34s} {r['impl']:6s} host {r['host_us'] or 0:7.1f} us  launches {r.get('launches')}  as called {r['as_called_ms']}")
PY
done
