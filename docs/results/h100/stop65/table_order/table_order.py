"""Diagnostic (issue 12): what in a shuffled block table costs the paged decode its bandwidth. Same cache memory
(the contiguous cache seen as pages, as the bench does), the same kernel, tables that differ only in the order the
pages are visited: in order, the bench's full shuffle, shuffles within windows of W pages (2 MB = TLB large page;
256 KB), and the full shuffle sorted within each split (what a kernel that reads a split's pages in address order
would see). Non-causal, full length: the output is the same for every order. Held time, read flush, rotated rounds."""
import argparse, json
import numpy as np
import cupy
from attention import kvcache, decode_configs
from cukernels import dtypes, timing, device as _device

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--budget-ms", type=float, default=120)
ap.add_argument("--json")
args = ap.parse_args()
CASES = [(1, 8192, 16, 16, 64, 1), (1, 32768, 16, 16, 64, 1), (1, 32768, 16, 16, 64, 4), (8, 1024, 16, 16, 64, 1),
         (8, 8192, 16, 16, 64, 4), (8, 32768, 16, 16, 64, 1), (1, 32768, 32, 8, 128, 1), (8, 32768, 32, 8, 128, 1)]

def call_of(q, k, v, lens, table):
    kvcache._CACHE.clear()
    o = kvcache.flash_attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, check_values=False)
    call = next(iter(kvcache._CACHE._entries.values()))
    base = [q.data.ptr, k.data.ptr, v.data.ptr, 0, 0, 0, 0, lens.data.ptr, 0 if table is None else table.data.ptr, 0, 0, 0]
    return (lambda: call(list(base), False, lens, table)), o, call

rows = []
for (B, L, H, KVH, D, SQ) in CASES:
    dt = dtypes.from_name("bf16")
    q = dtypes.random((B, SQ, H, D), dt, seed=1)
    k = dtypes.random((B, L, KVH, D), dt, seed=10); v = dtypes.random((B, L, KVH, D), dt, seed=11)
    lens = cupy.full((B,), L, dtype=cupy.int32)
    fns = {}
    fns["contig"], ref, _ = call_of(q, k, v, lens, None)
    ref = dtypes.to_float32(ref)
    page = 16
    per = L // page
    kp, vp = k.reshape(B * per, page, KVH, D), v.reshape(B * per, page, KVH, D)
    page_bytes = page * KVH * D * 2
    rng = np.random.default_rng(page)
    full = np.stack([rng.permutation(per) for _ in range(B)])
    # the paged plan's split length in pages
    prob = decode_configs.DecodeProblem(batch=B, seq_q=SQ, heads=H, kv_heads=KVH, head_dim=D, max_keys=L,
                                        dtype="bf16", paged=True)
    dp = decode_configs.plan_call(prob, _device.current(), heads_adjacent=False)
    sp = dp.split_keys // page
    def windowed(w):
        out = np.empty_like(full)
        for b in range(B):
            r = np.random.default_rng(100 + b)
            out[b] = np.concatenate([r.permutation(np.arange(s, min(s + w, per))) for s in range(0, per, w)])
        return out
    sorted_splits = np.concatenate([np.sort(full[:, s:s + sp], axis=1) for s in range(0, per, sp)], axis=1)
    w2m = max(1, (2 << 20) // page_bytes)
    tables = {"inorder": np.tile(np.arange(per), (B, 1)), "shuffled": full, f"win2MB({w2m})": windowed(w2m),
              f"win256K({max(1, (256 << 10) // page_bytes)})": windowed(max(1, (256 << 10) // page_bytes)),
              "split_sorted": sorted_splits}
    for name, t in tables.items():
        tab = cupy.asarray((t + np.arange(B)[:, None] * per).astype(np.int32))
        fn, o, call = call_of(q, kp, vp, lens, tab)
        err = float(cupy.abs(dtypes.to_float32(o) - ref).max())
        assert err < 2e-2, (B, L, name, err)
        fns[name] = fn
    print(f"B{B} L{L} {H}/{KVH} d{D} q{SQ}: paged plan {call.config} splits {call.splits} cluster {call.cluster} "
          f"split pages {sp} page bytes {page_bytes}", flush=True)
    names = list(fns)
    med = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            med[n].append(timing.benchmark(fns[n], budget_ms=args.budget_ms).median_ms * 1e3)
    res = {n: float(np.median(m)) for n, m in med.items()}
    c = res["contig"]
    print("   " + "  ".join(f"{n} {res[n]:.2f} ({res[n] / c:.3f})" for n in names), flush=True)
    rows.append({"case": f"B{B} L{L} H{H}/{KVH} D{D} q{SQ}", "us": res, "rounds": med})
if args.json:
    json.dump({"rows": rows}, open(args.json, "w"), indent=1)
