"""Scratch (stop 46): decode with the first K/V stage issued before the length read (tree) against HEAD's
flash_decode.cu (scratch/olddec), planned configs, held, interleaved rounds, torch flash/cuDNN beside."""
import os, sys, json, types
import numpy as np
from cukernels import timing, launch
from cukernels import compile as _compile
from attention import kvcache, decode_bench
from attention.kvcache import flash_attention_with_kvcache

ROUNDS = int(os.environ.get("ROUNDS", "5"))
orig_kernel = _compile.kernel
SRC = [None]
def patched(src, expr, options=()):
    if SRC[0] is not None and "flash_decode" in str(src):
        src = SRC[0]
    return orig_kernel(src, expr, options=options)
kvcache._compile = types.SimpleNamespace(kernel=patched)
pats = sys.argv[1:]
out = {}
for case in decode_bench.cases("decode", types.SimpleNamespace(dtype="bf16")):
    if not any(p in case.name for p in pats):
        continue
    inp = decode_bench.make_inputs(case, seed=1)
    ref = decode_bench.reference(case, inp)
    PAGE = int(os.environ.get("PAGE", "0"))
    kk, vv, tab = (inp["k"], inp["v"], None) if not PAGE else decode_bench._paged(inp, PAGE, seed=PAGE)
    fns = {}
    for name, src in (("new", None), ("old", "scratch/olddec/flash_decode.cu")):
        SRC[0] = src
        kvcache._CACHE.clear()
        call = lambda: flash_attention_with_kvcache(inp["q"], kk, vv, cache_seqlens=inp["lens"], block_table=tab, check_values=False)
        o = call()
        c = decode_bench.check(case, o, ref)[0]
        assert c.passed, (case.name, name)
        entries = dict(kvcache._CACHE._entries)
        def run(call=call, entries=entries):
            kvcache._CACHE._entries.clear(); kvcache._CACHE._entries.update(entries)
            return call()
        fns[name] = run
    SRC[0] = None
    for b in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
        fns[b[:5].lower()] = decode_bench._torch(b)(case, inp)
    times = {n: [] for n in fns}
    for r in range(ROUNDS):
        for n, f in fns.items():
            f()
            times[n].append(timing.benchmark(f, budget_ms=40, warmup_ms=5).median_ms)
    med = {n: float(np.median(v)) * 1e3 for n, v in times.items()}
    best = min(med["flash"], med["cudnn"])
    gain = float(np.median([times["old"][r] / times["new"][r] for r in range(ROUNDS)]))
    print(f"{case.name}{' p' + str(PAGE) if PAGE else ''}: new {med['new']:.2f} ({best / med['new']:.3f}) old {med['old']:.2f} ({best / med['old']:.3f}) flash {med['flash']:.2f} cudnn {med['cudnn']:.2f} old/new {gain:.3f}", flush=True)
    out[case.name] = dict(us=med, old_over_new=gain)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), f"dec_ab{os.environ.get('TAG', '')}.json"), "w"), indent=1)
