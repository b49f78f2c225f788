"""Stall reasons per opcode from ncu source-page CSVs (ours_src.csv.gz, cudnn_src.csv.gz: `ncu -i X.ncu-rep --page source --csv --print-source sass`), run in this folder."""
import csv, gzip, collections, re, sys
def load(f):
    rows = list(csv.reader(gzip.open(f, "rt")))
    return rows[1], rows[2:]
def region(op):
    o = op.split()[0] if op else ""
    if o.startswith("@"): o = op.split()[1]
    return o.split(".")[0]
for who in ("ours", "cudnn"):
    hdr, data = load(f"{who}_src.csv.gz")
    idx = {h: i for i, h in enumerate(hdr)}
    scols = [h for h in hdr if h.startswith("stall_")]
    tot = collections.Counter(); byop = collections.defaultdict(collections.Counter)
    samples = 0
    for r in data:
        s = int(r[idx["Warp Stall Sampling (All Samples)"]] or 0)
        samples += s
        op = region(r[idx["Source"]].strip())
        for c in scols:
            v = r[idx[c]]
            v = float(v) if v not in ("", None) else 0
            tot[c] += v
            byop[op][c] += v
        byop[op]["_all"] += s
    print(f"== {who}: samples {samples}")
    for c, v in tot.most_common(12):
        print(f"  {c:28s} {v:8.0f} {100*v/samples:5.1f}%")
    print("  by opcode (all samples): ", ", ".join(f"{op} {byop[op]['_all']}" for op in sorted(byop, key=lambda o: -byop[o]['_all'])[:14]))
    # wait stalls by opcode
    print("  wait by opcode: ", ", ".join(f"{op} {byop[op]['stall_wait']:.0f}" for op in sorted(byop, key=lambda o: -byop[o]['stall_wait'])[:10]))
