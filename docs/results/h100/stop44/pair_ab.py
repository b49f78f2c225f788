"""Decode A/B: head-dim-64 heads in pairs forced on small grids (dc.paired without the fills-the-GPU test) x
num_splits, held time, interleaved rounds, beside torch cuDNN/flash. NSPLITS=-,2,4 PAGE=0 python scratch/pair_ab.py
case-substrings..."""
import os, sys, json, types, dataclasses
import numpy as np
from cukernels import timing
from cukernels import compile as _compile
from attention import kvcache, decode_bench
from attention import decode_configs as dc
from attention.kvcache import flash_attention_with_kvcache

ROUNDS = int(os.environ.get("ROUNDS", "5"))
orig_paired = dc.paired


def forced(problem, spec, heads_adjacent=True):
    if problem.head_dim != 64 or problem.kv_heads % 2 or not heads_adjacent:
        return None
    if problem.seq_q * 2 * (problem.heads // problem.kv_heads) > dc.ROWS_PER_TILE:
        return None
    return dataclasses.replace(problem, kv_heads=problem.kv_heads // 2, head_dim=128)


_carved = [None]


def carve(cv):  # the decode kernels' preferred shared-memory carveout (-1: none), set only when it changes
    if _carved[0] == cv:
        return
    for k in list(_compile._cache.values()):
        if "flash_decode" in k.name_expression:
            k._raw.preferred_shared_memory_carveout = cv
    _carved[0] = cv


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
    for pf in [int(x) for x in os.environ.get("PAIRS", "0,1").split(",")]:
        for ns in [int(x) if x != "-" else None for x in os.environ.get("NSPLITS", "-").split(",")]:
            dc.paired = forced if pf else orig_paired
            kvcache._CACHE.clear()
            call = lambda ns=ns: flash_attention_with_kvcache(inp["q"], kk, vv, cache_seqlens=inp["lens"], block_table=tab,
                                                              check_values=False, num_splits=ns)
            try:
                o = call()
            except Exception as e:
                print(case.name, pf, ns, "skip", str(e)[:100]); continue
            c = decode_bench.check(case, o, ref)[0]
            entries = dict(kvcache._CACHE._entries)
            plan = next(iter(entries.values()))

            for cv in [int(x) for x in os.environ.get("CARVES", "-1").split(",")]:
                def run(call=call, entries=entries, cv=cv):
                    kvcache._CACHE._entries.clear(); kvcache._CACHE._entries.update(entries)
                    carve(cv)
                    return call()
                name = (f"{'P' if plan.pair else ''}{plan.config.warps}x{plan.config.stages}/{plan.splits}"
                        f"{'' if ns is None else 'n'}{'c' if plan.cluster > 1 else ''}{'' if cv < 0 else 'v%d' % cv}"
                        f"{'' if c.passed else '!'}")
                fns[name] = run
    dc.paired = orig_paired
    for b in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
        fns[b[:5].lower()] = decode_bench._torch(b)(case, inp)
    carve(-1)
    times = {n: [] for n in fns}
    for r in range(ROUNDS):
        for n, f in fns.items():
            f()
            times[n].append(timing.benchmark(f, budget_ms=40, warmup_ms=5).median_ms)
    med = {n: float(np.median(v)) * 1e3 for n, v in times.items()}
    best = min(med["flash"], med["cudnn"])
    print(f"{case.name}{' p' + str(PAGE) if PAGE else ''}: " + " ".join(f"{n} {med[n]:.2f}({best / med[n]:.3f})" for n in sorted(fns, key=lambda n: med[n])), flush=True)
    out[case.name] = med
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), f"pair_ab_{os.getpid()}.json"), "w"), indent=1)
