"""Analytic gradients of the naive attention formula, every mask, fp32 or fp64, NumPy or CuPy.

For o = softmax(scale * q k^T + mask) v and an upstream gradient do:
    P = softmax(...), dV = P^T dO, dP = dO V^T, D = rowsum(dO * O) = rowsum(P * dP), dS = P * (dP - D),
    dQ = scale * dS K, dK = scale * dS^T Q,
with K/V shared by a GQA group (dK, dV summed over the group's q heads). A row with no visible key has P = 0 and
contributes nothing. ``round_to`` ("fp16"/"bf16") rounds P, dS and the outputs to the storage type, as a naive
low-precision backward would: the yardstick of the tolerance policy (cukernels/checks.py). Tested against finite
differences in tests/test_attention_bwd_cpu.py.
"""
from __future__ import annotations

import math

import numpy as np

from cukernels import dtypes

from .reference import visible


def _xp(x):
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def _as_float(x, dt, xp):
    x = xp.asarray(x)
    if x.dtype in (dtypes.BF16, dtypes.FP16):
        return dtypes.to_float32(x).astype(dt)
    return x.astype(dt)


def _ids(segment_ids, xp):
    if segment_ids is None:
        return None, None
    if isinstance(segment_ids, (tuple, list)):
        return xp.asarray(segment_ids[0]), xp.asarray(segment_ids[1])
    ids = xp.asarray(segment_ids)
    return ids, ids


def _probs(qb, kb, mask, scale, xp):
    """P [H, Sq, Skv] (rows with no visible key all zero) and lse [H, Sq] (-inf there)."""
    s = (qb @ kb.transpose(0, 2, 1)) * scale
    s = xp.where(mask[None], s, -xp.inf)
    m = s.max(axis=-1, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0.0)
    p = xp.exp(s - m)
    denom = p.sum(axis=-1, keepdims=True)
    p = p / xp.where(denom > 0, denom, 1.0)
    with np.errstate(divide="ignore"):
        lse = xp.where(denom[..., 0] > 0, (m + xp.log(xp.where(denom > 0, denom, 1.0)))[..., 0], -xp.inf)
    return p, lse


def _per_batch(q, k, v, *, causal, window, segment_ids, softmax_scale, precision):
    xp = _xp(q)
    dt = np.float64 if precision == "fp64" else np.float32
    qf, kf, vf = (_as_float(x, dt, xp) for x in (q, k, v))
    batch, seq_q, heads, dim = qf.shape
    seq_kv, kv_heads = kf.shape[1], kf.shape[2]
    group = heads // kv_heads
    scale = 1.0 / math.sqrt(dim) if softmax_scale is None else float(softmax_scale)
    q_ids, kv_ids = _ids(segment_ids, xp)
    for b in range(batch):
        mask = visible(seq_q, seq_kv, causal=causal, window=window,
                       q_ids=None if q_ids is None else q_ids[b:b + 1],
                       kv_ids=None if kv_ids is None else kv_ids[b:b + 1], xp=xp)
        if mask.ndim == 3:
            mask = mask[0]
        qb = qf[b].transpose(1, 0, 2)  # [H, Sq, D]
        kb = xp.repeat(kf[b].transpose(1, 0, 2), group, axis=0)  # [H, Skv, D]
        vb = xp.repeat(vf[b].transpose(1, 0, 2), group, axis=0)
        yield b, qb, kb, vb, mask, scale, dt, xp, group


def attention_forward_reference(q, k, v, *, causal=False, window=None, segment_ids=None, softmax_scale=None,
                                precision="fp32"):
    """(o [B, Sq, H, D], lse [B, H, Sq]) in ``precision`` ("fp32" | "fp64")."""
    out = lse_out = None
    for b, qb, kb, vb, mask, scale, dt, xp, _ in _per_batch(q, k, v, causal=causal, window=window,
                                                           segment_ids=segment_ids, softmax_scale=softmax_scale,
                                                           precision=precision):
        if out is None:
            out = xp.empty((q.shape[0], q.shape[1], q.shape[2], q.shape[3]), dtype=dt)
            lse_out = xp.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=dt)
        p, lse = _probs(qb, kb, mask, scale, xp)
        out[b] = (p @ vb).transpose(1, 0, 2)
        lse_out[b] = lse
    return out, lse_out


def attention_backward_reference(do, q, k, v, *, causal=False, window=None, segment_ids=None, softmax_scale=None,
                                 o=None, precision="fp32", round_to=None):
    """(dq [B, Sq, H, D], dk, dv [B, Skv, KVH, D]) of o = attention(q, k, v) for the upstream gradient ``do``.

    ``o``: the forward output to take D = rowsum(dO * o) from (as the kernels do, e.g. a rounded fp16 o); by
    default the exact rowsum(P * dP)."""
    dq = dk = dv = None
    for b, qb, kb, vb, mask, scale, dt, xp, group in _per_batch(q, k, v, causal=causal, window=window,
                                                               segment_ids=segment_ids,
                                                               softmax_scale=softmax_scale, precision=precision):
        if dq is None:
            dof = _as_float(do, dt, xp)
            of = None if o is None else _as_float(o, dt, xp)
            dq = xp.empty(q.shape, dtype=dt)
            dk = xp.empty(k.shape, dtype=dt)
            dv = xp.empty(v.shape, dtype=dt)

        def rnd(x):
            if round_to is None:
                return x
            return dtypes.to_float32(dtypes.from_float32(x.astype(np.float32), dtypes.from_name(round_to))).astype(dt)

        p, _ = _probs(qb, kb, mask, scale, xp)
        dob = dof[b].transpose(1, 0, 2)  # [H, Sq, D]
        dp = dob @ vb.transpose(0, 2, 1)
        if of is None:
            d = (p * dp).sum(axis=-1, keepdims=True)
        else:
            d = (dob * of[b].transpose(1, 0, 2)).sum(axis=-1, keepdims=True)
        ds = rnd(p * (dp - d))
        pr = rnd(p)
        heads, seq_kv, dim = kb.shape
        dq[b] = rnd((scale * (ds @ kb)).transpose(1, 0, 2))
        dk_h = (scale * (ds.transpose(0, 2, 1) @ qb)).reshape(heads // group, group, seq_kv, dim).sum(axis=1)
        dv_h = (pr.transpose(0, 2, 1) @ dob).reshape(heads // group, group, seq_kv, dim).sum(axis=1)
        dk[b] = rnd(dk_h.transpose(1, 0, 2))
        dv[b] = rnd(dv_h.transpose(1, 0, 2))
    return dq, dk, dv
