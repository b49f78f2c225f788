"""Per-CTA timeline of the warp-specialised TMA forward: where a CTA's time goes (its Q, its first K/V, the loop,
the O store) and how the CTAs fall into waves, for problems whose time is not the loop's (small grids).

    PYTHONPATH=. python tools/fwd_timeline.py --shape 4,1024,8,8,64 [--causal] [--dtype fp16] [--json PATH]
                                              [--raw STAMPS.npy]
    python tools/fwd_timeline.py --from-raw STAMPS.npy      (no GPU: the analysis of saved stamps)

``--shape`` is batch, seq, heads, kv_heads, head_dim. The kernel is built with ``-DFWD_TIMELINE=N``
(attention/kernels/flash_fwd_tma.cu: global-timer stamps per CTA, off in every engine build) and launched through
the public ``flash_attention`` with the planner's tile (or ``--tile``: an index into ``configs.tma_tiles``). One
warm-up call, then the L2 flushed and one timed call. Times in microseconds from the first CTA's start. Besides each
phase's percentiles and the waves: how long an SM spends with 0, 1, 2, 3+ CTAs resident (per SM, mean), and the
turnaround from one CTA's end to the next CTA's start on the same SM (the block scheduler's gap, docs/perf/
attention.md v3.13). ``--raw`` saves the stamped rows (CTA x slot, ns; slot 5 the SM + 1); ``--from-raw`` reads them
back (a stack of calls: the last).
"""
import argparse
import json
import sys

import numpy as np

from cukernels import cli, device

PROG = "python tools/fwd_timeline.py"
SLOTS = ("start", "q landed", "first k", "loop done", "stored", "sm")


def _parse(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", help="batch,seq,heads,kv_heads,head_dim")
    p.add_argument("--raw", default=None, help="save the stamped rows (.npy)")
    p.add_argument("--from-raw", default=None, help="analyse stamps saved by --raw (no GPU, no --shape)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--tile", type=int, default=None, help="index into configs.tma_tiles (default: the planner's)")
    p.add_argument("--ctas", type=int, default=65536, help="CTAs stamped at most")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.from_raw is not None:
        return args, None
    if args.shape is None:
        p.error("--shape (or --from-raw) is required")
    try:
        shape = tuple(int(x) for x in args.shape.split(","))
        if len(shape) != 5 or min(shape) < 1:
            raise ValueError
    except ValueError:
        p.error(f"--shape: five positive integers batch,seq,heads,kv_heads,head_dim, got {args.shape!r}")
    return args, shape


def _instrumented(ctas: int):
    """Patches the forward's compile so the TMA kernel is built with the probe; returns the kernels built."""
    from attention import api

    built = []
    plain = api._compile.kernel

    def kernel(source, name, *, options=()):
        if "flash_fwd_tma" not in str(name):
            return plain(source, name, options=options)
        kern = plain(source, name, options=(*options, f"-DFWD_TIMELINE={ctas}"))
        built.append(kern)
        return kern

    api._compile.kernel = kernel
    return built


def _stamps(kern, ctas: int):
    import cupy

    ptr = kern.module.get_global("fwd_timeline")
    return cupy.ndarray((ctas, 8), dtype=cupy.uint64, memptr=ptr)


def summarize(raw: np.ndarray) -> dict:
    """Per phase percentiles over the stamped CTAs (rows with a start), and the CTAs' start times in waves."""
    rows = raw[raw[:, 0] > 0].astype(np.float64)
    t0 = rows[:, 0].min()
    t = (rows[:, :5] - t0) / 1e3  # us
    phases = {"q (start -> Q landed)": t[:, 1] - t[:, 0], "first k (start -> K landed)": t[:, 2] - t[:, 0],
              "loop (first K -> last P V)": t[:, 3] - t[:, 2], "store (last P V -> O stored)": t[:, 4] - t[:, 3],
              "cta (start -> stored)": t[:, 4] - t[:, 0]}
    out = {"ctas": int(len(rows)), "kernel_us": float(t[:, 4].max()), "sms": int(len(np.unique(rows[:, 5]))),
           "phases": {k: {q: float(np.percentile(v, q)) for q in (10, 50, 90)} for k, v in phases.items()}}
    starts = np.sort(t[:, 0])
    gaps = np.flatnonzero(np.diff(starts) > 0.25 * np.median(t[:, 4] - t[:, 0]))  # a new wave: a long pause
    out["waves"] = [float(starts[0])] + [float(starts[i + 1]) for i in gaps]
    # per SM: time at 0, 1, 2, 3+ resident CTAs over [0, kernel end], and each CTA end's wait for the next start
    sm, end = rows[:, 5].astype(np.int64), float(t[:, 4].max())
    resident, turnaround = np.zeros(4), []
    for s in np.unique(sm):
        mine = sm == s
        events = sorted([(x, 1) for x in t[mine, 0]] + [(x, -1) for x in t[mine, 4]])
        count, last = 0, 0.0
        for x, step in events:
            resident[min(count, 3)] += x - last
            count, last = count + step, x
        resident[0] += end - last
        begun = np.sort(t[mine, 0])
        for e in t[mine, 4]:
            later = begun[begun >= e]
            if len(later):
                turnaround.append(later[0] - e)
    out["resident_us"] = [float(x) for x in resident / out["sms"]]  # per SM, mean: 0, 1, 2, 3+ CTAs
    out["turnaround"] = ({q: float(np.percentile(turnaround, q)) for q in (10, 50, 90)} if turnaround else None)
    return out


def _report(result: dict) -> None:
    print(f"{result.get('kernel', 'saved stamps')}: {result['ctas']} CTAs on {result['sms']} SMs, "
          f"{result['kernel_us']:.1f} us from the first start to the last store; waves start at "
          + ", ".join(f"{w:.1f}" for w in result["waves"]))
    for name, pct in result["phases"].items():
        print(f"  {name:32s} p10 {pct[10]:7.2f}  p50 {pct[50]:7.2f}  p90 {pct[90]:7.2f} us")
    print("  per SM, us with 0 / 1 / 2 / 3+ CTAs resident: " + " / ".join(f"{x:.1f}" for x in result["resident_us"]))
    if result["turnaround"]:
        pct = result["turnaround"]
        print(f"  {'turnaround (end -> next start)':32s} p10 {pct[10]:7.2f}  p50 {pct[50]:7.2f}  p90 {pct[90]:7.2f} us")


def main(argv) -> int:
    args, shape = _parse(argv)
    if args.from_raw is not None:
        raw = np.load(args.from_raw)
        result = summarize(raw[-1] if raw.ndim == 3 else raw)
        _report(result)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        return cli.EXIT_OK
    batch, seq, heads, kv_heads, head_dim = shape
    if not device.gpu_available():
        return cli.no_gpu(PROG, "It times a kernel; without a GPU there is nothing to stamp.")
    import cupy

    from attention import configs, flash_attention
    from cukernels import dtypes, timing, tune

    built = _instrumented(args.ctas)
    t = dtypes.from_name(args.dtype)
    q = dtypes.random((batch, seq, heads, head_dim), t, seed=1)
    k, v = (dtypes.random((batch, seq, kv_heads, head_dim), t, seed=s) for s in (2, 3))
    plan = None
    if args.tile is not None:
        tiles = configs.tma_tiles(device.current(), head_dim)
        if not 0 <= args.tile < len(tiles):
            return cli.usage_error(PROG, f"--tile: 0..{len(tiles) - 1} at head dim {head_dim}, got {args.tile}")
        plan = tune.explicit(tiles[args.tile], device.current())
    flash_attention(q, k, v, causal=args.causal, plan=plan)
    if not built:
        return cli.usage_error(PROG, "the planner gave this problem no TMA tile (flash_fwd_tma): nothing to stamp")
    stamps = _stamps(built[-1], args.ctas)
    stamps.fill(0)
    timing.flush_l2()
    flash_attention(q, k, v, causal=args.causal, plan=plan)
    cupy.cuda.runtime.deviceSynchronize()
    raw = cupy.asnumpy(stamps)
    if args.raw:
        np.save(args.raw, raw[raw[:, 0] > 0])
    result = summarize(raw)
    result.update(shape=dict(batch=batch, seq=seq, heads=heads, kv_heads=kv_heads, head_dim=head_dim),
                  causal=args.causal, dtype=args.dtype, kernel=built[-1].name_expression)
    _report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return cli.EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
