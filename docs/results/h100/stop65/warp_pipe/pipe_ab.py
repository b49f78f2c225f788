"""A/B (issue 12): the decode kernel built with -DDECODE_WARP_PIPE=1 (warp-own stage slices) against the tree, contiguous and paged (pages of 16 and
256 shuffled as the bench shuffles them), held time (read flush), rotated rounds, one process. Outputs checked
against the contiguous cp.async call."""
import argparse, json
import numpy as np
import cupy
from attention import kvcache, decode_configs
from attention.decode_bench import _paged
from cukernels import dtypes, timing

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--budget-ms", type=float, default=100)
ap.add_argument("--json")
ap.add_argument("--cases", default="all")
ap.add_argument("--set", default="main")
args = ap.parse_args()
CASES = [(1, 1024, 32, 8, 128, 1), (1, 1024, 16, 16, 64, 1), (1, 1024, 32, 32, 128, 4), (1, 8192, 16, 16, 64, 1),
         (1, 8192, 16, 16, 64, 4), (1, 32768, 16, 16, 64, 1), (1, 32768, 32, 8, 128, 1), (8, 1024, 16, 16, 64, 1),
         (8, 1024, 32, 8, 128, 4), (8, 8192, 16, 16, 64, 4), (8, 8192, 32, 8, 128, 1), (8, 32768, 32, 8, 128, 1),
         (64, 1024, 16, 16, 64, 1), (64, 1024, 32, 8, 128, 1), (64, 8192, 16, 16, 64, 4), (1, 131072, 32, 32, 128, 1),
         (8, 131072, 32, 8, 128, 1), (1, 8192, 16, 16, 256, 1)]
if args.set == "d64":
    CASES = [(b, L, 16, 16, 64, sq) for b in (1, 8) for L in (1024, 8192, 32768, 131072) for sq in (1, 4)
             if b * L <= 8 * 131072] + [(2, 32768, 16, 16, 64, 1), (4, 32768, 16, 16, 64, 1)]
if args.set == "long64":
    CASES = [(8, 8192, 16, 16, 64, 1), (8, 8192, 16, 16, 64, 4), (8, 32768, 16, 16, 64, 1), (8, 32768, 16, 16, 64, 4),
             (8, 131072, 16, 16, 64, 1), (8, 131072, 16, 16, 64, 4), (2, 32768, 16, 16, 64, 1), (4, 32768, 16, 16, 64, 1),
             (1, 131072, 16, 16, 64, 1), (1, 131072, 16, 16, 64, 4), (4, 8192, 16, 16, 64, 1), (16, 8192, 16, 16, 64, 1)]
if args.set == "d128":
    CASES = [(b, L, h, kv, 128, sq) for b in (1, 8) for L in (1024, 8192, 32768) for (h, kv) in ((32, 8), (32, 32))
             for sq in (1, 4)]
if args.set == "d256":
    CASES = [(1, 1024, 16, 16, 256, 1), (1, 8192, 16, 16, 256, 1), (1, 32768, 8, 8, 256, 1), (1, 32768, 16, 4, 256, 4),
             (8, 1024, 16, 16, 256, 1), (8, 8192, 16, 16, 256, 1), (8, 8192, 16, 16, 256, 4), (8, 32768, 16, 4, 256, 1),
             (64, 1024, 8, 8, 256, 1), (64, 8192, 8, 2, 256, 1)]
if args.cases != "all":
    CASES = [CASES[int(i)] for i in args.cases.split(",")]

def call_of(q, k, v, lens, table, tma):
    kvcache._CACHE.clear()
    decode_configs.WARP_PIPE = tma
    o = kvcache.flash_attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, check_values=False)
    call = next(iter(kvcache._CACHE._entries.values()))
    assert call.config.warp_pipe == tma
    base = [q.data.ptr, k.data.ptr, v.data.ptr, 0, 0, 0, 0, lens.data.ptr, 0 if table is None else table.data.ptr, 0, 0, 0]
    return (lambda: call(list(base), False, lens, table)), o, call

rows = []
for (B, L, H, KVH, D, SQ) in CASES:
    dt = dtypes.from_name("bf16")
    q = dtypes.random((B, SQ, H, D), dt, seed=1)
    k = dtypes.random((B, L, KVH, D), dt, seed=10); v = dtypes.random((B, L, KVH, D), dt, seed=11)
    lens = cupy.full((B,), L, dtype=cupy.int32)
    fns, plans = {}, {}
    ref = None
    for page in (None, 16, 256):
        if page is None:
            kk, vv, tab = k, v, None
        else:
            kk, vv, tab = _paged({"k": k, "v": v}, page, seed=page)
        for tma in (False, True):
            name = f"{'contig' if page is None else 'p%d' % page}/{'pipe' if tma else 'tree'}"
            fn, o, call = call_of(q, kk, vv, lens, tab, tma)
            if ref is None:
                ref = dtypes.to_float32(o)
            err = float(cupy.abs(dtypes.to_float32(o) - ref).max())
            assert err < 2e-2, (B, L, name, err)
            fns[name] = fn
            plans[name] = f"{call.config} x{call.splits} c{call.cluster} err {err:.1e}"
    print(f"B{B} L{L} {H}/{KVH} d{D} q{SQ}: " + "; ".join(f"{n}: {p}" for n, p in plans.items()), flush=True)
    names = list(fns)
    med = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            med[n].append(timing.benchmark(fns[n], budget_ms=args.budget_ms).median_ms * 1e3)
    res = {n: float(np.median(m)) for n, m in med.items()}
    c = res["contig/tree"]
    line = "  ".join(f"{n} {res[n]:.2f} ({res[n] / c:.3f})" for n in names)
    print("   " + line, flush=True)
    rows.append({"case": f"B{B} L{L} H{H}/{KVH} D{D} q{SQ}", "us": res, "rounds": med, "plans": plans})
print("\nsummary: case | contig pipe/tree | p16 pipe/tree-contig (tree-paged/tree-contig) | p256 same | p16 pipe / pipe-contig")
for r in rows:
    u = r["us"]
    print(f"{r['case']:28s} contig {u['contig/pipe'] / u['contig/tree']:.3f} | p16 {u['p16/pipe'] / u['contig/tree']:.3f} "
          f"({u['p16/tree'] / u['contig/tree']:.3f}) | p256 {u['p256/pipe'] / u['contig/tree']:.3f} ({u['p256/tree'] / u['contig/tree']:.3f})"
          f" | p16/pipe-contig {u['p16/pipe'] / u['contig/pipe']:.3f}")
if args.json:
    json.dump({"rows": rows}, open(args.json, "w"), indent=1)
