"""``permute``, ``gather`` and ``combine``: token slots in expert order and back.

A *slot* is ``token * top_k + k``: the k-th choice of a token. ``permute`` is a stable counting sort of the slots
by expert on the GPU (the histogram comes from ``route``; a scan and a stable scatter follow), with no host round
trip. Row ``r`` of the expert-ordered layout holds slot ``sorted_slots[r]``; expert ``e`` owns rows
``[row_offsets[e], row_offsets[e] + counts[e])`` in increasing slot order. With ``block_m`` each expert's run is
padded to a multiple of ``block_m`` rows (for a grouped GEMM); padding rows hold -1. The padded total is only
known on the GPU, so the layout has the worst-case capacity ``tokens * top_k + experts * (block_m - 1)`` rows
and ``padded_offsets[-1]`` says how many are used; the rest hold -1 too.

``gather`` copies token rows into that order (padding rows are zeros); ``combine`` sums each token's top_k expert
rows, weighted, in fp32, by reading through the inverse map (no atomics: deterministic), into the dtype of the
expert output.
"""
from __future__ import annotations

import numpy as np

from cukernels import dtypes
from cukernels import launch as _launch

from . import configs, launch
from .routing import Routing

_ELEMENT_DTYPES = (dtypes.FP32, dtypes.FP16, dtypes.BF16)


class Dispatch:
    """What ``permute`` returns, in one allocation; arrays appear (CuPy or torch, like the routing's) when first
    read. sorted_slots int32 [rows]: slot of each row in expert order, -1 for padding; inverse int32 [tokens,
    top_k]: row of each slot; offsets int32 [experts + 1]: unpadded expert offsets (exclusive scan of counts);
    padded_offsets int32 [experts + 1] with each count rounded up to block_m (None without block_m)."""

    __slots__ = ("block_m", "tokens", "top_k", "num_experts", "rows", "device", "_frame", "_buf", "_base",
                 "_layout", "_views")

    def __init__(self, call: "PermuteCall", frame, buf, base: int):
        self.block_m, self.tokens, self.top_k = call.block_m, call.tokens, call.top_k
        self.num_experts, self.rows, self.device = call.experts, call.rows, frame.device_id
        self._frame, self._buf, self._base, self._layout, self._views = frame, buf, base, call.layout, {}

    ptr = Routing.ptr
    _view = Routing._view
    sorted_slots = property(lambda self: self._view("sorted_slots"))
    inverse = property(lambda self: self._view("inverse"))
    offsets = property(lambda self: self._view("offsets"))
    padded_offsets = property(lambda self: self._view("padded_offsets") if self.block_m else None)

    @property
    def row_offsets(self):
        """Where each expert's rows start in the layout: padded_offsets with block_m, else offsets."""
        return self.offsets if self.block_m is None else self.padded_offsets

    def row_offsets_ptr(self) -> int:
        return self.ptr("offsets" if self.block_m is None else "padded_offsets")


def capacity(tokens: int, top_k: int, experts: int, block_m: int | None) -> int:
    return tokens * top_k + (experts * (block_m - 1) if block_m else 0)


class PermuteCall:
    """The scatter for one (routing shape, block_m); ``layout`` places the outputs in one allocation."""

    def __init__(self, routing, block_m: int | None, frame):
        """``routing``: a ``Routing`` or the ``RouteCall`` that will make it (tokens, top_k, experts, blocks)."""
        tokens, top_k = routing.tokens, routing.top_k
        experts = routing.num_experts if isinstance(routing, Routing) else routing.experts
        rows = capacity(tokens, top_k, experts, block_m)
        if rows >= 2**31:
            raise ValueError(f"block_m={block_m}: the layout would need {rows} rows, at most 2**31 - 1 are supported")
        self.tokens, self.top_k, self.experts, self.block_m, self.rows, self.frame = (tokens, top_k, experts,
                                                                                      block_m, rows, frame)
        cfg = launch.plan(configs.plan_scatter).config
        ws = _launch.Workspace()
        self.layout = {"sorted_slots": (ws.add(4 * rows), (rows,), "int32"),
                       "inverse": (ws.add(4 * tokens * top_k), (tokens, top_k), "int32"),
                       "offsets": (ws.add(4 * (experts + 1)), (experts + 1,), "int32")}
        if block_m:
            self.layout["padded_offsets"] = (ws.add(4 * (experts + 1)), (experts + 1,), "int32")
        padded = "padded_offsets" if block_m else "offsets"
        self.nbytes = ws.nbytes
        self.out_offsets = tuple(self.layout[f][0] for f in ("sorted_slots", "inverse", "offsets", padded))
        # pointers: 0 the routing's allocation, 1 this call's, 2 row weights (0: none); the routing's fields at
        # their offsets in the routing's layout
        at = routing.offsets if not isinstance(routing, Routing) else {f: v[0] for f, v in routing._layout.items()}
        P = _launch.Ptr
        s, i, o, p = self.out_offsets
        self.scatter = _launch.Launcher(
            launch.kernel(launch.DISPATCH_SOURCE, cfg.name_expression()),
            (-(-tokens // routing.block_tokens),), (cfg.threads,),
            (P(0, at["experts"]), np.int32(tokens), np.int32(top_k), np.int32(experts),
             np.int32(routing.block_tokens), P(0, at["counts"]), P(0, at["block_base"]), np.int32(block_m or 1),
             np.int32(rows), P(1, s), P(1, i), P(1, o), P(1, p), P(0, at["weights"]), P(2)), pdl=True)

    def enqueue(self, stream: int, routing_base: int, base: int, row_weight: int = 0) -> None:
        """Scatter the routing at ``routing_base`` into the allocation at ``base``; with ``row_weight`` (an
        address, else 0) also each row's routing weight."""
        self.scatter.launch(stream, (routing_base, base, row_weight))

    def __call__(self, routing: Routing) -> Dispatch:
        f = self.frame
        stream = f.stream()
        buf, base = f.workspace(stream, self.nbytes)
        self.enqueue(stream, routing._base, base)
        return Dispatch(self, f, buf, base)


_PERMUTE = _launch.Cache("moe.permute")


def permute(routing: Routing, *, block_m: int | None = None) -> Dispatch:
    """Stable counting sort of ``routing``'s token slots by expert (see the module doc)."""
    if not isinstance(routing, Routing):
        raise TypeError(f"routing must be a moe.Routing (from moe.route), got {type(routing).__name__}")
    frame = routing._frame
    key = (routing.tokens, routing.top_k, routing.num_experts, routing.block_tokens, frame, block_m, type(block_m))
    call = _PERMUTE.get(key)
    if call is None:
        if block_m is not None:
            if isinstance(block_m, bool) or not isinstance(block_m, (int, np.integer)) or not 1 <= block_m <= 4096:
                raise ValueError(f"block_m must be None or an int in 1..4096, got {block_m!r}")
            block_m = int(block_m)
        call = _PERMUTE.put(key, _launch.on_device(frame.device_id, PermuteCall, routing, block_m, frame))
    return _launch.on_device(frame.device_id, call, routing)


def _rows_operand(arr, *, name: str, rows: int, rows_what: str):
    """Validate a [rows, hidden] operand of gather/combine; returns its frame."""
    if _launch.view(arr) is None:
        raise TypeError(f"{name} must be a cupy.ndarray or a torch CUDA tensor, got {type(arr).__name__}"
                        + (" on the host" if hasattr(arr, "shape") else ""))
    if len(arr.shape) != 2:
        raise ValueError(f"{name} must be 2-D [{rows_what}, hidden], got shape {tuple(arr.shape)}")
    if dtypes.storage(arr) not in _ELEMENT_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {dtypes.text(arr)}")
    if not dtypes.is_c_contiguous(arr):
        raise ValueError(f"{name} must be C-contiguous, got a strided view of shape {tuple(arr.shape)}")
    if arr.shape[0] != rows:
        raise ValueError(f"{name} has {arr.shape[0]} rows (shape[0]); the dispatch needs {rows} ({rows_what})")
    if arr.shape[1] < 1:
        raise ValueError(f"{name} has an empty hidden dimension (shape[1] == 0)")


def _alignment(ptr: int, row_bytes: int) -> int:
    """The largest of 16, 8, 4, 2, 1 bytes dividing the operand's address and row size."""
    bits = ptr | row_bytes
    return 16 if bits % 16 == 0 else 8 if bits % 8 == 0 else 4 if bits % 4 == 0 else 2 if bits % 2 == 0 else 1


def _check_dispatch(dispatch) -> None:
    if not isinstance(dispatch, Dispatch):
        raise TypeError(f"dispatch must be a moe.Dispatch (from moe.permute), got {type(dispatch).__name__}")


def _same_device(name: str, dev: int, dispatch: Dispatch) -> None:
    if dev != dispatch.device:
        raise ValueError(f"{name} is on device {dev}, the dispatch on device {dispatch.device}")


class RowsCall:
    """gather or combine for one signature: a launcher and the output's shape."""

    def __init__(self, launcher, out_shape, dtype: str, frame):
        self.launcher, self.out_shape, self.dtype, self.frame = launcher, out_shape, dtype, frame

    def __call__(self, ptrs) -> object:
        f = self.frame
        out, pout = f.empty(self.out_shape, self.dtype)
        self.launcher.launch(f.stream(), (*ptrs, pout))
        return out


def _rows_call(cache, kind: str, x, name: str, dispatch: Dispatch, rows: int, rows_what: str):
    """The cached gather/combine call for ``x`` (validated on a miss) and x's data pointer."""
    vx = _launch.view(x)
    if vx is None:
        _rows_operand(x, name=name, rows=rows, rows_what=rows_what)
    (_, shape, _, _, dev), ptr = vx
    align = _alignment(ptr, int(shape[1]) * int(x.element_size() if _launch.is_torch(x) else x.itemsize)) \
        if len(shape) == 2 else 0
    key = (vx[0], align, dispatch.rows, dispatch.tokens, dispatch.top_k, dispatch.num_experts)
    call = cache.get(key)
    if call is None:
        import cupy

        _check_dispatch(dispatch)
        _rows_operand(x, name=name, rows=rows, rows_what=rows_what)
        _same_device(name, dev, dispatch)
        hidden, dt = int(shape[1]), dtypes.storage(x)
        frame = _launch.frame(_launch.is_torch(x), dev)
        out_rows = dispatch.rows if kind == "gather" else dispatch.tokens
        with cupy.cuda.Device(dev):
            launcher = (gather_launcher if kind == "gather" else combine_launcher)(out_rows, hidden, dispatch.top_k,
                                                                                   dt, align)
        call = cache.put(key, RowsCall(launcher, (out_rows, hidden), dtypes.dtype_name(dt), frame))
    elif dev != dispatch.device:
        _same_device(name, dev, dispatch)
    return call, ptr


def gather_launcher(rows: int, hidden: int, top_k: int, dt, align: int) -> _launch.Launcher:
    """moe_gather for ``rows`` expert-ordered rows of ``hidden`` elements of ``dt`` whose addresses are ``align``-byte
    aligned (current device). Pointers: 0 x, 1 sorted_slots, 2 out."""
    problem = configs.RowsProblem(rows=rows, hidden=hidden, top_k=top_k, dtype=dtypes.dtype_name(dt), align=align)
    cfg = launch.plan(configs.plan_gather, problem).config
    P = _launch.Ptr
    return _launch.Launcher(launch.kernel(launch.DISPATCH_SOURCE, cfg.name_expression()),
                            (-(-rows // cfg.rows_per_block),), (cfg.threads_x, cfg.rows_per_block),
                            (P(0), P(1), np.int32(rows), np.int32(top_k),
                             np.int32(hidden * np.dtype(dt).itemsize // cfg.vec_bytes), P(2)), pdl=True)


def combine_launcher(tokens: int, hidden: int, top_k: int, dt, align: int) -> _launch.Launcher:
    """moe_combine for ``tokens`` rows (current device). Pointers: 0 expert_out, 1 inverse, 2 weights (0: unit
    weights), 3 out."""
    problem = configs.RowsProblem(rows=tokens, hidden=hidden, top_k=top_k, dtype=dtypes.dtype_name(dt), align=align)
    cfg = launch.plan(configs.plan_combine, problem).config
    P = _launch.Ptr
    return _launch.Launcher(launch.kernel(launch.DISPATCH_SOURCE, cfg.name_expression(dtype=dt)),
                            (-(-tokens // cfg.rows_per_block),), (cfg.threads_x, cfg.rows_per_block),
                            (P(0), P(1), P(2), np.int32(tokens), np.int32(top_k), np.int32(hidden), P(3)), pdl=True)


_GATHER = _launch.Cache("moe.gather")
_COMBINE = _launch.Cache("moe.combine")


def gather(x, dispatch: Dispatch):
    """``x`` [tokens, hidden] -> [dispatch.rows, hidden] in expert order; padding rows are zeros."""
    _check_dispatch(dispatch)
    call, px = _rows_call(_GATHER, "gather", x, "x", dispatch, dispatch.tokens, "tokens")
    return _launch.on_device(dispatch.device, call, (px, dispatch.ptr("sorted_slots")))


def combine(expert_out, dispatch: Dispatch, routing: Routing):
    """out[t] = sum_k routing.weights[t, k] * expert_out[dispatch.inverse[t, k]] in fp32 -> expert_out's dtype."""
    _check_dispatch(dispatch)
    if not isinstance(routing, Routing):
        raise TypeError(f"routing must be a moe.Routing (from moe.route), got {type(routing).__name__}")
    if (routing.tokens, routing.top_k, routing.num_experts) != (dispatch.tokens, dispatch.top_k, dispatch.num_experts):
        raise ValueError(f"routing (tokens {routing.tokens}, top_k {routing.top_k}, experts {routing.num_experts}) "
                         f"does not match dispatch (tokens {dispatch.tokens}, top_k {dispatch.top_k}, "
                         f"experts {dispatch.num_experts})")
    call, px = _rows_call(_COMBINE, "combine", expert_out, "expert_out", dispatch, dispatch.rows, "dispatch.rows")
    return _launch.on_device(dispatch.device, call, (px, dispatch.ptr("inverse"), routing.ptr("weights")))
