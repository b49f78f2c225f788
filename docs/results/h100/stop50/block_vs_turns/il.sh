export PYTHONPATH=. PYTHONUNBUFFERED=1
W=$OUT/il; mkdir -p $W; nvidia-smi -L > $W/gpus.txt
for dt in fp16 bf16; do
  for m in "" "--interleave"; do
    n=${dt}$( [ -n "$m" ] && echo _il )
    timeout 120 python -m attention.bench --suite seed004 --causal --dtype $dt --impl ours,torch-flash,torch-cudnn $m --json $W/$n.json > $W/$n.log 2>&1; echo "$n rc $?"
  done
done
timeout 100 python -m attention.bench --suite overhead --interleave --json $W/overhead_il.json > $W/overhead_il.log 2>&1; echo "overhead rc $?"
python - $W <<'PY'
import json, glob, sys, os
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(f))
    for r in d["results"]:
        if r.get("median_ms") and r["case"].startswith("seed004"):
            print(os.path.basename(f), r["case"], r["impl"], f"{r['median_ms']*1e3:.1f}", r.get("round_medians_ms") and [round(x*1e3,1) for x in r["round_medians_ms"]], r.get("speedup_vs_best_baseline") and round(r["speedup_vs_best_baseline"],3))
    if "overhead" in f:
        print(os.path.basename(f), len(d["results"]), "rows", sorted({r["status"] for r in d["results"]}))
PY
cd $OUT && tar czf il.tgz il && rm -rf il
