"""The model's forward in plain NumPy float32 (the MoE FFN through ``moe.layer.reference_forward``, float64), for
small configs (tests/test_models_gpu.py): the yardstick of ``OursModel`` and ``TorchModel``.

``round_bf16=True`` rounds every op's output to bfloat16 where a bf16 implementation stores it (norm outputs,
projections, rotary, attention, the SwiGLU activation, FFN outputs, the residual stream): the "naive" low-precision
computation of the tolerance policy (cukernels/checks.py), whose error against the float32 forward says how far a
correct bf16 implementation may be from it.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cukernels import dtypes

from .configs import ModelConfig
from .layers import LayerWeights, Weights
from .norm_rope import rotary_tables


def weights_to_numpy(weights: Weights) -> Weights:
    """The same weights as float32 NumPy arrays (bf16 values are exact in float32)."""
    def host(t):
        return None if t is None else t.float().cpu().numpy()

    layers = [LayerWeights(**{f.name: host(getattr(lw, f.name)) for f in dataclasses.fields(lw)})
              for lw in weights.layers]
    return Weights(layers=layers, final_norm=host(weights.final_norm))


def _bf16(a):
    return dtypes.to_float32(dtypes.to_bf16(np.asarray(a, dtype=np.float32)))


def rms_norm(x, weight, eps: float):
    x = np.asarray(x, dtype=np.float32)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotary(t, cos, sin):
    """neox half-rotation of t ``[batch, seq, heads, head_dim]``; cos/sin ``[seq, head_dim / 2]``."""
    half = t.shape[-1] // 2
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    a, b = t[..., :half], t[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def causal_attention(q, k, v):
    """q ``[batch, seq, heads, d]``, k/v ``[batch, seq, kv_heads, d]`` (query head h reads kv head h // group)."""
    batch, seq, heads, d = q.shape
    group = heads // k.shape[2]
    kk, vv = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, kk) / np.sqrt(d)
    s = np.where(np.triu(np.ones((seq, seq), dtype=bool), 1), -np.inf, s)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, vv).astype(np.float32)


def forward(cfg: ModelConfig, weights: Weights, x, *, round_bf16: bool = False):
    """``(out, route_gap)``: the final hidden states float32 ``[batch, seq, hidden]`` of x (float32 of the same
    shape; ``weights`` from ``weights_to_numpy``), and for an MoE model the smallest gap, over the layers, between
    each token's k-th and (k+1)-th router logit (``[batch * seq]``; None for a dense model): where it is tiny, a
    low-precision implementation may route the token to another expert, which no tolerance covers."""
    from moe.layer import reference_forward as moe_reference

    rnd = _bf16 if round_bf16 else (lambda a: np.asarray(a, dtype=np.float32))
    batch, seq, hidden = x.shape
    tokens, heads, kv, d = batch * seq, cfg.heads, cfg.kv_heads, cfg.head_dim
    cos, sin = rotary_tables(seq, d, cfg.rope_theta)
    eps = cfg.norm_eps
    resid = rnd(np.asarray(x, dtype=np.float32).reshape(tokens, hidden))
    gap = np.full(tokens, np.inf) if cfg.ffn == "moe" else None
    for lw in weights.layers:
        h = rnd(rms_norm(resid, lw.attn_norm, eps))
        qkv = rnd(h @ lw.w_qkv[0].T).reshape(batch, seq, heads + 2 * kv, d)
        q = rnd(rotary(qkv[:, :, :heads], cos, sin))
        k = rnd(rotary(qkv[:, :, heads:heads + kv], cos, sin))
        o = rnd(causal_attention(q, k, qkv[:, :, heads + kv:]))
        resid = rnd(resid + rnd(o.reshape(tokens, heads * d) @ lw.w_o[0].T))
        h = rnd(rms_norm(resid, lw.ffn_norm, eps))
        if cfg.ffn == "moe":
            f = moe_reference(h, lw.router, lw.w_gate_up, lw.w_down, cfg.top_k,
                              round_to=dtypes.BF16 if round_bf16 else None)
            logits = -np.sort(-(h.astype(np.float64) @ lw.router.astype(np.float64)), axis=1)
            gap = np.minimum(gap, logits[:, cfg.top_k - 1] - logits[:, cfg.top_k])
        else:
            g = h @ lw.w_gate_up[0].T
            gate, up = g[:, 0::2], g[:, 1::2]
            f = rnd(gate / (1.0 + np.exp(-gate)) * up) @ lw.w_down[0].T
        resid = rnd(resid + rnd(f))
    out = rnd(rms_norm(resid, weights.final_norm, eps))
    return out.reshape(batch, seq, hidden), gap
