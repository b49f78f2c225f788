"""``ExpertParallelMoE``: ``MoELayer`` with its experts sharded over GPUs, one process per GPU, the tokens carried
between them by NCCL (``cupy.cuda.nccl``, grouped send/recv).

Sharding. World size W, E experts, E a multiple of W: rank r holds experts ``[r E/W, (r + 1) E/W)``
(``shard_range``) in ``MoELayer``'s weight layout (``w_gate_up`` ``[E/W, 2I, H]`` gate/up interleaved, or
``[E/W, I, H]`` for GELU; ``w_down`` ``[E/W, H, I]``); the router weight ``[H, E]`` is replicated.
``ExpertParallelMoE.from_full`` takes the full weights and keeps this rank's slice (views, no copy). Each rank
calls ``forward`` on its own tokens; their number may differ between ranks. The calls are collective: every
rank makes the same sequence of calls, with the same ``chunks``.

Forward, on the caller's stream S and the layer's high-priority communication stream K. World size 1 takes the
direct path: router, route, permute, gather, the grouped GEMMs on the permuted rows in place (their offsets are
permute's own, on the device) and combine, on S, in one chunk whatever ``chunks`` says: ``MoELayer``'s work, with no
NCCL and no host synchronisation. With W >= 2:

1. S: the router logits (fp32, one grouped-GEMM group, as ``MoELayer``); per token chunk ``route``, ``permute``
   (stable order by global expert, so the rows bound for rank d are one contiguous run) and ``gather`` into the
   send buffer ``xs``; the counts, int32 per (destination rank, chunk, local expert of the destination), go to
   their ranks in one grouped send/recv (this rank's own block included), then to the host in one copy. **The host
   then synchronises S, the forward's one host synchronisation** (it also waits for the gathers queued before the
   counts; queueing them after the counts copy and waiting on an event instead is a known next step): the receive
   sizes (hence the buffers and every send/recv) depend on the counts.
2. Per chunk c, a pipeline between K and S (events, no host waits):
   K dispatches chunk c — one send and one receive per peer with rows to move, this rank's own rows included
   (through NCCL; a device copy would do), the rows arriving source-major; S reorders them by local expert
   (Megatron's "sort chunks by expert"; nothing to reorder when a rank holds one expert), runs the grouped GEMMs
   (up with the SwiGLU/GELU epilogue, then down), puts the rows back in source-major order; K returns them, each to
   the rank and the row of ``xs`` it came from; S combines the chunk's tokens. K's order is dispatch 0, dispatch 1,
   return 0, dispatch 2, return 1, ...: the exchange of one chunk runs while S computes its neighbour, so with
   ``chunks > 1`` communication overlaps the expert GEMMs; ``chunks = 1`` is the plain exchange.

Everything past the counts is enqueued without waiting; the output is ready on S when S reaches it, like any op.

Empty ranks and chunks: a rank may hold no tokens, or fewer than ``chunks`` (``chunk_bounds`` leaves chunks empty);
its empty chunks skip routing and GEMMs, send zero counts, and it still issues every NCCL group its peers issue
(the counts, then a dispatch and a return per chunk, the same number in the same order on every rank).
World size 1: nothing goes through NCCL (no counts, no host wait): one chunk, ``MoELayer``'s launches (the GEMMs
on the permuted rows in place, permute's device offsets, the routing weight as the down GEMM's row scale).

Collectives and failures. Every rank issues the same NCCL groups in the same order whatever its tokens (above).
The first forward of a layer checks, in one all-reduce, that the ranks agree on world size, chunks, experts,
top_k, hidden, intermediate, dtype and activation (message sizes follow from them), and whether every rank's ``x``
passed its checks; a disagreement or a refused ``x`` raises the same ``ValueError`` on every rank. On later
forwards a refused ``x`` raises on its own rank before any collective, and its peers wait in NCCL: a status word in
the counts message would carry it (not done). Not yet run on two GPUs: the world-size-1 path and the CPU fake of
the collectives (tests/test_ep_cpu.py) are what has been checked.
"""
from __future__ import annotations

import numpy as np

from cukernels import dtypes
from cukernels import launch as _launch

from . import configs
from .dispatch import PermuteCall, combine_launcher, gather_launcher
from .gemm_configs import GemmProblem
from .grouped_gemm import GemmCall
from .grouped_gemm import validate as validate_gemm
from .layer import ACTIVATIONS, _Meta, as_layer_weights, check_expert_weights
from .routing import RouteCall

_D2D, _D2H, _H2D = 3, 2, 1  # cudaMemcpyKind
_TOP_PRIORITY = -1000  # CUDA clamps a stream priority to the device's range: this is its highest


# ---------------------------------------------------------------- the arithmetic (no GPU)


def _int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def shard_range(experts: int, world: int, rank: int) -> tuple[int, int]:
    """The experts ``[lo, hi)`` that ``rank`` holds: an equal share of ``experts`` for each of ``world`` ranks."""
    experts, world = _int("experts", experts, 1), _int("world size", world, 1)
    rank = _int("rank", rank, 0)
    if rank >= world:
        raise ValueError(f"rank {rank} is outside the world size {world} (ranks 0..{world - 1})")
    if experts % world:
        fits = [w for w in range(1, experts + 1) if experts % w == 0]
        raise ValueError(f"{experts} experts do not split evenly over {world} ranks: expert parallelism needs the "
                         f"expert count to be a multiple of the world size (world sizes that divide {experts}: "
                         f"{', '.join(map(str, fits))})")
    per = experts // world
    return rank * per, (rank + 1) * per


def chunk_bounds(tokens: int, chunks: int) -> list[tuple[int, int]]:
    """(first token, tokens) of each chunk: sizes as even as possible, the first ``tokens % chunks`` one longer.
    Chunks may be empty (fewer tokens than chunks, or none): an empty chunk still takes part in the exchange."""
    tokens, chunks = _int("tokens", tokens, 0), _int("chunks", chunks, 1)
    base, extra = divmod(tokens, chunks)
    out, start = [], 0
    for c in range(chunks):
        n = base + (c < extra)
        out.append((start, n))
        start += n
    return out


def bucket_rows(rows: int) -> int:
    """Rows rounded up to a multiple of ``2 ** max(8, bit_length - 4)``: the received row count, which changes with
    every routing, picks one of 8 launch sizes per power of two (their launchers are kept), at the cost of less
    than 1/8 (or 256 rows) of padding. 0 stays 0."""
    rows = _int("rows", rows, 0)
    if rows == 0:
        return 0
    step = 1 << max(8, rows.bit_length() - 4)
    return -(-rows // step) * step


class ExchangePlan:
    """Where every row of one forward goes, from the counts alone (host arithmetic).

    ``send_counts[d, c, e]``: rows of chunk c this rank sends to rank d for d's local expert e;
    ``recv_counts[s, c, e]``: rows of chunk c rank s sends here for local expert e (``send_counts`` of rank s at
    index ``rank``). ``chunk_slots[c]``: the rows of chunk c in this rank's send buffer (tokens * top_k).

    Send side (per chunk, rows from the chunk's first row of ``xs``; expert order over all E experts, so d's rows
    are contiguous): ``send_off[c, d]``, ``send_rows[c, d]``. The returned rows land at the same places.
    Receive side (rows of the receive buffer ``rs``): chunk c occupies ``[base[c], base[c] + padded[c])``, the
    rows from source s at ``recv_off[c, s]`` (absolute), ``recv_rows[c, s]`` of them, source-major; ``rows[c]``
    received in all, ``padded[c] = bucket_rows(rows[c])``. ``gemm_offsets[c]`` ``[El + 1]``: the local experts'
    row offsets in the expert-major order of the chunk (the grouped GEMMs' ``offsets``).
    ``reorder()``: the index arrays of the two reorders (see there).
    """

    def __init__(self, send_counts, recv_counts, rank: int, chunk_slots):
        send = np.asarray(send_counts, dtype=np.int64)
        recv = np.asarray(recv_counts, dtype=np.int64)
        if send.ndim != 3 or send.shape != recv.shape:
            raise ValueError(f"send_counts and recv_counts must both be [world, chunks, local experts], got "
                             f"{send.shape} and {recv.shape}")
        world, chunks, local = send.shape
        self.rank, self.world, self.chunks, self.local_experts = int(rank), world, chunks, local
        slots = np.asarray(chunk_slots, dtype=np.int64)
        if slots.shape != (chunks,):
            raise ValueError(f"chunk_slots must have one entry per chunk ({chunks}), got shape {slots.shape}")
        if (send < 0).any() or (recv < 0).any():
            raise RuntimeError("negative expert counts: the routing or the counts exchange is corrupt")
        if not np.array_equal(send.sum(axis=(0, 2)), slots):
            raise RuntimeError(f"the expert counts of each chunk must add up to its rows {slots.tolist()}, got "
                               f"{send.sum(axis=(0, 2)).tolist()}: the routing or the counts exchange is corrupt")
        self.send_counts, self.recv_counts = send, recv
        self.send_rows = send.sum(axis=2).T  # [C, W]
        self.send_off = np.cumsum(self.send_rows, axis=1) - self.send_rows
        self.recv_rows = recv.sum(axis=2).T  # [C, W]
        self.rows = self.recv_rows.sum(axis=1)
        self.padded = np.array([bucket_rows(int(r)) for r in self.rows], dtype=np.int64)
        self.base = np.cumsum(self.padded) - self.padded
        self.total_rows = int(self.padded.sum())
        self.recv_off = self.base[:, None] + np.cumsum(self.recv_rows, axis=1) - self.recv_rows
        per_expert = recv.sum(axis=0)  # [C, El]
        self.gemm_offsets = np.concatenate([np.zeros((chunks, 1), np.int64), np.cumsum(per_expert, axis=1)], axis=1)
        others = np.arange(world) != self.rank
        self.remote_sent_rows = int(self.send_rows[:, others].sum())  # each way: dispatched out, returned in
        self.remote_recv_rows = int(self.recv_rows[:, others].sum())  # dispatched in, returned out

    def reorder(self) -> tuple[np.ndarray, np.ndarray]:
        """int32 ``(to_expert, to_source)``, each ``[total_rows]``, chunk c at ``[base[c], base[c] + padded[c])``
        with values relative to the chunk: row j of the expert-major layout (experts in order, within an expert the
        sources in order) comes from row ``to_expert[j]`` of the source-major receive layout, and source-major row
        i goes back from expert-major row ``to_source[i]``; -1 on the padding (``gather`` writes zeros there)."""
        to_expert = np.full(self.total_rows, -1, dtype=np.int32)
        to_source = np.full(self.total_rows, -1, dtype=np.int32)
        for c in range(self.chunks):
            cnt = self.recv_counts[:, c, :]  # [W, El]
            n = int(self.rows[c])
            if n == 0:
                continue
            sm_start = (np.cumsum(cnt.sum(axis=1)) - cnt.sum(axis=1))[:, None] + np.cumsum(cnt, axis=1) - cnt
            em_counts = cnt.T.ravel()  # expert-major blocks: for each expert, each source
            em_start = np.cumsum(em_counts) - em_counts
            ex = (np.repeat(sm_start.T.ravel() - em_start, em_counts) + np.arange(n)).astype(np.int32)
            b = int(self.base[c])
            to_expert[b:b + n] = ex
            inv = np.empty(n, dtype=np.int32)
            inv[ex] = np.arange(n, dtype=np.int32)
            to_source[b:b + n] = inv
        return to_expert, to_source


def check_agreement(comm, world: int, fields: dict, stream: int, ok: bool = True) -> None:
    """Raise ``ValueError`` on every rank unless all ``world`` ranks passed the same ``fields`` (ints; the exchange's
    message sizes follow from them) and ``ok``. One all-reduce MIN of ``[fields, ok, -fields]`` (MIN and MAX at
    once) and one host wait; collective: every rank calls it at the same point."""
    import cupy
    from cupy.cuda import nccl

    names = list(fields)
    v = np.array([int(fields[n]) for n in names], dtype=np.int64)
    buf = cupy.asarray(np.concatenate([v, [int(bool(ok))], -v]).astype(np.int64))
    n = len(names)
    comm.allReduce(buf.data.ptr, buf.data.ptr, 2 * n + 1, nccl.NCCL_INT64, nccl.NCCL_MIN, stream)
    host = np.empty(2 * n + 1, dtype=np.int64)
    rt = cupy.cuda.runtime
    rt.memcpyAsync(host.ctypes.data, buf.data.ptr, host.nbytes, _D2H, stream)
    rt.streamSynchronize(stream)
    lo, all_ok, hi = host[:n], bool(host[n]), -host[n + 1:]
    differ = [f"{name} (from {a} to {b})" for name, a, b in zip(names, lo, hi) if a != b]
    if differ:
        raise ValueError(f"the {world} ranks built this expert-parallel layer differently: {', '.join(differ)} "
                         "differ between ranks; every rank must pass the same experts, top_k, chunks, hidden, "
                         "intermediate, dtype and activation (the exchange's message sizes follow from them)")
    if ok and not all_ok:
        raise ValueError("another rank's forward failed its argument checks (its own error says why); this rank "
                         "stops too instead of waiting for it in NCCL")


# ---------------------------------------------------------------- the layer


class ExpertParallelMoE:
    """This rank's part of an expert-parallel MoE layer (see the module doc).

    ``comm``: a ``cupy.cuda.nccl.NcclCommunicator`` of ``world`` ranks, this one ``rank``, on the current device.
    ``router_weight`` ``[hidden, experts]`` (any float dtype; replicated), ``w_gate_up``, ``w_down``: this rank's
    experts (``shard_range``), dtypes and layouts as ``MoELayer``'s. ``chunks``: token chunks of the pipelined
    exchange (1: no overlap; ignored at world size 1, where nothing is exchanged). x: a CuPy array
    ``[tokens, hidden]``, any number of tokens (0 too; chunks may be empty).

    The first forward checks, in one small all-reduce, that every rank built the layer alike (``check_agreement``:
    experts, top_k, chunks, hidden, ...) and that every rank's x passed its checks, so that a mistake raises on
    every rank instead of leaving the others waiting in NCCL."""

    def __init__(self, comm, rank: int, world: int, router_weight, w_gate_up, w_down, top_k: int, *,
                 chunks: int = 2, activation: str = "swiglu"):
        import cupy

        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.chunks = _int("chunks", chunks, 1)
        router, w_gate_up, w_down = as_layer_weights(router_weight, w_gate_up, w_down, "local experts")
        hidden, experts = (int(v) for v in router.shape)
        lo, hi = shard_range(experts, world, rank)
        local, n_up, h2 = (int(v) for v in w_gate_up.shape)
        if local != hi - lo or h2 != hidden:
            raise ValueError(f"w_gate_up must be rank {rank}'s {hi - lo} of the {experts} experts (experts "
                             f"{lo}..{hi - 1}), [{hi - lo}, n, {hidden}]; got {tuple(w_gate_up.shape)} "
                             "(ExpertParallelMoE.from_full slices the full weights)")
        inter = check_expert_weights(w_gate_up, w_down, top_k, activation, experts, "router_weight (shape[1])")
        for name, (n, k) in (("w_gate_up", (n_up, hidden)), ("w_down", (hidden, inter))):
            try:  # the expert GEMMs' own rules (K and N multiples of 8, ...), stated for the weights
                validate_gemm(_Meta((1, k), w_gate_up.dtype), _Meta((local, n, k), w_gate_up.dtype),
                              _Meta((local + 1,), np.int32), epilogue=(activation if name == "w_gate_up" else None))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{name}: {exc}") from None
        size = getattr(comm, "size", None)  # NcclCommunicator.size() / rank_id()
        if callable(size) and (size() != world or comm.rank_id() != rank):
            raise ValueError(f"comm is rank {comm.rank_id()} of {size()}, the layer was told rank {rank} of {world}")
        self.comm, self.rank, self.world = comm, int(rank), int(world)
        self.w_gate_up, self.w_down = w_gate_up, w_down
        r32 = dtypes.to_float32(router) if router.dtype != dtypes.FP32 else router
        self.router_b = cupy.ascontiguousarray(dtypes.from_float32(r32.T, w_gate_up.dtype)[None])
        self.top_k, self.activation = int(top_k), activation
        self.experts, self.local_experts, self.first_expert = experts, local, lo
        self.hidden, self.intermediate = hidden, inter
        self.device = w_gate_up.device.id
        self.last_exchange: ExchangeRecord | None = None
        self._calls: dict = {}
        self._agreed = world == 1  # nothing to agree on alone

    @classmethod
    def from_full(cls, comm, rank: int, world: int, router_weight, w_gate_up, w_down, top_k: int, **kw):
        """The layer from the full weights (every expert, ``MoELayer``'s arguments): this rank keeps its slice."""
        lo, hi = shard_range(int(w_gate_up.shape[0]), world, rank)
        return cls(comm, rank, world, router_weight, w_gate_up[lo:hi], w_down[lo:hi], top_k, **kw)

    @property
    def dtype(self):
        return self.w_gate_up.dtype

    def forward(self, x, *, exchange_only: bool = False, record: bool = False):
        """``x`` [tokens, hidden] (this rank's tokens) -> [tokens, hidden], on CuPy's current stream.
        ``exchange_only``: skip the expert GEMMs (rows go out and come back unchanged, so the output is x up to
        rounding): the exchange alone, for benchmarks. ``record``: time each dispatch and return on the
        communication stream (``last_exchange.times_ms()``). ``last_exchange`` always holds the forward's plan."""
        import cupy

        if not isinstance(x, cupy.ndarray):
            raise TypeError(f"x must be a cupy.ndarray on this rank's GPU, got {type(x).__name__}")
        key = (x.shape, x.strides, x.dtype, x.data.device_id)
        call, error = self._calls.get(key), None
        try:  # every check of x before the first collective
            if call is None:
                call = self._calls[key] = _launch.on_device(self.device, self._plan, x)
            if x.data.ptr % 16:
                _launch.check_aligned(("x",), (x.data.ptr,))
        except (TypeError, ValueError) as exc:
            error = exc
        if not self._agreed:
            _launch.on_device(self.device, self._agree, error is None)
        if error is not None:
            raise error
        return _launch.on_device(self.device, call, x.data.ptr, bool(exchange_only), bool(record))

    __call__ = forward

    def _agree(self, ok: bool) -> None:
        import cupy

        fields = {"world": self.world, "experts": self.experts, "local_experts": self.local_experts,
                  "chunks": self.chunks, "top_k": self.top_k, "hidden": self.hidden,
                  "intermediate": self.intermediate, "dtype": int(self.dtype == dtypes.BF16),
                  "activation": ACTIVATIONS.index(self.activation)}
        check_agreement(self.comm, self.world, fields, cupy.cuda.get_current_stream().ptr, ok)
        self._agreed = True

    def _plan(self, x) -> "_EPCall":
        if x.ndim != 2 or int(x.shape[1]) != self.hidden:
            raise ValueError(f"x must be [tokens, {self.hidden}], got shape {tuple(x.shape)}")
        if x.dtype != self.dtype:
            raise TypeError(f"x must have the weights' dtype {dtypes.text(self.w_gate_up)}, got {dtypes.text(x)}")
        if not x.flags.c_contiguous:
            raise ValueError(f"x must be C-contiguous, got a strided view of shape {tuple(x.shape)}")
        if x.data.device_id != self.device:
            raise ValueError(f"x is on device {x.data.device_id}, this rank's experts on device {self.device}")
        tokens = int(x.shape[0])
        if tokens * self.top_k >= 2**31:
            raise ValueError(f"tokens * top_k = {tokens * self.top_k}: must stay below 2**31")
        return _EPCall(self, tokens, _launch.frame(False, self.device))


class ExchangeRecord:
    """One forward's exchange: its ``plan`` (None at world size 1: nothing exchanged), ``rows`` (the expert rows
    this rank computed) and, when recorded, CUDA events around each dispatch and return."""

    def __init__(self, plan: ExchangePlan | None, row_bytes: int, events, rows: int | None = None):
        self.plan, self.row_bytes, self._events = plan, row_bytes, events
        self.rows = int(plan.rows.sum()) if rows is None else int(rows)

    def bytes(self) -> dict[str, int]:
        """Bytes this rank moved to and from the other ranks (self-copies excluded), each way of each phase."""
        out_rows, in_rows = (0, 0) if self.plan is None else (self.plan.remote_sent_rows, self.plan.remote_recv_rows)
        rb = self.row_bytes
        return {"dispatch_out": out_rows * rb, "dispatch_in": in_rows * rb, "return_out": in_rows * rb,
                "return_in": out_rows * rb}

    def times_ms(self) -> dict[str, float]:
        """Milliseconds the communication stream spent in the dispatches and in the returns (synchronises); 0 at
        world size 1, which exchanges nothing."""
        import cupy

        if self.plan is None:
            return {"dispatch_ms": 0.0, "return_ms": 0.0}
        if self._events is None:
            raise ValueError("this forward was not recorded: call forward(x, record=True)")
        rt = cupy.cuda.runtime
        self._events[-1][-1].synchronize()
        disp = sum(rt.eventElapsedTime(d0.ptr, d1.ptr) for d0, d1, _, _ in self._events)
        ret = sum(rt.eventElapsedTime(r0.ptr, r1.ptr) for _, _, r0, r1 in self._events)
        return {"dispatch_ms": disp, "return_ms": ret}


class _EPCall:
    """A planned forward for one x signature: per-chunk routing, permutation, gather and combine launchers; the
    workspace known before the counts; the comm stream and events. Launchers whose row count depends on the
    counts (the grouped GEMMs, the reorders) are made per ``bucket_rows`` size and kept.

    World size 1 (``local``): no NCCL, no counts, no host wait: one chunk (there is no communication to overlap),
    the GEMMs on the permuted rows in place with permute's device offsets and the routing weight as the down
    GEMM's row scale: ``MoELayer``'s launches, so the output is ``MoELayer``'s bit for bit."""

    def __init__(self, layer: ExpertParallelMoE, tokens: int, frame):
        import cupy

        L = layer
        self.layer, self.frame, self.tokens = L, frame, tokens
        dt = L.dtype
        self.dt, self.dname = dt, dtypes.dtype_name(dt)
        self.row_bytes = L.hidden * dt.itemsize
        k, E, C, W, El = L.top_k, L.experts, L.chunks, L.world, L.local_experts
        self.local = W == 1
        self.bounds = chunk_bounds(tokens, 1 if self.local else C)
        self._gemms: dict = {}
        self._gathers: dict = {}
        if tokens:  # an empty rank routes nothing, but still exchanges (zero counts, its share of rows)
            self.router = GemmCall(GemmProblem(rows=tokens, n=E, k=L.hidden, experts=1, dtype=self.dname,
                                               epilogue=None, out_dtype="fp32"), None, dt, frame)
        self.one_group = cupy.asarray([0, tokens], dtype=cupy.int32)
        self.per_size = {}
        for n in sorted({n for _, n in self.bounds if n}):
            route = RouteCall(configs.RouteProblem(tokens=n, experts=E, top_k=k, dtype="fp32"), "softmax", True,
                              frame)
            self.per_size[n] = (route, PermuteCall(route, None, frame), gather_launcher(n * k, L.hidden, k, dt, 16),
                                combine_launcher(n, L.hidden, k, dt, 16))
        ws = _launch.Workspace()
        self.at_logits = ws.add(4 * tokens * E)
        self.at_route = [ws.add(self.per_size[n][0].nbytes) if n else None for _, n in self.bounds]
        self.at_perm = [ws.add(self.per_size[n][1].nbytes) if n else None for _, n in self.bounds]
        self.at_xs = ws.add(self.row_bytes * tokens * k)
        if self.local:
            self.at_h = ws.add(tokens * k * L.intermediate * dt.itemsize)
            self.at_row_weight = ws.add(4 * tokens * k)
            self.nbytes = ws.nbytes
            return
        self.counts_len = W * C * El
        self.at_counts = ws.add(2 * 4 * self.counts_len)  # [send: W, C, El | received: W, C, El]
        self.nbytes = ws.nbytes
        self.counts_host = np.frombuffer(cupy.cuda.alloc_pinned_memory(8 * self.counts_len), np.int32,
                                         2 * self.counts_len)
        self._index_host = None  # pinned, grown as needed: reorder indices and GEMM offsets going up
        self.reorder = El > 1  # source-major == expert-major otherwise
        # high priority: the NCCL kernels' few CTAs go ahead of the GEMMs' waiting ones as SMs free up
        self.stream = cupy.cuda.Stream(non_blocking=True, priority=_TOP_PRIORITY)
        self.off_stride = -(-(El + 1) // 4) * 4  # each chunk's GEMM offsets 16-byte aligned
        ev = lambda: cupy.cuda.Event(disable_timing=True)  # noqa: E731
        self.ev_ready = ev()
        self.ev_disp, self.ev_comp, self.ev_ret = ([ev() for _ in range(C)] for _ in range(3))

    # launchers per received-rows bucket
    def _gemm_pair(self, rows: int):
        pair = self._gemms.get(rows)
        if pair is None:
            L = self.layer
            n_up = 2 * L.intermediate if L.activation == "swiglu" else L.intermediate
            mk = lambda n, kk, epi: GemmCall(GemmProblem(rows=rows, n=n, k=kk, experts=L.local_experts,  # noqa: E731
                                                         dtype=self.dname, epilogue=epi), None, self.dt, self.frame)
            pair = self._gemms[rows] = (mk(n_up, L.hidden, L.activation), mk(L.hidden, L.intermediate, None))
        return pair

    def _gather(self, rows: int):
        g = self._gathers.get(rows)
        if g is None:
            g = self._gathers[rows] = gather_launcher(rows, self.layer.hidden, 1, self.dt, 16)
        return g

    def _host_index(self, nbytes: int) -> np.ndarray:
        import cupy

        if self._index_host is None or self._index_host.nbytes < nbytes:
            self._index_host = np.frombuffer(cupy.cuda.alloc_pinned_memory(max(nbytes, 4096)), np.uint8)
        return self._index_host

    def __call__(self, px: int, exchange_only: bool, record: bool):
        import cupy
        from cupy.cuda import nccl

        rt = cupy.cuda.runtime
        L, f = self.layer, self.frame
        comm, W, rank, C, El, k = L.comm, L.world, L.rank, L.chunks, L.local_experts, L.top_k
        rb, E = self.row_bytes, L.experts
        S = f.stream()
        ws, base = f.workspace(S, self.nbytes)
        out, pout = f.empty((self.tokens, L.hidden), self.dname)
        logits, xs = base + self.at_logits, base + self.at_xs
        # at world size 1 the routing weight goes to the down GEMM's row scale (MoELayer's way); combine sums
        # with unit weights. Not for the exchange alone: with the GEMMs skipped, combine must weigh the rows.
        row_weight = base + self.at_row_weight if self.local and not exchange_only else 0

        # 1. router, then per non-empty chunk: routing, permutation by expert, gather into xs
        if self.tokens:
            self.router.enqueue(S, px, L.router_b.data.ptr, logits, self.one_group.data.ptr, 0)
        chunk = []  # per chunk: (first token, tokens, routing base, permutation base)
        for c, (t0, n) in enumerate(self.bounds):
            if n == 0:
                chunk.append((t0, 0, None, None))
                continue
            route, perm, gather, _ = self.per_size[n]
            r_at, p_at = base + self.at_route[c], base + self.at_perm[c]
            route.enqueue(S, logits + 4 * t0 * E, r_at)
            perm.enqueue(S, r_at, p_at, row_weight + 4 * t0 * k if row_weight else 0)
            gather.launch(S, (px + t0 * rb, p_at + perm.out_offsets[0], xs + t0 * k * rb))
            chunk.append((t0, n, r_at, p_at))
        if self.local:
            return self._local(S, chunk, base, out, pout, exchange_only, ws)

        # counts staged [W, C, El]; an empty chunk's are zeros
        counts = base + self.at_counts
        recv_counts = counts + 4 * self.counts_len
        if any(n == 0 for _, n in self.bounds):
            rt.memsetAsync(counts, 0, 4 * self.counts_len, S)
        for c, (t0, n, r_at, p_at) in enumerate(chunk):
            if n:
                rt.memcpy2DAsync(counts + 4 * c * El, 4 * C * El, r_at + self.per_size[n][0].offsets["counts"],
                                 4 * El, 4 * El, W, _D2D, S)

        # 2. counts to their ranks, then to the host: the one synchronisation
        nccl.groupStart()
        for p in range(W):
            comm.send(counts + 4 * p * C * El, C * El, nccl.NCCL_INT32, p, S)
            comm.recv(recv_counts + 4 * p * C * El, C * El, nccl.NCCL_INT32, p, S)
        nccl.groupEnd()
        host = self.counts_host
        rt.memcpyAsync(host.ctypes.data, counts, host.nbytes, _D2H, S)
        rt.streamSynchronize(S)
        plan = ExchangePlan(host[:self.counts_len].reshape(W, C, El), host[self.counts_len:].reshape(W, C, El), rank,
                            [n * k for _, n in self.bounds])
        K = self.stream.ptr

        # 3. buffers that depend on the counts: rs (received rows, source-major; chunk c at base[c]), and for the
        # compute h, xe (expert-major rows, one chunk at a time), the reorder indices, the GEMM offsets
        max_pad = int(plan.padded.max())
        compute = not exchange_only and plan.total_rows > 0
        ws2 = _launch.Workspace()
        at_rs = ws2.add(rb * plan.total_rows)
        if compute:
            at_h = ws2.add(max_pad * L.intermediate * self.dt.itemsize)
            at_xe = ws2.add(rb * max_pad) if self.reorder else None
            at_idx = ws2.add(2 * 4 * plan.total_rows) if self.reorder else None
            at_off = ws2.add(4 * C * self.off_stride)
        buf2, base2 = f.workspace(S, ws2.nbytes)
        rs = base2 + at_rs
        rt.eventRecord(self.ev_ready.ptr, S)
        rt.streamWaitEvent(K, self.ev_ready.ptr, 0)

        def timed(fn, c):
            if not record:
                fn(c)
                return None
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            rt.eventRecord(e0.ptr, K)
            fn(c)
            rt.eventRecord(e1.ptr, K)
            return e0, e1

        def exchange(send_at, send_rows, recv_at, recv_rows):
            nccl.groupStart()
            for p in range(W):
                if send_rows[p]:
                    comm.send(send_at[p], int(send_rows[p]) * rb, nccl.NCCL_UINT8, p, K)
                if recv_rows[p]:
                    comm.recv(recv_at[p], int(recv_rows[p]) * rb, nccl.NCCL_UINT8, p, K)
            nccl.groupEnd()

        def xs_rows(c):  # this rank's rows of chunk c, per peer
            return [xs + (chunk[c][0] * k + int(o)) * rb for o in plan.send_off[c]]

        def dispatch(c):
            exchange(xs_rows(c), plan.send_rows[c], [rs + int(o) * rb for o in plan.recv_off[c]],
                     plan.recv_rows[c])

        def give_back(c):
            exchange([rs + int(o) * rb for o in plan.recv_off[c]], plan.recv_rows[c], xs_rows(c),
                     plan.send_rows[c])

        # dispatch 0 needs only the counts: on its way while the host works out the reorder indices
        marks = [[None, None] for _ in range(C)]
        marks[0][0] = timed(dispatch, 0)
        rt.eventRecord(self.ev_disp[0].ptr, K)
        if compute:
            gemm_off = base2 + at_off
            n_off = 4 * C * self.off_stride
            idx = self._host_index(n_off + (8 * plan.total_rows if self.reorder else 0))
            off_host = idx[:n_off].view(np.int32).reshape(C, self.off_stride)
            off_host[:, :El + 1] = plan.gemm_offsets
            if self.reorder:
                to_expert, to_source = plan.reorder()
                ix = idx[n_off:n_off + 8 * plan.total_rows].view(np.int32)
                ix[:plan.total_rows], ix[plan.total_rows:] = to_expert, to_source
                rt.memcpyAsync(base2 + at_idx, ix.ctypes.data, ix.nbytes, _H2D, S)
            rt.memcpyAsync(gemm_off, off_host.ctypes.data, off_host.nbytes, _H2D, S)

        def expert_ffn(c):
            pad = int(plan.padded[c])
            if not compute or pad == 0:
                return
            up, down = self._gemm_pair(pad)
            rs_c, off_c = rs + int(plan.base[c]) * rb, gemm_off + 4 * c * self.off_stride
            h = base2 + at_h
            if self.reorder:
                xe, ix_c = base2 + at_xe, base2 + at_idx + 4 * int(plan.base[c])
                g = self._gather(pad)
                g.launch(S, (rs_c, ix_c, xe))
                up.enqueue(S, xe, L.w_gate_up.data.ptr, h, off_c, 0)
                down.enqueue(S, h, L.w_down.data.ptr, xe, off_c, 0)
                g.launch(S, (xe, ix_c + 4 * plan.total_rows, rs_c))
            else:
                up.enqueue(S, rs_c, L.w_gate_up.data.ptr, h, off_c, 0)
                down.enqueue(S, h, L.w_down.data.ptr, rs_c, off_c, 0)

        def combine(c):  # S waits for every return, an empty chunk's too: K reads rs until then
            t0, n, r_at, p_at = chunk[c]
            rt.streamWaitEvent(S, self.ev_ret[c].ptr, 0)
            if n == 0:
                return
            route, perm, _, comb = self.per_size[n]
            comb.launch(S, (xs + t0 * k * rb, p_at + perm.out_offsets[1], r_at + route.offsets["weights"],
                            pout + t0 * rb))

        # 4. the pipeline: K dispatch 0, dispatch 1, return 0, dispatch 2, return 1, ...; S compute 0, compute 1,
        # combine 0, compute 2, combine 1, ...
        for c in range(C):
            if c + 1 < C:
                marks[c + 1][0] = timed(dispatch, c + 1)
                rt.eventRecord(self.ev_disp[c + 1].ptr, K)
            rt.streamWaitEvent(S, self.ev_disp[c].ptr, 0)
            expert_ffn(c)
            rt.eventRecord(self.ev_comp[c].ptr, S)
            rt.streamWaitEvent(K, self.ev_comp[c].ptr, 0)
            marks[c][1] = timed(give_back, c)
            rt.eventRecord(self.ev_ret[c].ptr, K)
            if c >= 1:
                combine(c - 1)
        combine(C - 1)
        L.last_exchange = ExchangeRecord(plan, rb, [(*d, *r) for d, r in marks] if record else None)
        del ws, buf2  # back to the pool on S: every later use is ordered after this forward's last combine
        return out

    def _local(self, S, chunk, base, out, pout, exchange_only, ws):
        """World size 1: the GEMMs on xs in place (up into h, down back into xs), then combine."""
        L, k, rb = self.layer, self.layer.top_k, self.row_bytes
        for t0, n, r_at, p_at in chunk:
            if n == 0:
                continue
            route, perm, _, comb = self.per_size[n]
            xs_c = base + self.at_xs + t0 * k * rb
            weights = r_at + route.offsets["weights"]
            if not exchange_only:
                up, down = self._gemm_pair(n * k)
                offsets, row_weight = p_at + perm.out_offsets[2], base + self.at_row_weight + 4 * t0 * k
                up.enqueue(S, xs_c, L.w_gate_up.data.ptr, base + self.at_h, offsets, 0)
                down.enqueue(S, base + self.at_h, L.w_down.data.ptr, xs_c, offsets, row_weight)
                weights = 0  # applied by the down GEMM
            comb.launch(S, (xs_c, p_at + perm.out_offsets[1], weights, pout + t0 * rb))
        L.last_exchange = ExchangeRecord(None, rb, None, rows=self.tokens * k)
        del ws  # back to the pool on S, after the last combine
        return out
