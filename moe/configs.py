"""Launch configs of the MoE kernels and the planner of each.

Every config is a frozen keyword-only dataclass with its shared-memory cost, its thread count and the template
instance it launches. Shared memory is static (sized by the template arguments) and small; the planners still
go through ``cukernels.tiling`` so that ``--plan`` shows the cost against every device's limit and a profile
may override a choice (``[overrides."moe.route"]`` etc.), validated like any other config.
"""
from __future__ import annotations

import dataclasses

from cukernels import dtypes, tiling
from cukernels.device import DeviceSpec

EXPERTS_PER_LANE = (1, 2, 4, 8, 16)  # moe_route's instances: experts in each lane's registers
MAX_EXPERTS = 512  # = WARP * EXPERTS_PER_LANE[-1], and the size of moe_permute_scatter's shared arrays
MAX_TOP_K = 8
WARP = 32
# routing of at most this many tokens is one launch (moe_route<..., FINISH>): the finishing kernel's launch costs
# more than the one block's extra tokens per warp (4 at most). H100, decode layer E64 top-8 (held): T1 0.0935 ->
# 0.0876 ms, T16 0.4317 -> 0.4267; with 64 tokens (8 per warp) one block was slower, 0.4718 -> 0.4798 ms
FINISH_TOKENS = 32


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


# ---------------------------------------------------------------- problems


@dataclasses.dataclass(frozen=True, kw_only=True)
class RouteProblem:
    tokens: int
    experts: int
    top_k: int
    dtype: str  # fp32 | fp16 | bf16 (logits)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RowsProblem:
    """gather (rows of x copied) and combine (tokens written): ``rows`` output rows of ``hidden`` elements."""

    rows: int
    hidden: int
    top_k: int
    dtype: str
    align: int = 16  # bytes: the largest access that divides the row size and the operand addresses


# ---------------------------------------------------------------- configs


@dataclasses.dataclass(frozen=True, kw_only=True)
class RouteConfig:
    """moe_route: one warp per token, ``experts_per_lane`` experts in each lane's registers, ``warps`` warps per
    block, each block owning ``warps * tokens_per_warp`` consecutive tokens (the blocks of the stable scatter)."""

    experts_per_lane: int  # one of EXPERTS_PER_LANE: experts <= 32 * experts_per_lane
    warps: int = 8
    tokens_per_warp: int = 8  # a runtime argument: more tokens per block, fewer per-block partials
    finish: bool = False  # one block that also finishes (counts, shares, losses): no moe_route_finish launch

    def __post_init__(self):
        if self.experts_per_lane not in EXPERTS_PER_LANE:
            raise ValueError(f"experts_per_lane must be one of {EXPERTS_PER_LANE}, got {self.experts_per_lane}")
        if self.warps not in (4, 8) or not 1 <= self.tokens_per_warp <= 64:
            raise ValueError(f"warps must be 4 or 8 and tokens_per_warp 1..64, got {self.warps}, {self.tokens_per_warp}")

    @property
    def threads(self) -> int:
        return self.warps * WARP

    @property
    def block_tokens(self) -> int:
        return self.warps * self.tokens_per_warp

    def smem_bytes(self) -> int:
        # probability sums, counts, z sums (and the finishing block's two reductions)
        return self.warps * WARP * self.experts_per_lane * 8 + self.warps * 4 + (8 * self.warps if self.finish else 0)

    def name_expression(self, *, dtype) -> str:
        finish = ", true" if self.finish else ""
        return f"moe_route<{dtypes.ctype(dtype)}, {self.experts_per_lane}, {self.warps}{finish}>"


@dataclasses.dataclass(frozen=True, kw_only=True)
class FinishConfig:
    """moe_route_finish: 32 experts x 32 groups of blocks per thread block."""

    @property
    def threads(self) -> int:
        return 32 * 32

    def smem_bytes(self) -> int:
        return 2 * 32 * 33 * 4 + 3 * 32 * 4 + 1

    def name_expression(self) -> str:
        return "moe_route_finish"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScatterConfig:
    """moe_permute_scatter: ``warps`` warps per block, one run of the block's slots per warp."""

    warps: int = 8

    def __post_init__(self):
        if self.warps not in (4, 8):
            raise ValueError(f"warps must be 4 or 8, got {self.warps}")

    @property
    def threads(self) -> int:
        return self.warps * WARP

    def smem_bytes(self) -> int:
        return (2 * MAX_EXPERTS + 1 + self.warps * MAX_EXPERTS) * 4

    def name_expression(self) -> str:
        return f"moe_permute_scatter<{self.warps}>"


_VEC_TYPES = {16: "uint4", 4: "unsigned int", 2: "unsigned short"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class GatherConfig:
    """moe_gather: rows copied in ``vec_bytes`` units; ``threads_x`` threads along a row, ``rows_per_block`` rows."""

    vec_bytes: int
    threads_x: int
    rows_per_block: int

    def __post_init__(self):
        if self.vec_bytes not in _VEC_TYPES:
            raise ValueError(f"vec_bytes must be one of {sorted(_VEC_TYPES)}, got {self.vec_bytes}")

    @property
    def threads(self) -> int:
        return self.threads_x * self.rows_per_block

    def smem_bytes(self) -> int:
        return 0

    def name_expression(self) -> str:
        return f"moe_gather<{_VEC_TYPES[self.vec_bytes]}>"


@dataclasses.dataclass(frozen=True, kw_only=True)
class CombineConfig:
    """moe_combine: ``vec`` elements per access, top_k <= ``max_k`` loads held at once, ``threads_x`` threads along
    a token's row, ``rows_per_block`` tokens per block."""

    vec: int
    max_k: int
    threads_x: int
    rows_per_block: int

    def __post_init__(self):
        if self.max_k not in (2, 4, 8):
            raise ValueError(f"max_k must be 2, 4 or 8, got {self.max_k}")

    @property
    def threads(self) -> int:
        return self.threads_x * self.rows_per_block

    def smem_bytes(self) -> int:
        return 0

    def name_expression(self, *, dtype) -> str:
        return f"moe_combine<{dtypes.ctype(dtype)}, {self.vec}, {self.max_k}>"


# ---------------------------------------------------------------- planners


def experts_per_lane(experts: int) -> int:
    """The fewest experts per lane that hold ``experts`` (1..MAX_EXPERTS): the fewest registers."""
    if not 1 <= experts <= MAX_EXPERTS:
        raise ValueError(f"experts = {experts}: moe_route supports 1..{MAX_EXPERTS}")
    return next(e for e in EXPERTS_PER_LANE if experts <= WARP * e)


def plan_route(problem: RouteProblem, spec: DeviceSpec) -> tiling.Plan:
    """About four blocks per SM: enough warps to hide the load latency, few per-block partials to reduce."""
    epl = experts_per_lane(problem.experts)
    tuned = tiling.override(spec, "moe.route", lambda raw: RouteConfig(experts_per_lane=epl, **raw))
    if tuned is not None:
        return tuned
    if problem.tokens <= FINISH_TOKENS:  # decode-sized: one block routes and finishes, one launch
        tpw = _pow2_at_least(-(-problem.tokens // 8))
        return tiling.choose([RouteConfig(experts_per_lane=epl, warps=8, tokens_per_warp=tpw, finish=True)], spec,
                             reason=f"experts {problem.experts} -> {epl} per lane; {problem.tokens} tokens <= "
                             f"{FINISH_TOKENS}: one block that also finishes (no moe_route_finish launch)")
    candidates = []
    for warps in (8, 4):
        per_warp = -(-problem.tokens // (warps * 4 * spec.sm_count))
        tpw = min(16, _pow2_at_least(max(1, per_warp)))
        candidates.append(RouteConfig(experts_per_lane=epl, warps=warps, tokens_per_warp=tpw))
    return tiling.choose(candidates, spec, reason=f"experts {problem.experts} -> {epl} per lane; "
                         f"~4 blocks per SM over {spec.sm_count} SMs")


def plan_finish(spec: DeviceSpec) -> tiling.Plan:
    return tiling.choose([FinishConfig()], spec, reason="fixed: 32 experts x 32 block groups")


def plan_scatter(spec: DeviceSpec) -> tiling.Plan:
    tuned = tiling.override(spec, "moe.permute", lambda raw: ScatterConfig(**raw))
    if tuned is not None:
        return tuned
    return tiling.choose([ScatterConfig(warps=8), ScatterConfig(warps=4)], spec,
                         reason="8 warps share the block's slots (the blocks of moe_route)")


def _row_threads(vecs: int, per_thread: int) -> tuple[int, int]:
    tx = min(256, max(WARP, _pow2_at_least(-(-vecs // per_thread))))
    return tx, 256 // tx


def plan_gather(problem: RowsProblem, spec: DeviceSpec) -> tiling.Plan:
    es = dtypes.from_name(problem.dtype).itemsize
    row_bytes = problem.hidden * es
    vec = next(v for v in (16, 4, 2) if row_bytes % v == 0 and problem.align % v == 0)
    tx, ty = _row_threads(row_bytes // vec, 4)
    return tiling.choose([GatherConfig(vec_bytes=vec, threads_x=tx, rows_per_block=ty)], spec,
                         reason=f"row of {row_bytes} B in {vec}-byte accesses, 4 per thread")


def plan_combine(problem: RowsProblem, spec: DeviceSpec) -> tiling.Plan:
    es = dtypes.from_name(problem.dtype).itemsize
    full = 16 // es
    vec = full if problem.hidden % full == 0 and problem.align % 16 == 0 else 1
    max_k = next(k for k in (2, 4, 8) if problem.top_k <= k)
    tuned = tiling.override(spec, "moe.combine", lambda raw: CombineConfig(vec=vec, max_k=max_k, **raw))
    if tuned is not None:
        return tuned
    unroll = 2 if max_k == 2 else 1
    tx, ty = _row_threads(problem.hidden // vec, 2 * unroll)
    return tiling.choose([CombineConfig(vec=vec, max_k=max_k, threads_x=tx, rows_per_block=ty)], spec,
                         reason=f"{vec * es}-byte accesses, top_k {problem.top_k} -> loads of {max_k} rows in flight")
