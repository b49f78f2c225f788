"""Issue 12: short caches split for half the SMs (decode_configs.SHORT_SPLIT_KEYS 1024) against the old plan (0),
contiguous and paged, held with the L2 flushed, rotated rounds, one process."""
import json, sys
import numpy as np
import cupy
from attention import kvcache, decode_configs as dc
from attention.decode_bench import _paged
from cukernels import dtypes, timing

CASES = [(1, 1024, 32, 32, 128, 1), (1, 1024, 32, 32, 128, 4), (1, 1024, 16, 16, 64, 1), (1, 1024, 16, 16, 64, 4),
         (8, 1024, 32, 8, 128, 1), (8, 1024, 32, 8, 128, 4), (1, 1024, 32, 8, 128, 1), (8, 1024, 16, 16, 64, 1)]

def build(q, k, v, lens, table, short):
    dc.SHORT_SPLIT_KEYS = short
    kvcache._CACHE.clear()
    o = kvcache.flash_attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, check_values=False)
    call = next(iter(kvcache._CACHE._entries.values()))
    base = [q.data.ptr, k.data.ptr, v.data.ptr, 0, 0, 0, 0, lens.data.ptr, 0 if table is None else table.data.ptr, 0, 0, 0]
    return (lambda: call(list(base), False, lens, table)), o, call.splits

rows = []
for (B, L, H, KVH, D, SQ) in CASES:
    dt = dtypes.from_name("bf16")
    q = dtypes.random((B, SQ, H, D), dt, seed=1)
    k = cupy.empty((B, L, KVH, D), dtype=dt); v = cupy.empty_like(k)
    for b in range(B):
        k[b] = dtypes.random((L, KVH, D), dt, seed=10 + b); v[b] = dtypes.random((L, KVH, D), dt, seed=5000 + b)
    lens = cupy.full((B,), L, dtype=cupy.int32)
    modes = {"contig": (k, v, None), "p16": _paged({"k": k, "v": v}, 16, seed=16),
             "p256": _paged({"k": k, "v": v}, 256, seed=256)}
    fns, splits, ref = {}, {}, None
    for short in (0, 1024):
        for m, (kk, vv, tt) in modes.items():
            fn, o, s = build(q, kk, vv, lens, tt, short)
            o = dtypes.to_float32(o)
            ref = o if ref is None else ref
            assert float(cupy.abs(o - ref).max()) < 1e-2
            fns[f"{m}/{'new' if short else 'old'}"], splits[f"{m}/{'new' if short else 'old'}"] = fn, s
    names = list(fns); med = {n: [] for n in names}
    for r in range(5):
        for n in names[r % len(names):] + names[:r % len(names)]:
            med[n].append(timing.benchmark(fns[n], budget_ms=100).median_ms * 1e3)
    res = {n: float(np.median(m)) for n, m in med.items()}
    case = f"B{B} L{L} H{H}/{KVH} D{D} q{SQ}"
    rows.append({"case": case, "us": res, "splits": splits, "rounds": med})
    print(f"{case:<24} splits {splits['contig/old']}->{splits['contig/new']}  " + "  ".join(
        f"{m} {res[m + '/old']:.2f}->{res[m + '/new']:.2f} ({res[m + '/new'] / res[m + '/old']:.3f})" for m in modes)
        + f"  paged/contig new p16 {res['p16/new'] / res['contig/new']:.3f} p256 {res['p256/new'] / res['contig/new']:.3f}", flush=True)
dc.SHORT_SPLIT_KEYS = 1024
json.dump(rows, open(sys.argv[1], "w"), indent=1)
