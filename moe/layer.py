"""``MoELayer``: route -> permute -> gather -> grouped GEMM (up, fused activation) -> grouped GEMM (down, routing
weight as row scale) -> combine, all on the GPU with no host synchronisation (CUDA-graph capturable:
``MoELayer.capture``).

A forward is at most eight launches from one cached plan per (x's signature, weights): the router logits, routing,
the permutation and every intermediate live in one workspace allocation; the output is the only other one. With
decode-sized groups (skinny tiles) and on the 128 x 256 tma tiles of sm_90a (``grouped_gemm.TMA_GATHER``: the
producer warpgroup copies the token rows into the pipeline) the up-projection gathers the token rows itself (no
gather launch), and where the down-projection runs on that tile in pairs with top-k <= 2 it adds its rows into
the zeroed output itself (``grouped_gemm.TMA_SCATTER``: no y, no combine launch; deterministic, the combine
launch's bits); with fewer rows than experts both expert GEMMs and the combine run as one launch
(``grouped_gemm.SkinnyFFN``; ``FUSED_COMBINE``): four launches; and with the router GEMM on a skinny tile too,
the router GEMM, routing and permutation run in that launch (``grouped_gemm.SkinnyDecode``, the routing built in
each CTA's shared memory): the whole layer in one.

Weights:

- ``router_weight`` ``[hidden, experts]`` (any float dtype; held in x's dtype, ``[1, experts, hidden]``):
  logits = x @ router_weight accumulated and returned in fp32 by ``grouped_gemm`` as one group (cuBLAS through
  CuPy cannot be captured in a CUDA graph), so routing does not depend on low-precision rounding of the logits.
- ``activation="swiglu"``: ``w_gate_up`` ``[experts, 2 * intermediate, hidden]`` with gate and up rows
  interleaved (``grouped_gemm.interleave_gate_up``), expert FFN = ``down(silu(gate x) * up x)``.
- ``activation="gelu"``: ``w_gate_up`` is ``w_up`` ``[experts, intermediate, hidden]``, FFN = ``down(gelu(up x))``.
- ``w_down`` ``[experts, hidden, intermediate]``.

Expert weights in torch Linear layout ([out, in], K contiguous), float16 or bf16 bits (uint16), as ``x``.
out[t] = sum_k weight[t, k] * FFN_{expert[t, k]}(x[t]); the weight multiplies the down GEMM's rows in fp32
before they are rounded, and combine then sums the k rows per token with unit weights.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cukernels import dtypes
from cukernels import launch as _launch

from . import configs
from .dispatch import PermuteCall, combine_launcher, gather_launcher
from .gemm_configs import GemmProblem
from .grouped_gemm import GemmCall, SkinnyDecode, SkinnyFFN, validate as validate_gemm
from .routing import RouteCall

if TYPE_CHECKING:  # the annotation of MoELayer.capture (imported where it runs: capture.py imports this module)
    from .capture import CapturedMoE

ACTIVATIONS = ("swiglu", "gelu")


# The expert GEMMs' skinny (decode-sized) plans list the touched experts from the routing's counts, written two
# launches or more before them, and prefetch their first weights into L2 before their programmatic wait: the weight
# stream starts under the permutation / the up-projection's last CTAs (GemmCall early=).
EARLY_WEIGHTS = True
# Both expert GEMMs skinny (decode-sized groups) over fewer rows than experts: one launch of moe_ffn_skinny instead
# of two (SkinnyFFN.planned)
FUSED_FFN = True
# Where the FFN runs fused and the router GEMM is a skinny tile: the router GEMM, routing, permutation and FFN as
# one launch too (SkinnyDecode)
FUSED_DECODE = True
# Where the FFN runs fused (either kernel), the combine in its launch too (the CTA that stores a column block of y
# last sums it per token: moe_combine's bits): the layer is then one launch (SkinnyDecode) or four (SkinnyFFN)
FUSED_COMBINE = True


class LayerCall:
    """A planned layer forward for one (x signature, weights): the kernels of every stage and the workspace layout.
    Intermediates (expert order, rows = tokens * top_k): logits fp32 [tokens, experts], the routing and dispatch
    blocks, row weights fp32 [rows], xs [rows, hidden] (none when the up-projection's tiles read the token rows
    through the sorted slots: skinny tiles, the tma 128 x 256 tile and pair), h [rows, intermediate], y [rows, hidden]."""

    def __init__(self, tokens: int, layer_shape: tuple, top_k: int, activation: str, dtype: np.dtype, frame):
        import cupy

        experts, hidden, inter = layer_shape
        self.frame, self.out_shape, self.dtype = frame, (tokens, hidden), dtypes.dtype_name(dtype)
        rows = tokens * top_k
        name = self.dtype
        with cupy.cuda.Device(frame.device_id):
            gemm = lambda rows_, n, k, e, epi, out=None, gather=0, early=False, scatter=0: GemmCall(  # noqa: E731
                GemmProblem(rows=rows_, n=n, k=k, experts=e, dtype=name, epilogue=epi, out_dtype=out), None, dtype,
                frame, gather, early=early, scatter=scatter)
            self.router = gemm(tokens, experts, hidden, 1, None, "fp32")
            self.route = RouteCall(configs.RouteProblem(tokens=tokens, experts=experts, top_k=top_k, dtype="fp32"),
                                   "softmax", True, frame)
            self.permute = PermuteCall(self.route, None, frame)
            n_up = 2 * inter if activation == "swiglu" else inter
            # decode-sized groups: the up-projection's skinny tiles read the token rows themselves
            self.up = gemm(rows, n_up, hidden, experts, activation, gather=top_k, early=EARLY_WEIGHTS)
            self.fused_gather = self.up.gather > 0
            # on the 128 x 256 tma tile in pairs with top-k <= 2 the down-projection adds its rows into the tokens'
            # rows of the zeroed output itself (grouped_gemm.TMA_SCATTER): no y, no combine launch
            self.down = gemm(rows, hidden, inter, experts, None, early=EARLY_WEIGHTS, scatter=top_k)
            self.fused_scatter = self.down.scatter > 0
            self.ffn = (SkinnyFFN(self.up, self.down, dtype, top_k, EARLY_WEIGHTS)
                        if FUSED_FFN and SkinnyFFN.fits(self.up, self.down) else None)
            self.decode = (SkinnyDecode(self.router, self.up, self.down, dtype, top_k, EARLY_WEIGHTS)
                           if FUSED_DECODE and SkinnyDecode.fits(self.router, self.ffn) else None)
            self._sync_bytes = SkinnyFFN.SYNC_BYTES if self.ffn is not None else 0  # (SkinnyDecode: the same)
            self.fused_combine = (FUSED_COMBINE and self.ffn is not None
                                  and SkinnyFFN.combines(self.down, top_k))
            # the fused kernel's counters: one zeroed buffer per stream for eager calls (each launch leaves them
            # zeroed), a graph's own in the workspace, zeroed by a node of the graph
            self._sync: dict = {}
            self._memset, self._capturing = cupy.cuda.runtime.memsetAsync, cupy.cuda.runtime.streamIsCapturing
            # x and the workspace's rows are 16-byte aligned (x is checked per call; K % 8 == 0 makes rows so)
            # (none where the fused kernel combines: it would be planned and compiled and never launched)
            self.combine = (None if self.fused_combine or self.fused_scatter else
                            combine_launcher(tokens, hidden, top_k, dtype, 16))
            self.gather_launcher = None if self.fused_gather else gather_launcher(rows, hidden, top_k, dtype, 16)
            # the router GEMM's one group: rows [0, tokens) (a constant, made before any capture)
            self.one_group = cupy.asarray([0, tokens], dtype=cupy.int32)
        self._one_group_ptr = self.one_group.data.ptr
        self._counts = self.route.offsets["counts"]  # the routing's per-expert row counts, in its block
        ws = _launch.Workspace()
        es = dtype.itemsize
        self.at = {"logits": ws.add(4 * tokens * experts), "routing": ws.add(self.route.nbytes),
                   "dispatch": ws.add(self.permute.nbytes), "row_weight": ws.add(4 * rows),
                   "xs": ws.add(0 if self.fused_gather else es * rows * hidden), "h": ws.add(es * rows * inter),
                   "y": ws.add(0 if self.fused_scatter else es * rows * hidden), "sync": ws.add(self._sync_bytes)}
        self._out_bytes = es * tokens * hidden
        self.nbytes = ws.nbytes

    def __call__(self, px: int, router_b: int, w_gate_up: int, w_down: int):
        f = self.frame
        stream = f.stream()
        ws, base = f.workspace(stream, self.nbytes)
        out, pout = f.empty(self.out_shape, self.dtype)
        at = {k: base + off for k, off in self.at.items()}
        sync = self._sync_buffer(stream, at["sync"]) if self._sync_bytes else 0  # (a memset: before the chain)
        sorted_slots, inverse, offsets, _ = (at["dispatch"] + off for off in self.permute.out_offsets)
        if self.fused_scatter:  # the down-projection adds into it (a memset: before the chain)
            self._memset(pout, 0, self._out_bytes, stream)
        if self.decode is not None:
            self.decode.enqueue(stream, px, router_b, at["logits"], w_gate_up, at["h"], w_down, at["y"], inverse, sync,
                                pout if self.fused_combine else 0)
            if not self.fused_combine:
                self.combine.launch(stream, (at["y"], inverse, 0, pout))
            return out
        self.router.enqueue(stream, px, router_b, at["logits"], self._one_group_ptr, 0)
        self.route.enqueue(stream, at["logits"], at["routing"])
        self.permute.enqueue(stream, at["routing"], at["dispatch"], at["row_weight"])
        counts = at["routing"] + self._counts
        if self.ffn is not None:
            self.ffn.enqueue(stream, px, w_gate_up, at["h"], w_down, at["y"], offsets, at["row_weight"], sorted_slots,
                             counts, sync, *((pout, inverse) if self.fused_combine else ()))
            if self.fused_combine:
                return out
        elif self.fused_gather:
            self.up.enqueue(stream, px, w_gate_up, at["h"], offsets, 0, sorted_slots, pcounts=counts)
        else:
            self.gather_launcher.launch(stream, (px, sorted_slots, at["xs"]))
            self.up.enqueue(stream, at["xs"], w_gate_up, at["h"], offsets, 0, pcounts=counts)
        if self.fused_scatter:
            self.down.enqueue(stream, at["h"], w_down, pout, offsets, at["row_weight"], sorted_slots, pcounts=counts)
            return out
        if self.ffn is None:
            self.down.enqueue(stream, at["h"], w_down, at["y"], offsets, at["row_weight"], pcounts=counts)
        self.combine.launch(stream, (at["y"], inverse, 0, pout))  # weights already applied: unit weights
        return out

    def _sync_buffer(self, stream: int, in_workspace: int) -> int:
        """The fused kernel's zeroed counters for a launch on ``stream``."""
        if self._capturing(stream):
            self._memset(in_workspace, 0, self._sync_bytes, stream)
            return in_workspace
        kept = self._sync.get(stream)
        if kept is None:
            buf, ptr = self.frame.workspace(stream, self._sync_bytes)
            self._memset(ptr, 0, self._sync_bytes, stream)
            kept = self._sync[stream] = (buf, ptr)
        return kept[1]


_LAYER = _launch.Cache("moe.layer")


def moe_forward(x, router_b, w_gate_up, w_down, top_k: int, activation: str):
    """The layer's forward on its weights in kernel layout (router_b ``[1, experts, hidden]`` in x's dtype; see
    ``MoELayer``); what ``MoELayer.forward`` and the torch custom op call. Cached by signature."""
    views = [_launch.view(t) for t in (x, router_b, w_gate_up, w_down)]
    if None in views:
        raise TypeError(f"x must be a cupy.ndarray or a torch CUDA tensor, got {type(x).__name__}"
                        + (" on the host" if hasattr(x, "shape") else ""))
    key = (*(v[0] for v in views), top_k, activation)
    call = _LAYER.get(key)
    if call is None:
        call = _LAYER.put(key, _layer_call(x, router_b, w_gate_up, w_down, top_k, activation, views))
    px = views[0][1]
    if px % 16:
        _launch.check_aligned(("x",), (px,))
    return _launch.on_device(call.frame.device_id, call, px, views[1][1], views[2][1], views[3][1])


def _layer_call(x, router_b, w_gate_up, w_down, top_k, activation, views) -> LayerCall:
    experts, hidden = int(router_b.shape[1]), int(router_b.shape[2])
    n_up = int(w_gate_up.shape[1])
    inter = n_up // 2 if activation == "swiglu" else n_up
    if len(x.shape) != 2 or int(x.shape[1]) != hidden:
        raise ValueError(f"x must be [tokens, {hidden}], got shape {tuple(x.shape)}")
    dt = dtypes.storage(x)
    if dt != dtypes.storage(w_gate_up):
        raise TypeError(f"x must have the weights' dtype {dtypes.text(w_gate_up)}, got {dtypes.text(x)}")
    if not dtypes.is_c_contiguous(x):
        raise ValueError(f"x must be C-contiguous, got a strided view of shape {tuple(x.shape)}")
    tokens = int(x.shape[0])
    if tokens < 1:
        raise ValueError("x has no tokens (shape[0] == 0)")
    if tokens * top_k >= 2**31:
        raise ValueError(f"tokens * top_k = {tokens * top_k}: must stay below 2**31")
    devs = {v[0][4] for v in views}
    if len(devs) != 1:
        raise ValueError(f"x is on device {views[0][0][4]}, the layer's weights on {views[2][0][4]}")
    # the expert GEMMs' own rules (K and N multiples of 8, ...), stated for the weights
    rows = tokens * top_k
    for name, (n, k) in (("w_gate_up", (n_up, hidden)), ("w_down", (hidden, inter))):
        try:
            validate_gemm(_Meta((rows, k), dt), _Meta((experts, n, k), dt), _Meta((experts + 1,), np.int32),
                          epilogue=(activation if name == "w_gate_up" else None))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name}: {exc}") from None
    frame = _launch.frame(_launch.is_torch(x), devs.pop())
    return LayerCall(tokens, (experts, hidden, inter), int(top_k), activation, dt, frame)


class _Meta:
    """Shape and dtype standing in for an array the layer makes itself (for the GEMM's validation)."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype, self.strides = shape, np.dtype(dtype), None
        self.flags = type("Flags", (), {"c_contiguous": True})()


def as_layer_weights(router_weight, w_gate_up, w_down, experts_word: str):
    """An MoE layer's weights as CuPy views (torch tensors zero-copy), ranks checked: router_weight [hidden,
    experts], w_gate_up [``experts_word``, n, hidden], w_down [``experts_word``, hidden, intermediate]."""
    w_gate_up, _ = dtypes.as_cupy(w_gate_up, name="w_gate_up")
    w_down, _ = dtypes.as_cupy(w_down, name="w_down")
    router, _ = dtypes.as_cupy(router_weight, name="router_weight")
    if w_gate_up.ndim != 3 or w_down.ndim != 3 or router.ndim != 2:
        raise ValueError(f"expected router_weight [hidden, experts], w_gate_up [{experts_word}, n, hidden], "
                         f"w_down [{experts_word}, hidden, intermediate]; got {router.shape}, {w_gate_up.shape}, "
                         f"{w_down.shape}")
    return router, w_gate_up, w_down


def check_expert_weights(w_gate_up, w_down, top_k, activation: str, experts: int, experts_from: str) -> int:
    """The checks an MoE layer's expert weights share (``MoELayer``, the expert-parallel ``moe.ep`` layer, which
    holds a slice): gate/up pairs for SwiGLU, ``w_down`` [w_gate_up's experts, hidden, intermediate], 1..MAX_EXPERTS
    ``experts`` in all (counted from ``experts_from``), one 16-bit float dtype, ``top_k`` in 1..min(experts,
    MAX_TOP_K), C-contiguous. Returns the intermediate size."""
    local, n_up, hidden = (int(v) for v in w_gate_up.shape)
    if activation == "swiglu" and n_up % 2:
        raise ValueError(f"w_gate_up has {n_up} rows per expert: SwiGLU needs gate/up pairs (an even count)")
    inter = n_up // 2 if activation == "swiglu" else n_up
    if tuple(w_down.shape) != (local, hidden, inter):
        raise ValueError(f"w_down must be [experts of w_gate_up, hidden, intermediate] = {(local, hidden, inter)}, "
                         f"got {tuple(w_down.shape)}")
    if not 1 <= experts <= configs.MAX_EXPERTS:
        raise ValueError(f"{experts_from} gives {experts} experts; 1..{configs.MAX_EXPERTS} are supported")
    if w_gate_up.dtype not in (dtypes.FP16, dtypes.BF16) or w_down.dtype != w_gate_up.dtype:
        raise TypeError(f"w_gate_up and w_down must share float16 or bf16 (uint16), got {w_gate_up.dtype}, "
                        f"{w_down.dtype}")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) \
            or not 1 <= top_k <= min(experts, configs.MAX_TOP_K):
        raise ValueError(f"top_k must be an int in 1..{min(experts, configs.MAX_TOP_K)} (at most "
                         f"{configs.MAX_TOP_K} and at most the {experts} experts), got {top_k!r}")
    for name, w in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        if not w.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
    return inter


class MoELayer:
    def __init__(self, router_weight, w_gate_up, w_down, top_k: int, *, activation: str = "swiglu"):
        import cupy

        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self._torch_weights = _launch.is_torch(w_gate_up)
        router, w_gate_up, w_down = as_layer_weights(router_weight, w_gate_up, w_down, "experts")
        experts, _, hidden = (int(v) for v in w_gate_up.shape)
        inter = check_expert_weights(w_gate_up, w_down, top_k, activation, experts, "w_gate_up (shape[0])")
        if tuple(router.shape) != (hidden, experts):
            raise ValueError(f"router_weight must be [hidden, experts] = {(hidden, experts)}, got {tuple(router.shape)}")
        self.w_gate_up, self.w_down = w_gate_up, w_down
        r32 = dtypes.to_float32(router) if router.dtype != dtypes.FP32 else router
        self.router_b = cupy.ascontiguousarray(dtypes.from_float32(r32.T, w_gate_up.dtype)[None])
        self.top_k, self.activation = int(top_k), activation
        self.experts, self.hidden, self.intermediate = experts, hidden, inter
        self._compiling = None  # with torch weights: torch.compiler.is_compiling, and the custom op's operands
        if self._torch_weights:
            import torch

            from .torch import torch_views

            self._compiling = torch.compiler.is_compiling
            self._op = torch.ops.cukernels.moe_layer
            self._op_weights = torch_views(self.router_b, self.w_gate_up, self.w_down)

    @property
    def dtype(self):
        return self.w_gate_up.dtype

    def forward(self, x):
        """``x`` [tokens, hidden] -> [tokens, hidden], same dtype (and library, and stream) as x."""
        if self._compiling is not None and self._compiling():  # torch.compile traces the custom op
            return self._op(x, *self._op_weights, self.top_k, self.activation)
        return moe_forward(x, self.router_b, self.w_gate_up, self.w_down, self.top_k, self.activation)

    __call__ = forward

    def capture(self, tokens: int, *, torch: bool | None = None) -> CapturedMoE:
        """Capture a forward of ``tokens`` tokens into a CUDA graph: ``captured(x)`` copies x into the graph's
        input, replays it and returns the graph's output (the same array each time: copy it to keep it).
        ``torch``: capture with ``torch.cuda.graph`` on torch tensors (default: when the weights were torch
        tensors), else with CuPy's stream capture on CuPy arrays."""
        from .capture import CapturedMoE

        return CapturedMoE(self, int(tokens), self._torch_weights if torch is None else bool(torch))


def reference_forward(x, router_weight, w_gate_up, w_down, top_k: int, *, activation: str = "swiglu",
                      round_to=None) -> np.ndarray:
    """float64 NumPy reference of ``MoELayer.forward`` (softmax top-k, renormalised, as ``moe.route``; the router
    weight rounded to x's dtype, as the layer holds it).
    ``round_to``: a storage dtype to round the intermediate activations and the expert outputs to (the "naive"
    low-precision computation of the tolerance policy); None keeps everything in float64."""
    def host(v):
        v = v.get() if hasattr(v, "get") else np.asarray(v)
        return dtypes.to_float32(v).astype(np.float64) if v.dtype in (dtypes.FP16, dtypes.BF16) else v.astype(np.float64)

    def rnd(v):
        if round_to is None:
            return v
        return dtypes.to_float32(dtypes.from_float32(v.astype(np.float32), round_to)).astype(np.float64)

    x64, wgu, wd = host(x), host(w_gate_up), host(w_down)
    wr = host(dtypes.from_float32(np.asarray(host(router_weight), dtype=np.float32), x.dtype))  # as the layer holds it
    logits = x64 @ wr
    sel = np.argsort(-logits, axis=1, kind="stable")[:, :top_k]
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    w = np.take_along_axis(p, sel, axis=1)
    w /= w.sum(axis=1, keepdims=True)
    out = np.zeros_like(x64)
    for e in range(wgu.shape[0]):
        tok, kk = np.nonzero(sel == e)
        if tok.size == 0:
            continue
        y = x64[tok] @ wgu[e].T
        if activation == "swiglu":
            g, u = y[:, 0::2], y[:, 1::2]
            h = g / (1.0 + np.exp(-g)) * u
        else:
            from math import erf, sqrt

            h = 0.5 * y * (1.0 + np.vectorize(erf, otypes=[np.float64])(y / sqrt(2.0)))
        o = rnd(rnd(h) @ wd[e].T * w[tok, kk][:, None])
        np.add.at(out, tok, o)
    return out
