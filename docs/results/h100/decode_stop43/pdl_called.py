"""As-called decode with and without PDL: 200 back-to-back calls of the cached call (no L2 flush), events at the
ends, variants interleaved over rounds. python scratch/pdl_called.py case-substrings..."""
import sys, types
import numpy as np, cupy
from cukernels import launch
from attention import decode_bench
from attention.kvcache import flash_attention_with_kvcache
N = 200
for case in decode_bench.cases("decode", types.SimpleNamespace(dtype="bf16")):
    if not any(p in case.name for p in sys.argv[1:]):
        continue
    inp = decode_bench.make_inputs(case, seed=1)
    call = lambda: flash_attention_with_kvcache(inp["q"], inp["k"], inp["v"], cache_seqlens=inp["lens"], check_values=False)
    res = {False: [], True: []}
    for r in range(7):
        for pd in (False, True):
            launch.PDL[0] = pd
            for _ in range(20): call()
            s, e = cupy.cuda.Event(), cupy.cuda.Event()
            s.record()
            for _ in range(N): call()
            e.record(); e.synchronize()
            res[pd].append(cupy.cuda.get_elapsed_time(s, e) * 1e3 / N)
    m = {k: float(np.median(v)) for k, v in res.items()}
    print(f"{case.name}: as called us/call, pdl off {m[False]:.2f}  on {m[True]:.2f}  ({m[True]/m[False]:.3f})", flush=True)
    launch.PDL[0] = True
