"""Flash attention as torch ops: ``attention.torch.flash_attention`` and ``flash_attention_varlen``
(differentiable) and the custom ops ``torch.ops.cukernels.flash_attention_forward`` / ``flash_attention_backward``
and ``flash_attention_varlen_forward`` / ``flash_attention_varlen_backward``.

Importing this module imports torch (``import attention`` never does) and registers the two custom ops through
``torch.library``, with fake (meta) implementations and the forward's autograd, so ``torch.compile(fullgraph=True)``
traces a model that calls ``flash_attention`` as one node per op, and ``torch.cuda.graph`` captures them (they
run on ``torch.cuda.current_stream()`` with outputs from torch's allocator, see cukernels/launch.py).

Inputs are torch CUDA tensors in the forward's layout (q ``[batch, seq_q, heads, head_dim]``, k, v
``[batch, seq_kv, kv_heads, head_dim]``, fp16 or bf16); gradients flow to q, k and v (dk, dv with kv_heads
heads). In eager mode ``flash_attention`` calls the kernels through a ``torch.autograd.Function`` directly; the
custom ops compute the same thing through the dispatcher, which costs more host time per call than the kernels
of a small problem take, so they are what a compiled graph calls and eager code does not.
"""
from __future__ import annotations

from typing import Optional

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError("attention.torch needs PyTorch (pip install 'cukernels[torch]')") from exc

from .api import flash_attention as _forward
from .api import forward_keyed
from .backward import backward_keyed
from .backward import flash_attention_backward as _backward
from . import varlen as _varlen

Tensor = torch.Tensor


def _segments(q_ids, kv_ids):
    return None if q_ids is None else (q_ids, kv_ids)


def _window(window):
    return None if window is None else (int(window[0]), int(window[1]))


def _aligned_grad(do: Tensor) -> Tensor:
    """The kernels read dO with a contiguous head_dim and 16-byte row strides; autograd may hand a view."""
    st = do.stride()
    if st[-1] != 1 or any(s % 8 for s in st[:-1]):
        return do.contiguous()
    return do


# what the direct C++ entry needs (torch 2.x); without any of it, flash_attention goes through Function.apply
_C_ENTRY = getattr(getattr(torch._C, "_FunctionBase", None), "__dict__", {}).get("apply")
_unwrap_tensor = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)
_are_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None)


def _functorch_active() -> bool:
    """True while a functorch transform is active, or when this torch lacks the pieces of the direct entry."""
    return _C_ENTRY is None or _unwrap_tensor is None or _are_transforms_active is None or _are_transforms_active()


def _unwrap_if_dead(x):
    """What ``Function.apply`` does to each tensor argument (anything else passes, for validation to name)."""
    return _unwrap_tensor(x) if isinstance(x, Tensor) else x


def _c_apply(function: type):
    """``function.apply`` without its Python layer: ``torch.autograd.Function.apply`` binds default arguments
    (only for functions with ``setup_context``), unwraps dead functorch wrappers and calls the C++
    ``_FunctionBase.apply``; with no functorch transform active, that is all it does, and its Python costs about
    as much host time as our whole forward (H100 host, 2026-11-23: 26.0 vs 12.3 us for a Function that only
    allocates its output). Callers unwrap their tensor arguments with ``_unwrap_if_dead`` and take
    ``function.apply`` itself while a transform is active (vmap, grad: ``_functorch_active()``)."""
    return function.apply if _C_ENTRY is None else _C_ENTRY.__get__(None, function)


# ---------------------------------------------------------------- custom ops (what torch.compile sees)


@torch.library.custom_op("cukernels::flash_attention_forward", mutates_args=(), device_types="cuda")
def flash_attention_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, window: Optional[list[int]],
                            q_segment_ids: Optional[Tensor], kv_segment_ids: Optional[Tensor],
                            softmax_scale: Optional[float], deterministic: bool) -> tuple[Tensor, Tensor]:
    """(o, lse) of ``attention.flash_attention``; ``deterministic`` is the backward's option, kept for it."""
    return _forward(q, k, v, causal=causal, window=_window(window),
                    segment_ids=_segments(q_segment_ids, kv_segment_ids), softmax_scale=softmax_scale,
                    return_lse=True)


@flash_attention_forward.register_fake
def _(q, k, v, causal, window, q_segment_ids, kv_segment_ids, softmax_scale, deterministic):
    batch, seq_q, heads, head_dim = q.shape
    return q.new_empty((batch, seq_q, heads, head_dim)), q.new_empty((batch, heads, seq_q), dtype=torch.float32)


@torch.library.custom_op("cukernels::flash_attention_backward", mutates_args=(), device_types="cuda")
def flash_attention_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, causal: bool,
                             window: Optional[list[int]], q_segment_ids: Optional[Tensor],
                             kv_segment_ids: Optional[Tensor], softmax_scale: Optional[float],
                             deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of ``attention.flash_attention_backward``."""
    return _backward(_aligned_grad(do), q, k, v, o, lse, causal=causal, window=_window(window),
                     segment_ids=_segments(q_segment_ids, kv_segment_ids), softmax_scale=softmax_scale,
                     deterministic=deterministic)


@flash_attention_backward.register_fake
def _(do, q, k, v, o, lse, causal, window, q_segment_ids, kv_segment_ids, softmax_scale, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, window, q_ids, kv_ids, softmax_scale, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, q_ids, kv_ids)
    ctx.options = (causal, window, softmax_scale, deterministic)


def _op_backward(ctx, do, dlse):
    q, k, v, o, lse, q_ids, kv_ids = ctx.saved_tensors
    causal, window, softmax_scale, deterministic = ctx.options
    dq, dk, dv = torch.ops.cukernels.flash_attention_backward(do, q, k, v, o, lse, causal, window, q_ids, kv_ids,
                                                              softmax_scale, deterministic)
    return dq, dk, dv, None, None, None, None, None, None


flash_attention_forward.register_autograd(_op_backward, setup_context=_setup_context)


# ---------------------------------------------------------------- eager


class _FlashAttention(torch.autograd.Function):
    # q, k, v and one tuple (causal, window, softmax_scale, deterministic, segment_ids): each argument of an
    # autograd.Function costs host time on the way in and a returned None on the way back; segment ids take no
    # gradient, so they ride in the tuple. lse is neither an input nor an output: it is kept on ctx, not saved
    # (a saved tensor costs its packing here and its unpacking in the backward; lse is never modified in place)
    @staticmethod
    def forward(ctx, q, k, v, options):
        causal, window, softmax_scale, _, segment_ids = options
        o, lse, key = forward_keyed(q, k, v, causal, window, segment_ids, softmax_scale)
        ctx.save_for_backward(q, k, v, o)
        ctx.state = (key, lse, options)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o = ctx.saved_tensors
        key, lse, (causal, window, softmax_scale, deterministic, segment_ids) = ctx.state
        if do.is_contiguous():  # the strides are multiples of head_dim, aligned; autograd gives o's shape, device
            like_o = do.dtype is o.dtype
        else:
            do, like_o = _aligned_grad(do), False
        dq, dk, dv = backward_keyed(key, do, q, k, v, o, lse, causal=causal, window=window,
                                    segment_ids=segment_ids, softmax_scale=softmax_scale,
                                    deterministic=deterministic, do_like_o=like_o)
        return dq, dk, dv, None


_compiling = torch.compiler.is_compiling
_apply = _c_apply(_FlashAttention)


def flash_attention(q, k, v, *, causal=False, window=None, segment_ids=None, softmax_scale=None,
                    deterministic=False):
    """Differentiable flash attention on torch CUDA tensors; options as ``attention.flash_attention`` plus
    ``deterministic`` for the backward. Returns o."""
    if _compiling():
        q_ids, kv_ids = (None, None) if segment_ids is None else (
            tuple(segment_ids) if isinstance(segment_ids, (tuple, list)) else (segment_ids, segment_ids))
        o, _ = torch.ops.cukernels.flash_attention_forward(
            q, k, v, causal, None if window is None else list(window), q_ids, kv_ids,
            None if softmax_scale is None else float(softmax_scale), deterministic)
        return o
    if _functorch_active():
        return _FlashAttention.apply(q, k, v, (causal, window, softmax_scale, deterministic, segment_ids))
    return _apply(_unwrap_if_dead(q), _unwrap_if_dead(k), _unwrap_if_dead(v),
                  (causal, window, softmax_scale, deterministic, _unwrap_if_dead(segment_ids)))


# ---------------------------------------------------------------- packed variable-length batches (varlen.py)


@torch.library.custom_op("cukernels::flash_attention_varlen_forward", mutates_args=(), device_types="cuda")
def flash_attention_varlen_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                   max_seqlen_q: int, max_seqlen_k: int, causal: bool, window: Optional[list[int]],
                                   softmax_scale: Optional[float], deterministic: bool) -> tuple[Tensor, Tensor]:
    """(o, lse) of ``attention.varlen.flash_attention_varlen`` (no host check of the offsets: a compiled graph
    cannot synchronise); ``deterministic`` is the backward's option, kept for it."""
    o, lse, _ = _varlen.forward_keyed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                      _window(window), softmax_scale, False)
    return o, lse


@flash_attention_varlen_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window, softmax_scale, deterministic):
    total, heads, head_dim = q.shape
    return q.new_empty((total, heads, head_dim)), q.new_empty((heads, total), dtype=torch.float32)


@torch.library.custom_op("cukernels::flash_attention_varlen_backward", mutates_args=(), device_types="cuda")
def flash_attention_varlen_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                                    cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                                    causal: bool, window: Optional[list[int]], softmax_scale: Optional[float],
                                    deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of ``attention.varlen.flash_attention_varlen_backward``."""
    return _varlen.flash_attention_varlen_backward(
        _aligned_grad(do), q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
        window=_window(window), softmax_scale=softmax_scale, deterministic=deterministic, check_values=False)


@flash_attention_varlen_backward.register_fake
def _(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window, softmax_scale,
      deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _varlen_setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, window, softmax_scale, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
    ctx.options = (max_q, max_k, causal, window, softmax_scale, deterministic)


def _varlen_op_backward(ctx, do, dlse):
    q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
    max_q, max_k, causal, window, softmax_scale, deterministic = ctx.options
    dq, dk, dv = torch.ops.cukernels.flash_attention_varlen_backward(do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k,
                                                                     causal, window, softmax_scale, deterministic)
    return dq, dk, dv, None, None, None, None, None, None, None, None


flash_attention_varlen_forward.register_autograd(_varlen_op_backward, setup_context=_varlen_setup_context)


class _FlashAttentionVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, causal, window, softmax_scale, deterministic, check):
        o, lse, _ = _varlen.forward_keyed(q, k, v, cu_q, cu_k, max_q, max_k, causal, window, softmax_scale, check)
        ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
        ctx.options = (max_q, max_k, causal, window, softmax_scale, deterministic)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
        max_q, max_k, causal, window, softmax_scale, deterministic = ctx.options
        dq, dk, dv = _varlen.flash_attention_varlen_backward(
            _aligned_grad(do), q, k, v, o, lse, cu_q, cu_k, max_q, max_k, causal=causal, window=window,
            softmax_scale=softmax_scale, deterministic=deterministic, check_values=False)
        return dq, dk, dv, None, None, None, None, None, None, None, None, None


def flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                           window=None, softmax_scale=None, deterministic=False, check_values=True):
    """Differentiable attention over packed sequences (``attention.varlen``): q ``[total_q, heads, head_dim]``,
    k, v ``[total_k, kv_heads, head_dim]``, int32 cu_seqlens ``[batch + 1]``. Returns o. ``check_values``: the
    host check of the offsets in eager mode (the forward only; a compiled graph never checks)."""
    if _compiling():
        o, _ = torch.ops.cukernels.flash_attention_varlen_forward(
            q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), causal,
            None if window is None else list(window), None if softmax_scale is None else float(softmax_scale),
            deterministic)
        return o
    if _functorch_active():
        return _FlashAttentionVarlen.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                           window, softmax_scale, deterministic, check_values)
    return _apply_varlen(_unwrap_if_dead(q), _unwrap_if_dead(k), _unwrap_if_dead(v), _unwrap_if_dead(cu_seqlens_q),
                         _unwrap_if_dead(cu_seqlens_k), max_seqlen_q, max_seqlen_k, causal, window, softmax_scale,
                         deterministic, check_values)


_apply_varlen = _c_apply(_FlashAttentionVarlen)
