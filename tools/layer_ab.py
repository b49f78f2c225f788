"""A/B of MoE layer variants set by module attributes (planner knobs, kernel flags), on the decode suite's shapes
(or any MoE shape's layer case, e.g. seed 004's batches).

    python tools/layer_ab.py --case seed004:4 --case E64top8:1 \\
        --variant base --variant cap1m:moe.gemm_configs.SKINNY_MAX_ITEM_BYTES=1048576 [--rounds 5] [--json PATH]
    python tools/layer_ab.py --case E64top8:1 --variant base --variant up64:up=8/16/2,down=8/16/8
    python tools/layer_ab.py --case seed004_b16x2048 --variant tree --variant combine:moe.grouped_gemm.TMA_SCATTER=False

A variant is ``NAME[:module.attr=value[,module.attr=value...]]`` (values are Python literals; the first variant is
the reference, usually the tree's plan with no assignment); ``up=BM/PW/KS`` / ``down=BM/PW/KS`` force the expert
GEMMs' skinny tiles (block_m, weight rows per warp, K split; the fused decode kernels take them too); ``-DMACRO=V``
builds the MoE package's kernels with that preprocessor definition (kernel variants behind an ``#if``;
``moe.launch.kernels_built_with``). Each case
plans the suite's layer once per variant (the assignments applied, the planner's and the layer's caches cleared),
records its plan (the expert GEMMs' tiles, whether the layer runs as one decode launch), compares its output with
the reference variant's (rel L2 and bitwise) and over two calls (bitwise), then times every variant in ``--rounds``
rounds, the order rotated each round: triton's do_bench (L2 flushed by a write, whose write-back the timed call
pays: a few us more than the held timer on these layers) and the engine's held timer of the layer's
cached call, and after the last round the time as called (``cukernels.timing.as_called``). Weights and tokens are
the decode suite's (``moe.bench.make_inputs`` with the case's seed, ``cukernels.bench.case_seed``), so every variant
of a case routes the same slots to the same experts as the suite does (the bytes a decode layer streams depend on
that; before stop 66 the tools drew the tokens with seed 0 and routed some cases elsewhere: E64 top-8 T4 to 23
experts, the suite to 27).
Needs a GPU and triton. Every attribute is put back at the end.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ab_variants  # noqa: E402

def _tile_item(item: str, target: str, value: str):
    """``up=BM/PW/KS`` / ``down=BM/PW/KS``: that expert GEMM's skinny tile forced, as ("tile", "up" | "down",
    (BM, PW, KS))."""
    if target not in ("up", "down"):
        return None
    parts = value.split("/")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise SystemExit(f"--variant: a forced tile is {target}=BLOCK_M/ROWS_PER_WARP/SPLIT_K, got {item!r}")
    return ("tile", target, tuple(int(p) for p in parts))


def parse_variant(text: str) -> tuple[str, list[tuple[str, str, object]]]:
    """``NAME[:module.attr=value,...]`` -> (name, [(module, attr, value)]); ``up=BM/PW/KS`` or ``down=BM/PW/KS``
    forces that expert GEMM's skinny tile (block_m, weight rows per warp, K split) as ("tile", "up" | "down",
    (BM, PW, KS)); ``-DMACRO=V`` as ("define", "-DMACRO=V", None) (tools/ab_variants.py)."""
    return ab_variants.parse_variant(text, _tile_item)


def skinny_tile(spec: tuple[int, int, int]):
    """The skinny tile (block_m, weight rows per warp, split_k) of ``moe.gemm_configs.SKINNY``."""
    from moe import gemm_configs

    for c in gemm_configs.SKINNY:
        if (c.block_m, c.block_n // c.warps_n, c.split_k) == spec:
            return c
    raise SystemExit(f"no skinny tile {spec} (block_m 8 or 16, 16 or 32 rows per warp, split 1, 2, 4 or 8)")


def layer_case(name: str):
    """(case, inputs) of a shape's layer case as the MoE bench makes them: its ``layer`` case and the inputs the suite
    draws for it (``moe.bench.make_inputs`` with ``cukernels.bench.case_seed``), so a tool times the suite's tokens."""
    from cukernels import bench
    from moe import bench as moe_bench
    from moe import suites

    case = next(c for c in moe_bench.cases_for([suites.shape(name)], "bf16") if c.params["kind"] == "layer")
    return case, moe_bench.make_inputs(case, bench.case_seed(case))


def parse_case(text: str) -> str:
    """A case of ``moe.bench --suite decode``: its shape name (``decode_seed004_T4``) or ``SHAPE:TOKENS``
    (``seed004:4``); or any MoE shape of ``moe.suites`` (``seed004_b16x2048``: its layer case)."""
    from moe import suites

    shape, colon, tokens = text.partition(":")
    name = f"decode_{shape}_T{tokens}" if colon else text
    try:
        suites.shape(name)
    except ValueError as exc:
        raise SystemExit(f"--case {text!r}: {exc}") from None
    return name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", required=True,
                    help="a decode suite case, decode_seed004_T4 or seed004:4 (repeatable)")
    ap.add_argument("--variant", action="append", required=True, help="NAME[:module.attr=value,...] (repeatable)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    variants = dict(parse_variant(v) for v in args.variant)
    cases = [parse_case(c) for c in args.case]

    import cupy

    from cukernels import timing

    layer_mod = importlib.import_module("moe.layer")
    plan_cache = importlib.import_module("moe.launch")._plan
    gemm_configs = importlib.import_module("moe.gemm_configs")
    attrs = ab_variants.Attributes(variants, kinds=("tile", "define"))
    forced = {name: {kind: skinny_tile(spec) for m, kind, spec in sets if m == "tile"}
              for name, sets in variants.items()}
    defines = {name: ab_variants.defines(sets) for name, sets in variants.items()}
    moe_launch = importlib.import_module("moe.launch")
    tiles = contextlib.ExitStack()  # the current variant's forced tiles and kernel definitions

    def configure(name):
        tiles.close()
        attrs.apply(variants[name])  # back to the tree's values, then this variant's
        if forced[name]:
            tiles.enter_context(gemm_configs.expert_gemms_planned_as(**forced[name]))
        if defines[name]:
            tiles.enter_context(moe_launch.kernels_built_with(defines[name]))
        plan_cache.cache_clear()
        layer_mod._LAYER.clear()

    print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), flush=True)
    rows, names = [], list(variants)
    try:
        for case_name in cases:  # the decode suite's weights and tokens (moe.bench.make_inputs)
            case, inputs = layer_case(case_name)
            layer, x, top_k = inputs.layer, inputs.x, case.params["top_k"]
            tensors = (x, layer.router_b, layer.w_gate_up, layer.w_down)
            key = (*(layer_mod._launch.view(t)[0] for t in tensors), top_k, "swiglu")
            ptrs = [layer_mod._launch.view(t)[1] for t in tensors]
            calls, outs, plans = {}, {}, {}
            for name in names:
                configure(name)
                outs[name] = [layer(x), layer(x)]
                call = layer_mod._LAYER.get(key)
                plans[name] = {"up": str(call.up.config), "down": str(call.down.config),
                               "one_launch": call.decode is not None}
                calls[name] = lambda c=call, p=ptrs: c(*p)
            row = {"case": case.name, "plans": plans, **ab_variants.compare_outputs(outs, names[0]),
                   **ab_variants.time_rounds(calls, args.rounds, rep_ms=150)}
            row["called_us"] = {}
            for name in names:  # the public call, the variant's plan made again in the cleared cache
                configure(name)
                layer(x)
                row["called_us"][name] = round(timing.as_called(lambda: layer(x)) * 1e3, 2)
            row["median_us"] = {n: {"do_bench": float(np.median(row["do_bench_us"][n])),
                                    "held": float(np.median(row["held_us"][n])), "called": row["called_us"][n]}
                                for n in names}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:  # the tree's values and planner back, and no plan made under a variant left in the caches
        tiles.close()
        attrs.restore()
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
