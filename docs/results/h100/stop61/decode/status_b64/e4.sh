# stop 61: the decode suite at B64 on the committed tree (paged rows with the block lookups)
export PYTHONPATH=.
O=$OUT/decode_b64; mkdir -p $O; git log -1 --format=%h > $O/tree.txt
t=$(date +%s); timeout 500 python -m attention.bench --suite decode --case b64_ --budget-ms 100 --rounds 2 --json $O/attn_decode_b64.json > $O/attn_decode_b64.log 2>&1; echo "b64 suite rc $? $(( $(date +%s) - t )) s"
python - <<'PY'
import json, os
o = os.environ["OUT"] + "/decode_b64"
d = json.load(open(f"{o}/attn_decode_b64.json")); by = {}
for r in d["results"]:
    by.setdefault(r["case"], {})[r["impl"]] = r
n = bad = 0
for c, m in by.items():
    if not (m.get("ours") or {}).get("median_ms"):
        print(c, "skipped:", (m.get("ours") or {}).get("reason")); continue
    best = min(m[i]["median_ms"] for i in ("torch-flash", "torch-cudnn") if i in m and m[i].get("median_ms"))
    for p in ("ours-paged16", "ours-paged256"):
        if not (m.get(p) or {}).get("median_ms"): continue
        rat = m[p]["median_ms"] / m["ours"]["median_ms"]; n += 1; bad += rat > 1.05
        print(f"{c:<34} {p:<14} {rat:.3f}{' MISS' if rat > 1.05 else ''}  ours/best torch {best/m['ours']['median_ms']:.3f}")
print(f"paged within 5 %: {n - bad} of {n}")
PY
grep -E "copy|GB/s" $O/attn_decode_b64.log | tail -3
