"""B1 h16-16 d64 q1 decode: contiguous vs paged (pages of 16 in order / shuffled, 256 shuffled), planned and with the
other config forced (contiguous plan w4 s4, paged plan w8 s3 for >= 8k keys). argv: L (keys) [mode]: mode 'time'
(held timer, 5 rotated rounds) or a variant name (one warm call of it, for ncu)."""
import sys
import numpy as np, cupy
from attention import kvcache, decode_configs as dc
from attention.decode_bench import _random_bf16_chunked
from cukernels import dtypes, timing
from cukernels.compile import kernels_built_with
L = int(sys.argv[1]); mode = sys.argv[2] if len(sys.argv) > 2 else "time"
dt = dtypes.from_name("bf16")
q = dtypes.random((1, 1, 16, 64), dt, seed=0)
k = _random_bf16_chunked((1, L, 16, 64), dt, 1)
v = _random_bf16_chunked((1, L, 16, 64), dt, 2)
lens = cupy.full((1,), L, dtype=cupy.int32)


def paged(page, shuffle):
    n = L // page
    order = np.random.default_rng(page).permutation(n) if shuffle else np.arange(n)
    return (k.reshape(n, page, 16, 64), v.reshape(n, page, 16, 64), cupy.asarray(order[None].astype(np.int32)))


orig = dc.search_space


def build(kc, vc, table, force=None):
    if force is not None:
        dc.search_space = lambda *a, **kw: [dc.DecodeConfig(head_dim=64, warps=force[0], stages=force[1])] + orig(*a, **kw)
    try:
        problem, page, sn = kvcache.validate(q, kc, vc, lens, table, None, None, False, None, None, None)
        call = kvcache.DecodeCall(q, kc, vc, None, None, problem, page, sn, False, None, None, None)
    finally:
        dc.search_space = orig
    ptrs = [q.data.ptr, kc.data.ptr, vc.data.ptr, 0, 0, 0, 0, lens.data.ptr, 0 if table is None else table.data.ptr, 0, 0, 0]
    fn = lambda: call(ptrs, False, lens, table)
    return fn, f"{call.config} splits {call.splits} cluster {call.cluster}"


def old(*args):
    with kernels_built_with(["-DDECODE_BLOCK_LOOKUPS=0"], "flash_decode") as built:
        r = build(*args)
    assert built, "the old variant built nothing"
    return r


variants = {
    "contig": build(k, v, None),
    "p16_inorder": build(*paged(16, False)),
    "p16_inorder_old": old(*paged(16, False)),
    "p16_inorder_w4s4": build(*paged(16, False), (4, 4)),
    "p16_inorder_w4s4_old": old(*paged(16, False), (4, 4)),
    "p16_shuffled": build(*paged(16, True)),
    "p16_shuffled_old": old(*paged(16, True)),
    "p256_shuffled": build(*paged(256, True)),
    "p256_shuffled_old": old(*paged(256, True)),
}
if mode != "time":
    f = variants[mode][0]
    f(); cupy.cuda.Device().synchronize()
    f(); cupy.cuda.Device().synchronize()
    print(mode, variants[mode][1])
    sys.exit(0)
ref = dtypes.to_float32(variants["contig"][0]()[0])
for n, (f, desc) in variants.items():
    o = dtypes.to_float32(f()[0])
    print(f"{n:18s} {desc}  max|diff| vs contig {float(cupy.abs(o - ref).max()):.2e}", flush=True)
names = list(variants)
res = {n: [] for n in names}
for r in range(5):
    for n in names[r % len(names):] + names[:r % len(names)]:
        res[n].append(timing.benchmark(variants[n][0]).median_ms * 1e3)
base = np.median(res["contig"])
print(f"== B1 L{L} h16-16 d64 q1, held us (median of 5 rotated rounds; / contig)")
for n in names:
    m = np.median(res[n])
    print(f"   {n:18s} {m:8.2f}  {m / base:.3f}   {[round(x, 2) for x in res[n]]}", flush=True)
