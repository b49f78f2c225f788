import json, os, sys
out = sys.argv[1]; n = bad = 0
for b in ("b1", "b8"):
    path = f"{out}/attn_decode_{b}.json"
    if not os.path.exists(path):
        print("missing", path); continue
    d = json.load(open(path)); by = {}
    for r in d["results"]:
        by.setdefault(r["case"], {})[r["impl"]] = r
    for c, m in by.items():
        best = min(m[i]["median_ms"] for i in ("torch-flash", "torch-cudnn") if i in m and m[i].get("median_ms"))
        for p in ("ours-paged16", "ours-paged256"):
            rat = m[p]["median_ms"] / m["ours"]["median_ms"]; n += 1; bad += rat > 1.05
            print(f"{c:<34} {p:<14} {m['ours']['median_ms']*1e3:8.2f} {m[p]['median_ms']*1e3:8.2f} {rat:.3f}{' MISS' if rat > 1.05 else ''}  ours/best torch {best/m['ours']['median_ms']:.3f}  {m[p].get('plan')}")
print(f"paged within 5 %: {n - bad} of {n}")
