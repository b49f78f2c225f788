"""Per-CTA timeline of the warp-specialised TMA forward: where a CTA's time goes (its Q, its first K/V, the loop,
the O store) and how the CTAs fall into waves, for problems whose time is not the loop's (small grids).

    PYTHONPATH=. python tools/fwd_timeline.py --shape 4,1024,8,8,64 [--causal] [--dtype fp16] [--json PATH]

``--shape`` is batch, seq, heads, kv_heads, head_dim. The kernel is built with ``-DFWD_TIMELINE=N``
(attention/kernels/flash_fwd_tma.cu: global-timer stamps per CTA, off in every engine build) and launched through
the public ``flash_attention`` with the planner's tile (or ``--tile``: an index into ``configs.tma_tiles``). One
warm-up call, then the L2 flushed and one timed call. Times in microseconds from the first CTA's start.
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
    p.add_argument("--shape", required=True, help="batch,seq,heads,kv_heads,head_dim")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--tile", type=int, default=None, help="index into configs.tma_tiles (default: the planner's)")
    p.add_argument("--ctas", type=int, default=65536, help="CTAs stamped at most")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
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
    return out


def main(argv) -> int:
    args, (batch, seq, heads, kv_heads, head_dim) = _parse(argv)
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
    result = summarize(cupy.asnumpy(stamps))
    result.update(shape=dict(batch=batch, seq=seq, heads=heads, kv_heads=kv_heads, head_dim=head_dim),
                  causal=args.causal, dtype=args.dtype, kernel=built[-1].name_expression)
    print(f"{result['kernel']}: {result['ctas']} CTAs on {result['sms']} SMs, {result['kernel_us']:.1f} us from "
          f"the first start to the last store; waves start at " + ", ".join(f"{w:.1f}" for w in result["waves"]))
    for name, pct in result["phases"].items():
        print(f"  {name:32s} p10 {pct[10]:7.2f}  p50 {pct[50]:7.2f}  p90 {pct[90]:7.2f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return cli.EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
