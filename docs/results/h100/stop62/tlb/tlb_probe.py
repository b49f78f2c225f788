"""Decode q1: contiguous vs paged (shuffled pages of 16 / 256 as the bench shuffles them), with and without the
page pools' translations warmed at the start (-DDECODE_TLB_WARM=1, suffix _tlb), planned config or forced (w, s). argv: B H KVH D L [variants]
(comma list of NAME = contig | p16 | p256 [ _tlb ] [ _wXsY ]); held timer, 5 rotated rounds."""
import sys
import numpy as np, cupy
from attention import kvcache, decode_configs as dc
from attention.decode_bench import _random_bf16_chunked
from cukernels import dtypes, timing
from cukernels.compile import kernels_built_with
B, H, KVH, D, L = (int(x) for x in sys.argv[1:6])
names = sys.argv[6].split(",")
dt = dtypes.from_name("bf16")
q = dtypes.random((B, 1, H, D), dt, seed=0)
k = _random_bf16_chunked((B, L, KVH, D), dt, 1)
v = _random_bf16_chunked((B, L, KVH, D), dt, 2)
lens = cupy.full((B,), L, dtype=cupy.int32)
orig = dc.search_space


def cache(kind):
    if kind == "contig":
        return k, v, None
    page = int(kind[1:])
    n = L // page
    rng = np.random.default_rng(page)
    table = np.stack([i * n + rng.permutation(n) for i in range(B)]).astype(np.int32)
    return k.reshape(B * n, page, KVH, D), v.reshape(B * n, page, KVH, D), cupy.asarray(table)


def build(name):
    parts = name.split("_")
    kc, vc, table = cache(parts[0])
    force = next(((int(p[1:p.index("s")]), int(p[p.index("s") + 1:])) for p in parts[1:] if p.startswith("w")), None)
    opts = ["-DDECODE_TLB_WARM=1"] if "tlb" in parts else ["-DDECODE_TLB_WARM=0"]
    if force is not None:
        dc.search_space = lambda *a, **kw: [dc.DecodeConfig(head_dim=D, warps=force[0], stages=force[1])] + orig(*a, **kw)
    try:
        with kernels_built_with(opts, "flash_decode"):
            problem, page, sn = kvcache.validate(q, kc, vc, lens, table, None, None, False, None, None, None)
            call = kvcache.DecodeCall(q, kc, vc, None, None, problem, page, sn, False, None, None, None)
    finally:
        dc.search_space = orig
    ptrs = [q.data.ptr, kc.data.ptr, vc.data.ptr, 0, 0, 0, 0, lens.data.ptr, 0 if table is None else table.data.ptr, 0, 0, 0]
    return (lambda: call(ptrs, False, lens, table)), f"{call.config} splits {call.splits} cluster {call.cluster}{' pair' if call.pair else ''}"


variants = {n: build(n) for n in names}
ref = dtypes.to_float32(variants[names[0]][0]()[0])
for n, (f, desc) in variants.items():
    o = dtypes.to_float32(f()[0])
    print(f"{n:16s} {desc}  max|diff| vs {names[0]} {float(cupy.abs(o - ref).max()):.2e}", flush=True)
res = {n: [] for n in names}
for r in range(5):
    for n in names[r % len(names):] + names[:r % len(names)]:
        res[n].append(timing.benchmark(variants[n][0], budget_ms=200).median_ms * 1e3)
base = np.median(res[names[0]])
print(f"== B{B} L{L} h{H}-{KVH} d{D} q1, held us (median of 5 rotated rounds; / {names[0]})")
for n in names:
    m = np.median(res[n])
    print(f"   {n:16s} {m:9.2f}  {m / base:.3f}   {[round(x, 2) for x in res[n]]}", flush=True)
