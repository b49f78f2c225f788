"""Stop 64: the paged early stage (warp w copies its own group from its own page id, before the length and the
offsets' barrier) against HEAD's kernel (scratch/s64/k_head/flash_decode.cu), with the contiguous call beside (its
SASS is the same in both). One process, held timer, ROUNDS rotated rounds; paged / contiguous ratios and new / old."""
import collections, importlib, json, os, sys
from pathlib import Path
sys.path.insert(0, ".")
import cupy, numpy as np
from cukernels import bench as cb, dtypes, timing
from attention import decode_bench as db
from attention.kvcache import flash_attention_with_kvcache
kv = importlib.import_module("attention.kvcache")
ROUNDS = int(os.environ.get("ROUNDS", "5"))
NEW, OLD = kv.SOURCE, Path("scratch/s64/k_head/flash_decode.cu").resolve()
ROWS = [(1, 1024, 32, 8, 128, 1), (1, 1024, 32, 8, 128, 4), (1, 1024, 32, 32, 128, 1), (1, 1024, 32, 32, 128, 4),
        (1, 1024, 16, 16, 64, 1), (1, 1024, 16, 16, 64, 4), (1, 8192, 16, 16, 64, 1), (1, 32768, 16, 16, 64, 4),
        (8, 1024, 16, 16, 64, 4), (8, 1024, 32, 8, 128, 4), (8, 8192, 16, 16, 64, 4), (64, 1024, 32, 8, 128, 1)]
print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), flush=True)
out = []
for b, n, h, kvh, d, sq in ROWS:
    case = cb.Case(name=f"b{b}_L{n // 1024}k_{h}-{kvh}_d{d}_q{sq}", params=dict(batch=b, length=n, heads=h,
                   kv_heads=kvh, head_dim=d, seq_q=sq), dtype="bf16")
    inp = db.make_inputs(case, 0)
    q, lens = inp["q"], inp["lens"]
    caches, calls, outs = {}, {}, {}
    layouts = {"contiguous": (inp["k"], inp["v"], None)}
    for page in (16, 256):
        layouts[f"p{page}"] = db._paged(inp, page, seed=page)
    for src_name, src in (("new", NEW), ("old", OLD)):
        kv.SOURCE = src
        caches[src_name] = collections.OrderedDict()
        kv._CACHE._entries = caches[src_name]
        for lay, (k, v, table) in layouts.items():
            if src_name == "old" and lay == "contiguous":
                continue
            f = (lambda k=k, v=v, table=table: flash_attention_with_kvcache(q, k, v, cache_seqlens=lens,
                                                                           block_table=table, check_values=False))
            outs[(src_name, lay)] = dtypes.to_float32(f()[0])
            def call(f=f, c=caches[src_name]):
                kv._CACHE._entries = c
                return f()
            calls[f"{lay} {src_name}" if lay != "contiguous" else lay] = call
    kv.SOURCE = NEW
    ref = outs[("new", "contiguous")]
    diffs = {f"{s} {l}": float(cupy.abs(o - ref).max()) for (s, l), o in outs.items()}
    same = {l: bool((outs[("new", l)] == outs[("old", l)]).all()) for l in ("p16", "p256")}
    names = list(calls)
    med = {nm: [] for nm in names}
    for r in range(ROUNDS):
        k0 = r % len(names)
        for nm in names[k0:] + names[:k0]:
            med[nm].append(timing.benchmark(calls[nm], budget_ms=150, min_samples=10).median_ms * 1e3)
    m = {nm: float(np.median(v)) for nm, v in med.items()}
    c = m["contiguous"]
    line = f"{case.name:22s} contig {c:8.2f} us"
    for page in (16, 256):
        o, nw = m[f"p{page} old"], m[f"p{page} new"]
        line += f" | p{page} old x{o / c:.3f} new x{nw / c:.3f} (new/old {nw / o:.3f})"
    line += f" | max|diff| {max(diffs.values()):.2e} bitwise old=new {same}"
    print(line, flush=True)
    out.append({"case": case.name, "median_us": m, "rounds_us": med, "max_abs_diff": diffs, "bitwise_old_new": same})
    del inp, layouts, calls, caches, outs
    cupy.get_default_memory_pool().free_all_blocks()
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "paged_ab.json"), "w"), indent=1)
