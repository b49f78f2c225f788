#!/bin/bash
# stop 66 final tree (inputs seeded by case name): on an H200 the MoE suites (+ the T1 timeline);
# on an H100 the attention decode suite and the MoE suites
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
if nvidia-smi -L | grep -q H200; then
  timeout 150 python tools/decode_timeline.py --case E64top8:1 --case seed004:1 --calls 9 --json $OUT/timeline.json > $OUT/timeline.log 2>&1
  echo "timeline rc $?"; grep "layer:\|routed\|up items done\|down items done\|exit" $OUT/timeline.log
else
  timeout 300 python -m attention.bench --suite decode --budget-ms 100 --rounds 2 --json $OUT/attn_decode.json > $OUT/attn_decode.txt 2>&1
  echo "attn decode rc $?"
  python docs/results/h100/stop65/suite/summary.py run=$OUT/attn_decode.json
fi
timeout 150 python -m moe.bench --suite decode --json $OUT/moe_decode.json > $OUT/moe_decode.txt 2>&1; echo "moe decode rc $?"
grep -A14 "^decode layers" $OUT/moe_decode.txt
timeout 200 python -m moe.bench --suite gemm --impl ours,cublas,torch-grouped --rounds 5 --json $OUT/moe_gemm.json > $OUT/moe_gemm.txt 2>&1; echo "gemm rc $?"
timeout 200 python -m moe.bench --suite seed004 --json $OUT/moe_seed004.json > $OUT/moe_seed004.txt 2>&1; echo "seed004 rc $?"
python - <<'PY'
import json, os
out = os.environ["OUT"]
for f in ("moe_gemm.json", "moe_seed004.json"):
    try:
        d = json.load(open(f"{out}/{f}"))
    except Exception as e:
        print(f, e); continue
    by = {(r["case"], r["impl"]): r for r in d["results"] if r.get("median_ms") and r["status"] == "ok"}
    for (c, i), r in by.items():
        if i != "ours" or not ("layer" in c or "gemm" in c):
            continue
        g, l = by.get((c, "torch-grouped")), by.get((c, "torch-loop"))
        h = r.get("held_ms")
        print(f"{c[:38]:38s} ours {r['median_ms']*1e3:9.1f} us held {'' if h is None else round(h*1e3,1)!s:>9s} called {r['as_called_ms']*1e3:9.1f}"
              f"  /grouped {g['median_ms']/r['median_ms'] if g else 0:.3f}  /loop {l['median_ms']/r['median_ms'] if l else 0:.3f}  x-best {r.get('speedup_vs_best_baseline') or 0:.3f}")
PY
