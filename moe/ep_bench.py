"""``python -m moe.bench --suite ep``: the expert-parallel MoE layer (``moe.ep``) checked, then timed, one process
per GPU.

Cases: seed 004's MoE layer (hidden, intermediate and top-k of moe/suites.py's seed004 shapes) with 32 and 64
experts (``--experts``), T tokens per GPU (``--tokens``, default 32768; ``32k`` works), the exchange in 1 and 4
chunks (``--chunks``; 1: nothing overlapped). ``--quick``: a small layer (``QUICK``) for a fast pass.

Processes: ``--gpus N`` runs world size 1, then N (``--gpus 1,2,4`` names the sizes), each world in processes
started here, one per GPU, the NCCL id passed from this process (``cukernels.comm``'s way). Under torchrun or Slurm
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) each process is one rank of that one
world and the id travels through torch.distributed's TCPStore (``cukernels.comm``).

Every rank measures, rank 0 reports; per case and world size:

- check: each rank's output against the single-GPU ``MoELayer`` on the same full weights and its own tokens
  (``cukernels.checks`` tolerance of the dtype), bitwise the same on a second forward (deterministic), and the
  exchange alone (the GEMMs skipped) must give back x. A failed check makes the row FAILED and the exit status 1.
- fwd ms: the median of ``--iters`` forwards (after ``--warmup``), CUDA events on the caller's stream, the slowest
  rank's; tokens/s = W T / that. Every rank runs the same fixed number of forwards: a forward is collective, so
  ``cukernels.timing``'s adaptive loop (each process stopping on its own noise) would hang the others. The
  timed forwards record nothing; the communication times below come from separate recorded forwards.
- x 1-GPU MoELayer: tokens/s over the single-GPU ``MoELayer``'s on T tokens (timed the same way on every rank, the
  fastest); eff vs MoELayer = that / W. scaling vs EP(W=1): tokens/s(W) / (W tokens/s(1)), the expert-parallel
  layer against itself at world size 1 (weak scaling), when world size 1 ran too; it says nothing of how EP(1)
  compares with ``MoELayer`` (the column before does).
- dispatch / combine GB/s per GPU: bytes this rank exchanged with the other ranks (the larger of sent and
  received) over the communication stream's time in that phase, in forwards that skip the GEMMs (the exchange
  alone); the slowest rank's. World size 1 has no other rank: no figure.
- comm share: the communication stream's busy time in a full forward (every dispatch and return, including waits
  for the peers) over the forward's time; with chunks > 1 it runs under the GEMMs.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from queue import Empty
from typing import Sequence

import numpy as np

PROG = "python -m moe.bench --suite ep"
QUICK = {"hidden": 1024, "intermediate": 1024, "tokens": (4096,), "experts": (8, 16), "chunks": (1, 3)}
DEFAULT_TOKENS, DEFAULT_EXPERTS, DEFAULT_CHUNKS = (32768,), (32, 64), (1, 4)
_SEED004 = "seed004_b16x2048"  # the shape whose hidden, intermediate and top-k the cases take


def selected(argv: Sequence[str]) -> bool:
    """Whether a ``python -m moe.bench`` command line asks for this suite (``--suite ep`` or ``--suite=ep``)."""
    argv = list(argv)
    return any(a == "--suite=ep" or (a == "--suite" and i + 1 < len(argv) and argv[i + 1] == "ep")
               for i, a in enumerate(argv))


# ---------------------------------------------------------------- options (no GPU)


def parse_counts(option: str, text: str, low: int = 1) -> tuple[int, ...]:
    """``"32768,65536"`` or ``"32k,64k"`` (k = 1024) -> ints >= ``low``, in the order given, repeats dropped."""
    out = []
    for part in (p.strip() for p in str(text).split(",")):
        scale = 1024 if part[-1:] in ("k", "K") else 1
        try:
            value = int(part[:-1] if scale > 1 else part) * scale
        except ValueError:
            raise ValueError(f"{option} {text}: expected comma-separated whole numbers (32768, or 32k), "
                             f"got {part!r}") from None
        if value < low:
            raise ValueError(f"{option} {text}: each value must be at least {low}, got {value}")
        if value not in out:
            out.append(value)
    return tuple(out)


def world_sizes(spec: str | None, rv: dict | None) -> list[int] | None:
    """The world sizes to run: from ``--gpus`` (N: 1 and N; a list: those), or the launcher's WORLD_SIZE under
    torchrun/Slurm. None: 1 and every GPU of the node (known once a GPU is)."""
    if rv is not None:
        if spec is not None and list(parse_counts("--gpus", spec)) != [rv["world"]]:
            raise ValueError(f"--gpus {spec}: under torchrun/Slurm the world size is the launcher's "
                             f"(WORLD_SIZE={rv['world']}); leave --gpus out")
        return [rv["world"]]
    if spec is None:
        return None
    sizes = parse_counts("--gpus", spec)
    return sorted({1, *sizes}) if len(sizes) == 1 else sorted(sizes)


def resolve_world_sizes(sizes: list[int] | None, available: int) -> list[int]:
    """``world_sizes``' answer checked against the GPUs of this node."""
    sizes = sorted({1, available}) if sizes is None else sizes
    if max(sizes) > available:
        raise ValueError(f"--gpus {max(sizes)}: this node has {available} GPU(s)")
    return sizes


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    hidden: int
    intermediate: int
    top_k: int
    experts: tuple[int, ...]
    tokens: tuple[int, ...]
    chunks: tuple[int, ...]
    worlds: list[int] | None  # None: 1 and every GPU of the node


def settings(args, rv: dict | None) -> Settings:
    """The cases' dimensions from the options, every value checked (``ValueError`` naming the option)."""
    from . import configs, suites

    seed = suites.shape(_SEED004)
    if args.quick:
        hidden, inter = QUICK["hidden"], QUICK["intermediate"]
        experts, tokens, chunks = QUICK["experts"], QUICK["tokens"], QUICK["chunks"]
    else:
        hidden, inter = seed.hidden, seed.intermediate
        experts, tokens, chunks = DEFAULT_EXPERTS, DEFAULT_TOKENS, DEFAULT_CHUNKS
    experts = parse_counts("--experts", args.experts) if args.experts else experts
    tokens = parse_counts("--tokens", args.tokens) if args.tokens else tokens
    chunks = parse_counts("--chunks", args.chunks) if args.chunks else chunks
    top_k = seed.top_k if args.top_k is None else args.top_k
    worlds = world_sizes(args.gpus, rv)
    for e in experts:
        if e > configs.MAX_EXPERTS:
            raise ValueError(f"--experts {e}: at most {configs.MAX_EXPERTS} experts are supported")
        if not 1 <= top_k <= min(e, configs.MAX_TOP_K):
            raise ValueError(f"--top-k {top_k}: must be 1..{min(e, configs.MAX_TOP_K)} with {e} experts")
    check_shards(experts, worlds or ())
    if max(chunks) > min(tokens):
        raise ValueError(f"--chunks {max(chunks)} is more than --tokens {min(tokens)}: chunks would be empty "
                         "(the layer allows it; a benchmark of empty chunks measures nothing)")
    return Settings(hidden=hidden, intermediate=inter, top_k=top_k, experts=experts, tokens=tokens, chunks=chunks,
                    worlds=worlds)


def check_shards(experts: Sequence[int], worlds: Sequence[int]) -> None:
    """Every expert count must split evenly over every world size (``moe.ep.shard_range``'s rule)."""
    from .ep import shard_range

    for e in experts:
        for w in worlds:
            try:
                shard_range(e, w, 0)
            except ValueError as exc:
                raise ValueError(f"--experts {e} with world size {w}: {exc}") from None


# ---------------------------------------------------------------- results (no GPU)

# what each rank measures, in this order (one float64 vector per rank, all-gathered to every rank)
METRICS = ("fwd_ms", "comm_ms", "xo_ms", "xo_dispatch_ms", "xo_return_ms", "dispatch_out_b", "dispatch_in_b",
           "ok", "deterministic", "max_abs", "rel_l2", "xo_ok", "rows", "single_ms")


def row_from_ranks(*, world: int, experts: int, tokens: int, top_k: int, chunks: int, hidden: int,
                   intermediate: int, dtype: str, ranks: np.ndarray) -> dict:
    """A result row from every rank's ``METRICS`` vector (``ranks`` [world, len(METRICS)])."""
    m = {name: ranks[:, i] for i, name in enumerate(METRICS)}
    fwd = float(m["fwd_ms"].max())
    single = float(m["single_ms"].min())
    tps = world * tokens / (fwd * 1e-3)
    speedup = tps / (tokens / (single * 1e-3))

    def gbs(nbytes, ms):  # per rank, then the slowest
        with np.errstate(divide="ignore", invalid="ignore"):
            v = nbytes / (ms * 1e-3) / 1e9
        return float(v.min()) if world > 1 else None

    both = np.maximum(m["dispatch_out_b"], m["dispatch_in_b"])  # a return moves the dispatch's rows back
    return {
        "world": world, "experts": experts, "tokens_per_gpu": tokens, "top_k": top_k, "chunks": chunks,
        "hidden": hidden, "intermediate": intermediate, "dtype": dtype,
        "fwd_ms": fwd, "tokens_per_s": tps, "single_gpu_ms": single, "speedup_vs_1gpu_layer": speedup,
        "efficiency": speedup / world, "efficiency_vs_ep1": None,
        "dispatch_gbs": gbs(both, m["xo_dispatch_ms"]), "combine_gbs": gbs(both, m["xo_return_ms"]),
        "exchange_gbs": gbs(2 * both, m["xo_dispatch_ms"] + m["xo_return_ms"]),
        "exchange_ms": float((m["xo_dispatch_ms"] + m["xo_return_ms"]).max()),
        "exchange_only_fwd_ms": float(m["xo_ms"].max()),
        "comm_ms": float(m["comm_ms"].max()), "comm_share": float((m["comm_ms"] / m["fwd_ms"]).max()),
        "remote_bytes_per_gpu": int(both.max()),
        "load_imbalance": float(m["rows"].max() / m["rows"].mean()) if m["rows"].mean() > 0 else 1.0,
        "max_abs": float(m["max_abs"].max()), "rel_l2": float(m["rel_l2"].max()),
        "deterministic": bool(m["deterministic"].all()), "exchange_ok": bool(m["xo_ok"].all()),
        "correct": bool(m["ok"].all() and m["deterministic"].all() and m["xo_ok"].all()),
    }


def add_scaling(rows: list[dict]) -> list[dict]:
    """Fill ``efficiency_vs_ep1`` of every row whose case also ran at world size 1."""
    one = {(r["experts"], r["tokens_per_gpu"], r["chunks"]): r for r in rows if r["world"] == 1}
    for r in rows:
        base = one.get((r["experts"], r["tokens_per_gpu"], r["chunks"]))
        if base is not None:
            r["efficiency_vs_ep1"] = r["tokens_per_s"] / (r["world"] * base["tokens_per_s"])
    return rows


def table(rows: Sequence[dict]) -> str:
    from tabulate import tabulate

    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    body = [{"GPUs": r["world"], "experts": r["experts"], "tokens/GPU": f"{r['tokens_per_gpu']:,}",
             "chunks": r["chunks"], "fwd ms": f"{r['fwd_ms']:.3f}", "tokens/s": f"{r['tokens_per_s']:,.0f}",
             "x 1-GPU MoELayer": f"{r['speedup_vs_1gpu_layer']:.2f}",
             "eff vs MoELayer": f"{r['efficiency']:.2f}",
             "scaling vs EP(W=1)": num(r["efficiency_vs_ep1"], ".2f"), "dispatch GB/s": num(r["dispatch_gbs"], ".0f"),
             "combine GB/s": num(r["combine_gbs"], ".0f"), "comm share": f"{100 * r['comm_share']:.1f}%",
             "imbalance": f"{r['load_imbalance']:.2f}",
             "check": (f"ok ({r['max_abs']:.2g})" if r["correct"] else
                       "FAILED" + ("" if r["deterministic"] else " nondeterministic")
                       + ("" if r["exchange_ok"] else " exchange"))} for r in rows]
    return tabulate(body, headers="keys", tablefmt="github", disable_numparse=True)


def plots(rows: Sequence[dict], out_dir) -> list:
    """tokens/s against the GPU count per case, and the exchange's GB/s per case (needs matplotlib)."""
    from pathlib import Path

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: --plot needs matplotlib (pip install 'cukernels[plot]'); no plots written")
        return []
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for key in dict.fromkeys((r["experts"], r["tokens_per_gpu"], r["chunks"]) for r in rows):
        pts = sorted((r["world"], r["tokens_per_s"]) for r in rows if (r["experts"], r["tokens_per_gpu"],
                                                                        r["chunks"]) == key)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"E{key[0]} T{key[1]} C{key[2]}")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("tokens/s")
    ax.set_title("expert-parallel MoE: tokens/s")
    ax.legend(fontsize=7)
    fig.tight_layout()
    written.append(out / "ep_tokens_per_s.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    multi = [r for r in rows if r["dispatch_gbs"] is not None]
    if multi:
        fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(multi)), 4))
        names = [f"W{r['world']} E{r['experts']} T{r['tokens_per_gpu']} C{r['chunks']}" for r in multi]
        xs = np.arange(len(multi))
        ax.bar(xs - 0.2, [r["dispatch_gbs"] for r in multi], 0.4, label="dispatch")
        ax.bar(xs + 0.2, [r["combine_gbs"] for r in multi], 0.4, label="combine")
        ax.set_xticks(xs, names, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("GB/s per GPU")
        ax.legend()
        fig.tight_layout()
        written.append(out / "ep_exchange_gbs.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


# ---------------------------------------------------------------- one rank


def layer_weights(experts: int, hidden: int, inter: int, dtype, seed: int):
    """Router fp32 [hidden, experts] and expert weights (gate/up interleaved), the same on every rank; made one
    expert at a time (a fp32 copy of all of them would need twice their size)."""
    import cupy

    from cukernels import dtypes

    router = cupy.random.default_rng(seed * 7919 + 7).standard_normal((hidden, experts), dtype=cupy.float32)
    router /= np.sqrt(hidden)
    w_gu = cupy.empty((experts, 2 * inter, hidden), dtype=dtype)
    w_down = cupy.empty((experts, hidden, inter), dtype=dtype)
    for e in range(experts):
        w_gu[e] = dtypes.random((2 * inter, hidden), dtype, seed=(seed * 1024 + e) * 2 + 1, scale=1 / np.sqrt(hidden))
        w_down[e] = dtypes.random((hidden, inter), dtype, seed=(seed * 1024 + e) * 2 + 2, scale=1 / np.sqrt(inter))
    return router, w_gu, w_down


def _timed(fn, iters: int, warmup: int, stream) -> list[float]:
    """ms of each of ``iters`` calls (after ``warmup``), CUDA events on ``stream`` around each."""
    import cupy

    for _ in range(warmup):
        fn()
    marks = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(iters)]
    for e0, e1 in marks:
        e0.record(stream)
        fn()
        e1.record(stream)
    marks[-1][1].synchronize()
    return [cupy.cuda.get_elapsed_time(e0, e1) for e0, e1 in marks]


def _recorded(layer, x, n: int, exchange_only: bool) -> list:
    """The exchange records of ``n`` recorded forwards, untimed (every rank runs the same number)."""
    out = []
    for _ in range(n):
        layer(x, exchange_only=exchange_only, record=True)
        out.append(layer.last_exchange)
    return out


def compare_rows(out, ref, tol, name: str, block: int = 8192) -> dict:
    """``cukernels.checks.compare`` over blocks of rows (a float64 copy of a whole 64k x 4096 output would take
    GBs): passed, the largest error and the relative L2 error over every element."""
    import cupy

    from cukernels import checks, dtypes

    passed, max_abs, err2, ref2 = True, 0.0, 0.0, 0.0
    for lo in range(0, out.shape[0], block):
        r = ref[lo:lo + block]
        c = checks.compare(out[lo:lo + block], r, tol=tol, name=name)
        norm = float(cupy.linalg.norm(dtypes.to_float32(r).astype(cupy.float64)))
        passed, max_abs = passed and c.passed, max(max_abs, c.max_abs)
        err2, ref2 = err2 + (c.rel_l2 * norm) ** 2, ref2 + norm ** 2
    return {"passed": passed, "max_abs": max_abs, "rel_l2": float(np.sqrt(err2 / ref2)) if ref2 else float(err2)}


def _run_experts(comm, rank: int, world: int, s: Settings, experts: int, args, stream) -> list[dict]:
    import cupy
    from cupy.cuda import nccl

    from cukernels import checks, dtypes

    from .ep import ExpertParallelMoE
    from .layer import MoELayer

    dt = dtypes.from_name(args.dtype)
    tol = checks.TOLERANCES[args.dtype]
    router, w_gu, w_down = layer_weights(experts, s.hidden, s.intermediate, dt, args.seed)
    single = MoELayer(router, w_gu, w_down, s.top_k)
    rows = []
    for tokens in s.tokens:
        x = dtypes.random((tokens, s.hidden), dt, seed=args.seed * 7919 + 1000 + rank)  # this rank's tokens
        ref = single(x)
        single_ms = float(np.median(_timed(lambda: single(x), args.iters, args.warmup, stream)))
        for chunks in s.chunks:
            layer = ExpertParallelMoE.from_full(comm, rank, world, router, w_gu, w_down, s.top_k, chunks=chunks)
            out = layer(x)
            again = layer(x)
            check = compare_rows(out, ref, tol, "EP output vs MoELayer")
            same = bool((out.view(cupy.uint16) == again.view(cupy.uint16)).all())
            xo_check = compare_rows(layer(x, exchange_only=True), x, tol, "exchange alone")
            del out, again
            # timed plain; the communication stream's times come from separate recorded forwards (recording
            # adds 4 events per chunk to a forward, which would inflate fwd ms)
            fwd = _timed(lambda: layer(x), args.iters, args.warmup, stream)
            comm_ms = [sum(r.times_ms().values()) for r in _recorded(layer, x, args.iters, False)]
            xo = _timed(lambda: layer(x, exchange_only=True), args.iters, args.warmup, stream)
            records = _recorded(layer, x, args.iters, True)
            xo_times = [r.times_ms() for r in records]
            nbytes = records[-1].bytes()
            vec = {"fwd_ms": np.median(fwd), "comm_ms": np.median(comm_ms), "xo_ms": np.median(xo),
                   "xo_dispatch_ms": np.median([t["dispatch_ms"] for t in xo_times]),
                   "xo_return_ms": np.median([t["return_ms"] for t in xo_times]),
                   "dispatch_out_b": nbytes["dispatch_out"], "dispatch_in_b": nbytes["dispatch_in"],
                   "ok": check["passed"], "deterministic": same, "max_abs": check["max_abs"],
                   "rel_l2": check["rel_l2"], "xo_ok": xo_check["passed"],
                   "rows": records[-1].rows, "single_ms": single_ms}
            mine = cupy.asarray([float(vec[k]) for k in METRICS], dtype=cupy.float64)
            every = cupy.empty((world, len(METRICS)), dtype=cupy.float64)
            comm.allGather(mine.data.ptr, every.data.ptr, len(METRICS), nccl.NCCL_FLOAT64, stream.ptr)
            stream.synchronize()
            rows.append(row_from_ranks(world=world, experts=experts, tokens=tokens, top_k=s.top_k, chunks=chunks,
                                       hidden=s.hidden, intermediate=s.intermediate, dtype=args.dtype,
                                       ranks=cupy.asnumpy(every)))
            cupy.get_default_memory_pool().free_all_blocks()
    return rows


def rank_main(rank: int, world: int, local_rank: int, uid: tuple, args) -> list[dict]:
    import cupy
    from cupy.cuda import nccl

    s = settings(argparse.Namespace(**{**vars(args), "gpus": None}), {"world": world})
    from cukernels.comm import device_index

    cupy.cuda.Device(device_index(local_rank, cupy.cuda.runtime.getDeviceCount())).use()
    comm = nccl.NcclCommunicator(world, uid, rank)
    stream = cupy.cuda.Stream(non_blocking=True)
    rows = []
    with stream:
        for experts in s.experts:
            rows += _run_experts(comm, rank, world, s, experts, args, stream)
            cupy.get_default_memory_pool().free_all_blocks()
    return rows


def uneven_rank_main(rank: int, world: int, local_rank: int, uid: tuple, args) -> list[dict]:
    """A correctness run (no timing) with ``args.rank_tokens[rank]`` tokens on this rank (0 allowed; fewer than
    ``args.chunks`` leaves chunks empty): the output against the single-GPU ``MoELayer`` on the same weights, raising
    ``AssertionError`` when it differs. Layer sizes from ``args``: experts, hidden, intermediate, top_k, dtype,
    seed."""
    import cupy
    from cupy.cuda import nccl

    from cukernels import checks, dtypes
    from cukernels.comm import device_index

    from .ep import ExpertParallelMoE
    from .layer import MoELayer

    cupy.cuda.Device(device_index(local_rank, cupy.cuda.runtime.getDeviceCount())).use()
    comm = nccl.NcclCommunicator(world, uid, rank)
    dt = dtypes.from_name(args.dtype)
    router, w_gu, w_down = layer_weights(args.experts, args.hidden, args.intermediate, dt, args.seed)
    tokens = args.rank_tokens[rank]
    x = (dtypes.random((tokens, args.hidden), dt, seed=args.seed * 7919 + 1000 + rank) if tokens
         else cupy.empty((0, args.hidden), dtype=dt))
    layer = ExpertParallelMoE.from_full(comm, rank, world, router, w_gu, w_down, args.top_k, chunks=args.chunks)
    out = layer(x)
    plan = layer.last_exchange.plan
    if tuple(out.shape) != (tokens, args.hidden):
        raise AssertionError(f"rank {rank}: output shape {tuple(out.shape)}, expected {(tokens, args.hidden)}")
    if tokens:
        check = compare_rows(out, MoELayer(router, w_gu, w_down, args.top_k)(x), checks.TOLERANCES[args.dtype],
                             "EP output vs MoELayer")
        if not check["passed"]:
            raise AssertionError(f"rank {rank} ({tokens} tokens): EP output differs from MoELayer's: {check}")
    cupy.cuda.get_current_stream().synchronize()
    return [{"rank": rank, "tokens": tokens, "rows_computed": int(plan.rows.sum()) if plan is not None else None,
             "sent_rows": plan.send_rows.tolist() if plan is not None else None}]


def _child(rank: int, world: int, uid: tuple, args, queue, main=rank_main) -> None:
    try:
        queue.put((rank, main(rank, world, rank, uid, args), None))
    except BaseException as exc:  # reported by the parent, which exits non-zero
        queue.put((rank, None, f"{type(exc).__name__}: {exc}"))


def launch_local(world: int, args, main=rank_main) -> list[dict]:
    """Start ``world`` processes on this node (one per GPU, as ``cukernels.comm.launch_local``), each running
    ``main(rank, world, local_rank, uid, args)`` (``rank_main``: the bench), and return rank 0's rows."""
    import multiprocessing as mp

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    from cupy.cuda import nccl

    uid = nccl.get_unique_id()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(r, world, uid, args, queue, main)) for r in range(world)]
    for p in procs:
        p.start()
    results, errors = {}, []
    deadline = time.monotonic() + args.timeout
    while len(results) < world:
        # after a rank failed, the others may wait in NCCL for it forever: give them a little while, no more
        wait = min(deadline - time.monotonic(), 60.0 if errors else args.timeout)
        try:
            rank, rows, err = queue.get(timeout=max(wait, 1.0))
        except Empty:
            late = sorted(set(range(world)) - set(results))
            errors.append(f"rank(s) {', '.join(map(str, late))} gave no result "
                          + ("after another rank failed" if errors else f"within --timeout {args.timeout:g} s"))
            break
        if err:
            errors.append(f"rank {rank}: {err}")
        results[rank] = rows
    for p in procs:
        p.join(timeout=30 if not errors else 5)
        if p.is_alive():  # only when a rank is stuck: the processes are this function's own
            p.terminate()
            p.join(timeout=10)
    if errors:
        raise RuntimeError("; ".join(errors))
    return results[0]


# ---------------------------------------------------------------- the command


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default="ep", choices=["ep"], help="this suite (python -m moe.bench --list: the others)")
    p.add_argument("--gpus", metavar="N|LIST", help="world sizes on this node: N runs 1 and N; 1,2,4 those "
                                                    "(default: 1 and every GPU); under torchrun/Slurm the "
                                                    "launcher's WORLD_SIZE (leave --gpus out)")
    p.add_argument("--tokens", metavar="LIST", help=f"tokens per GPU (default {DEFAULT_TOKENS[0]}; 32k works)")
    p.add_argument("--experts", metavar="LIST", help="expert counts (default 32,64)")
    p.add_argument("--chunks", metavar="LIST", help="token chunks of the pipelined exchange, 1 = no overlap "
                                                    "(default 1,4)")
    p.add_argument("--top-k", type=int, default=None, help="experts per token (default: seed 004's, 2)")
    p.add_argument("--quick", action="store_true", help=f"a small layer: hidden {QUICK['hidden']}, intermediate "
                                                        f"{QUICK['intermediate']}, 8 and 16 experts, 4096 tokens, "
                                                        "chunks 1 and 3")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--iters", type=int, default=10, help="timed forwards per case (the same on every rank)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="write the rows, environment and topology as JSON")
    p.add_argument("--plot", metavar="DIR", help="write PNG plots (needs matplotlib)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the ranks of one world size")
    return p


def nccl_missing() -> str | None:
    """Why NCCL cannot be used through CuPy, or None."""
    try:
        from cupy.cuda import nccl

        nccl.get_version()
    except Exception as exc:
        return (f"{PROG}: NCCL is not available to CuPy ({type(exc).__name__}: {exc}); the expert-parallel suite "
                "exchanges tokens through it: pip install nvidia-nccl-cu13 (nvidia-nccl-cu12 with CuPy for CUDA 12). "
                "Every other suite runs without it.")
    return None


def main(argv=None) -> int:
    from cukernels import cli, comm, device, environment

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    try:
        if args.iters < 1 or args.warmup < 0:
            raise ValueError(f"--iters {args.iters} / --warmup {args.warmup}: need at least 1 timed forward and no "
                             "negative warm-up")
        rv = comm.rendezvous_env(os.environ)
        s = settings(args, rv)
    except ValueError as exc:
        return cli.usage_error(PROG, exc)
    if not device.gpu_available():
        return cli.no_gpu(PROG, "It runs the expert-parallel MoE layer over this node's GPUs (NCCL); "
                                f"`{PROG} --help` lists its options, `python -m moe.bench --plan --profile h200` "
                                "shows the single-GPU kernels' tiles.")
    missing = nccl_missing()
    if missing:
        print(missing, file=sys.stderr)
        return cli.EXIT_USAGE
    import cupy
    from cupy.cuda import nccl

    t0 = time.perf_counter()
    if rv is not None:  # under torchrun/Slurm: this process is one rank
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        rows = rank_main(rv["rank"], rv["world"], rv["local_rank"], comm._unique_id_through_store(rv), args)
        if rv["rank"] != 0:
            return cli.EXIT_OK if all(r["correct"] for r in rows) else cli.EXIT_FAILED
        worlds = [rv["world"]]
    else:
        available = cupy.cuda.runtime.getDeviceCount()
        try:
            worlds = resolve_world_sizes(s.worlds, available)
            check_shards(s.experts, worlds)
        except ValueError as exc:
            return cli.usage_error(PROG, exc)
        rows = []
        for w in worlds:
            print(f"{PROG}: world size {w} ...", file=sys.stderr, flush=True)
            try:
                rows += launch_local(w, args)
            except RuntimeError as exc:
                print(f"{PROG}: world size {w}: {exc}", file=sys.stderr)
                return cli.EXIT_FAILED
    rows = add_scaling(rows)
    gpu = device.nvml_info(0).get("name")
    print(f"{PROG}: world sizes {', '.join(map(str, worlds))}; {args.dtype}; hidden {s.hidden}, intermediate "
          f"{s.intermediate}, top-{s.top_k}; {gpu or 'GPU'}; NCCL {nccl.get_version()}; "
          f"{time.perf_counter() - t0:.0f} s")
    print(table(rows))
    if args.json:
        doc = {"command": " ".join(["python -m moe.bench", *argv]), "environment": environment.collect(),
               "topology": comm.topology(max(worlds)), "nccl_version": nccl.get_version(), "rows": rows}
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1, default=str)
        print(f"json: {args.json}")
    if args.plot:
        for path in plots(rows, args.plot):
            print(f"plot: {path}")
    return cli.EXIT_OK if all(r["correct"] for r in rows) else cli.EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
