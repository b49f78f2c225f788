"""A/B of MoE layer variants set by module attributes (planner knobs, kernel flags), on the decode suite's shapes.

    python tools/layer_ab.py --case seed004:4 --case E64top8:1 \\
        --variant base --variant cap1m:moe.gemm_configs.SKINNY_MAX_ITEM_BYTES=1048576 [--rounds 5] [--json PATH]
    python tools/layer_ab.py --case E64top8:1 --variant base --variant up64:up=8/16/2,down=8/16/8

A variant is ``NAME[:module.attr=value[,module.attr=value...]]`` (values are Python literals; the first variant is
the reference, usually the tree's plan with no assignment); ``up=BM/PW/KS`` / ``down=BM/PW/KS`` force the expert
GEMMs' skinny tiles (block_m, weight rows per warp, K split; the fused decode kernels take them too). Each case
builds one layer per variant (the assignments applied, the planner's and the layer's caches cleared), records its
plan (the expert GEMMs' tiles, whether the layer runs as one decode launch), compares its output with the reference
variant's (rel L2 and bitwise) and over two calls (bitwise), then times every variant in ``--rounds`` rounds, the
order rotated each round: triton's do_bench (L2 flushed) and the engine's held timer of the layer's cached call, and
after the last round the time as called (200 back-to-back public calls, one synchronisation). Weights and tokens
come from fixed seeds, so every variant of a case routes the same slots to the same experts (the bytes a decode
layer streams depend on that: compare variants within a run, not across scripts). Needs a GPU and triton. Every
attribute is put back at the end.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {"E64top8": (64, 8, 2048, 1408), "seed004": (32, 2, 4096, 11008)}  # experts, top_k, hidden, inter


def parse_variant(text: str) -> tuple[str, list[tuple[str, str, object]]]:
    """``NAME[:module.attr=value,...]`` -> (name, [(module, attr, value)]); ``up=BM/PW/KS`` or ``down=BM/PW/KS``
    forces that expert GEMM's skinny tile (block_m, weight rows per warp, K split) as ("tile", "up" | "down",
    (BM, PW, KS))."""
    name, _, body = text.partition(":")
    sets = []
    for item in filter(None, body.split(",")):
        target, eq, value = (part.strip() for part in item.partition("="))
        if eq and target in ("up", "down"):
            parts = value.split("/")
            if len(parts) != 3 or not all(p.isdigit() for p in parts):
                raise SystemExit(f"--variant {text!r}: a forced tile is {target}=BLOCK_M/ROWS_PER_WARP/SPLIT_K, "
                                 f"got {item!r}")
            sets.append(("tile", target, tuple(int(p) for p in parts)))
            continue
        module, dot, attr = target.rpartition(".")
        if not (eq and dot and module and attr):
            raise SystemExit(f"--variant {text!r}: expected NAME[:module.attr=value,...], got {item!r}")
        sets.append((module, attr, ast.literal_eval(value)))
    return name, sets


def skinny_tile(spec: tuple[int, int, int]):
    """The skinny tile (block_m, weight rows per warp, split_k) of ``moe.gemm_configs.SKINNY``."""
    from moe import gemm_configs

    for c in gemm_configs.SKINNY:
        if (c.block_m, c.block_n // c.warps_n, c.split_k) == spec:
            return c
    raise SystemExit(f"no skinny tile {spec} (block_m 8 or 16, 16 or 32 rows per warp, split 1, 2, 4 or 8)")


def forcing_planner(real_plan, forced: dict):
    """``moe.gemm_configs.plan`` with the expert GEMMs' tiles forced: ``forced`` maps "up" (the GEMM with an
    epilogue) and / or "down" to a config; the router's one-group GEMM is planned as before."""
    from cukernels import tiling

    def plan(problem, spec):
        p = real_plan(problem, spec)
        kind = "up" if problem.epilogue is not None else "down"
        if problem.experts > 1 and problem.out_dtype is None and kind in forced:
            c = forced[kind]
            return tiling.Plan(config=c, smem_bytes=c.smem_bytes(), limit=p.limit, reason=f"forced {kind}: {c}")
        return p
    return plan


def parse_case(text: str) -> tuple[str, int]:
    shape, _, tokens = text.partition(":")
    if shape not in SHAPES or not tokens.isdigit():
        raise SystemExit(f"--case {text!r}: expected SHAPE:TOKENS with SHAPE in {sorted(SHAPES)}")
    return shape, int(tokens)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", required=True, help="SHAPE:TOKENS, e.g. seed004:4 (repeatable)")
    ap.add_argument("--variant", action="append", required=True, help="NAME[:module.attr=value,...] (repeatable)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    variants = dict(parse_variant(v) for v in args.variant)
    cases = [parse_case(c) for c in args.case]

    import cupy
    import triton

    from cukernels import dtypes, timing
    from moe import MoELayer, interleave_gate_up

    layer_mod = importlib.import_module("moe.layer")
    plan_cache = importlib.import_module("moe.launch")._plan
    gemm_configs = importlib.import_module("moe.gemm_configs")
    saved = {(m, a): getattr(importlib.import_module(m), a) for sets in variants.values() for m, a, _ in sets
             if m != "tile"}
    saved[("moe.gemm_configs", "plan")] = gemm_configs.plan
    forced = {name: {kind: skinny_tile(spec) for m, kind, spec in sets if m == "tile"}
              for name, sets in variants.items()}

    def configure(name):
        for (m, a), v in saved.items():  # back to the tree's values, then this variant's
            setattr(importlib.import_module(m), a, v)
        for m, a, v in variants[name]:
            if m != "tile":
                setattr(importlib.import_module(m), a, v)
        if forced[name]:
            gemm_configs.plan = forcing_planner(saved[("moe.gemm_configs", "plan")], forced[name])
        plan_cache.cache_clear()
        layer_mod._LAYER.clear()

    def f32(a):
        return (a.view(cupy.uint16).astype(cupy.uint32) << 16).view(cupy.float32)

    print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), flush=True)
    rows, names = [], list(variants)
    try:
        for shape in dict.fromkeys(s for s, _ in cases):
            experts, top_k, hidden, inter = SHAPES[shape]
            router = cupy.random.default_rng(experts).standard_normal((hidden, experts), dtype=cupy.float32)
            w_up = interleave_gate_up(dtypes.random((experts, inter, hidden), dtypes.BF16, seed=2,
                                                    scale=1 / np.sqrt(hidden)),
                                      dtypes.random((experts, inter, hidden), dtypes.BF16, seed=3,
                                                    scale=1 / np.sqrt(hidden)))
            w_down = dtypes.random((experts, hidden, inter), dtypes.BF16, seed=4, scale=1 / np.sqrt(inter))
            for tokens in [t for s, t in cases if s == shape]:
                x = dtypes.random((tokens, hidden), dtypes.BF16, seed=10 + tokens)
                calls, outs, plans = {}, {}, {}
                for name in names:
                    configure(name)
                    layer = MoELayer(router, w_up, w_down, top_k)
                    outs[name] = [layer(x), layer(x)]
                    tensors = (x, layer.router_b, layer.w_gate_up, layer.w_down)
                    call = layer_mod._LAYER.get((*(layer_mod._launch.view(t)[0] for t in tensors), top_k, "swiglu"))
                    plans[name] = {"up": str(call.up.config), "down": str(call.down.config),
                                   "one_launch": call.decode is not None}
                    ptrs = [layer_mod._launch.view(t)[1] for t in tensors]
                    calls[name] = (lambda c=call, p=ptrs: c(*p), layer)
                ref = f32(outs[names[0]][0])
                row = {"case": f"{shape} T{tokens}", "plans": plans,
                       "rel_l2_vs_" + names[0]: {n: float(cupy.linalg.norm(f32(o[0]) - ref) / cupy.linalg.norm(ref))
                                                 for n, o in outs.items()},
                       "bitwise_vs_" + names[0]: {n: bool((o[0] == outs[names[0]][0]).all()) for n, o in outs.items()},
                       "same_over_calls": {n: bool((o[0] == o[1]).all()) for n, o in outs.items()},
                       "do_bench_us": {n: [] for n in names}, "held_us": {n: [] for n in names}}
                for r in range(args.rounds):
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        time.sleep(0.3)
                        fn = calls[name][0]
                        row["do_bench_us"][name].append(round(triton.testing.do_bench(fn, warmup=25, rep=150) * 1e3, 2))
                        row["held_us"][name].append(round(timing.benchmark(fn, budget_ms=60).median_ms * 1e3, 2))
                row["called_us"] = {}
                for name in names:  # the public call, with the variant's plan in the cache
                    configure(name)
                    layer = calls[name][1]
                    for _ in range(20):
                        layer(x)
                    cupy.cuda.Device().synchronize()
                    t0 = time.perf_counter()
                    for _ in range(200):
                        layer(x)
                    cupy.cuda.Device().synchronize()
                    row["called_us"][name] = round((time.perf_counter() - t0) / 200 * 1e6, 2)
                row["median_us"] = {n: {"do_bench": float(np.median(row["do_bench_us"][n])),
                                        "held": float(np.median(row["held_us"][n])), "called": row["called_us"][n]}
                                    for n in names}
                rows.append(row)
                print(json.dumps(row), flush=True)
            del w_up, w_down
            cupy.get_default_memory_pool().free_all_blocks()
    finally:  # the tree's values back, and no plan made under a variant left in the caches
        for (m, a), v in saved.items():
            setattr(importlib.import_module(m), a, v)
        plan_cache.cache_clear()
        layer_mod._LAYER.clear()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print("\n| case | " + " | ".join(f"{n}: do_bench / held / called us" for n in names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for row in rows:
        m = row["median_us"]
        print(f"| {row['case']} | " + " | ".join(f"{m[n]['do_bench']:.2f} / {m[n]['held']:.2f} / {m[n]['called']:.2f}"
                                                for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
