#!/bin/bash
# stop 66: the MoE suites (decode with held_ms, gemm with rounds, seed 004) on the tree with the skinny loads' L2 hint, on the card that came
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
if nvidia-smi -L | grep -q H200; then
  timeout 200 python tools/decode_timeline.py --case E64top8:1 --case seed004:1 --calls 9 --json $OUT/timeline.json > $OUT/timeline.log 2>&1
  echo "timeline rc $?"; grep -v "^  [a-z]" $OUT/timeline.log; grep "routed\|up items done\|down items done\|exit" $OUT/timeline.log
fi
python -m moe.bench --suite decode --json $OUT/moe_decode.json > $OUT/moe_decode.txt 2>&1; echo "decode rc $?"
grep -A14 "^decode layers" $OUT/moe_decode.txt
python -m moe.bench --suite gemm --impl ours,cublas,torch-grouped --rounds 5 --json $OUT/moe_gemm.json > $OUT/moe_gemm.txt 2>&1; echo "gemm rc $?"
python -m moe.bench --suite seed004 --json $OUT/moe_seed004.json > $OUT/moe_seed004.txt 2>&1; echo "seed004 rc $?"
python - <<'PY'
import json, os
out = os.environ["OUT"]
for f in ("moe_gemm.json", "moe_seed004.json"):
    d = json.load(open(f"{out}/{f}"))
    for r in d["results"]:
        if r.get("median_ms") and r["status"] == "ok" and ("layer" in r["case"] or "gemm" in r["case"]):
            h = r.get("held_ms")
            print(f"{r['case'][:40]:40s} {r['impl']:14s} {r['median_ms']*1e3:10.1f} us  held {'' if h is None else round(h*1e3,1)!s:>10s}"
                  f"  called {r['as_called_ms']*1e3:10.1f}  x{r.get('speedup_vs_best_baseline') or 0:.3f}")
PY
