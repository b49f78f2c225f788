"""Scratch (stop 47): paged decode against contiguous on the same rows, the tree's flash_decode.cu and a variant
(VAR, default scratch/dec_deep: page ids read two stages ahead), held, interleaved rounds, cuDNN beside."""
import os, sys, json, types
import numpy as np
from cukernels import timing
from cukernels import compile as _compile
from attention import kvcache, decode_bench
from attention.kvcache import flash_attention_with_kvcache

ROUNDS = int(os.environ.get("ROUNDS", "5"))
VAR = os.environ.get("VAR", "scratch/dec_deep/flash_decode.cu")
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
    fns = {}
    for page in (0, 16, 256):
        kk, vv, tab = (inp["k"], inp["v"], None) if not page else decode_bench._paged(inp, page, seed=page)
        for name, src in (("tree", None), ("var", VAR)):
            if page == 0 and name == "var" and not os.environ.get("CONTIG_VAR"):
                continue
            SRC[0] = src
            kvcache._CACHE.clear()
            call = lambda kk=kk, vv=vv, tab=tab: flash_attention_with_kvcache(inp["q"], kk, vv, cache_seqlens=inp["lens"],
                                                                          block_table=tab, check_values=False)
            o = call()
            c = decode_bench.check(case, o, ref)[0]
            assert c.passed, (case.name, name, page)
            entries = dict(kvcache._CACHE._entries)
            def run(call=call, entries=entries):
                kvcache._CACHE._entries.clear(); kvcache._CACHE._entries.update(entries)
                return call()
            fns[f"{name}{page}"] = run
    SRC[0] = None
    fns["cudnn"] = decode_bench._torch("CUDNN_ATTENTION")(case, inp)
    times = {n: [] for n in fns}
    for r in range(ROUNDS):
        for n, f in fns.items():
            f()
            times[n].append(timing.benchmark(f, budget_ms=40, warmup_ms=5).median_ms)
    med = {n: float(np.median(v)) * 1e3 for n, v in times.items()}
    rel = {n: float(np.median([times[n][r] / times["tree0"][r] for r in range(ROUNDS)])) for n in fns}
    print(f"{case.name}: " + " ".join(f"{n} {med[n]:.2f} ({rel[n]:.3f})" for n in fns), flush=True)
    out[case.name] = dict(us=med, over_contiguous=rel)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), f"dec_pg{os.environ.get('TAG', '')}.json"), "w"), indent=1)
