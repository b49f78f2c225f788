"""A/B of grouped-GEMM variants (kernel builds behind an ``#if``, planner knobs, forced tiles) on the MoE gemm suite's
cases or any grouped shape, each variant's call built once and kept.

    python tools/gemm_ab.py --case E32_equal --case 1group --variant tree --variant noepi:-DGEMM_PROBE_EPI=1
    python tools/gemm_ab.py --case 65536x22016x4096/32:swiglu --variant tree --variant tile:config=TMA --sustained 2
    python tools/gemm_ab.py --case E8_random --variant tree --variant nopair:moe.gemm_configs.PAIR_MIN_GROUP_ROWS=1000000000 \\
        --baseline [--rounds 5] [--json PATH]

A case is a gemm suite case (``gemm_8192x11008x4096_E32_equal``, or the part after the shape: ``E32_equal``; its
inputs are the suite's, ``moe.bench.make_inputs`` with ``cukernels.bench.case_seed``) or ``ROWSxNxK/E`` (E equal
groups of random bf16 rows, weights scaled 1/64), either with ``:swiglu`` or ``:gelu`` for that epilogue. A variant
is ``NAME[:item,...]`` (tools/ab_variants.py): ``module.attr=value``, ``-DMACRO=V`` (the MoE kernels built with
that definition, ``moe.launch.kernels_built_with``) or ``config=NAME`` (the tile ``moe.gemm_configs.NAME``, its
first entry where it names a list, instead of the planner's). The first variant is the reference.

``grouped_gemm``'s call cache is keyed by the arrays' shapes, not their pointers or the kernels' build (stop 66's
void A/B): this tool builds each variant's call (``moe.grouped_gemm.GemmCall``, with the variant's attributes, build
and tile in force) and keeps that object, so no variant can run another's kernel. Each output is compared with the
reference variant's (bitwise and rel L2) and over two calls (bitwise); then every variant (and with ``--baseline``
``torch._grouped_mm`` on a suite case) is timed in ``--rounds`` rounds, the order rotated each round: triton's
do_bench and the engine's held timer (L2 flushed by a read), and with ``--sustained S`` the first two rounds also S
seconds back to back (``cukernels.timing.sustained``: the time per call and energy where the card settles at its
power limit). Needs a GPU and triton. Every attribute is put back at the end.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ab_variants  # noqa: E402

_SHAPE = re.compile(r"^(\d+)x(\d+)x(\d+)/(\d+)$")
EPILOGUES = ("swiglu", "gelu")


def _config_item(item: str, key: str, value: str):
    """``config=NAME``: the tile ``moe.gemm_configs.NAME`` forced, as ("config", NAME, None)."""
    if key != "config":
        return None
    if not value.isidentifier():
        raise SystemExit(f"--variant: a forced tile is config=NAME of moe.gemm_configs, got {item!r}")
    return ("config", value, None)


def parse_variant(text: str):
    """``NAME[:item,...]`` (tools/ab_variants.py) with this tool's ``config=NAME``."""
    return ab_variants.parse_variant(text, _config_item)


def forced_config(name: str):
    """``moe.gemm_configs.NAME`` as one tile (the first of a list)."""
    gemm_configs = importlib.import_module("moe.gemm_configs")
    value = getattr(gemm_configs, name, None)
    if isinstance(value, (tuple, list)) and value:
        value = value[0]
    if not isinstance(value, gemm_configs.GemmConfig):
        raise SystemExit(f"--variant config={name}: moe.gemm_configs.{name} is not a GemmConfig or a list of them")
    return value


def parse_case(text: str) -> dict:
    """A gemm suite case (full name or the part after its shape) or ``ROWSxNxK/E``, with ``:swiglu`` / ``:gelu``."""
    body, _, epilogue = text.partition(":")
    if epilogue and epilogue not in EPILOGUES:
        raise SystemExit(f"--case {text!r}: the epilogue is one of {', '.join(EPILOGUES)}, got {epilogue!r}")
    m = _SHAPE.match(body)
    if m:
        rows, n, k, e = (int(x) for x in m.groups())
        if e < 1 or rows % e:
            raise SystemExit(f"--case {text!r}: ROWS must be a positive multiple of E (equal groups)")
        return dict(name=text, suite=None, rows=rows, n=n, k=k, experts=e, epilogue=epilogue or None)
    from moe import bench as moe_bench
    from moe import suites

    cases = {c.name: c for c in moe_bench.cases_for(suites.suite("gemm"), "bf16")}
    hits = [c for n, c in cases.items() if n == body or n.endswith("_" + body)]
    if len(hits) != 1:
        raise SystemExit(f"--case {text!r}: a gemm suite case ({', '.join(cases)}; or the part after the shape) "
                         f"or ROWSxNxK/E")
    return dict(name=text, suite=hits[0], epilogue=epilogue or None)


def inputs(case: dict):
    """(a, b, offsets) of a case: the suite's draw, or equal groups of random bf16."""
    import cupy

    from cukernels import bench, dtypes

    if case["suite"] is not None:
        from moe import bench as moe_bench

        inp = moe_bench.make_inputs(case["suite"], bench.case_seed(case["suite"]))
        return inp.a, inp.b, inp.offsets_d, inp
    bf = dtypes.from_name("bf16")
    rows, e = case["rows"], case["experts"]
    a = dtypes.random((rows, case["k"]), bf, seed=1)
    b = dtypes.random((e, case["n"], case["k"]), bf, seed=2, scale=1 / 64)
    return a, b, cupy.asarray(np.arange(e + 1, dtype=np.int32) * (rows // e)), None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", required=True, help="E32_equal, a suite case or ROWSxNxK/E[:swiglu]")
    ap.add_argument("--variant", action="append", required=True, help="NAME[:item,...] (repeatable)")
    ap.add_argument("--baseline", action="store_true", help="add torch._grouped_mm (suite cases, no epilogue)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sustained", type=float, default=0.0, metavar="S", help="also S s back to back (rounds 1-2)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    variants = dict(parse_variant(v) for v in args.variant)
    cases = [parse_case(c) for c in args.case]
    configs = {n: [forced_config(a) for m, a, _ in sets if m == "config"] for n, sets in variants.items()}

    import cupy

    from cukernels import launch as cl

    gg = importlib.import_module("moe.grouped_gemm")
    moe_launch = importlib.import_module("moe.launch")
    attrs = ab_variants.Attributes(variants, kinds=("define", "config"))
    builds = contextlib.ExitStack()

    def configure(name):  # the tree's values, then this variant's; its kernel build; cleared caches
        builds.close()
        attrs.apply(variants[name])
        defs = ab_variants.defines(variants[name])
        if defs:
            builds.enter_context(moe_launch.kernels_built_with(defs))
        moe_launch._plan.cache_clear()
        gg._GEMM.clear()

    print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), flush=True)
    rows, names = [], list(variants)
    try:
        for case in cases:
            a, b, offs, suite_inputs = inputs(case)
            ptrs = [cl.view(x)[1] for x in (a, b, offs)]
            fns, outs, plans = {}, {}, {}
            for name in names:
                configure(name)
                config = configs[name][-1] if configs[name] else None
                call = gg._validated(a, b, offs, case["epilogue"], None, None, config)  # kept: this build's call
                plans[name] = str(call.config)
                fns[name] = lambda c=call: c(*ptrs, 0)
                outs[name] = [fns[name](), fns[name]()]
            builds.close()
            attrs.restore()
            row = {"case": case["name"], "plans": plans, **ab_variants.compare_outputs(outs, names[0])}
            timed = dict(fns)
            if args.baseline and case["suite"] is not None and case["epilogue"] is None:
                from moe import bench as moe_bench

                timed["torch-grouped"] = moe_bench._torch_grouped(case["suite"], suite_inputs)
            row.update(ab_variants.time_rounds(timed, args.rounds, sustained_s=args.sustained))
            order = list(timed)
            row["median_us"] = {n: {"do_bench": float(np.median(row["do_bench_us"][n])),
                                    "held": float(np.median(row["held_us"][n]))} for n in order}
            for n in order:
                s = row["sustained"][n]
                if s:
                    row["median_us"][n].update(cap=float(np.mean([x["ms_per_call"] for x in s])) * 1e3,
                                               cap_mj=float(np.mean([x["mj_per_call"] for x in s])))
            rows.append(row)
            print(json.dumps(row, default=str), flush=True)
            del a, b, offs, suite_inputs, fns, outs, timed
    finally:  # the tree's values back, and no call made under a variant left in the caches
        builds.close()
        attrs.restore()
        moe_launch._plan.cache_clear()
        gg._GEMM.clear()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    ref = names[0]
    print(f"\n| case | variant | plan | bitwise vs {ref} | do_bench us | held us | at the cap us (mJ) | {ref} / this "
          f"(do_bench, held, cap) |")
    print("|---" * 7 + "|")
    for row in rows:
        m = row["median_us"]
        for n in m:
            cap = f"{m[n]['cap']:.1f} ({m[n]['cap_mj']:.0f})" if "cap" in m[n] else ""
            ratios = [m[ref][k] / m[n][k] for k in ("do_bench", "held", "cap") if k in m[n] and k in m[ref]]
            print(f"| {row['case']} | {n} | {row['plans'].get(n, '')} | {row['bitwise_vs_' + ref].get(n, '')} | "
                  f"{m[n]['do_bench']:.1f} | {m[n]['held']:.1f} | {cap} | {', '.join(f'{x:.3f}' for x in ratios)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
