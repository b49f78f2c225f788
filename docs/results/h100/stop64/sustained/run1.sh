#!/bin/bash
# stop 64, H100: the sustained timer's GPU test; the gemm suite and the seed 004 layer rows with --sustained
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
nvidia-smi -q -d POWER | grep -i "limit" | head -4 | tee -a $OUT/gpu.txt
python -m pytest -q -s -p no:cacheprovider tests/test_engine_gpu.py -k "sustained" > $OUT/sustained_test.log 2>&1
tail -3 $OUT/sustained_test.log
python -m moe.bench --suite gemm --impl ours,cublas,torch-grouped --rounds 5 --sustained 6 --json $OUT/moe_gemm.json > $OUT/moe_gemm.txt 2>&1; echo "gemm rc $?"
python -m moe.bench --suite seed004 --case layer --sustained 6 --json $OUT/moe_layer.json > $OUT/moe_layer.txt 2>&1; echo "layer rc $?"
python - <<'PY'
import json, os
out = os.environ["OUT"]
for f in ("moe_gemm.json", "moe_layer.json"):
    d = json.load(open(f"{out}/{f}"))
    for r in d["results"]:
        if r.get("median_ms") and r["status"] == "ok":
            s = r.get("sustained") or {}
            x = s.get("speedup_vs_best_baseline")
            print(f"{r['case'][:34]:34s} {r['impl']:13s} held {r['median_ms']*1e3:9.1f} x{r.get('speedup_vs_best_baseline') or 0:.3f} | "
                  f"sust {1e3*(s.get('ms_per_call') or 0):9.1f} us {s.get('mj_per_call') or 0:8.1f} mJ {s.get('power_w') or 0:5.0f} W "
                  f"{s.get('sm_clock_mean_mhz') or 0:5.0f} MHz x{x or 0:.3f} passes {[round(1e3*p['ms_per_call'],1) for p in s.get('passes', [])]}")
PY
