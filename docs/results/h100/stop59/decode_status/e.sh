#!/bin/bash
# stop 59 run e: the committed fast page division - GPU tests, memcheck/racecheck, the decode suite b1 and b8
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt
python -m pytest -q -x tests/test_kvcache_gpu.py > $OUT/tests_kvcache.log 2>&1; tail -1 $OUT/tests_kvcache.log
timeout 150 compute-sanitizer --tool memcheck python tools/sanitize.py decode > $OUT/memcheck_decode.log 2>&1; tail -1 $OUT/memcheck_decode.log
timeout 150 compute-sanitizer --tool racecheck python tools/sanitize.py decode > $OUT/racecheck_decode.log 2>&1; tail -1 $OUT/racecheck_decode.log
for b in b1 b8; do
python -m attention.bench --suite decode --case ${b}_ --budget-ms 100 --rounds 2 --json $OUT/attn_decode_$b.json > $OUT/attn_decode_$b.log 2>&1
done
python - <<'PY'
import json, os
out = os.environ["OUT"]; n = bad = 0
for b in ("b1", "b8"):
    d = json.load(open(f"{out}/attn_decode_{b}.json")); by = {}
    for r in d["results"]:
        by.setdefault(r["case"], {})[r["impl"]] = r
    for c, m in by.items():
        best = min(m[i]["median_ms"] for i in ("torch-flash", "torch-cudnn") if i in m and m[i].get("median_ms"))
        for p in ("ours-paged16", "ours-paged256"):
            rat = m[p]["median_ms"] / m["ours"]["median_ms"]; n += 1; bad += rat > 1.05
            print(f"{c:<34} {p:<14} {m['ours']['median_ms']*1e3:8.2f} {m[p]['median_ms']*1e3:8.2f} {rat:.3f}  ours/best torch {best/m['ours']['median_ms']:.3f}  {m[p].get('plan')}")
print(f"paged within 5 %: {n - bad} of {n}")
PY
