"""B8 L1k h16-16 d64 q1 contiguous decode under the hold-flush order (every launch queued before the flush runs,
the regime of a GPU-bound loop) and flush-sync: our planned call, forced splits 2 / 4, forced rings w4 s6 / w4 s8 /
w8 s4; SDPA cuDNN. 7 rotated rounds, 80 ms a timer call. With argv[1] == "once": one call of ours and of cuDNN
(for ncu)."""
import sys
import types
import numpy as np
from attention import decode_bench as db, decode_configs as dc, kvcache
from cukernels import timing
args = types.SimpleNamespace(dtype="bf16")
case = {c.name: c for c in db.cases("decode", args)}["decode_b8_L1k_h16-16_d64_q1"]
inputs = db.make_inputs(case, 0)
impls = {i.name: i for i in db.impls(args)}
q, k, v, lens = inputs["q"], inputs["k"], inputs["v"], inputs["lens"]
ptrs = [q.data.ptr, k.data.ptr, v.data.ptr, 0, 0, 0, 0, lens.data.ptr, 0, 0, 0, 0]
orig = dc.search_space


def ours(splits=None, ring=None):
    if ring is not None:
        dc.search_space = lambda *a, **kw: [dc.DecodeConfig(head_dim=64, warps=ring[0], stages=ring[1])] + orig(*a, **kw)
    try:
        problem, page, sn = kvcache.validate(q, k, v, lens, None, None, None, False, None, None, splits)
        call = kvcache.DecodeCall(q, k, v, None, None, problem, page, sn, False, None, None, splits)
    finally:
        dc.search_space = orig
    print(splits, ring, call.config, "splits", call.splits, "cluster", call.cluster, flush=True)
    return lambda: call(ptrs, False, lens, None)


cudnn = impls["torch-cudnn"].prepare(case, inputs)
if sys.argv[1:] == ["once"]:
    ours()()
    cudnn()
    sys.exit(0)
fns = {"planned": ours(), "splits2": ours(splits=2), "splits4": ours(splits=4), "w4s6": ours(ring=(4, 6)),
       "w4s8": ours(ring=(4, 8)), "w8s4": ours(ring=(8, 4)), "cudnn": cudnn}
for f in fns.values():
    f()
combos = [(n, o) for n in fns for o in ("hold-flush", "flush-sync")]
res = {c: [] for c in combos}
for r in range(7):
    for c in combos[r * 3 % len(combos):] + combos[:r * 3 % len(combos)]:
        timing.SAMPLE_ORDER = c[1]
        try:
            res[c].append(timing.benchmark(fns[c[0]], budget_ms=80).median_ms * 1e3)
        finally:
            timing.SAMPLE_ORDER = "flush-hold"
print("== B8 L1k h16-16 d64 q1: held us, median of 7 rotated rounds")
for c in combos:
    print(f"   {c[0]:9s} {c[1]:11s} {np.median(res[c]):8.2f}   {[round(x, 2) for x in res[c]]}", flush=True)
