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
