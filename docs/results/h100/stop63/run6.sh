#!/bin/bash
# stop 63, H100: the offline-compile tests with --no-cache (a driver present); the MoE seed 004 and gemm suites and
# the attention overhead suite under the timer's new order (seed 004's host-time layer rows now carry held_ms)
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
python -m pytest -q -p no:cacheprovider tests/test_engine_cpu.py -k "every_profile or repeated" > $OUT/compile_tests.log 2>&1
tail -1 $OUT/compile_tests.log
python -m moe.bench --suite seed004 --json $OUT/moe_seed004.json > $OUT/moe_seed004.txt 2>&1; echo "seed004 rc $?"
python -m moe.bench --suite gemm --impl ours,cublas,torch-grouped --rounds 5 --json $OUT/moe_gemm.json > $OUT/moe_gemm.txt 2>&1; echo "gemm rc $?"
python -m attention.bench --suite overhead --json $OUT/attn_overhead.json > $OUT/attn_overhead.txt 2>&1; echo "overhead rc $?"
python - <<'PY'
import json, os
out = os.environ["OUT"]
for f in ("moe_seed004.json", "moe_gemm.json", "attn_overhead.json"):
    d = json.load(open(f"{out}/{f}"))
    for r in d["results"]:
        if r.get("median_ms") and r["status"] == "ok":
            h = r.get("held_ms")
            print(f"{r['case'][:40]:40s} {r['impl']:14s} {r['median_ms']*1e3:10.1f} us  held {'' if h is None else round(h*1e3,1)!s:>10s}"
                  f"  called {r['as_called_ms']*1e3:10.1f}  x{r.get('speedup_vs_best_baseline') or 0:.3f}  {'H' if r['clocks'].get('held') else 'host'}")
PY
