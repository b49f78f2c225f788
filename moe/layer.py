"""``MoELayer``: route -> permute -> gather -> grouped GEMM (up, fused activation) -> grouped GEMM (down, routing
weight as row scale) -> combine, all on the GPU with no host synchronisation (CUDA-graph capturable).

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

import dataclasses

import numpy as np

from cukernels import dtypes

from .dispatch import combine, gather, permute
from .grouped_gemm import grouped_gemm
from .routing import route

ACTIVATIONS = ("swiglu", "gelu")


class MoELayer:
    def __init__(self, router_weight, w_gate_up, w_down, top_k: int, *, activation: str = "swiglu"):
        import cupy

        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        w_gate_up, _ = dtypes.as_cupy(w_gate_up, name="w_gate_up")
        w_down, _ = dtypes.as_cupy(w_down, name="w_down")
        router, _ = dtypes.as_cupy(router_weight, name="router_weight")
        if w_gate_up.ndim != 3 or w_down.ndim != 3 or router.ndim != 2:
            raise ValueError(f"expected router_weight [hidden, experts], w_gate_up [experts, n, hidden], "
                             f"w_down [experts, hidden, intermediate]; got {router.shape}, {w_gate_up.shape}, "
                             f"{w_down.shape}")
        experts, n_up, hidden = (int(v) for v in w_gate_up.shape)
        inter = n_up // 2 if activation == "swiglu" else n_up
        if activation == "swiglu" and n_up % 2:
            raise ValueError(f"w_gate_up has {n_up} rows per expert: SwiGLU needs gate/up pairs (an even count)")
        if tuple(w_down.shape) != (experts, hidden, inter):
            raise ValueError(f"w_down must be [experts, hidden, intermediate] = {(experts, hidden, inter)}, "
                             f"got {tuple(w_down.shape)}")
        if tuple(router.shape) != (hidden, experts):
            raise ValueError(f"router_weight must be [hidden, experts] = {(hidden, experts)}, got {tuple(router.shape)}")
        if w_gate_up.dtype not in (dtypes.FP16, dtypes.BF16) or w_down.dtype != w_gate_up.dtype:
            raise TypeError(f"w_gate_up and w_down must share float16 or bf16 (uint16), got {w_gate_up.dtype}, "
                            f"{w_down.dtype}")
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or not 1 <= top_k <= experts:
            raise ValueError(f"top_k must be an int in 1..{experts}, got {top_k!r}")
        self.w_gate_up, self.w_down = w_gate_up, w_down
        r32 = dtypes.to_float32(router) if router.dtype != dtypes.FP32 else router
        self.router_b = cupy.ascontiguousarray(dtypes.from_float32(r32.T, w_gate_up.dtype)[None])
        self.top_k, self.activation = int(top_k), activation
        self.experts, self.hidden, self.intermediate = experts, hidden, inter
        self._ones: dict[int, object] = {}
        self._one_group: dict[int, object] = {}

    @property
    def dtype(self):
        return self.w_gate_up.dtype

    def _unit_weights(self, tokens: int):
        """Per-batch-size constants, made on the first call (eagerly: a graph capture then only reuses them)."""
        import cupy

        if tokens not in self._ones:
            self._ones[tokens] = cupy.ones((tokens, self.top_k), dtype=cupy.float32)
            self._one_group[tokens] = cupy.asarray([0, tokens], dtype=cupy.int32)
        return self._ones[tokens]

    def forward(self, x):
        """``x`` [tokens, hidden] -> [tokens, hidden], same dtype (and library) as x."""
        xc, was_torch = dtypes.as_cupy(x, name="x")
        if xc.ndim != 2 or xc.shape[1] != self.hidden:
            raise ValueError(f"x must be [tokens, {self.hidden}], got shape {tuple(xc.shape)}")
        if xc.dtype != self.dtype:
            raise TypeError(f"x must have the weights' dtype {self.dtype}, got {xc.dtype}")
        tokens = int(xc.shape[0])
        ones = self._unit_weights(tokens)
        logits = grouped_gemm(xc, self.router_b, self._one_group[tokens], out_dtype=np.float32)
        routing = route(logits, self.top_k)
        disp = permute(routing)
        xs = gather(xc, disp)
        epi = "swiglu" if self.activation == "swiglu" else "gelu"
        h = grouped_gemm(xs, self.w_gate_up, disp.offsets, epilogue=epi)
        slot_weight = routing.weights.ravel()[disp.sorted_slots]
        y = grouped_gemm(h, self.w_down, disp.offsets, row_scale=slot_weight)
        out = combine(y, disp, dataclasses.replace(routing, weights=ones))
        return dtypes.like_input(out, was_torch)

    __call__ = forward


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
