"""Per-CTA timeline of the decode-sized MoE layer in one launch (``moe_decode_skinny``): where its fixed cost goes
(the router items, the grid-wide wait, the routing, the up and down items, the combine) for the decode suite's cases.

    PYTHONPATH=. python tools/decode_timeline.py --case E64top8:1 [--case seed004:1] [--calls 7] [--define -DM=V]
        [--json PATH]

The kernel is built with ``-DDECODE_TIMELINE=N`` (moe/kernels/grouped_gemm.cu: global-timer stamps by thread 0 of
each CTA, off in every engine build) and called through the layer (``MoELayer``) on the suite's weights and tokens
(``moe.bench.make_inputs``), its output checked bitwise against the engine's build (``--define``: a variant's
build, stamped, against the engine's). Each timed call follows an L2
flush (as the held timer's samples do); the stamps of ``--calls`` calls, each phase as percentiles over the CTAs and
the median over calls, in microseconds from the first CTA's start. Beside them the layer's held time
(``timing.benchmark``), whose excess over the stamped span is the launch and the kernel's first CTA start.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SLOTS = ("start", "past pdl", "router items done", "past router barrier", "routed", "up items done",
         "first down past wait", "down items done", "exit", "sm", "up items", "down items", "counts zeroed",
         "choices made", "offsets scanned", "slots sorted")
PHASES = (0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8)  # the time stamps, in kernel order
STAMPED = 4096  # CTAs stamped at most


def summarize(raw: np.ndarray) -> dict:
    """Per phase (a stamp's time from the first start) p10 / p50 / p90 / max over the stamped CTAs."""
    rows = raw[raw[:, 0] > 0].astype(np.float64)
    t0 = rows[:, 0].min()
    out = {"ctas": int(len(rows)), "sms": int(len(np.unique(rows[:, 9]))),
           "span_us": float((rows[:, 8].max() - t0) / 1e3)}
    for i in PHASES:
        name, col = SLOTS[i], rows[:, i]
        col = col[col > 0]
        if len(col):
            t = (col - t0) / 1e3
            out[name] = {q: float(np.percentile(t, q)) for q in (10, 50, 90)} | {"max": float(t.max())}
    for i, name in ((10, "up items"), (11, "down items")):
        out[name + " per CTA"] = {str(int(k)): int(v) for k, v in zip(*np.unique(rows[:, i], return_counts=True))}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", required=True, help="a decode suite case: E64top8:1, seed004:4")
    ap.add_argument("--calls", type=int, default=7)
    ap.add_argument("--define", action="append", default=[],
                    help="-DMACRO=V for the stamped build too (a kernel variant behind an #if)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from cukernels import cli, device

    if not device.gpu_available():
        return cli.no_gpu("python tools/decode_timeline.py", "It stamps a kernel on a GPU; there is nothing to do here.")
    import cupy

    from cukernels import timing

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from layer_ab import layer_case, parse_case

    ml = importlib.import_module("moe.launch")
    layer_mod = importlib.import_module("moe.layer")

    results = []
    for case_name in (parse_case(c) for c in args.case):
        case, inputs = layer_case(case_name)
        layer, x = inputs.layer, inputs.x
        layer_mod._LAYER.clear()
        ref = layer(x)
        held_plain = timing.benchmark(lambda: layer(x), budget_ms=100).median_ms * 1e3
        layer_mod._LAYER.clear()
        try:
            with ml.kernels_built_with((f"-DDECODE_TIMELINE={STAMPED}", *args.define), "moe_decode_skinny") as built:
                got = layer(x)
            if not built:
                print(f"{case.name}: not one decode launch (no moe_decode_skinny built); skipped")
                continue
            same = bool((got == ref).all())
            stamps = cupy.ndarray((STAMPED, 16), dtype=cupy.uint64,
                                  memptr=built[-1].module.get_global("decode_timeline"))
            runs = []
            for _ in range(args.calls):
                layer(x)
                cupy.cuda.Device().synchronize()
                stamps[...] = 0
                timing.flush_l2()
                cupy.cuda.Device().synchronize()
                layer(x)
                cupy.cuda.Device().synchronize()
                runs.append(summarize(stamps.get()))
            held_stamped = timing.benchmark(lambda: layer(x), budget_ms=100).median_ms * 1e3
        finally:  # the stamped build's calls leave the layer cache
            layer_mod._LAYER.clear()
        med = {"case": case.name, "bitwise_equal_to_engine_build": same, "held_us": round(held_plain, 2),
               "held_us_stamped_build": round(held_stamped, 2),
               "span_us": float(np.median([r["span_us"] for r in runs])), "ctas": runs[0]["ctas"],
               "sms": runs[0]["sms"], "up items per CTA": runs[0]["up items per CTA"],
               "down items per CTA": runs[0]["down items per CTA"]}
        for name in (SLOTS[i] for i in PHASES):
            if name in runs[0]:
                med[name] = {q: round(float(np.median([r[name][q] for r in runs if name in r])), 2)
                             for q in (10, 50, 90, "max")}
        results.append(med)
        print(f"{case.name}: held {held_plain:.2f} us (stamped build {held_stamped:.2f}), stamped span "
              f"{med['span_us']:.2f} us, {med['ctas']} CTAs on {med['sms']} SMs, output bitwise equal: {same}")
        print(f"  up items per CTA {med['up items per CTA']}, down items per CTA {med['down items per CTA']}")
        for name in (SLOTS[i] for i in PHASES):
            if name in med:
                p = med[name]
                print(f"  {name:24s} p10 {p[10]:7.2f}  p50 {p[50]:7.2f}  p90 {p[90]:7.2f}  max {p['max']:7.2f} us")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
