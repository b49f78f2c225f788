"""NumPy references of route, permute, gather and combine: the specification the kernels are tested against.

Float64 arithmetic on the fp32 values of the stored logits. Ranking: ``argsort(-logits, kind="stable")``: larger
logit first, equal logits in increasing expert index, NaN last (after -inf). ``moe.routing``'s module doc states
the definitions of the weights, losses and usage statistics.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cukernels import dtypes


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoutingRef:
    weights: np.ndarray  # float64 [tokens, top_k]
    experts: np.ndarray  # int32 [tokens, top_k]
    counts: np.ndarray  # int64 [experts]
    mean_prob: np.ndarray  # float64 [experts]
    share: np.ndarray  # float64 [experts]
    aux_loss: float
    z_loss: float
    usage_cv: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class DispatchRef:
    sorted_slots: np.ndarray  # int32 [rows], -1 for padding
    inverse: np.ndarray  # int32 [tokens, top_k]
    offsets: np.ndarray  # int32 [experts + 1]
    padded_offsets: np.ndarray  # int32 [experts + 1] (== offsets without block_m)


def logits_f32(logits) -> np.ndarray:
    """Host float32 values of logits stored as float32, float16 or bf16 bits (uint16)."""
    x = logits.get() if hasattr(logits, "get") else np.asarray(logits)
    return dtypes.to_float32(x)


def route(logits, top_k: int, *, scoring: str = "softmax", renormalize: bool = True) -> RoutingRef:
    x32 = logits_f32(logits)
    tokens, experts = x32.shape
    experts_sel = np.argsort(-x32, axis=1, kind="stable")[:, :top_k].astype(np.int32)
    x = x32.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        m = x.max(axis=1, keepdims=True)
        e = np.exp(x - m)
        s = e.sum(axis=1, keepdims=True)
        lse = (m + np.log(s))[:, 0]
        if scoring == "softmax":
            scores = e / s
            probs = scores
        elif scoring == "sigmoid":
            scores = 1.0 / (1.0 + np.exp(-x))
            probs = scores / scores.sum(axis=1, keepdims=True)
        else:
            raise ValueError(f"scoring must be softmax or sigmoid, got {scoring!r}")
        w = np.take_along_axis(scores, experts_sel, axis=1)
        if renormalize:
            w = w / w.sum(axis=1, keepdims=True)
    counts = np.bincount(experts_sel.ravel(), minlength=experts).astype(np.int64)
    slots = tokens * top_k
    share = counts / slots
    mean_prob = probs.mean(axis=0)
    return RoutingRef(weights=w, experts=experts_sel, counts=counts, mean_prob=mean_prob, share=share,
                      aux_loss=float(experts * (share * mean_prob).sum()), z_loss=float((lse**2).mean()),
                      usage_cv=float(counts.std() / counts.mean()))


def permute(experts_sel: np.ndarray, num_experts: int, *, block_m: int | None = None) -> DispatchRef:
    """Stable sort of the slots (token * top_k + k) by expert, padded per expert to block_m rows."""
    ids = np.asarray(experts_sel).ravel()
    tokens, top_k = np.asarray(experts_sel).shape
    counts = np.bincount(ids, minlength=num_experts)
    padded = counts if not block_m else -(-counts // block_m) * block_m
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    padded_offsets = np.concatenate([[0], np.cumsum(padded)]).astype(np.int32)
    rows = tokens * top_k + (num_experts * (block_m - 1) if block_m else 0)
    sorted_slots = np.full(rows, -1, dtype=np.int32)
    inverse = np.empty(tokens * top_k, dtype=np.int32)
    order = np.argsort(ids, kind="stable")
    for e in range(num_experts):
        mine = order[offsets[e]:offsets[e + 1]]
        where = padded_offsets[e] + np.arange(mine.size)
        sorted_slots[where] = mine
        inverse[mine] = where
    return DispatchRef(sorted_slots=sorted_slots, inverse=inverse.reshape(tokens, top_k), offsets=offsets,
                       padded_offsets=padded_offsets)


def gather(x: np.ndarray, sorted_slots: np.ndarray, top_k: int) -> np.ndarray:
    """Rows of x in expert order (zeros for -1); same dtype as x."""
    x = np.asarray(x)
    out = np.zeros((sorted_slots.size, x.shape[1]), dtype=x.dtype)
    used = sorted_slots >= 0
    out[used] = x[sorted_slots[used] // top_k]
    return out


def combine(expert_out, inverse: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """float64 [tokens, hidden]: sum over k of weights[t, k] * expert_out[inverse[t, k]] (expert_out's values)."""
    y = dtypes.to_float32(np.asarray(expert_out)).astype(np.float64)
    return np.einsum("tk,tkh->th", np.asarray(weights, dtype=np.float64), y[np.asarray(inverse)])
