"""Stop 63: head-dim-128 KV heads in pairs (two adjacent heads read as one 512-byte row per key by the kernel's
HEAD_DIM = 256 instance with PAIR, as head dim 64 goes in pairs on the 128 instance), where the unpaired grid fills
the GPU. Same process: the planned call, the paired call (a copy of the decode sources with the pair assert
widened, decode_configs.paired widened to head dim 128), cuDNN; held, 5 rotated rounds, 80 ms a timer call;
outputs of the paired call against the planned one."""
import dataclasses, sys, types
from pathlib import Path
import numpy as np
import cupy
from attention import decode_bench as db, decode_configs as dc, kvcache
from cukernels import launch, timing

HERE = Path(__file__).parent
args = types.SimpleNamespace(dtype="bf16")
cases = {c.name: c for c in db.cases("decode", args)}
impls = {i.name: i for i in db.impls(args)}
orig_paired, orig_source = dc.paired, kvcache.SOURCE


def paired128(problem, spec, heads_adjacent=True):
    if problem.head_dim == 128:
        if problem.kv_heads % 2 or problem.seq_q * 2 * (problem.heads // problem.kv_heads) > dc.ROWS_PER_TILE:
            return None
        if problem.batch * problem.kv_heads * problem.row_tiles < spec.sm_count:
            return None
        return dataclasses.replace(problem, kv_heads=problem.kv_heads // 2, head_dim=256)
    return orig_paired(problem, spec, heads_adjacent)


def variant(case, inputs, pair):
    cache = launch.Cache(f"probe {pair}")
    kvcache._CACHE = cache
    if pair:
        dc.paired, kvcache.SOURCE = paired128, HERE / "flash_decode.cu"
    try:
        fn = impls["ours"].prepare(case, inputs)
        out = fn()
        cupy.cuda.Device().synchronize()
        (call,) = cache._entries.values() if hasattr(cache, "_entries") else (None,)
    finally:
        dc.paired, kvcache.SOURCE = orig_paired, orig_source
    desc = f"pair={getattr(call, 'pair', '?')} {getattr(call, 'config', '?')} splits={getattr(call, 'splits', '?')}"

    def run():
        kvcache._CACHE = cache
        return fn()
    return run, out, desc


names = [] if __name__ != "__main__" else sys.argv[1:] or ["decode_b8_L32k_h32-32_d128_q1", "decode_b8_L32k_h32-32_d128_q4",
                         "decode_b64_L8k_h32-32_d128_q1", "decode_b64_L1k_h32-32_d128_q4",
                         "decode_b64_L1k_h32-8_d128_q1", "decode_b64_L8k_h32-8_d128_q1",
                         "decode_b64_L32k_h32-8_d128_q1", "decode_b8_L128k_h32-32_d128_q1"]
print("== held us, median of 5 rotated rounds: planned / paired (ratio, > 1: paired faster) / cuDNN", flush=True)
for name in names:
    case = cases[name]
    inputs = db.make_inputs(case, 0)
    plan_fn, plan_out, plan_desc = variant(case, inputs, False)
    pair_fn, pair_out, pair_desc = variant(case, inputs, True)
    cudnn = impls["torch-cudnn"].prepare(case, inputs)
    a = cupy.asarray(plan_out).astype(cupy.float32)
    b = cupy.asarray(pair_out).astype(cupy.float32)
    diff = float(cupy.abs(a - b).max())
    fns = {"plan": plan_fn, "pair": pair_fn, "cudnn": cudnn}
    res = {k: [] for k in fns}
    for r in range(5):
        order = list(fns)[r % 3:] + list(fns)[:r % 3]
        for k in order:
            res[k].append(timing.benchmark(fns[k], budget_ms=80).median_ms * 1e3)
    m = {k: float(np.median(v)) for k, v in res.items()}
    print(f"   {name[7:]:26s} {m['plan']:9.2f} / {m['pair']:9.2f} ({m['plan'] / m['pair']:.3f}) / {m['cudnn']:9.2f}"
          f"   vs cuDNN plan {m['cudnn'] / m['plan']:.3f} pair {m['cudnn'] / m['pair']:.3f}   max|diff| {diff:.2e}"
          f"   [{plan_desc}] [{pair_desc}]", flush=True)
    del inputs, plan_fn, pair_fn, cudnn, fns, plan_out, pair_out, a, b
    kvcache._CACHE.clear()
    cupy.get_default_memory_pool().free_all_blocks()
    import torch
    torch.cuda.empty_cache()
