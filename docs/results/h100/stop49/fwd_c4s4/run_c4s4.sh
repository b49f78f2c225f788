export PYTHONPATH=. PYTHONUNBUFFERED=1; W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader > $W/gpu.txt; cat $W/gpu.txt
timeout 200 python -m pytest -q -x tests/test_attention_gpu.py -k tma tests/test_tma_gpu.py tests/test_varlen_gpu.py > $W/tests.log 2>&1; echo "tests rc $?" >> $W/tests.log; tail -2 $W/tests.log
timeout 80 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py tma > $W/memcheck.log 2>&1; tail -1 $W/memcheck.log
timeout 80 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py tma > $W/racecheck.log 2>&1; tail -1 $W/racecheck.log
C4PLAN=1 FEW=1 ROUNDS=5 TAG=_c4s4_bf16 timeout 100 python scratch/fwd4sm.py > $W/c4s4_bf16.log 2>&1; cat $W/c4s4_bf16.log
mv $OUT/fwd4sm_c4s4_*.json $W/
for dt in bf16 fp16; do timeout 30 python -m attention.bench --suite quick --no-causal --impl ours,torch-flash,torch-cudnn --dtype $dt --json $W/fwd_quick_${dt}--no-causal.json > $W/fwd_quick_${dt}--no-causal.log 2>&1; done
python - $W <<'PY'
import json, glob, sys, os
for f in sorted(glob.glob(sys.argv[1] + "/fwd_*.json")):
    d = json.load(open(f))
    print(os.path.basename(f), " ".join(f"{r['case']}:{r['speedup_vs_best_baseline']:.3f} {r.get('plan','')[:40]}" for r in d["results"] if r.get("impl") == "ours" and r.get("speedup_vs_best_baseline")))
PY
cd $OUT && tar czf w.tgz w && rm -rf w
