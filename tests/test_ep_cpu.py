"""The expert-parallel layer's parts that need no GPU: expert shards, token chunks, launch-size buckets, the count
and offset arithmetic of the exchange (checked by moving labelled rows between simulated ranks in NumPy), the
bench's options, world sizes, result rows, and the command with no GPU or no NCCL."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from moe import ep, ep_bench


# ---------------------------------------------------------------- shards, chunks, buckets


def test_shard_ranges():
    assert [ep.shard_range(32, 2, r) for r in range(2)] == [(0, 16), (16, 32)]
    assert [ep.shard_range(64, 8, r) for r in (0, 7)] == [(0, 8), (56, 64)]
    assert ep.shard_range(5, 1, 0) == (0, 5)
    shards = [ep.shard_range(60, 4, r) for r in range(4)]
    assert shards[0][0] == 0 and shards[-1][1] == 60 and all(a[1] == b[0] for a, b in zip(shards, shards[1:]))
    with pytest.raises(ValueError, match=r"6 experts do not split evenly over 4 ranks.*multiple of the world size"
                                         r".*1, 2, 3, 6"):
        ep.shard_range(6, 4, 0)
    with pytest.raises(ValueError, match="rank 2 is outside the world size 2"):
        ep.shard_range(32, 2, 2)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="world size must be an int"):
            ep.shard_range(32, bad, 0)


def test_chunk_bounds():
    assert ep.chunk_bounds(10, 3) == [(0, 4), (4, 3), (7, 3)]
    assert ep.chunk_bounds(8, 1) == [(0, 8)]
    assert ep.chunk_bounds(4, 4) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert ep.chunk_bounds(2, 4) == [(0, 1), (1, 1), (2, 0), (2, 0)]  # empty chunks still take part
    assert ep.chunk_bounds(0, 3) == [(0, 0)] * 3
    b = ep.chunk_bounds(32769, 4)
    assert sum(n for _, n in b) == 32769 and max(n for _, n in b) - min(n for _, n in b) <= 1
    assert all(s + n == t for (s, n), (t, _) in zip(b, b[1:]))
    with pytest.raises(ValueError, match="tokens must be an int >= 0"):
        ep.chunk_bounds(-1, 2)
    with pytest.raises(ValueError, match="chunks must be an int >= 1"):
        ep.chunk_bounds(4, 0)


def test_bucket_rows():
    assert [ep.bucket_rows(n) for n in (0, 1, 256, 257, 1000, 4096, 4097)] == [0, 256, 256, 512, 1024, 4096, 4608]
    seen = {}
    for n in range(1, 1 << 16, 37):
        b = ep.bucket_rows(n)
        assert n <= b < max(n + 256, n * 1.125)
        seen.setdefault(n.bit_length(), set()).add(b)
    assert max(len(v) for v in seen.values()) <= 9  # at most 8 per power of two (+ the next power itself)
    with pytest.raises(ValueError, match="rows must be an int >= 0"):
        ep.bucket_rows(-1)


# ---------------------------------------------------------------- the exchange, simulated


def _routing(world, tokens, chunks, experts, top_k, seed):
    """Per rank: each chunk's expert of every slot (tokens * top_k, distinct experts per token)."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(world):
        per_chunk = []
        for _, n in ep.chunk_bounds(tokens[r], chunks):
            # skewed: a few experts popular, some idle
            p = rng.dirichlet(np.full(experts, 0.3))
            per_chunk.append(np.stack([rng.choice(experts, top_k, replace=False, p=p) for _ in range(n)]).ravel())
        out.append(per_chunk)
    return out


def _simulate(world, tokens, chunks, experts, top_k, seed=0):
    """Move labelled rows the way ``_EPCall`` does, with each rank's ``ExchangePlan``; returns the plans and what
    each rank's expert GEMMs saw, after checking every row's round trip."""
    local = experts // world
    slots = _routing(world, tokens, chunks, experts, top_k, seed)
    # each rank's send buffer: per chunk the slots in stable expert order; a row's label is (rank, chunk, slot)
    xs, send_counts = [], []
    for r in range(world):
        rows, counts = [], []
        for c, ids in enumerate(slots[r]):
            order = np.argsort(ids, kind="stable")
            rows.append([(r, c, int(s), int(ids[s])) for s in order])
            counts.append(np.bincount(ids, minlength=experts))
        xs.append(rows)
        # [W, C, El]: what routing's counts become after the staging copy
        send_counts.append(np.stack(counts).reshape(chunks, world, local).transpose(1, 0, 2))
    plans = [ep.ExchangePlan(send_counts[r], np.stack([send_counts[s][r] for s in range(world)]), r,
                             [len(x) for x in xs[r]]) for r in range(world)]
    seen = []
    returned = [[[None] * len(ch) for ch in xs[r]] for r in range(world)]
    for r, plan in enumerate(plans):
        to_expert, to_source = plan.reorder()
        assert to_expert.shape == to_source.shape == (plan.total_rows,)
        rs = [None] * plan.total_rows
        for c in range(chunks):
            for s in range(world):  # dispatch: s's run for r lands at r's recv_off
                ps = plans[s]
                n = int(ps.send_rows[c, r])
                assert n == plan.recv_rows[c, s]
                block = xs[s][c][int(ps.send_off[c, r]):int(ps.send_off[c, r]) + n]
                assert all(row[3] // local == r for row in block)  # only this rank's experts
                rs[int(plan.recv_off[c, s]):int(plan.recv_off[c, s]) + n] = block
            b, n, pad = int(plan.base[c]), int(plan.rows[c]), int(plan.padded[c])
            assert pad == ep.bucket_rows(n) and (to_expert[b + n:b + pad] == -1).all()
            assert (to_source[b + n:b + pad] == -1).all()
            chunk_rs = rs[b:b + n]
            xe = [chunk_rs[i] for i in to_expert[b:b + n]]  # the expert-major rows the GEMMs read
            off = plan.gemm_offsets[c]
            assert off[0] == 0 and off[-1] == n and (np.diff(off) >= 0).all()
            for e in range(local):
                group = xe[off[e]:off[e + 1]]
                assert all(row[3] == r * local + e for row in group)
                assert [row[0] for row in group] == sorted(row[0] for row in group)  # sources in order
            seen.append(xe)
            back = [xe[i] for i in to_source[b:b + n]]
            assert back == chunk_rs  # the reorders are inverse permutations
            for s in range(world):  # return: to s, at the rows they left
                ps = plans[s]
                n_s = int(plan.recv_rows[c, s])
                o = int(plan.recv_off[c, s]) - b
                returned[s][c][int(ps.send_off[c, r]):int(ps.send_off[c, r]) + n_s] = back[o:o + n_s]
    assert returned == xs  # every row came home to where it left
    return plans, seen


@pytest.mark.parametrize("world, chunks, experts, top_k", [(1, 1, 8, 2), (1, 3, 8, 2), (2, 1, 32, 2),
                                                           (2, 4, 32, 2), (4, 3, 16, 4), (8, 2, 8, 1),
                                                           (4, 2, 4, 2)])
def test_exchange_moves_every_row_home(world, chunks, experts, top_k):
    tokens = [37 + 11 * r for r in range(world)]  # ranks may hold different token counts
    plans, seen = _simulate(world, tokens, chunks, experts, top_k, seed=world * 100 + chunks)
    total = sum(t * top_k for t in tokens)
    assert sum(int(p.rows.sum()) for p in plans) == total  # every slot computed exactly once
    for r, p in enumerate(plans):
        assert p.remote_sent_rows == int(p.send_rows.sum()) - int(p.send_rows[:, r].sum())
        assert p.remote_recv_rows == int(p.recv_rows.sum()) - int(p.recv_rows[:, r].sum())
        assert (p.base == np.concatenate([[0], np.cumsum(p.padded)[:-1]])).all()
        if world == 1:
            assert p.remote_sent_rows == p.remote_recv_rows == 0


def test_one_source_needs_no_reorder():
    """With one rank (or one expert per rank) source-major is already expert-major: the reorder is the identity,
    which is why ``_EPCall`` skips it."""
    for world, experts in ((1, 8), (4, 4)):
        plans, _ = _simulate(world, [50] * world, 2, experts, 2, seed=3)
        for p in plans:
            to_expert, to_source = p.reorder()
            for c in range(p.chunks):
                b, n = int(p.base[c]), int(p.rows[c])
                assert (to_expert[b:b + n] == np.arange(n)).all() and (to_source[b:b + n] == np.arange(n)).all()


def test_exchange_plan_rejects_bad_counts():
    send = np.ones((2, 1, 4), dtype=np.int32)
    with pytest.raises(RuntimeError, match=r"add up to its rows \[9\], got \[8\]"):
        ep.ExchangePlan(send, send, 0, [9])
    with pytest.raises(ValueError, match="must both be"):
        ep.ExchangePlan(send, send[:, :, :2], 0, [8])
    with pytest.raises(RuntimeError, match="negative"):
        ep.ExchangePlan(-send, send, 0, [-8])
    empty = ep.ExchangePlan(np.array([[[2, 0]], [[0, 0]]]), np.zeros((2, 1, 2)), 0, [2])
    assert empty.total_rows == 0 and empty.reorder()[0].size == 0 and empty.rows.tolist() == [0]


# ---------------------------------------------------------------- the bench's options


def _args(**kw):
    base = dict(suite="ep", gpus=None, tokens=None, experts=None, chunks=None, top_k=None, quick=False,
                dtype="bf16", iters=10, warmup=3, seed=0, json=None, plot=None, timeout=60.0)
    return argparse.Namespace(**{**base, **kw})


def test_selected():
    assert ep_bench.selected(["--suite", "ep"]) and ep_bench.selected(["--gpus", "2", "--suite=ep"])
    assert not ep_bench.selected(["--suite", "quick"]) and not ep_bench.selected(["--case", "ep"])
    assert not ep_bench.selected(["--suite"])


def test_counts_and_world_sizes():
    assert ep_bench.parse_counts("--tokens", "32k,64K,32768") == (32768, 65536)
    for bad in ("0", "x", "1,,2"):
        with pytest.raises(ValueError, match="--tokens"):
            ep_bench.parse_counts("--tokens", bad)
    assert ep_bench.world_sizes(None, None) is None
    assert ep_bench.world_sizes("2", None) == [1, 2]
    assert ep_bench.world_sizes("1", None) == [1]
    assert ep_bench.world_sizes("4,2", None) == [2, 4]
    assert ep_bench.resolve_world_sizes(None, 8) == [1, 8] and ep_bench.resolve_world_sizes(None, 1) == [1]
    with pytest.raises(ValueError, match="--gpus 4: this node has 2 GPU"):
        ep_bench.resolve_world_sizes([1, 4], 2)
    rv = {"rank": 1, "world": 2, "local_rank": 1, "addr": "node0", "port": 29500}
    assert ep_bench.world_sizes(None, rv) == [2] and ep_bench.world_sizes("2", rv) == [2]
    with pytest.raises(ValueError, match="WORLD_SIZE=2"):
        ep_bench.world_sizes("4", rv)


def test_settings():
    s = ep_bench.settings(_args(), None)
    assert (s.hidden, s.intermediate, s.top_k) == (4096, 11008, 2)  # seed 004's layer (moe/suites.py)
    assert s.experts == (32, 64) and s.tokens == (32768,) and s.chunks == (1, 4) and s.worlds is None
    q = ep_bench.settings(_args(quick=True, gpus="2"), None)
    assert q.hidden == ep_bench.QUICK["hidden"] and q.experts == (8, 16) and q.worlds == [1, 2]
    t = ep_bench.settings(_args(tokens="32k,64k", experts="32", chunks="2"), None)
    assert t.tokens == (32768, 65536) and t.experts == (32,) and t.chunks == (2,)
    with pytest.raises(ValueError, match="--experts 6 with world size 4: 6 experts do not split evenly"):
        ep_bench.settings(_args(experts="6", gpus="4"), None)
    with pytest.raises(ValueError, match="--chunks 8 is more than --tokens 4"):
        ep_bench.settings(_args(tokens="4", chunks="8"), None)
    with pytest.raises(ValueError, match="--top-k 9"):
        ep_bench.settings(_args(top_k=9), None)
    with pytest.raises(ValueError, match="--experts 1024: at most"):
        ep_bench.settings(_args(experts="1024"), None)
    with pytest.raises(ValueError, match="experts do not split"):
        ep_bench.check_shards((32, 48), [1, 2, 4, 32])


# ---------------------------------------------------------------- results


def _metrics(fwd, single, disp_ms, ret_ms, nbytes, ok=1.0, rows=100.0):
    m = dict(fwd_ms=fwd, comm_ms=fwd / 10, xo_ms=disp_ms + ret_ms + 1, xo_dispatch_ms=disp_ms, xo_return_ms=ret_ms,
             dispatch_out_b=nbytes, dispatch_in_b=nbytes / 2, ok=ok, deterministic=1.0, max_abs=0.01, rel_l2=1e-3,
             xo_ok=1.0, rows=rows, single_ms=single)
    return [m[k] for k in ep_bench.METRICS]


def _row(world, ranks, chunks=4):
    return ep_bench.row_from_ranks(world=world, experts=32, tokens=32768, top_k=2, chunks=chunks, hidden=4096,
                                   intermediate=11008, dtype="bf16", ranks=np.array(ranks, dtype=np.float64))


def test_rows_and_scaling():
    one = _row(1, [_metrics(40.0, 35.0, 1.0, 1.0, 0.0)])
    assert one["dispatch_gbs"] is None and one["tokens_per_s"] == pytest.approx(32768 / 0.040)
    two = _row(2, [_metrics(40.0, 35.0, 1.0, 2.0, 300e6), _metrics(42.0, 36.0, 1.5, 1.0, 200e6, rows=300.0)])
    assert two["fwd_ms"] == 42.0 and two["single_gpu_ms"] == 35.0  # slowest EP rank, fastest single GPU
    assert two["tokens_per_s"] == pytest.approx(2 * 32768 / 0.042)
    assert two["speedup_vs_1gpu_layer"] == pytest.approx(35.0 / 21.0)
    assert two["efficiency"] == pytest.approx(35.0 / 42.0)
    assert two["dispatch_gbs"] == pytest.approx(min(300e6 / 1e-3, 200e6 / 1.5e-3) / 1e9)
    assert two["combine_gbs"] == pytest.approx(min(300e6 / 2e-3, 200e6 / 1e-3) / 1e9)
    assert two["load_imbalance"] == pytest.approx(1.5) and two["correct"]
    rows = ep_bench.add_scaling([one, two])
    assert rows[1]["efficiency_vs_ep1"] == pytest.approx(two["tokens_per_s"] / (2 * one["tokens_per_s"]))
    assert rows[0]["efficiency_vs_ep1"] == pytest.approx(1.0)
    bad = _row(2, [_metrics(40.0, 35.0, 1.0, 1.0, 1e6, ok=0.0), _metrics(40.0, 35.0, 1.0, 1.0, 1e6)], chunks=1)
    assert not bad["correct"]
    text = ep_bench.table([one, two, bad])
    assert text.count("\n") == 4 and "FAILED" in text and "| -" in text


# ---------------------------------------------------------------- the command


def test_no_gpu_message(monkeypatch, capsys):
    from cukernels import cli, device

    import moe.bench

    monkeypatch.setattr(device, "gpu_available", lambda: False)
    assert ep_bench.main(["--suite", "ep", "--gpus", "2"]) == cli.EXIT_NO_GPU
    assert "No CUDA GPU" in capsys.readouterr().err
    assert moe.bench.main(["--suite", "ep", "--quick"]) == cli.EXIT_NO_GPU  # moe.bench hands the suite over
    err = capsys.readouterr().err
    assert "No CUDA GPU" in err and "--suite ep" in err


def test_bad_arguments_exit_2(monkeypatch, capsys):
    from cukernels import cli

    for argv, words in ((["--experts", "6", "--gpus", "4"], "--experts 6"), (["--tokens", "zero"], "--tokens"),
                        (["--iters", "0"], "--iters"), (["--chunks", "5", "--tokens", "4"], "--chunks 5")):
        assert ep_bench.main(["--suite", "ep", *argv]) == cli.EXIT_USAGE
        assert words in capsys.readouterr().err
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert ep_bench.main(["--suite", "ep", "--gpus", "4"]) == cli.EXIT_USAGE
    assert "WORLD_SIZE=2" in capsys.readouterr().err


def test_missing_nccl_is_said(monkeypatch, capsys):
    from cukernels import cli, device

    monkeypatch.setattr(device, "gpu_available", lambda: True)
    monkeypatch.setattr(ep_bench, "nccl_missing", lambda: "moe ep: NCCL is not available to CuPy; pip install x")
    assert ep_bench.main(["--suite", "ep"]) == cli.EXIT_USAGE
    assert "NCCL is not available" in capsys.readouterr().err


def test_nccl_missing_names_the_package():
    msg = ep_bench.nccl_missing()
    assert msg is None or ("pip install nvidia-nccl" in msg and "Every other suite" in msg)


def test_single_gpu_suites_unchanged(capsys):
    import moe.bench

    assert moe.bench.main(["--list"]) == 0
    assert "seed004" in capsys.readouterr().out


# ---------------------------------------------------------------- the forward's pointers, with fake GPUs
#
# ``_EPCall`` does its work through device addresses: workspace offsets, chunk bases, per-peer runs, the index
# and offset uploads. Here "device memory" is host memory (addresses are real, every copy is a memmove), NCCL is
# a mailbox between threads (one per rank, FIFO per pair of ranks, as NCCL matches send/recv), and the kernels are
# NumPy models of route, permute, gather, the grouped GEMM and combine. Each call runs when it is issued, so host
# order is the execution order (it respects every stream and event dependency of the forward; races are the GPU
# tests' business). The output must be the NumPy reference layer's on each rank's tokens.

import ctypes  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import types  # noqa: E402
from collections import defaultdict, deque  # noqa: E402


def _mem(addr: int, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return np.frombuffer((ctypes.c_char * max(n, 1)).from_address(addr), dtype, int(np.prod(shape))).reshape(shape)


class _Dev:
    """A host array standing for a device array: ``.data.ptr`` is its address."""

    def __init__(self, arr):
        self.arr = np.ascontiguousarray(arr)
        self.data = types.SimpleNamespace(ptr=self.arr.ctypes.data)


class _Frame:
    device_id = 0

    def __init__(self):
        self.keep = []

    def stream(self):
        return 1

    def workspace(self, stream, nbytes):
        buf = np.full(max(nbytes, 1), 0xAB, np.uint8)  # garbage, as fresh pool memory is
        self.keep.append(buf)
        return buf, buf.ctypes.data

    def empty(self, shape, dtype):
        arr = np.full(shape, np.nan, np.float16)
        self.keep.append(arr)
        return arr, arr.ctypes.data


class _Route:
    def __init__(self, problem, scoring, renormalize, frame):
        self.tokens, self.experts, self.top_k, self.block_tokens = (problem.tokens, problem.experts, problem.top_k,
                                                                    64)
        t, k, e = self.tokens, self.top_k, self.experts
        self.offsets = {"weights": 0, "experts": 4 * t * k, "counts": 8 * t * k}
        self.nbytes = 8 * t * k + 4 * e

    def enqueue(self, stream, logits_ptr, base):
        t, k, e = self.tokens, self.top_k, self.experts
        logits = _mem(logits_ptr, (t, e), np.float32).astype(np.float64)
        sel = np.argsort(-logits, axis=1, kind="stable")[:, :k]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        w = np.take_along_axis(p, sel, axis=1)
        _mem(base, (t, k), np.float32)[:] = w / w.sum(axis=1, keepdims=True)
        _mem(base + self.offsets["experts"], (t, k), np.int32)[:] = sel
        _mem(base + self.offsets["counts"], (e,), np.int32)[:] = np.bincount(sel.ravel(), minlength=e)


class _Permute:
    def __init__(self, route, block_m, frame):
        self.route, rows, e = route, route.tokens * route.top_k, route.experts
        up = lambda n: -(-n // 256) * 256  # noqa: E731  (the real layout: each field 256-byte aligned)
        self.out_offsets = (0, up(4 * rows), 2 * up(4 * rows), 2 * up(4 * rows))
        self.nbytes = 2 * up(4 * rows) + up(4 * (e + 1))

    def enqueue(self, stream, routing_base, base, row_weight):
        r = self.route
        ids = _mem(routing_base + r.offsets["experts"], (r.tokens * r.top_k,), np.int32)
        order = np.argsort(ids, kind="stable")
        _mem(base, order.shape, np.int32)[:] = order
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        _mem(base + self.out_offsets[1], order.shape, np.int32)[:] = inverse
        counts = np.bincount(ids, minlength=r.experts)
        _mem(base + self.out_offsets[2], (r.experts + 1,), np.int32)[:] = np.concatenate([[0], np.cumsum(counts)])
        if row_weight:
            w = _mem(routing_base + r.offsets["weights"], (r.tokens * r.top_k,), np.float32)
            _mem(row_weight, order.shape, np.float32)[:] = w[order]


class _Launch:
    def __init__(self, fn):
        self.launch = fn


def _gather(rows, hidden, top_k, dt, align):
    def launch(stream, ptrs):
        x, slots, out = ptrs
        idx = _mem(slots, (rows,), np.int32)
        dst = _mem(out, (rows, hidden), dt)
        for r, s in enumerate(idx):
            dst[r] = 0 if s < 0 else _mem(x + int(s // top_k) * hidden * dt.itemsize, (hidden,), dt)
    return _Launch(launch)


def _combine(tokens, hidden, top_k, dt, align):
    def launch(stream, ptrs):
        y, inverse, weights, out = ptrs
        inv = _mem(inverse, (tokens, top_k), np.int32)
        w = _mem(weights, (tokens, top_k), np.float32) if weights else np.ones((tokens, top_k), np.float32)
        rows = _mem(y, (int(inv.max()) + 1, hidden), dt).astype(np.float32)
        _mem(out, (tokens, hidden), dt)[:] = (rows[inv] * w[:, :, None]).sum(axis=1)
    return _Launch(launch)


class _Gemm:
    def __init__(self, problem, config, dtype, frame):
        self.p, self.dtype = problem, np.dtype(dtype)
        self.out_dtype = np.dtype(np.float32) if problem.out_dtype == "fp32" else self.dtype

    def enqueue(self, stream, pa, pb, pout, poffsets, pscale):
        p = self.p
        off = _mem(poffsets, (p.experts + 1,), np.int32)
        assert poffsets % 16 == 0 and off[0] >= 0 and (np.diff(off) >= 0).all() and off[-1] <= p.rows
        a = _mem(pa, (int(off[-1]), p.k), self.dtype).astype(np.float32)
        b = _mem(pb, (p.experts, p.n, p.k), self.dtype).astype(np.float32)
        n_out = p.n // 2 if p.epilogue == "swiglu" else p.n
        out = _mem(pout, (int(off[-1]), n_out), self.out_dtype)
        scale = _mem(pscale, (int(off[-1]), 1), np.float32) if pscale else np.ones((int(off[-1]), 1), np.float32)
        for e in range(p.experts):
            y = a[off[e]:off[e + 1]] @ b[e].T
            if p.epilogue == "swiglu":
                y = y[:, 0::2] / (1 + np.exp(-y[:, 0::2])) * y[:, 1::2]
            out[off[e]:off[e + 1]] = y * scale[off[e]:off[e + 1]]  # the row scale, in fp32 before rounding


class _Nccl:
    NCCL_INT32, NCCL_UINT8, NCCL_INT64, NCCL_MIN = 7, 1, 4, 3
    _SIZE = {7: 4, 1: 1, 4: 8}

    def __init__(self, world=1):
        self.box = defaultdict(deque)
        self.cond = threading.Condition()
        self.local = threading.local()
        self.barrier = threading.Barrier(world, timeout=20)
        self.reduce_in = {}
        self.groups = defaultdict(int)  # per rank (thread name): NCCL groups issued (every rank issues as many)
        self.calls = defaultdict(int)  # per rank: sends, receives and all-reduces

    def groupStart(self):
        self.local.ops = []

    def groupEnd(self):
        ops, self.local.ops = self.local.ops, None
        self.groups[threading.current_thread().name] += 1  # empty groups too: a real one is still collective
        with self.cond:
            for kind, rank, ptr, n, peer in ops:
                if kind == "send":
                    self.box[(rank, peer)].append(bytes(_mem(ptr, (n,), np.uint8)))
            self.cond.notify_all()
            for kind, rank, ptr, n, peer in ops:
                if kind == "recv":
                    assert self.cond.wait_for(lambda: self.box[(peer, rank)], timeout=20), "a recv was never sent"
                    data = self.box[(peer, rank)].popleft()
                    assert len(data) == n, f"rank {rank} expects {n} bytes from {peer}, was sent {len(data)}"
                    ctypes.memmove(ptr, data, n)

    def comm(self, rank):
        lib = self

        class Comm:
            def send(self, ptr, count, dtype, peer, stream):
                lib.calls[rank] += 1
                lib.local.ops.append(("send", rank, ptr, count * lib._SIZE[dtype], peer))

            def recv(self, ptr, count, dtype, peer, stream):
                lib.calls[rank] += 1
                lib.local.ops.append(("recv", rank, ptr, count * lib._SIZE[dtype], peer))

            def allReduce(self, send, recv, count, dtype, op, stream):
                assert dtype == lib.NCCL_INT64 and op == lib.NCCL_MIN
                lib.calls[rank] += 1
                lib.reduce_in[rank] = _mem(send, (count,), np.int64).copy()
                lib.barrier.wait()
                _mem(recv, (count,), np.int64)[:] = np.min(np.stack(list(lib.reduce_in.values())), axis=0)
                lib.barrier.wait()
        return Comm()


def _fake_cupy(nccl, syncs):
    rt = types.SimpleNamespace(
        memcpy2DAsync=lambda dst, dp, src, sp, w, h, kind, s: [ctypes.memmove(dst + i * dp, src + i * sp, w)
                                                               for i in range(h)],
        memcpyAsync=lambda dst, src, n, kind, s: ctypes.memmove(dst, src, n),
        memsetAsync=lambda dst, value, n, s: ctypes.memset(dst, value, n),
        streamSynchronize=lambda s: syncs.append(s), eventRecord=lambda e, s: None,
        streamWaitEvent=lambda s, e, f=0: None,
        eventElapsedTime=lambda a, b: 0.5)
    event = lambda **kw: types.SimpleNamespace(ptr=3, synchronize=lambda: None)  # noqa: E731
    cuda = types.SimpleNamespace(runtime=rt, nccl=nccl, Event=event, alloc_pinned_memory=lambda n: bytearray(n),
                                 Stream=lambda **kw: types.SimpleNamespace(ptr=2))
    return types.SimpleNamespace(cuda=cuda, int32=np.int32, asarray=lambda a, dtype=None: _Dev(np.asarray(a, dtype)))


def _fake_env(monkeypatch, world):
    """Fake CuPy, NCCL and kernels installed for ``world`` ranks (threads): (nccl, host synchronisations)."""
    nccl, syncs = _Nccl(world), []
    cp = _fake_cupy(nccl, syncs)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cp.cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", nccl)
    for name, fake in (("RouteCall", _Route), ("PermuteCall", _Permute), ("GemmCall", _Gemm),
                       ("gather_launcher", _gather), ("combine_launcher", _combine)):
        monkeypatch.setattr(ep, name, fake)
    return nccl, syncs


def _on_ranks(world, fn):
    """fn(rank) on one thread per rank; the errors each rank raised."""
    errors = {}

    def main(rank):
        try:
            fn(rank)
        except BaseException as exc:  # reported by the test
            errors[rank] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=main, args=(r,), name=f"rank {r}") for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a rank is stuck (waiting for a peer that never came)"
    return errors


def _fake_forward(monkeypatch, world, experts, tokens, chunks, *, exchange_only=False, force_reorder=False):
    hidden, inter, top_k = 16, 8, 2
    nccl, syncs = _fake_env(monkeypatch, world)
    rng = np.random.default_rng(world * 10 + chunks)
    router = rng.standard_normal((hidden, experts)).astype(np.float16)
    w_gu = (rng.standard_normal((experts, 2 * inter, hidden)) / 4).astype(np.float16)
    w_down = (rng.standard_normal((experts, hidden, inter)) / 3).astype(np.float16)
    xs = [rng.standard_normal((t, hidden)).astype(np.float16) for t in tokens]
    outs, records = [None] * world, [None] * world

    def rank_main(rank):
        lo, hi = ep.shard_range(experts, world, rank)
        layer = types.SimpleNamespace(
            dtype=np.dtype(np.float16), hidden=hidden, intermediate=inter, top_k=top_k, experts=experts,
            chunks=chunks, world=world, rank=rank, local_experts=hi - lo, activation="swiglu",
            comm=nccl.comm(rank), router_b=_Dev(router.T[None]), w_gate_up=_Dev(w_gu[lo:hi]),
            w_down=_Dev(w_down[lo:hi]), last_exchange=None)
        call = ep._EPCall(layer, tokens[rank], _Frame())
        if force_reorder:
            call.reorder = True
        x = _Dev(xs[rank])
        outs[rank] = call(x.data.ptr, exchange_only, True).copy()
        records[rank] = layer.last_exchange

    errors = _on_ranks(world, rank_main)
    assert not errors, errors
    from moe.layer import reference_forward

    for rank in range(world):
        assert outs[rank].shape == (tokens[rank], hidden)
        if tokens[rank] == 0:
            continue
        if exchange_only:
            ref = xs[rank].astype(np.float64)
        else:
            ref = reference_forward(xs[rank], router, w_gu, w_down, top_k, round_to=np.float16)
        assert np.isfinite(outs[rank]).all(), f"rank {rank}: unwritten output rows"
        np.testing.assert_allclose(outs[rank].astype(np.float64), ref, atol=2e-2, rtol=2e-2,
                                   err_msg=f"rank {rank} of {world}")
    if world > 1:  # every rank issued the same NCCL groups: the counts, then a dispatch and a return per chunk
        assert [nccl.groups[f"rank {r}"] for r in range(world)] == [1 + 2 * chunks] * world
    return types.SimpleNamespace(records=records, nccl=nccl, syncs=syncs)


@pytest.mark.parametrize("world, experts, chunks, force", [(2, 8, 1, False), (2, 8, 3, False), (4, 8, 2, False),
                                                           (4, 4, 2, False), (4, 4, 2, True)])
def test_forward_moves_rows_through_fake_gpus(monkeypatch, world, experts, chunks, force):
    tokens = [23 + 7 * r for r in range(world)]  # unequal tokens per rank
    run = _fake_forward(monkeypatch, world, experts, tokens, chunks, force_reorder=force)
    for rank, rec in enumerate(run.records):
        assert int(rec.plan.send_rows.sum()) == tokens[rank] * 2
        assert rec.times_ms() == {"dispatch_ms": 0.5 * chunks, "return_ms": 0.5 * chunks}
        b = rec.bytes()
        assert b["dispatch_out"] == b["return_in"] == rec.plan.remote_sent_rows * 16 * 2
    assert len(run.syncs) == world  # one host wait per rank: the counts


@pytest.mark.parametrize("chunks", [1, 3])
def test_world_one_takes_no_exchange(monkeypatch, chunks):
    """World size 1: MoELayer's launches, no NCCL call, no host wait; chunks change nothing (nothing to overlap)."""
    run = _fake_forward(monkeypatch, 1, 8, [29], chunks)
    (rec,) = run.records
    assert rec.plan is None and rec.rows == 29 * 2
    assert rec.times_ms() == {"dispatch_ms": 0.0, "return_ms": 0.0} and set(rec.bytes().values()) == {0}
    assert run.nccl.calls[0] == 0 and not run.nccl.groups and run.syncs == []


@pytest.mark.parametrize("world, tokens, chunks", [(2, [0, 19], 3), (2, [19, 0], 1), (4, [5, 0, 2, 40], 3),
                                                   (3, [0, 0, 0], 2), (1, [0], 2)])
def test_empty_ranks_and_chunks_still_exchange(monkeypatch, world, tokens, chunks):
    """A rank with no tokens, or fewer tokens than chunks, sends zero counts and still takes part in every
    exchange; its peers' rows are computed by its experts all the same."""
    experts = 4 * world
    run = _fake_forward(monkeypatch, world, experts, tokens, chunks)
    if world > 1:
        total_in = sum(int(r.plan.rows.sum()) for r in run.records)
        assert total_in == 2 * sum(tokens)
        for rank, rec in enumerate(run.records):
            assert int(rec.plan.send_rows.sum()) == 2 * tokens[rank]


def test_chunk_with_no_rows_for_a_peer(monkeypatch):
    """One token per chunk, top-2 over 4 ranks: every chunk leaves at least two peers with no rows."""
    run = _fake_forward(monkeypatch, 4, 8, [3, 3, 3, 3], 3)
    for rec in run.records:
        assert ((rec.plan.send_rows == 0).sum(axis=1) >= 2).all()


@pytest.mark.parametrize("world, chunks", [(1, 2), (2, 3)])
def test_exchange_alone_gives_x_back(monkeypatch, world, chunks):
    _fake_forward(monkeypatch, world, 8, [31] * world, chunks, exchange_only=True)


_FIELDS = dict(world=3, experts=12, local_experts=4, chunks=2, top_k=2, hidden=16, intermediate=8, dtype=1,
               activation=0)


@pytest.mark.parametrize("bad_rank, change, words", [
    (None, {}, None), (2, {"chunks": 3}, r"chunks \(from 2 to 3\)"),
    (0, {"top_k": 1, "hidden": 32}, r"top_k \(from 1 to 2\), hidden \(from 16 to 32\)"),
    (1, {"ok": False}, "another rank's forward failed")])
def test_ranks_must_agree(monkeypatch, bad_rank, change, words):
    """One all-reduce tells every rank that the ranks disagree (or that one's x failed its checks): every rank
    raises, none waits."""
    nccl, syncs = _fake_env(monkeypatch, 3)

    def rank_main(rank):
        mine = {**_FIELDS, **(change if rank == bad_rank else {})}
        ok = mine.pop("ok", True)
        ep.check_agreement(nccl.comm(rank), 3, mine, 1, ok)

    errors = _on_ranks(3, rank_main)
    if words is None:
        assert not errors and len(syncs) == 3
    else:
        expect = [r for r in range(3) if r != bad_rank] if "ok" in change else list(range(3))
        assert sorted(errors) == expect and all(re.search(words, e) for e in errors.values()), errors
