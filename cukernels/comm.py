"""``python -m cukernels.comm``: NCCL collectives timed the way nccl-tests times them, one process per GPU.

Collectives (NCCL through ``cupy.cuda.nccl``): all-reduce, all-gather, reduce-scatter, all-to-all (grouped
send/recv, as nccl-tests builds it) and send/recv (a ring: each rank sends to the next, receives from the previous),
over sizes from 8 B to 1 GB (``--sizes``), in place or not, fp32/fp16/bf16. Per size and operation: the time of one
operation (``--iters`` back-to-back operations between CUDA events after a warm-up, the slowest rank), the algorithm
bandwidth ``size / time`` and the bus bandwidth by nccl-tests' factors (all-reduce 2(n-1)/n, all-gather,
reduce-scatter and all-to-all (n-1)/n, send/recv 1), where ``size`` is the larger of one rank's input and output.
Every result is checked: inputs are small integers times (rank + 1), so every sum is exact in every dtype.

Processes: with ``--gpus N`` on one node this command starts the N processes itself (the NCCL unique id travels
from the parent to them); under torchrun or Slurm (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT`` set) each process runs its rank and the id is exchanged through torch.distributed's TCPStore.
NVLink multicast (NVLS) stays off: ``NCCL_NVLS_ENABLE=0`` unless the environment says otherwise.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Sequence

import numpy as np

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2}
PROG = "python -m cukernels.comm"


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth factor (its PERFORMANCE.md): what each link carries relative to ``size / time``."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    if op == "send_recv":
        return 1.0
    raise ValueError(f"op must be one of {OPS}, got {op!r}")


def parse_size(text: str) -> int:
    """``8``, ``64K``, ``16M``, ``1G`` (powers of 1024) -> bytes."""
    t = text.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    number = t[:-1] if scale > 1 else t
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise ValueError(f"size {text!r}: expected a number with an optional K, M or G suffix") from None
    if value < 1:
        raise ValueError(f"size {text!r}: must be at least 1 byte")
    return value


def sizes_between(spec: str) -> list[int]:
    """``LO:HI`` (doubling from LO to HI, both included when HI is LO times a power of two) or a comma list."""
    if ":" in spec:
        lo, hi = (parse_size(p) for p in spec.split(":", 1))
        if hi < lo:
            raise ValueError(f"--sizes {spec}: the upper end is below the lower")
        out = [lo]
        while out[-1] * 2 <= hi:
            out.append(out[-1] * 2)
        return out
    return [parse_size(p) for p in spec.split(",")]


def counts(op: str, nbytes: int, itemsize: int, ranks: int) -> tuple[int, int]:
    """(elements of one rank's input, of its output) for ``nbytes`` = the larger of the two, rounded down to whole
    elements per rank (at least one)."""
    per = max(1, nbytes // itemsize // ranks)
    if op == "all_reduce" or op == "send_recv":
        n = max(1, nbytes // itemsize)
        return n, n
    if op == "all_gather":
        return per, per * ranks
    if op == "reduce_scatter":
        return per * ranks, per
    if op == "all_to_all":
        return per * ranks, per * ranks
    raise ValueError(f"op must be one of {OPS}, got {op!r}")


@dataclasses.dataclass(kw_only=True)
class Row:
    op: str
    bytes: int
    dtype: str
    in_place: bool
    ranks: int
    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    correct: bool


def rendezvous_env(env: os._Environ | dict) -> dict | None:
    """(rank, world, local_rank, addr, port, store_server, store_key) from torchrun/Slurm variables, or None outside
    a launcher. ``store_server``: whether this process serves the TCPStore (``store_server_here``)."""
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", rank))
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        local = int(env.get("SLURM_LOCALID", rank))
    else:
        return None
    if not 0 <= rank < world:
        raise ValueError(f"RANK {rank} is outside WORLD_SIZE {world}")
    return {"rank": rank, "world": world, "local_rank": local, "addr": env.get("MASTER_ADDR", "127.0.0.1"),
            "port": int(env.get("MASTER_PORT", "29500")), "store_server": store_server_here(rank, env),
            # torchrun's agent store outlives a restart of the workers: a key per restart, never a stale id
            "store_key": f"cukernels.comm.nccl_id.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"}


def store_server_here(rank: int, env: os._Environ | dict) -> bool:
    """Whether this process must start the TCPStore server on MASTER_PORT: rank 0, unless torchrun's agent already
    serves it there (``TORCHELASTIC_USE_AGENT_STORE=True``, torch.distributed's own test), when every rank, rank 0
    too, connects as a client (a second server on the port would fail to bind)."""
    return rank == 0 and str(env.get("TORCHELASTIC_USE_AGENT_STORE", "")).lower() != "true"


def device_index(local_rank: int, device_count: int) -> int:
    """The GPU of a process with ``local_rank`` among ``device_count`` visible GPUs: ``local_rank % device_count``.
    Under Slurm each task may see only its own GPU(s) (CUDA_VISIBLE_DEVICES per task) while SLURM_LOCALID still
    counts the node's tasks, and LOCAL_RANK falls back to the global rank when absent."""
    if device_count < 1:
        raise ValueError(f"no visible GPU for local rank {local_rank} (device count {device_count})")
    if local_rank < 0:
        raise ValueError(f"local rank must be >= 0, got {local_rank}")
    return local_rank % device_count


def _unique_id_through_store(rv: dict) -> tuple:
    try:
        from torch.distributed import TCPStore
    except ImportError:
        raise SystemExit(f"{PROG}: under a multi-node launcher the NCCL id is exchanged through "
                         "torch.distributed's TCPStore: install torch (pip install 'cukernels[torch]')") from None
    from cupy.cuda import nccl

    store = TCPStore(rv["addr"], rv["port"], rv["world"], rv["store_server"])
    if rv["rank"] == 0:
        store.set(rv["store_key"], json.dumps(list(nccl.get_unique_id())))
    return tuple(json.loads(store.get(rv["store_key"])))


# ---------------------------------------------------------------- one rank


def _fill(arr, rank: int, seed: int):
    """Small integers (-4..4) times (rank + 1): every sum of up to 64 ranks is exact in fp16 and bf16."""
    import cupy

    from . import dtypes as _dtypes

    base = cupy.random.default_rng(seed).integers(-4, 5, size=arr.shape[0]).astype(cupy.float32) * (rank + 1)
    arr[...] = base if arr.dtype != _dtypes.BF16 else _dtypes.to_bf16(base)
    return base


def _run_op(comm, op, send, recv, n_in, n_out, nccl_dtype, rank, ranks, stream):
    from cupy.cuda import nccl

    ptr_s, ptr_r = send.data.ptr, recv.data.ptr
    if op == "all_reduce":
        comm.allReduce(ptr_s, ptr_r, n_in, nccl_dtype, nccl.NCCL_SUM, stream)
    elif op == "all_gather":
        comm.allGather(ptr_s, ptr_r, n_in, nccl_dtype, stream)
    elif op == "reduce_scatter":
        comm.reduceScatter(ptr_s, ptr_r, n_out, nccl_dtype, nccl.NCCL_SUM, stream)
    elif op == "all_to_all":
        block, item = n_in // ranks, send.itemsize
        nccl.groupStart()
        for peer in range(ranks):
            comm.send(ptr_s + peer * block * item, block, nccl_dtype, peer, stream)
            comm.recv(ptr_r + peer * block * item, block, nccl_dtype, peer, stream)
        nccl.groupEnd()
    else:  # send_recv ring
        nccl.groupStart()
        comm.send(ptr_s, n_in, nccl_dtype, (rank + 1) % ranks, stream)
        comm.recv(ptr_r, n_out, nccl_dtype, (rank - 1) % ranks, stream)
        nccl.groupEnd()


def _expected(op, n_in, n_out, rank, ranks, seed):
    """What this rank's output must hold (float32), from every rank's input pattern."""
    import cupy

    # every rank's input is this pattern times (rank + 1) (``_fill``)
    pattern = cupy.asnumpy(cupy.random.default_rng(seed).integers(-4, 5, size=n_in).astype(np.float32))
    if op == "all_reduce":
        return pattern * sum(r + 1 for r in range(ranks))
    if op == "all_gather":
        return np.concatenate([pattern * (r + 1) for r in range(ranks)])
    if op == "reduce_scatter":
        return pattern[rank * n_out:(rank + 1) * n_out] * sum(r + 1 for r in range(ranks))
    if op == "all_to_all":
        block = n_in // ranks
        return np.concatenate([pattern[rank * block:(rank + 1) * block] * (r + 1) for r in range(ranks)])
    return pattern * (((rank - 1) % ranks) + 1)


def rank_main(rank: int, ranks: int, local_rank: int, uid: tuple, args) -> list[Row]:
    import cupy
    from cupy.cuda import nccl

    from . import dtypes as _dtypes

    nccl_types = {"fp32": nccl.NCCL_FLOAT32, "fp16": nccl.NCCL_FLOAT16, "bf16": getattr(nccl, "NCCL_BFLOAT16", 9)}
    storage = {"fp32": np.float32, "fp16": np.float16, "bf16": _dtypes.BF16}
    cupy.cuda.Device(device_index(local_rank, cupy.cuda.runtime.getDeviceCount())).use()
    comm = nccl.NcclCommunicator(ranks, uid, rank)
    stream = cupy.cuda.Stream(non_blocking=True)
    rows = []
    for op in args.ops:
        for nbytes in args.sizes:
            n_in, n_out = counts(op, nbytes, DTYPES[args.dtype], ranks)
            in_place = args.in_place and op in ("all_reduce", "all_gather", "reduce_scatter")
            send = cupy.empty(max(n_in, n_out) if in_place else n_in, dtype=storage[args.dtype])
            recv = send if in_place and op == "all_reduce" else cupy.empty(n_out, dtype=storage[args.dtype])
            if in_place and op == "all_gather":  # NCCL's in-place all-gather: the input is this rank's block
                recv = cupy.empty(n_out, dtype=storage[args.dtype])
                send = recv[rank * n_in:(rank + 1) * n_in]
            if in_place and op == "reduce_scatter":
                send = cupy.empty(n_in, dtype=storage[args.dtype])
                recv = send[rank * n_out:(rank + 1) * n_out]
            seed = 1000 + nbytes % 9973
            cupy.cuda.Device().synchronize()
            _fill(send, rank, seed)
            cupy.cuda.Device().synchronize()
            run = lambda: _run_op(comm, op, send, recv, n_in, n_out, nccl_types[args.dtype], rank, ranks,  # noqa: E731
                                  stream.ptr)
            run()
            stream.synchronize()
            got = _dtypes.to_float32(recv) if recv.dtype == _dtypes.BF16 else recv.astype(cupy.float32)
            correct = bool(np.array_equal(cupy.asnumpy(got), _expected(op, n_in, n_out, rank, ranks, seed)))
            iters = args.iters if nbytes < (64 << 20) else max(5, args.iters // 4)
            for _ in range(args.warmup):
                run()
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            for _ in range(iters):
                run()
            end.record(stream)
            end.synchronize()
            t_us = cupy.cuda.get_elapsed_time(start, end) * 1e3 / iters
            # the slowest rank's time, and whether every rank's check passed: an all-reduce of two floats
            stat = cupy.asarray([t_us, 0.0 if correct else 1.0], dtype=cupy.float32)
            comm.allReduce(stat.data.ptr, stat.data.ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_MAX, stream.ptr)
            stream.synchronize()
            t_max, bad = (float(x) for x in cupy.asnumpy(stat))
            size = max(n_in, n_out) * DTYPES[args.dtype]
            alg = size / (t_max * 1e-6) / 1e9
            rows.append(Row(op=op, bytes=size, dtype=args.dtype, in_place=in_place, ranks=ranks, time_us=t_max,
                            algbw_gbs=alg, busbw_gbs=alg * bus_factor(op, ranks), correct=bad == 0.0))
            del send, recv
            cupy.get_default_memory_pool().free_all_blocks()
    return rows


def _child(rank: int, ranks: int, uid: tuple, args, queue) -> None:
    try:
        rows = rank_main(rank, ranks, rank, uid, args)
        queue.put((rank, [dataclasses.asdict(r) for r in rows], None))
    except BaseException as exc:  # reported by the parent, which exits non-zero
        queue.put((rank, None, f"{type(exc).__name__}: {exc}"))


def launch_local(ranks: int, args) -> list[dict]:
    """Start ``ranks`` processes on this node (one per GPU) and return rank 0's rows."""
    import multiprocessing as mp

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    from cupy.cuda import nccl

    uid = nccl.get_unique_id()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(r, ranks, uid, args, queue)) for r in range(ranks)]
    for p in procs:
        p.start()
    results, errors = {}, []
    for _ in procs:
        rank, rows, err = queue.get(timeout=args.timeout)
        if err:
            errors.append(f"rank {rank}: {err}")
        results[rank] = rows
    for p in procs:
        p.join(timeout=30)
    if errors:
        raise RuntimeError("; ".join(errors))
    return results[0]


# ---------------------------------------------------------------- the command


def topology(ranks: int) -> dict:
    """GPU names and active NVLink links per GPU from NVML (empty where NVML cannot say)."""
    from . import device

    out = {}
    nv = device._nvml()
    for i in range(ranks):
        info = device.nvml_info(i)
        links = None
        if nv is not None:
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                links = 0
                for link in range(18):
                    try:
                        links += int(nv.nvmlDeviceGetNvLinkState(h, link) == nv.NVML_FEATURE_ENABLED)
                    except Exception:
                        break
            except Exception:
                links = None
        out[f"gpu{i}"] = {"name": info.get("name"), "nvlink_active_links": links}
    return out


def table(rows: Sequence[dict]) -> str:
    from tabulate import tabulate

    def size_text(n):
        for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
            if n >= scale and n % scale == 0:
                return f"{n // scale}{unit}"
        return str(n)

    body = [{"op": r["op"], "size": size_text(r["bytes"]), "in place": "yes" if r["in_place"] else "",
             "time us": f"{r['time_us']:,.1f}", "algbw GB/s": f"{r['algbw_gbs']:,.1f}",
             "busbw GB/s": f"{r['busbw_gbs']:,.1f}", "check": "ok" if r["correct"] else "WRONG"} for r in rows]
    return tabulate(body, headers="keys", tablefmt="github", disable_numparse=True)


def seed_table(rows: Sequence[dict]) -> str:
    """Seed 002's communication table: a row per size, a column per operation, time in ms."""
    from tabulate import tabulate

    sizes = sorted({r["bytes"] for r in rows})
    ops = list(dict.fromkeys(r["op"] for r in rows))
    by = {(r["op"], r["bytes"]): r for r in rows}
    body = [{"size B": f"{s:,}", **{op: (f"{by[(op, s)]['time_us'] / 1e3:.4f}" if (op, s) in by else "")
                                   for op in ops}} for s in sizes]
    return tabulate(body, headers="keys", tablefmt="github", disable_numparse=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=None, help="processes (GPUs) to start on this node (default: all)")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {', '.join(OPS)}")
    p.add_argument("--sizes", default="8:1G", help="LO:HI (doubling) or a comma list, e.g. 1M,16M,1G")
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    p.add_argument("--in-place", action="store_true", help="all-reduce/all-gather/reduce-scatter in place")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the ranks")
    p.add_argument("--json", metavar="PATH")
    return p


def main(argv=None) -> int:
    from . import cli, device, environment

    p = parser()
    args = p.parse_args(argv)
    try:
        args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
        bad = [o for o in args.ops if o not in OPS]
        if bad:
            raise ValueError(f"--ops {','.join(bad)}: unknown; known: {', '.join(OPS)}")
        args.sizes = sizes_between(args.sizes)
        rv = rendezvous_env(os.environ)
    except ValueError as exc:
        return cli.usage_error(PROG, str(exc))
    if not device.gpu_available():
        return cli.no_gpu(PROG, "It runs NCCL collectives between GPUs; `--help` lists its options.")
    try:
        from cupy.cuda import nccl

        nccl.get_version()
    except Exception as exc:
        print(f"{PROG}: NCCL is not available to CuPy ({type(exc).__name__}: {exc}); "
              "pip install nvidia-nccl-cu13", file=sys.stderr)
        return cli.EXIT_USAGE
    import cupy

    t0 = time.perf_counter()
    if rv is not None:  # under torchrun/Slurm: this process is one rank
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        rows = [dataclasses.asdict(r) for r in rank_main(rv["rank"], rv["world"], rv["local_rank"],
                                                          _unique_id_through_store(rv), args)]
        if rv["rank"] != 0:
            return cli.EXIT_OK if all(r["correct"] for r in rows) else cli.EXIT_FAILED
        ranks = rv["world"]
    else:
        available = cupy.cuda.runtime.getDeviceCount()
        ranks = args.gpus or available
        if not 1 <= ranks <= available:
            return cli.usage_error(PROG, f"--gpus {ranks}: this node has {available} GPU(s)")
        rows = launch_local(ranks, args)
    print(f"{PROG}: {ranks} ranks, {args.dtype}, NCCL {nccl.get_version()}, {time.perf_counter() - t0:.0f} s")
    print(table(rows))
    print("\nseed 002's layout (time per operation, ms):")
    print(seed_table(rows))
    if args.json:
        doc = {"environment": environment.collect() if hasattr(environment, "collect") else {},
               "topology": topology(min(ranks, cupy.cuda.runtime.getDeviceCount())), "ranks": ranks,
               "nccl_version": nccl.get_version(), "rows": rows}
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1, default=str)
    return cli.EXIT_OK if all(r["correct"] for r in rows) else cli.EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
