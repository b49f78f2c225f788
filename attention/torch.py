"""``attention.torch.flash_attention``: the flash attention forward and backward as one differentiable torch op.

torch is optional for the project: this module imports without it and only imports torch when the op is first
used (``import attention`` never imports torch). Inputs are torch CUDA tensors in the forward's layout (q
``[batch, seq_q, heads, head_dim]``, k, v ``[batch, seq_kv, kv_heads, head_dim]``, fp16 or bf16); gradients flow to
q, k and v (dk, dv with kv_heads heads). Kernels run on CuPy's current stream, which for the default stream is
torch's default stream too.
"""
from __future__ import annotations

import functools


@functools.cache
def _function():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised only without torch
        raise ImportError("attention.torch needs PyTorch (pip install 'cukernels[torch]')") from exc

    from .api import flash_attention as _forward
    from .backward import flash_attention_backward as _backward

    class FlashAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, window, segment_ids, softmax_scale, deterministic):
            o, lse = _forward(q, k, v, causal=causal, window=window, segment_ids=segment_ids,
                              softmax_scale=softmax_scale, return_lse=True)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.options = dict(causal=causal, window=window, segment_ids=segment_ids, softmax_scale=softmax_scale,
                               deterministic=deterministic)
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            if do.stride(-1) != 1 or any(s % 8 for s in do.stride()[:-1]):
                do = do.contiguous()
            dq, dk, dv = _backward(do, q, k, v, o, lse, **ctx.options)
            return dq, dk, dv, None, None, None, None, None

    return FlashAttention


def flash_attention(q, k, v, *, causal=False, window=None, segment_ids=None, softmax_scale=None,
                    deterministic=False):
    """Differentiable flash attention on torch CUDA tensors; options as ``attention.flash_attention`` plus
    ``deterministic`` for the backward."""
    return _function().apply(q, k, v, causal, window, segment_ids, softmax_scale, deterministic)
