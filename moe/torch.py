"""The MoE layer and the grouped GEMM as torch custom ops (``torch.ops.cukernels.moe_layer``,
``torch.ops.cukernels.grouped_gemm``), with fake implementations, so ``torch.compile(fullgraph=True)`` traces
a model that calls ``MoELayer`` (on torch tensors) as one node. Importing this module imports torch
(``import moe`` never does). Eager calls go to the kernels directly (``MoELayer.forward``); the custom ops are
what a compiled graph calls. No autograd: these are forward (inference) kernels.
"""
from __future__ import annotations

from typing import Optional

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError("moe.torch needs PyTorch (pip install 'cukernels[torch]')") from exc

from .grouped_gemm import grouped_gemm as _grouped_gemm
from .layer import moe_forward

Tensor = torch.Tensor


@torch.library.custom_op("cukernels::moe_layer", mutates_args=(), device_types="cuda")
def moe_layer(x: Tensor, router_b: Tensor, w_gate_up: Tensor, w_down: Tensor, top_k: int,
              activation: str) -> Tensor:
    """``MoELayer.forward`` on weights in kernel layout (router_b ``[1, experts, hidden]`` in x's dtype)."""
    return moe_forward(x, router_b, w_gate_up, w_down, top_k, activation)


@moe_layer.register_fake
def _(x, router_b, w_gate_up, w_down, top_k, activation):
    return x.new_empty(x.shape)


@torch.library.custom_op("cukernels::grouped_gemm", mutates_args=(), device_types="cuda")
def grouped_gemm(a: Tensor, b: Tensor, offsets: Tensor, row_scale: Optional[Tensor], epilogue: Optional[str],
                 out_fp32: bool) -> Tensor:
    """``moe.grouped_gemm`` (out_fp32: float32 output of the plain GEMM)."""
    import numpy as np

    return _grouped_gemm(a, b, offsets, epilogue=epilogue, row_scale=row_scale,
                         out_dtype=np.float32 if out_fp32 else None)


@grouped_gemm.register_fake
def _(a, b, offsets, row_scale, epilogue, out_fp32):
    n = b.shape[1] // 2 if epilogue == "swiglu" else b.shape[1]
    return a.new_empty((a.shape[0], n), dtype=torch.float32 if out_fp32 else a.dtype)


def torch_views(*arrays):
    """CuPy arrays as torch tensors on the same memory (uint16 bf16 bits as bfloat16), for the custom ops."""
    out = []
    for arr in arrays:
        if arr.dtype.kind == "u":
            out.append(torch.from_dlpack(arr.view("int16")).view(torch.bfloat16))
        else:
            out.append(torch.from_dlpack(arr))
    return tuple(out)


def torch_moe_swiglu(x: Tensor, logits: Tensor, top_k: int, w_gate_up: Tensor, w_down: Tensor, *,
                     grouped: bool) -> Tensor:
    """The torch baseline of a SwiGLU MoE layer (what eager PyTorch MoE code does): softmax + top-k of the router
    ``logits`` (renormalised), tokens sorted by expert, the experts by a per-expert cuBLAS loop (counts copied to
    the host) or ``torch._grouped_mm`` (``grouped``), then a weighted ``index_add`` in fp32. ``w_gate_up``
    ``[experts, 2 I, H]`` gate/up interleaved, ``w_down`` ``[experts, H, I]``. Used by moe.bench and models."""
    import torch.nn.functional as F

    experts = w_gate_up.shape[0]
    w, sel = torch.topk(torch.softmax(logits.float(), dim=-1), top_k, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    flat = sel.flatten()
    order = flat.argsort(stable=True)
    tok = order // top_k
    xs = x[tok]
    if grouped:
        offs = torch.cumsum(torch.bincount(flat, minlength=experts), 0).to(torch.int32)
        h = torch._grouped_mm(xs, w_gate_up.transpose(1, 2), offs=offs)
        ys = torch._grouped_mm((F.silu(h[:, 0::2]) * h[:, 1::2]).contiguous(), w_down.transpose(1, 2), offs=offs)
    else:
        counts = torch.bincount(flat, minlength=experts).tolist()
        ys = torch.empty_like(xs)
        start = 0
        for e, c in enumerate(counts):
            if c:
                h = F.linear(xs[start:start + c], w_gate_up[e])
                ys[start:start + c] = F.linear(F.silu(h[:, 0::2]) * h[:, 1::2], w_down[e])
                start += c
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    out.index_add_(0, tok, ys.float() * w.flatten()[order, None])
    return out.to(x.dtype)
