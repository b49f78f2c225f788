"""Decode A/B: the K/V copies' L2 hint (DECODE_L2_HINT 0 none, 1 evict-first, 2 256-byte prefetch, 3 both) x
configs, held time, interleaved rounds, beside torch cuDNN/flash. HINTS=0,2 CONFIGS=4x4,... PAGE=16
python scratch/hint_ab.py case-substrings..."""
import os, sys, json, types
import numpy as np
from cukernels import timing
from cukernels import compile as _compile
from attention import kvcache, decode_bench
from attention import decode_configs as dc
from attention.kvcache import flash_attention_with_kvcache

ROUNDS = int(os.environ.get("ROUNDS", "5"))
from cukernels import launch
PDLS = [x == "1" for x in os.environ.get("PDLS", "1").split(",")]
HINTS = [int(h) for h in os.environ.get("HINTS", "0,1").split(",")]
orig_space, orig_kernel = dc.search_space, _compile.kernel
EXTRA = []
kvcache._compile = types.SimpleNamespace(kernel=lambda src, expr, options=(): orig_kernel(src, expr, options=tuple(options) + tuple(EXTRA)))
pats = sys.argv[1:]
out = {}
for case in decode_bench.cases("decode", types.SimpleNamespace(dtype="bf16")):
    if not any(p in case.name for p in pats):
        continue
    inp = decode_bench.make_inputs(case, seed=1)
    ref = decode_bench.reference(case, inp)
    d = case.params["head_dim"]
    PAGE = int(os.environ.get("PAGE", "0"))
    kk, vv, tab = (inp["k"], inp["v"], None) if not PAGE else decode_bench._paged(inp, PAGE, seed=PAGE)
    fns = {}
    combos = [tuple(map(int, c.split("x"))) for c in os.environ.get("CONFIGS", "").split(",") if c] or [None]
    for combo, h, ns, pd in [(c, h, n, p) for c in combos for h in HINTS for n in [int(x) if x != "-" else None for x in os.environ.get("NSPLITS", "-").split(",")] for p in PDLS]:
        if True:
            EXTRA[:] = [f"-DDECODE_TABLE_PREFETCH={h}"]
            if combo is None:
                dc.search_space = orig_space
            else:
                w, s = combo
                dc.search_space = lambda hd, *a, w=w, s=s, **k: [dc.DecodeConfig(head_dim=hd, warps=w, stages=s)]
            kvcache._CACHE.clear()
            try:
                call = lambda ns=ns: flash_attention_with_kvcache(inp["q"], kk, vv, cache_seqlens=inp["lens"], block_table=tab, check_values=False, num_splits=ns)
                o = call()
            except Exception as e:
                print(case.name, combo, h, "skip", str(e)[:80]); continue
            c = decode_bench.check(case, o, ref)[0]
            entries = dict(kvcache._CACHE._entries)
            plan = next(iter(entries.values()))
            def run(call=call, entries=entries, pd=pd):
                kvcache._CACHE._entries.clear(); kvcache._CACHE._entries.update(entries)
                launch.PDL[0] = pd
                return call()
            name = f"{plan.config.warps}x{plan.config.stages}/{plan.splits}{'' if ns is None else 'n'}{'c' if plan.cluster > 1 else ''}h{h}{'p' if pd else ''}{'' if c.passed else '!'}"
            fns[name] = run
    dc.search_space = orig_space
    EXTRA[:] = []
    launch.PDL[0] = True
    for b in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
        fns[b[:5].lower()] = decode_bench._torch(b)(case, inp)
    times = {n: [] for n in fns}
    for r in range(ROUNDS):
        for n, f in fns.items():
            f()
            times[n].append(timing.benchmark(f, budget_ms=40, warmup_ms=5).median_ms)
    med = {n: float(np.median(v)) * 1e3 for n, v in times.items()}
    best = min(med["flash"], med["cudnn"])
    print(f"{case.name}{' p' + str(PAGE) if PAGE else ''}: " + " ".join(f"{n} {med[n]:.2f}({best / med[n]:.3f})" for n in sorted(fns, key=lambda n: med[n])), flush=True)
    out[case.name] = med
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), f"table_ab_{os.getpid()}.json"), "w"), indent=1)
