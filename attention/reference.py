"""The naive attention formula with every mask, in fp32 on NumPy or CuPy (whichever owns the inputs).

It materializes the [seq_q, seq_kv] scores one batch element at a time. Used by the tests as the reference
and by the bench as the "naive" implementation. ``round_to`` gives the "same computation done naively in low
precision" of the tolerance policy (cukernels/checks.py): P and the output rounded to the storage type.
"""
from __future__ import annotations

import math

import numpy as np

from cukernels import dtypes


def _xp(x):
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def visible(seq_q: int, seq_kv: int, *, causal=False, window=None, q_ids=None, kv_ids=None, xp=np):
    """Bool [seq_q, seq_kv] (or [batch, seq_q, seq_kv] with ids): which keys each query may attend to.
    Query i sits at kv position i + seq_kv - seq_q (bottom-right alignment); -1 in window = unbounded."""
    i = xp.arange(seq_q)[:, None] + (seq_kv - seq_q)
    j = xp.arange(seq_kv)[None, :]
    mask = xp.ones((seq_q, seq_kv), dtype=bool)
    left, right = (-1, -1) if window is None else window
    if causal:
        right = 0
    if left >= 0:
        mask &= j >= i - left
    if right >= 0:
        mask &= j <= i + right
    if q_ids is not None:
        mask = mask[None] & (q_ids[:, :, None] == kv_ids[:, None, :])
    return mask


def attention_reference(q, k, v, *, causal=False, window=None, segment_ids=None, softmax_scale=None,
                        return_lse=False, round_to=None):
    """fp32 attention. q [B, Sq, H, D]; k, v [B, Skv, KVH, D] (float16/float32, or uint16 bf16 bits).

    Returns o float32 [B, Sq, H, D] (and lse float32 [B, H, Sq], natural log). Rows with no visible key give
    o = 0 and lse = -inf. ``round_to`` ("fp16"/"bf16") rounds P before P V and the output, as a naive
    low-precision implementation would."""
    xp = _xp(q)
    qf, kf, vf = (dtypes.to_float32(x) for x in (q, k, v))
    batch, seq_q, heads, dim = qf.shape
    seq_kv, kv_heads = kf.shape[1], kf.shape[2]
    group = heads // kv_heads
    scale = 1.0 / math.sqrt(dim) if softmax_scale is None else float(softmax_scale)
    if segment_ids is None:
        q_ids = kv_ids = None
    elif isinstance(segment_ids, (tuple, list)):
        q_ids, kv_ids = (xp.asarray(x) for x in segment_ids)
    else:
        q_ids = kv_ids = xp.asarray(segment_ids)

    def rnd(x):
        if round_to is None:
            return x
        return dtypes.to_float32(dtypes.from_float32(x, dtypes.from_name(round_to)))

    out = xp.empty((batch, seq_q, heads, dim), dtype=xp.float32)
    lse = xp.empty((batch, heads, seq_q), dtype=xp.float32)
    for b in range(batch):
        ids = None if q_ids is None else (q_ids[b : b + 1], kv_ids[b : b + 1])
        mask = visible(seq_q, seq_kv, causal=causal, window=window, q_ids=None if ids is None else ids[0],
                       kv_ids=None if ids is None else ids[1], xp=xp)
        if mask.ndim == 3:
            mask = mask[0]
        qb = qf[b].transpose(1, 0, 2)  # [H, Sq, D]
        kb = xp.repeat(kf[b].transpose(1, 0, 2), group, axis=0)  # [H, Skv, D]
        vb = xp.repeat(vf[b].transpose(1, 0, 2), group, axis=0)
        s = (qb @ kb.transpose(0, 2, 1)) * xp.float32(scale)
        s = xp.where(mask[None], s, -xp.inf)
        m = s.max(axis=-1, keepdims=True)
        m_safe = xp.where(xp.isfinite(m), m, 0.0).astype(xp.float32)
        p = xp.exp(s - m_safe)
        denom = p.sum(axis=-1, keepdims=True)
        o = rnd(p) @ vb
        o = xp.where(denom > 0, o / xp.where(denom > 0, denom, 1.0), 0.0)
        out[b] = rnd(o.transpose(1, 0, 2))
        with np.errstate(divide="ignore"):
            lse[b] = xp.where(denom[..., 0] > 0, (m_safe + xp.log(denom))[..., 0], -xp.inf)
    return (out, lse) if return_lse else out
