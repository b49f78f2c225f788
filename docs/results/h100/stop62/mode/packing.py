"""B8 L1k h16-16 d64 q1 contiguous decode (128 CTAs, 2 fit an SM by registers): is the slow mode CTAs packed two
to an SM? Our kernel with its planned dynamic shared memory (68 KB: 2-3 CTAs per SM by shared memory, 2 by
registers) and with 120 KB asked (1 CTA per SM), under the held timer's flush-hold order (as landed), hold-flush
(every launch queued before the flush runs) and flush-sync (the host waits for the flush); SDPA cuDNN beside.
Also B1 L1k h32-8 d128 q1 (64 CTAs). 7 rotated rounds, 80 ms a timer call."""
import types
import numpy as np
from attention import decode_bench as db, decode_configs as dc, kvcache
from cukernels import timing
args = types.SimpleNamespace(dtype="bf16")
allc = {c.name: c for c in db.cases("decode", args)}
orig = dc.DecodeConfig.dynamic_smem_bytes
for name in ("decode_b8_L1k_h16-16_d64_q1", "decode_b1_L1k_h32-8_d128_q1"):
    case = allc[name]
    inputs = db.make_inputs(case, 0)
    impls = {i.name: i for i in db.impls(args)}
    q, k, v, lens = inputs["q"], inputs["k"], inputs["v"], inputs["lens"]
    ptrs = [q.data.ptr, k.data.ptr, v.data.ptr, 0, 0, 0, 0, lens.data.ptr, 0, 0, 0, 0]
    fns = {}
    for label, smem in (("ours", None), ("ours-120K", 120 * 1024)):
        if smem is not None:
            dc.DecodeConfig.dynamic_smem_bytes = lambda self, s=smem: s
        try:
            problem, page, sn = kvcache.validate(q, k, v, lens, None, None, None, False, None, None, None)
            call = kvcache.DecodeCall(q, k, v, None, None, problem, page, sn, False, None, None, None)
        finally:
            dc.DecodeConfig.dynamic_smem_bytes = orig
        print(name, label, call.config, "splits", call.splits, "cluster", call.cluster, flush=True)
        fns[label] = (lambda c=call: c(ptrs, False, lens, None))
    fns["cudnn"] = impls["torch-cudnn"].prepare(case, inputs)
    for f in fns.values():
        f()
    combos = [(n, o) for n in fns for o in ("flush-hold", "hold-flush", "flush-sync")]
    res = {c: [] for c in combos}
    for r in range(7):
        for c in combos[r * 4 % len(combos):] + combos[:r * 4 % len(combos)]:
            timing.SAMPLE_ORDER = c[1]
            try:
                res[c].append(timing.benchmark(fns[c[0]], budget_ms=80).median_ms * 1e3)
            finally:
                timing.SAMPLE_ORDER = "flush-hold"
    print(f"== {name}: held us, median of 7 rotated rounds")
    for c in combos:
        print(f"   {c[0]:10s} {c[1]:11s} {np.median(res[c]):8.2f}   {[round(x, 2) for x in res[c]]}", flush=True)
