"""Decode ring configs forced for the contiguous and the paged cache (held time, rotated rounds, one process)."""
import argparse, json
import numpy as np
import cupy
from attention import kvcache, decode_configs
from attention.decode_bench import _paged
from cukernels import dtypes, timing

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--budget-ms", type=float, default=100)
ap.add_argument("--json")
args = ap.parse_args()

CASES = [(1, 1024, 32, 8, 128, 1), (1, 1024, 16, 16, 64, 1), (1, 8192, 32, 8, 128, 1), (1, 8192, 16, 16, 64, 1),
         (1, 32768, 16, 16, 64, 1), (8, 1024, 16, 16, 64, 1), (8, 1024, 32, 8, 128, 1), (1, 32768, 32, 8, 128, 1)]
CONFIGS = {64: [None, (4, 4), (4, 6), (4, 8), (8, 3), (8, 4), (8, 6)], 128: [None, (4, 3), (4, 4), (4, 6), (8, 3), (8, 4)]}
_space = decode_configs.search_space
force = [None]
def search_space(head_dim, waves=0.0, paged=False, keys=0, bandwidth_gbs=0.0):
    rest = _space(head_dim, waves, paged, keys, bandwidth_gbs)
    if force[0] is None:
        return rest
    return [decode_configs.DecodeConfig(head_dim=head_dim, warps=force[0][0], stages=force[0][1])] + rest
decode_configs.search_space = search_space

def build(q, k, v, lens, table):
    kvcache._CACHE.clear()
    o = kvcache.flash_attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, check_values=False)
    call = next(iter(kvcache._CACHE._entries.values()))
    base = [q.data.ptr, k.data.ptr, v.data.ptr, 0, 0, 0, 0, lens.data.ptr, 0 if table is None else table.data.ptr, 0, 0, 0]
    return (lambda: call(list(base), False, lens, table)), o, f"{call.config} x{call.splits}"

rows = []
for (B, L, H, KVH, D, SQ) in CASES:
    dt = dtypes.from_name("bf16")
    q = dtypes.random((B, SQ, H, D), dt, seed=1)
    k = cupy.empty((B, L, KVH, D), dtype=dt); v = cupy.empty_like(k)
    for b in range(B):
        k[b] = dtypes.random((L, KVH, D), dt, seed=10 + b); v[b] = dtypes.random((L, KVH, D), dt, seed=5000 + b)
    lens = cupy.full((B,), L, dtype=cupy.int32)
    modes = {"contig": (k, v, None)}
    for page in (16, 256):
        modes[f"p{page}"] = _paged({"k": k, "v": v}, page, seed=page)
    fns, labels, ref = {}, {}, None
    for cfg in CONFIGS[D]:
        force[0] = cfg
        for m, (kk, vv, tt) in modes.items():
            fn, o, label = build(q, kk, vv, lens, tt)
            o = dtypes.to_float32(o)
            if ref is None:
                ref = o
            err = float(cupy.abs(o - ref).max())
            assert err < 1e-2, (B, L, cfg, m, err)
            name = f"{'plan' if cfg is None else f'{cfg[0]}x{cfg[1]}'}/{m}"
            fns[name], labels[name] = fn, label
    force[0] = None
    names = list(fns)
    med = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            med[n].append(timing.benchmark(fns[n], budget_ms=args.budget_ms).median_ms * 1e3)
    res = {n: float(np.median(m)) for n, m in med.items()}
    case = f"B{B} L{L} H{H}/{KVH} D{D} q{SQ}"
    rows.append({"case": case, "us": res, "labels": labels, "rounds": med})
    c = res["plan/contig"]
    print(f"{case}: planned contig {c:.2f} us ({labels['plan/contig']}), p16 {labels['plan/p16']}")
    for cfg in CONFIGS[D]:
        tag = 'plan' if cfg is None else f'{cfg[0]}x{cfg[1]}'
        print(f"   {tag:<5} " + "  ".join(f"{m} {res[f'{tag}/{m}']:8.2f} ({res[f'{tag}/{m}']/c:.3f})" for m in modes), flush=True)
    del q, k, v, fns, modes
    cupy.get_default_memory_pool().free_all_blocks()
if args.json:
    json.dump(rows, open(args.json, "w"), indent=1)
