"""``permute``, ``gather`` and ``combine``: token slots in expert order and back.

A *slot* is ``token * top_k + k``: the k-th choice of a token. ``permute`` is a stable counting sort of the slots
by expert on the GPU (the histogram comes from ``route``; a scan and a stable scatter follow), with no host round
trip. Row ``r`` of the expert-ordered layout holds slot ``sorted_slots[r]``; expert ``e`` owns rows
``[row_offsets[e], row_offsets[e] + counts[e])`` in increasing slot order. With ``block_m`` each expert's run is
padded to a multiple of ``block_m`` rows (for a grouped GEMM); padding rows hold -1. The padded total is only
known on the GPU, so the layout has the worst-case capacity ``tokens * top_k + experts * (block_m - 1)`` rows
and ``padded_offsets[-1]`` says how many are used; the rest hold -1 too.

``gather`` copies token rows into that order (padding rows are zeros); ``combine`` sums each token's top_k expert
rows, weighted, in fp32, by reading through the inverse map (no atomics: deterministic), into the dtype of the
expert output.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cukernels import dtypes

from . import configs, launch
from .routing import Routing

_ELEMENT_DTYPES = (dtypes.FP32, dtypes.FP16, dtypes.BF16)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Dispatch:
    sorted_slots: object  # int32 [rows]: slot of each row in expert order, -1 for padding
    inverse: object  # int32 [tokens, top_k]: row of each slot
    offsets: object  # int32 [experts + 1]: unpadded expert offsets (exclusive scan of counts)
    padded_offsets: object | None  # int32 [experts + 1] with each count rounded up to block_m; None without
    block_m: int | None
    tokens: int
    top_k: int
    num_experts: int

    @property
    def rows(self) -> int:
        """Rows of the expert-ordered layout (its capacity; with block_m, padded_offsets[-1] of them are used)."""
        return int(self.sorted_slots.shape[0])

    @property
    def row_offsets(self):
        """Where each expert's rows start in the layout: padded_offsets with block_m, else offsets."""
        return self.offsets if self.padded_offsets is None else self.padded_offsets


def capacity(tokens: int, top_k: int, experts: int, block_m: int | None) -> int:
    return tokens * top_k + (experts * (block_m - 1) if block_m else 0)


def permute(routing: Routing, *, block_m: int | None = None) -> Dispatch:
    """Stable counting sort of ``routing``'s token slots by expert (see the module doc)."""
    import cupy

    if not isinstance(routing, Routing):
        raise TypeError(f"routing must be a moe.Routing (from moe.route), got {type(routing).__name__}")
    if block_m is not None:
        if isinstance(block_m, bool) or not isinstance(block_m, (int, np.integer)) or not 1 <= block_m <= 4096:
            raise ValueError(f"block_m must be None or an int in 1..4096, got {block_m!r}")
        block_m = int(block_m)
    tokens, top_k, experts = routing.tokens, routing.top_k, routing.num_experts
    rows = capacity(tokens, top_k, experts, block_m)
    if rows >= 2**31:
        raise ValueError(f"block_m={block_m}: the layout would need {rows} rows, at most 2**31 - 1 are supported")
    cfg = launch.plan(configs.plan_scatter).config
    nblk = int(routing.block_base.shape[0])

    sorted_slots = cupy.empty((rows,), dtype=cupy.int32)
    inverse = cupy.empty((tokens, top_k), dtype=cupy.int32)
    offsets = cupy.empty((experts + 1,), dtype=cupy.int32)
    padded = cupy.empty((experts + 1,), dtype=cupy.int32) if block_m else offsets
    launch.kernel(launch.DISPATCH_SOURCE, cfg.name_expression()).launch(
        (nblk,), (cfg.threads,),
        (routing.experts, np.int32(tokens), np.int32(top_k), np.int32(experts), np.int32(routing.block_tokens),
         routing.counts, routing.block_base, np.int32(block_m or 1), np.int32(rows), sorted_slots, inverse,
         offsets, padded))
    return Dispatch(sorted_slots=sorted_slots, inverse=inverse, offsets=offsets,
                    padded_offsets=padded if block_m else None, block_m=block_m, tokens=tokens, top_k=top_k,
                    num_experts=experts)


def _rows_operand(arr, *, name: str, rows: int, rows_what: str):
    a, was_torch = dtypes.as_cupy(arr, name=name)
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D [{rows_what}, hidden], got shape {tuple(a.shape)}")
    if a.dtype not in _ELEMENT_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16 (uint16 bits), got {a.dtype}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous, got strides {a.strides} for shape {tuple(a.shape)}")
    if a.shape[0] != rows:
        raise ValueError(f"{name} has {a.shape[0]} rows (shape[0]); the dispatch needs {rows} ({rows_what})")
    if a.shape[1] < 1:
        raise ValueError(f"{name} has an empty hidden dimension (shape[1] == 0)")
    return a, was_torch


def _alignment(*arrays) -> int:
    """The largest of 16, 8, 4, 2, 1 bytes dividing every operand's address and row size."""
    bits = 0
    for a in arrays:
        bits |= int(a.data.ptr) | int(a.shape[1] * a.itemsize)
    return next(v for v in (16, 8, 4, 2, 1) if bits % v == 0)


def _check_dispatch(dispatch) -> None:
    if not isinstance(dispatch, Dispatch):
        raise TypeError(f"dispatch must be a moe.Dispatch (from moe.permute), got {type(dispatch).__name__}")


def gather(x, dispatch: Dispatch):
    """``x`` [tokens, hidden] -> [dispatch.rows, hidden] in expert order; padding rows are zeros."""
    import cupy

    _check_dispatch(dispatch)
    a, was_torch = _rows_operand(x, name="x", rows=dispatch.tokens, rows_what="tokens")
    hidden = int(a.shape[1])
    problem = configs.RowsProblem(rows=dispatch.rows, hidden=hidden, top_k=dispatch.top_k,
                                  dtype=dtypes.dtype_name(a.dtype), align=_alignment(a))
    cfg = launch.plan(configs.plan_gather, problem).config
    out = cupy.empty((dispatch.rows, hidden), dtype=a.dtype)
    launch.kernel(launch.DISPATCH_SOURCE, cfg.name_expression()).launch(
        (-(-dispatch.rows // cfg.rows_per_block),), (cfg.threads_x, cfg.rows_per_block),
        (a, dispatch.sorted_slots, np.int32(dispatch.rows), np.int32(dispatch.top_k),
         np.int32(hidden * a.itemsize // cfg.vec_bytes), out))
    return dtypes.like_input(out, was_torch)


def combine(expert_out, dispatch: Dispatch, routing: Routing):
    """out[t] = sum_k routing.weights[t, k] * expert_out[dispatch.inverse[t, k]] in fp32 -> expert_out's dtype."""
    import cupy

    _check_dispatch(dispatch)
    if not isinstance(routing, Routing):
        raise TypeError(f"routing must be a moe.Routing (from moe.route), got {type(routing).__name__}")
    if (routing.tokens, routing.top_k, routing.num_experts) != (dispatch.tokens, dispatch.top_k, dispatch.num_experts):
        raise ValueError(f"routing (tokens {routing.tokens}, top_k {routing.top_k}, experts {routing.num_experts}) "
                         f"does not match dispatch (tokens {dispatch.tokens}, top_k {dispatch.top_k}, "
                         f"experts {dispatch.num_experts})")
    a, was_torch = _rows_operand(expert_out, name="expert_out", rows=dispatch.rows, rows_what="dispatch.rows")
    hidden = int(a.shape[1])
    problem = configs.RowsProblem(rows=dispatch.tokens, hidden=hidden, top_k=dispatch.top_k,
                                  dtype=dtypes.dtype_name(a.dtype), align=_alignment(a))
    cfg = launch.plan(configs.plan_combine, problem).config
    out = cupy.empty((dispatch.tokens, hidden), dtype=a.dtype)
    launch.kernel(launch.DISPATCH_SOURCE, cfg.name_expression(dtype=a.dtype)).launch(
        (-(-dispatch.tokens // cfg.rows_per_block),), (cfg.threads_x, cfg.rows_per_block),
        (a, dispatch.inverse, routing.weights, np.int32(dispatch.tokens), np.int32(dispatch.top_k),
         np.int32(hidden), out))
    return dtypes.like_input(out, was_torch)
