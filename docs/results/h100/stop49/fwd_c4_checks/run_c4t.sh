export PYTHONPATH=. PYTHONUNBUFFERED=1; W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader > $W/gpu.txt
timeout 230 python -m pytest -q -x tests/test_attention_gpu.py -k tma tests/test_tma_gpu.py tests/test_varlen_gpu.py > $W/tests2.log 2>&1; echo "tests rc $?" >> $W/tests2.log; tail -2 $W/tests2.log
timeout 90 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py tma > $W/memcheck.log 2>&1; tail -1 $W/memcheck.log
timeout 90 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py tma > $W/racecheck.log 2>&1; tail -1 $W/racecheck.log
for dt in bf16 fp16; do timeout 30 python -m attention.bench --suite quick --no-causal --impl ours,torch-flash,torch-cudnn --dtype $dt --json $W/fwd_quick_${dt}--no-causal.json > $W/fwd_quick_${dt}--no-causal.log 2>&1; done
for dt in bf16 fp16; do timeout 45 python -m attention.bench --suite default --no-causal --impl ours,torch-flash,torch-cudnn --dtype $dt --json $W/fwd_default_${dt}--no-causal.json > $W/fwd_default_${dt}--no-causal.log 2>&1; done
python - $W <<'PY'
import json, glob, sys, os
for f in sorted(glob.glob(sys.argv[1] + "/fwd*.json")):
    d = json.load(open(f))
    print(os.path.basename(f), " ".join(f"{r['case']}:{r['speedup_vs_best_baseline']:.3f}" for r in d["results"] if r.get("impl") == "ours" and r.get("speedup_vs_best_baseline")))
PY
cd $OUT && tar czf w.tgz w && rm -rf w
