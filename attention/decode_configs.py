"""Tile configs of attention over a KV cache (kernels/flash_decode.cu) and the planner: the CTA shape and the
number of key splits.

A ``DecodeConfig`` is one instance of ``flash_decode``: ``warps`` warps, each taking 16 keys of every stage of a
``stages``-deep cp.async ring (a stage holds ``16 * warps`` keys of K and of V), one 16-row tile of packed query
rows. Shared memory: the Q tile plus the ring, 2-byte elements; the warps' merge reuses the ring.

``plan_splits`` cuts each sequence's keys into splits so that the grid (splits x kv heads x row tiles x batch)
fills the GPU in whole waves, never below one stage of keys per split.
"""
from __future__ import annotations

import dataclasses

from cukernels import dtypes, tiling
from cukernels.device import DeviceSpec

from .configs import HEAD_DIMS, MIN_COMPUTE_CAPABILITY

OP = "attention.decode"
ROWS_PER_TILE = 16  # one mma.sync row tile of packed (query position, head-in-group) rows
MAX_SPLITS = 128
MIN_STAGES_PER_SPLIT = 4  # fewer keys per split and the pipeline's fill and the combine outweigh the parallelism


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeProblem:
    batch: int
    seq_q: int
    heads: int
    kv_heads: int
    head_dim: int
    max_keys: int  # capacity of one sequence's cache (max_seq, or max_pages * page)
    dtype: str
    paged: bool

    @property
    def row_tiles(self) -> int:
        return -(-self.seq_q * (self.heads // self.kv_heads) // ROWS_PER_TILE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeConfig:
    head_dim: int
    warps: int = 4
    stages: int = 3

    source = "flash_decode.cu"

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim}")
        if self.warps not in (2, 4, 8) or not 2 <= self.stages <= 4:
            raise ValueError(f"warps must be 2, 4 or 8 and stages 2..4, got {self.warps}, {self.stages}")

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def keys_per_stage(self) -> int:
        return 16 * self.warps

    def smem_bytes(self) -> int:
        return 2 * self.head_dim * (ROWS_PER_TILE + 2 * self.stages * self.keys_per_stage)

    def name_expression(self, *, dtype, paged: bool) -> str:
        return (f"flash_decode<{dtypes.ctype(dtype)},{self.head_dim},{self.warps},{self.stages},"
                f"{'true' if paged else 'false'}>")

    def __str__(self) -> str:
        return f"DecodeConfig(d{self.head_dim} w{self.warps} s{self.stages})"


def search_space(head_dim: int, paged: bool = False) -> list[DecodeConfig]:
    """Preference order: about 16 KB of K and V per stage (8 warps at head dim 64, 4 above: rows of 128 bytes need
    more of them in flight), a deep ring, then shallower, then fewer warps (small shared memory). A paged cache
    takes the ring that lets two CTAs share an SM first (see ``plan_splits``)."""
    first = ([(8, 3), (8, 4)] if paged else [(8, 4), (8, 3)]) if head_dim == 64 else []
    return [DecodeConfig(head_dim=head_dim, warps=w, stages=s) for w, s in first + [(4, 3), (4, 2), (2, 3), (2, 2)]]


def plan_decode(problem: DecodeProblem, spec: DeviceSpec) -> tiling.Plan:
    if spec.compute_capability < MIN_COMPUTE_CAPABILITY:
        raise tiling.PlanError(f"attention over a KV cache needs mma.sync bf16 and cp.async (sm_80+); "
                               f"{spec.name} is sm_{spec.compute_capability[0]}{spec.compute_capability[1]}")
    tuned = tiling.override(spec, OP, lambda raw: DecodeConfig(head_dim=problem.head_dim, **raw))
    if tuned is not None:
        return tuned
    return tiling.choose(search_space(problem.head_dim, problem.paged), spec,
                         reason="16 keys per warp and stage; the deepest ring that fits")


def plan_splits(problem: DecodeProblem, config: DecodeConfig, spec: DeviceSpec) -> int:
    """Splits per sequence: the fewest whose grid reaches 95 % of the best wave efficiency over 1..MAX_SPLITS
    (FlashAttention's heuristic) counting one CTA per SM, each split keeping at least MIN_STAGES_PER_SPLIT stages
    of keys. Measured on an H100 (one sequence, 32/8 heads, d128): 12-16 splits of an 8k-32k cache beat 26-32 by
    5-8 %."""
    # one CTA per SM for a contiguous cache: its ring keeps enough loads in flight (two per SM measured slower);
    # a paged cache's page lookups stall each CTA's copies, which a second CTA per SM hides (measured: 0.72-0.89x
    # of the contiguous time with one, 0.96-1.0x with two)
    per_sm = min(2, spec.smem_per_sm // max(config.smem_bytes(), 1)) if problem.paged else 1
    slots = spec.sm_count * max(per_sm, 1)
    base = problem.batch * problem.kv_heads * problem.row_tiles
    max_useful = max(1, min(MAX_SPLITS, problem.max_keys // (MIN_STAGES_PER_SPLIT * config.keys_per_stage)))
    if base >= slots:
        return 1

    def efficiency(s: int) -> float:
        waves = base * s / slots
        return waves / -(-waves // 1)

    best = max(efficiency(s) for s in range(1, max_useful + 1))
    return next(s for s in range(1, max_useful + 1) if efficiency(s) >= 0.95 * best)
