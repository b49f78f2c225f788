"""A/B of the paged decode kernel's block-table prefetch (-DDECODE_TABLE_PREFETCH=0/1) against the contiguous
cache, held time (read flush), rotated rounds, one process. Outputs compared with the contiguous call."""
import argparse, json
import numpy as np
import cupy
from attention import kvcache
from attention.decode_bench import _paged
from cukernels import dtypes, timing, compile as _compile

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--budget-ms", type=float, default=150)
ap.add_argument("--variants", default="0,1")
ap.add_argument("--macro", default="DECODE_TABLE_PREFETCH")
ap.add_argument("--json")
ap.add_argument("--plan-ab", action="store_true", help="variant 1: the paged call planned as the contiguous one")
args = ap.parse_args()

CASES = [(1, 1024, 32, 8, 128, 1), (1, 1024, 16, 16, 64, 1), (1, 8192, 32, 8, 128, 1), (1, 8192, 16, 16, 64, 1),
         (1, 8192, 16, 16, 64, 4), (1, 32768, 16, 16, 64, 1), (1, 32768, 32, 32, 128, 1), (8, 1024, 16, 16, 64, 1),
         (8, 8192, 16, 16, 64, 4), (8, 32768, 32, 8, 128, 1), (8, 32768, 16, 16, 64, 1), (64, 8192, 32, 8, 128, 1),
         (8, 131072, 16, 16, 64, 4)]
VARIANTS = [int(x) for x in args.variants.split(",")]
_kernel = _compile.kernel
extra = []
def kernel(source, name, *, options=()):
    return _kernel(source, name, options=tuple(options) + tuple(extra))
kvcache._compile.kernel = kernel
from attention import decode_configs
_space = decode_configs.search_space
as_contig = [False]
def search_space(head_dim, waves=0.0, paged=False, keys=0, bandwidth_gbs=0.0):
    return _space(head_dim, waves, paged and not as_contig[0], keys, bandwidth_gbs)
decode_configs.search_space = search_space

def build(q, k, v, lens, table):
    kvcache._CACHE.clear()
    o = kvcache.flash_attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, check_values=False)
    call = next(iter(kvcache._CACHE._entries.values()))
    print(f"  plan: paged={table is not None} {call.config} splits {call.splits} cluster {call.cluster}", flush=True)
    base = [q.data.ptr, k.data.ptr, v.data.ptr, 0, 0, 0, 0, lens.data.ptr, 0 if table is None else table.data.ptr, 0, 0, 0]
    return (lambda: call(list(base), False, lens, table)), o

rows = []
for (B, L, H, KVH, D, SQ) in CASES:
    dt = dtypes.from_name("bf16")
    q = dtypes.random((B, SQ, H, D), dt, seed=1)
    k = cupy.empty((B, L, KVH, D), dtype=dt); v = cupy.empty_like(k)
    for b in range(B):
        k[b] = dtypes.random((L, KVH, D), dt, seed=10 + b); v[b] = dtypes.random((L, KVH, D), dt, seed=5000 + b)
    lens = cupy.full((B,), L, dtype=cupy.int32)
    fns = {}
    extra[:] = []
    fns["contig"], ref = build(q, k, v, lens, None)
    ref = dtypes.to_float32(ref)
    for page in (16, 256, "16seq"):
        if page == "16seq":  # pages in order: the table's lookups without the shuffle's scattered reads
            per = L // 16
            kp, vp = k.reshape(B * per, 16, KVH, D), v.reshape(B * per, 16, KVH, D)
            table = cupy.arange(B * per, dtype=cupy.int32).reshape(B, per)
        else:
            kp, vp, table = _paged({"k": k, "v": v}, page, seed=page)
        for var in (VARIANTS[:1] if page == "16seq" else VARIANTS):
            if args.plan_ab:
                as_contig[0] = bool(var)
            else:
                extra[:] = [f"-D{args.macro}={var}"]
            fn, o = build(q, kp, vp, lens, table)
            err = float(cupy.abs(dtypes.to_float32(o) - ref).max())
            assert err < 1e-2, (B, L, page, var, err)
            as_contig[0] = False
            fns[f"p{page}/pf{var}"] = fn
    names = list(fns)
    med = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            med[n].append(timing.benchmark(fns[n], budget_ms=args.budget_ms).median_ms * 1e3)
    res = {n: float(np.median(m)) for n, m in med.items()}
    row = {"case": f"B{B} L{L} H{H}/{KVH} D{D} q{SQ}", "us": res, "rounds": med}
    rows.append(row)
    c = res["contig"]
    print(f"{row['case']:<28} contig {c:8.2f}  " + "  ".join(f"{n} {res[n]:8.2f} ({res[n]/c:.3f})" for n in names[1:]), flush=True)
    del q, k, v, fns
    cupy.get_default_memory_pool().free_all_blocks()
if args.json:
    json.dump(rows, open(args.json, "w"), indent=1)
