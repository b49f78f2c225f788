"""The engine's held timer (read flush) against triton's do_bench as it is (a write flush: cache.zero_()) and with
its cache clear swapped for the engine's read flush: do they agree once the flush is the same?"""
import json, sys
import numpy as np
import cupy
sys.path.insert(0, ".")
import triton, triton.testing
from triton import runtime
from cukernels import timing, dtypes
from moe import bench as moe_bench, suites
import attention

drv = runtime.driver.active
orig_clear = drv.clear_cache
cases = {}
for cname in ("decode_E64top8_T1", "decode_seed004_T1"):
    (case,) = moe_bench.cases_for([suites.shape(cname)], "bf16")
    inp = moe_bench.make_inputs(case, 0)
    cases[cname] = lambda inp=inp: inp.layer(inp.x)
for B, L in ((1, 8192), (8, 32768)):
    q = dtypes.random((B, 1, 32, 128), dtypes.BF16, seed=1)
    kc, vc = (dtypes.random((B, L, 8, 128), dtypes.BF16, seed=s) for s in (2, 3))
    lens = cupy.full((B,), L, dtype=cupy.int32)
    cases[f"kv decode B{B} L{L}"] = (lambda q=q, kc=kc, vc=vc, lens=lens: attention.flash_attention_with_kvcache(
        q, kc, vc, cache_seqlens=lens, check_values=False))
rows = []
for name, fn in cases.items():
    fn()
    r = {"case": name, "held": [], "do_bench (write)": [], "do_bench (read)": []}
    for _ in range(5):
        r["held"].append(timing.benchmark(fn, budget_ms=60).median_ms * 1e3)
        drv.clear_cache = orig_clear
        r["do_bench (write)"].append(triton.testing.do_bench(fn, warmup=25, rep=100) * 1e3)
        drv.clear_cache = lambda cache: timing.flush_l2()
        try:
            r["do_bench (read)"].append(triton.testing.do_bench(fn, warmup=25, rep=100) * 1e3)
        finally:
            drv.clear_cache = orig_clear
    rows.append(r)
    print(f"{name:28s} " + "  ".join(f"{k} {np.median(v):8.2f}" for k, v in r.items() if k != "case"), flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
