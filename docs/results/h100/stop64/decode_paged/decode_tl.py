"""Stop 64: the B1 L1k decode calls stamped (flash_decode built with -DATTN_DECODE_TIMELINE=64): contiguous
against paged (pages of 16 / 256, shuffled table), CALLS calls each after an L2 flush (the held timer's state: table,
length, q, K/V all cold). Per call: CTA start skew, per-CTA phase times (clock64 / the SM clock), the end."""
import importlib, json, os, sys
sys.path.insert(0, ".")
import cupy, numpy as np
from cukernels import bench as cb, compile as cc, device, timing
from attention import decode_bench as db
from attention.kvcache import flash_attention_with_kvcache
kv = importlib.import_module("attention.kvcache")
CALLS = int(os.environ.get("CALLS", "15"))
N = 64
# clock64 counts SM cycles: the clock while the calls run (an idle card reads its idle clock here: the committed
# decode_tl.log was converted with 345 MHz read idle; its clock64 rows read ~5.7x too long, divide by 1,980 / 345)
mhz = device.nvml_info(0).get("sm_clock_max_mhz") or 1980
print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "SM clock", mhz, flush=True)
out = []
for heads, kvh, d in ((32, 8, 128), (32, 32, 128), (16, 16, 64)):
    case = cb.Case(name=f"b1_L1k_{heads}-{kvh}_d{d}_q1", params=dict(batch=1, length=1024, heads=heads, kv_heads=kvh,
                   head_dim=d, seq_q=1), dtype="bf16")
    inp = db.make_inputs(case, 0)
    q, lens = inp["q"], inp["lens"]
    variants = {"contiguous": (inp["k"], inp["v"], None)}
    for page in (16, 256):
        variants[f"p{page}"] = db._paged(inp, page, seed=page)
    stamps, calls, plain = {}, {}, {}
    for name, (k, v, table) in variants.items():
        f = (lambda k=k, v=v, table=table: flash_attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table,
                                                                       check_values=False))
        kv._CACHE.clear()
        plain[name] = timing.benchmark(f, budget_ms=150, min_samples=10).median_ms * 1e3
        kv._CACHE.clear()
        with cc.kernels_built_with((f"-DATTN_DECODE_TIMELINE={N}",), "flash_decode") as built:
            f()
        cupy.cuda.Device().synchronize()
        stamps[name] = cupy.ndarray((N, 8), dtype=cupy.uint64, memptr=built[-1].module.get_global("attn_decode_timeline"))
        calls[name] = (f, built)  # each stamped call below re-plans inside the block (the compile cache's module)
    res = {}
    for name in variants:
        f, built = calls[name]
        runs = []
        for c in range(CALLS):
            kv._CACHE.clear()
            with cc.kernels_built_with((f"-DATTN_DECODE_TIMELINE={N}",), "flash_decode"):
                f()  # (re)builds from the compile cache: the same module
            cupy.cuda.Device().synchronize()
            st = stamps[name]
            st[...] = 0
            timing.flush_l2()
            cupy.cuda.Device().synchronize()
            f()
            cupy.cuda.Device().synchronize()
            a = st.get().astype(np.int64)
            live = a[:, 0] > 0
            a = a[live]
            t0 = a[:, 0].min()
            us = lambda cyc: cyc / mhz
            runs.append({
                "ctas": int(live.sum()),
                "start_skew_us": float((a[:, 0] - t0).max() / 1e3),
                "enter_to_first_copies_us": float(np.median(us(a[:, 2] - a[:, 1]))),
                "first_copies_to_stage0_us": float(np.median(us(a[:, 3] - a[:, 2]))),
                "stage0_to_loop_end_us": float(np.median(us(a[:, 4] - a[:, 3]))),
                "loop_end_to_merged_us": float(np.median(us(a[:, 5] - a[:, 4]))),
                "merged_to_exit_us": float(np.median(us(a[:, 6] - a[:, 5]))),
                "enter_to_exit_max_us": float(us(a[:, 6] - a[:, 1]).max()),
                "span_us": float((a[:, 7].max() - t0) / 1e3),
            })
        res[name] = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
        res[name]["held_us_engine_build"] = plain[name]
    print(f"== {case.name}")
    keys = list(res["contiguous"])
    print(f"{'':28s}" + "".join(f"{n:>12s}" for n in variants))
    for k in keys:
        print(f"{k:28s}" + "".join(f"{res[n][k]:12.2f}" for n in variants), flush=True)
    out.append({"case": case.name, "result": res})
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "decode_tl.json"), "w"), indent=1)
