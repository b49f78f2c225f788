"""Issue 12: head-dim-64 KV heads read in pairs (decode_configs.paired: two heads as one 256-byte row) where the
unpaired grid does not fill the GPU (today's rule pairs only then), against the plan; contiguous and paged, held
with the L2 flushed, rotated rounds, one process."""
import json, sys
import numpy as np
import cupy
from attention import kvcache, decode_configs as dc
from attention.decode_bench import _paged
from cukernels import dtypes, timing

CASES = [(8, 1024, 16, 16, 64, 1), (8, 1024, 16, 16, 64, 4), (8, 8192, 16, 16, 64, 1), (8, 8192, 16, 16, 64, 4),
         (8, 32768, 16, 16, 64, 1), (1, 1024, 16, 16, 64, 1), (1, 8192, 16, 16, 64, 1), (1, 32768, 16, 16, 64, 1),
         (4, 8192, 16, 16, 64, 1)]
real_paired = dc.paired


def forced(problem, spec, heads_adjacent=True):
    if problem.head_dim != 64 or problem.kv_heads % 2 or not heads_adjacent:
        return None
    if problem.seq_q * 2 * (problem.heads // problem.kv_heads) > dc.ROWS_PER_TILE:
        return None
    import dataclasses
    return dataclasses.replace(problem, kv_heads=problem.kv_heads // 2, head_dim=128)


def build(q, k, v, lens, table, pair):
    dc.paired = forced if pair else real_paired
    kvcache._CACHE.clear()
    o = kvcache.flash_attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, check_values=False)
    call = next(iter(kvcache._CACHE._entries.values()))
    base = [q.data.ptr, k.data.ptr, v.data.ptr, 0, 0, 0, 0, lens.data.ptr, 0 if table is None else table.data.ptr, 0, 0, 0]
    dc.paired = real_paired
    return (lambda: call(list(base), False, lens, table)), o, f"{call.config}{' pair' if call.pair else ''} x{call.splits}{' cl' if call.cluster > 1 else ''}"

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
    fns, plans, ref = {}, {}, None
    for pair in (False, True):
        for m, (kk, vv, tt) in modes.items():
            fn, o, p = build(q, kk, vv, lens, tt, pair)
            o = dtypes.to_float32(o)
            ref = o if ref is None else ref
            err = float(cupy.abs(o - ref).max())
            assert err < 1e-2, err
            fns[f"{m}/{'pair' if pair else 'plan'}"], plans[f"{m}/{'pair' if pair else 'plan'}"] = fn, p
    names = list(fns); med = {n: [] for n in names}
    for r in range(5):
        for n in names[r % len(names):] + names[:r % len(names)]:
            med[n].append(timing.benchmark(fns[n], budget_ms=100).median_ms * 1e3)
    res = {n: float(np.median(m)) for n, m in med.items()}
    case = f"B{B} L{L} H{H}/{KVH} D{D} q{SQ}"
    rows.append({"case": case, "us": res, "plans": plans, "rounds": med})
    print(f"{case:<24} {plans['contig/plan']} -> {plans['contig/pair']}  " + "  ".join(
        f"{m} {res[m + '/plan']:.2f}->{res[m + '/pair']:.2f} ({res[m + '/pair'] / res[m + '/plan']:.3f})" for m in modes)
        + f"  paged/contig pair p16 {res['p16/pair'] / res['contig/pair']:.3f} p256 {res['p256/pair'] / res['contig/pair']:.3f}", flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
