#!/bin/bash
# stop 59 run l: the committed tree (short caches of one sequence split for half the SMs): GPU tests, decode b1
export PYTHONPATH=.
python -m pytest -q -x tests/test_kvcache_gpu.py > $OUT/tests_kvcache.log 2>&1; tail -1 $OUT/tests_kvcache.log
python -m attention.bench --suite decode --case b1_ --budget-ms 100 --rounds 2 --json $OUT/attn_decode_b1.json > $OUT/attn_decode_b1.log 2>&1
python - <<'PY'
import json, os
out = os.environ["OUT"]; n = bad = 0; d = json.load(open(f"{out}/attn_decode_b1.json")); by = {}
for r in d["results"]:
    by.setdefault(r["case"], {})[r["impl"]] = r
for c, m in by.items():
    best = min(m[i]["median_ms"] for i in ("torch-flash", "torch-cudnn") if i in m and m[i].get("median_ms"))
    rats = [m[p]["median_ms"] / m["ours"]["median_ms"] for p in ("ours-paged16", "ours-paged256")]
    n += 2; bad += sum(r > 1.05 for r in rats)
    print(f"{c:<34} ours {m['ours']['median_ms']*1e3:8.2f} us  x torch {best/m['ours']['median_ms']:.3f}  paged {rats[0]:.3f} {rats[1]:.3f}  {m['ours'].get('plan')}")
print(f"paged within 5 %: {n - bad} of {n}")
PY
