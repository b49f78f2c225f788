"""``flash_attention_varlen``: attention over a packed batch of variable-length sequences, forward and backward
(FlashAttention's ``flash_attn_varlen_func``).

- ``q`` ``[total_q, heads, head_dim]``, ``k`` and ``v`` ``[total_k, kv_heads, head_dim]``: the sequences one after
  another, no padding (strides as ``flash_attention``'s: head_dim contiguous, the others multiples of 8).
- ``cu_seqlens_q`` / ``cu_seqlens_k`` int32 ``[batch + 1]``, contiguous, on q's device: sequence b is rows
  ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of q and ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]`` of k/v (0-length
  sequences allowed; ``cu[0] == 0`` and ``cu[-1]`` the total).
- ``max_seqlen_q`` / ``max_seqlen_k``: host ints, the longest sequence of each (the planner's tile choice).
- ``causal``, ``window``, ``softmax_scale`` as in ``flash_attention``, within each sequence (causal aligned
  bottom-right per sequence: query i of a sequence sees its keys j <= i + len_k - len_q).

The kernels are the dense ones with the packed mode (``MASK_VARLEN``, kernels/common.cuh): one grid dimension
runs over every sequence's tiles, so the work is that of the real tokens, not of ``batch x max_seqlen``.

``check_values`` (default True) reads both cu_seqlens on the host once per call and refuses, before any launch,
a first entry other than 0, a decreasing entry, a last entry other than the packed length, or a sequence longer
than ``max_seqlen``: a small device-to-host copy that a CUDA graph cannot capture, so pass False inside captured or
latency-critical loops. The kernels clamp the offsets to the packed rows either way, so bad values never read or
write outside the tensors.

Returns ``o`` ``[total_q, heads, head_dim]`` (new, contiguous) and with ``return_lse`` float32 ``lse``
``[heads, total_q]`` (natural log; -inf for a row that sees no key, whose output is 0).
"""
from __future__ import annotations

import numpy as np

from cukernels import launch

from . import api, backward
from .configs import FwdProblem


def _check_cu(name: str, cu, batch: int | None) -> tuple[int, int | None]:
    """Shape/dtype/contiguity of a cu_seqlens array; returns (batch, device)."""
    if cu is None or not hasattr(cu, "shape") or not hasattr(cu, "dtype"):
        raise TypeError(f"{name} must be an int32 cupy.ndarray or torch CUDA tensor, got {type(cu).__name__}")
    shape, _, _, dev, _ = api.describe_ids(cu, name)
    if len(shape) != 1 or shape[0] < 2:
        raise ValueError(f"{name} must be 1-D [batch + 1] with batch >= 1, got shape {list(shape)}")
    if not _contiguous(cu):
        raise ValueError(f"{name} must be contiguous")
    if batch is not None and shape[0] - 1 != batch:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
                         f"{batch + 1} and {shape[0]}")
    return shape[0] - 1, dev


def _contiguous(x) -> bool:
    if launch.is_torch(x):
        return x.is_contiguous()
    return bool(x.flags.c_contiguous)


def _check_max(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, window=None,
                    softmax_scale=None) -> FwdProblem:
    """Every check that the arguments' attributes allow (no device work); the packed problem (batch = the
    sequences, seq_q / seq_kv = the packed totals) or ``ValueError``/``TypeError`` naming the argument."""
    layouts, devs, qdt = api.describe_qkv(q, k, v, "[total_tokens, heads, head_dim]")
    (total_q, heads, head_dim), (total_k, kv_heads, _) = layouts["q"][0], layouts["k"][0]
    api.check_sizes(layouts, (("q total tokens", total_q), ("k/v total tokens", total_k)), (total_q, total_k))
    batch, cdev_q = _check_cu("cu_seqlens_q", cu_seqlens_q, None)
    _, cdev_k = _check_cu("cu_seqlens_k", cu_seqlens_k, batch)
    _check_max("max_seqlen_q", max_seqlen_q)
    _check_max("max_seqlen_k", max_seqlen_k)
    window = api.check_options(causal, window, softmax_scale)
    devs |= {cdev_q, cdev_k}
    if None in devs:
        raise TypeError("q, k, v and cu_seqlens must be CuPy arrays or torch CUDA tensors on a GPU; got host data "
                        "(numpy array or CPU tensor)")
    if len(devs) != 1:
        raise ValueError(f"q, k, v and cu_seqlens must be on one device, got devices {sorted(devs)}")
    return FwdProblem(batch=batch, seq_q=total_q, seq_kv=total_k, heads=heads, kv_heads=kv_heads,
                      head_dim=head_dim, dtype=qdt, causal=bool(causal), window=window, varlen=True,
                      tma_layout=api.tma_layout(layouts))


def _host(x) -> np.ndarray:
    if launch.is_torch(x):
        return x.detach().cpu().numpy()
    return x.get()


def check_offsets(cu_seqlens_q, cu_seqlens_k, total_q: int, total_k: int, max_seqlen_q: int,
                  max_seqlen_k: int) -> None:
    """What only the device's values can say: offsets that start at 0, never decrease, end at the packed length,
    and sequences no longer than max_seqlen."""
    for name, cu, total, longest, max_name in (("cu_seqlens_q", cu_seqlens_q, total_q, max_seqlen_q, "max_seqlen_q"),
                                               ("cu_seqlens_k", cu_seqlens_k, total_k, max_seqlen_k, "max_seqlen_k")):
        c = _host(cu).astype(np.int64)
        if c[0] != 0:
            raise ValueError(f"{name}[0] must be 0, got {int(c[0])}")
        lens = np.diff(c)
        bad = np.nonzero(lens < 0)[0]
        if bad.size:
            b = int(bad[0])
            raise ValueError(f"{name} must not decrease: {name}[{b + 1}] = {int(c[b + 1])} < {name}[{b}] = "
                             f"{int(c[b])}")
        if c[-1] != total:
            raise ValueError(f"{name}[-1] must be the packed length {total} (rows of the tensor), got {int(c[-1])}")
        if lens.size and int(lens.max()) > longest:
            b = int(np.argmax(lens))
            raise ValueError(f"sequence {b} has {int(lens[b])} rows by {name}, more than {max_name} = {longest}")


class _Call:
    """A cached packed forward: the dense ForwardCall in packed mode, and what the value check needs."""

    __slots__ = ("forward", "totals", "maxes")

    def __init__(self, forward, totals, maxes):
        self.forward, self.totals, self.maxes = forward, totals, maxes


_FORWARD = launch.Cache("attention.varlen forward")


def _cache_key(tensors, causal, window, softmax_scale, max_seqlen_q, max_seqlen_k):
    views = [launch.view(x) for x in tensors]
    opts = api.options_key(causal, window, None, softmax_scale)
    if opts is None or None in views or type(max_seqlen_q) is not int or type(max_seqlen_k) is not int:
        return None, views
    return (*(vw[0] for vw in views), opts, max_seqlen_q, max_seqlen_k), views


def forward_keyed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window, softmax_scale,
                  check, plan=None):
    """``(o, lse, key)`` of the packed forward; ``key`` (None when uncached) keys its backward."""
    tensors = (q, k, v, cu_seqlens_q, cu_seqlens_k)
    key, views = _cache_key(tensors, causal, window, softmax_scale, max_seqlen_q, max_seqlen_k)
    call = None if key is None or plan is not None else _FORWARD.get(key)
    if call is None:
        problem = validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                                  window=window, softmax_scale=softmax_scale)
        call = _Call(api.ForwardCall(q, k, v, problem, plan, softmax_scale, None),
                     (problem.seq_q, problem.seq_kv), (int(max_seqlen_q), int(max_seqlen_k)))
        if key is not None and plan is None:
            _FORWARD.put(key, call)
        else:
            key = None
        views = [launch.view(x) for x in tensors]
    if check:
        check_offsets(cu_seqlens_q, cu_seqlens_k, *call.totals, *call.maxes)
    o, lse = call.forward(views[0][1], views[1][1], views[2][1], (views[3][1], views[4][1]))
    return o, lse, key


def flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                           window=None, softmax_scale=None, return_lse=False, check_values=True, plan=None):
    """Attention of each packed sequence of q over its keys (see the module doc). Cached by signature like
    ``flash_attention``. ``plan``: a ``cukernels.tiling.Plan`` to use instead of the planner's."""
    o, lse, _ = forward_keyed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window,
                              softmax_scale, check_values, plan)
    return (o, lse) if return_lse else o


_BACKWARD = launch.Cache("attention.varlen backward")


def flash_attention_varlen_backward(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                                    causal=False, window=None, softmax_scale=None, deterministic=False,
                                    check_values=True):
    """Gradients (dq, dk, dv) of ``o = flash_attention_varlen(q, k, v, ...)`` given dO ([total_q, heads,
    head_dim] like q) and the forward's lse ([heads, total_q]); dk, dv have kv_heads heads (a GQA group's
    gradients summed). ``deterministic`` as in ``flash_attention_backward``."""
    tensors = (do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k)
    key, views = _cache_key(tensors, causal, window, softmax_scale, max_seqlen_q, max_seqlen_k)
    if deterministic is not True and deterministic is not False:
        key = None
    call = None if key is None else _BACKWARD.get((key, deterministic))
    if call is None:
        problem = validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                                  window=window, softmax_scale=softmax_scale)
        problem = backward.validate_backward(do, q, k, v, o, lse, deterministic=deterministic, problem=problem)
        call = _Call(backward.BackwardCall(do, q, k, v, o, lse, problem, None, softmax_scale, None, deterministic),
                     (problem.seq_q, problem.seq_kv), (int(max_seqlen_q), int(max_seqlen_k)))
        if key is not None:
            _BACKWARD.put((key, deterministic), call)
        views = [launch.view(x) for x in tensors]
    if check_values:
        check_offsets(cu_seqlens_q, cu_seqlens_k, *call.totals, *call.maxes)
    return call.forward(tuple(vw[1] for vw in views[:5]), lse, (views[6][1], views[7][1]))
