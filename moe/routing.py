"""``route``: top-k expert selection with the load-balance statistics, one fused pass over the router logits.

Semantics (the NumPy reference in ``moe.reference`` is the specification):

- ``logits`` ``[tokens, experts]``, float32, float16 or bfloat16 (a ``uint16`` CuPy array of bf16 bits, or a
  torch bf16 CUDA tensor). ``experts <= 256``, ``1 <= top_k <= min(8, experts)``.
- Experts are ranked by their logit (fp32 value of the stored element); **equal logits go to the lower expert
  index**; NaN ranks below -inf. Both scorings are monotonic in the logit, so this is the ranking by score,
  without the ties that rounding of the scores would add.
- ``scoring="softmax"``: weight = softmax probability; with ``renormalize`` divided by the sum over the chosen k.
  ``scoring="sigmoid"`` (DeepSeek-V3): weight = sigmoid(logit); with ``renormalize`` divided by the chosen sum.
- ``aux_loss`` (Switch/GShard) = experts * sum_i fraction_i * mean_prob_i, fraction_i = counts_i / (tokens top_k),
  mean_prob_i = mean over tokens of the softmax probability of expert i (for sigmoid scoring: the sigmoid scores
  normalised to sum 1 over all experts, DeepSeek-V3's balance-loss probabilities).
- ``z_loss`` = mean over tokens of logsumexp(logits)^2 (both scorings).
- Usage: ``share`` = counts / (tokens top_k); ``usage_cv`` = std(counts) / mean(counts) (population std).

Everything stays on the GPU; the reductions have a fixed order, so the losses are bitwise reproducible.
``Routing.stats()`` synchronises and returns Python floats.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cukernels import dtypes

from . import configs, launch

SCORINGS = ("softmax", "sigmoid")


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Routing:
    weights: object  # float32 [tokens, top_k]
    experts: object  # int32 [tokens, top_k], in rank order
    counts: object  # int32 [experts]: slots routed to each expert
    aux_loss: object  # float32 0-d
    z_loss: object  # float32 0-d
    usage_cv: object  # float32 0-d
    share: object  # float32 [experts]: counts / (tokens * top_k)
    mean_prob: object  # float32 [experts]: mean probability per expert (the aux-loss factor)
    num_experts: int
    scoring: str
    renormalize: bool
    # the blocks of tokens of the routing kernel and, per block and expert, the slots routed by earlier blocks:
    # the starting ranks of moe.permute's stable scatter
    block_tokens: int
    block_base: object  # int32 [blocks, experts]

    @property
    def tokens(self) -> int:
        return int(self.weights.shape[0])

    @property
    def top_k(self) -> int:
        return int(self.weights.shape[1])

    def stats(self) -> dict[str, float]:
        """Load-balance figures as Python floats (synchronises)."""
        share = self.share.get()
        return {
            "aux_loss": float(self.aux_loss.get()),
            "z_loss": float(self.z_loss.get()),
            "usage_cv": float(self.usage_cv.get()),
            "max_share": float(share.max()),
            "min_share": float(share.min()),
            "idle_experts": int((share == 0).sum()),
        }


def validate(logits, top_k, scoring, renormalize):
    """Check route's arguments; returns the CuPy view of ``logits``. Raises before anything is launched."""
    x, _ = dtypes.as_cupy(logits, name="logits")
    if x.ndim != 2:
        raise ValueError(f"logits must be 2-D [tokens, experts], got shape {tuple(x.shape)}")
    if x.dtype not in (dtypes.FP32, dtypes.FP16, dtypes.BF16):
        raise TypeError(f"logits must be float32, float16 or bfloat16 (uint16 bits), got {x.dtype}")
    if not x.flags.c_contiguous:
        raise ValueError(f"logits must be C-contiguous, got strides {x.strides} for shape {tuple(x.shape)}")
    tokens, experts = x.shape
    if tokens < 1:
        raise ValueError("logits has no tokens (shape[0] == 0)")
    if not 1 <= experts <= configs.MAX_EXPERTS:
        raise ValueError(f"logits has {experts} experts (shape[1]); 1..{configs.MAX_EXPERTS} are supported")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)):
        raise TypeError(f"top_k must be an int, got {type(top_k).__name__}")
    if not 1 <= top_k <= min(configs.MAX_TOP_K, experts):
        raise ValueError(f"top_k={top_k}: must be 1..{min(configs.MAX_TOP_K, experts)} "
                         f"(at most {configs.MAX_TOP_K} and at most the {experts} experts)")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    if not isinstance(renormalize, (bool, np.bool_)):
        raise TypeError(f"renormalize must be a bool, got {type(renormalize).__name__}")
    if tokens * top_k >= 2**31:
        raise ValueError(f"tokens * top_k = {tokens * top_k} slots: must stay below 2**31")
    return x


def route(logits, top_k: int, *, scoring: str = "softmax", renormalize: bool = True) -> Routing:
    """Top-k routing of ``logits`` [tokens, experts] with the load-balance statistics (see the module doc)."""
    import cupy

    x = validate(logits, top_k, scoring, renormalize)
    tokens, experts = (int(n) for n in x.shape)
    top_k = int(top_k)
    problem = configs.RouteProblem(tokens=tokens, experts=experts, top_k=top_k, dtype=dtypes.dtype_name(x.dtype))
    cfg = launch.plan(configs.plan_route, problem).config
    finish = launch.plan(configs.plan_finish).config
    nblk = -(-tokens // cfg.block_tokens)

    weights = cupy.empty((tokens, top_k), dtype=cupy.float32)
    ids = cupy.empty((tokens, top_k), dtype=cupy.int32)
    blk_counts = cupy.empty((nblk, experts), dtype=cupy.int32)
    blk_base = cupy.empty((nblk, experts), dtype=cupy.int32)
    blk_prob = cupy.empty((nblk, experts), dtype=cupy.float32)
    blk_z = cupy.empty((nblk,), dtype=cupy.float32)
    ticket = cupy.empty((1,), dtype=cupy.uint32)
    counts = cupy.empty((experts,), dtype=cupy.int32)
    per_expert = cupy.empty((2, experts), dtype=cupy.float32)  # mean_prob, share
    scalars = cupy.empty((3,), dtype=cupy.float32)  # aux_loss, z_loss, usage_cv

    launch.kernel(launch.ROUTE_SOURCE, cfg.name_expression(dtype=x.dtype)).launch(
        (nblk,), (cfg.threads,),
        (x, np.int32(tokens), np.int32(experts), np.int32(top_k), np.int32(cfg.block_tokens),
         np.int32(SCORINGS.index(scoring)), np.int32(bool(renormalize)), weights, ids, blk_counts, blk_prob, blk_z,
         ticket))
    launch.kernel(launch.ROUTE_SOURCE, finish.name_expression()).launch(
        (-(-experts // 32),), (32, 32),
        (blk_counts, blk_prob, blk_z, np.int32(nblk), np.int32(tokens), np.int32(experts), np.int32(top_k),
         blk_base, counts, per_expert[0], per_expert[1], scalars, ticket))
    return Routing(weights=weights, experts=ids, counts=counts, aux_loss=scalars[0], z_loss=scalars[1],
                   usage_cv=scalars[2], share=per_expert[1], mean_prob=per_expert[0], num_experts=experts,
                   scoring=scoring, renormalize=bool(renormalize), block_tokens=cfg.block_tokens, block_base=blk_base)
