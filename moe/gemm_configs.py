"""Tile configs of the grouped expert GEMM and their planner.

``GemmConfig`` is one instance of ``moe_grouped_gemm`` (moe/kernels/grouped_gemm.cu): CTA tile BM x BN x BK,
WARPS_M x WARPS_N warps, STAGES cp.async stages, MIN_BLOCKS CTAs per SM promised to the compiler (its register
cap). Shared memory is the pipeline's ``STAGES * (BM + BN) * BK * 2`` bytes (the epilogue's staging tile reuses
it), all dynamic, checked against the device's opt-in limit by ``cukernels.tiling.choose``.

The kernel needs mma.sync.m16n8k16 with bf16 and cp.async: sm_80 or newer. On older GPUs (T4, sm_75) the
planner raises ``PlanError``; it never hands back a config that would fail or fall back silently.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools

from pathlib import Path

from cukernels import dtypes, tiling, tune
from cukernels.device import DeviceSpec

EPILOGUES = {None: 0, "swiglu": 1, "gelu": 2, "rope64": 3, "rope128": 4, "rope256": 5}
NAMED_EPILOGUES = (None, "swiglu", "gelu")  # the epilogues a caller names (the rotary ones come with rotary=)
# rotary embedding on the leading output columns (``grouped_gemm(rotary=...)``), by head dim: tma tiles only
ROPE = {64: "rope64", 128: "rope128", 256: "rope256"}
# stages of (block_m + block_n) x 64 that fit beside the staging buffers, by (block_m, block_n); with clusters
# along K, whose fp32 sums take more room than the staging
TMA_MAX_STAGES = {(128, 256): 4, (128, 128): 6, (64, 128): 8, (64, 64): 8}
TMA_MAX_STAGES_CK = {(128, 128): 5, (64, 128): 8, (64, 64): 8}
TMA_MAX_SPLIT = 8
TMA_MAX_CLUSTER_K = 4
KINDS = ("mma", "wgmma", "tma", "skinny")
MIN_CC = (8, 0)
OP = "moe.grouped_gemm"


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmProblem:
    rows: int  # total rows of a (all groups)
    n: int  # columns of b[e] (before the SwiGLU halving)
    k: int
    experts: int
    dtype: str  # fp16 | bf16
    epilogue: str | None = None
    out_dtype: str | None = None  # None: the input dtype; "fp32" (plain GEMM only, e.g. router logits)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    warps_m: int
    warps_n: int
    stages: int
    min_blocks: int = 1
    # "mma": mma.sync + ldmatrix (sm_80+); "wgmma": Hopper warpgroup MMA from shared memory (sm_90a), which
    # fixes the tile at block_m x 256 x 64 with one warpgroup per 64 rows (warps_m = block_m / 16, warps_n = 1);
    # "tma": the persistent warp-specialised Hopper kernel (sm_90a, TMA loads through tensor maps, so it also
    # needs cuda-bindings at run time): 128 x (256 or 128) x 64 tiles computed by two consumer warpgroups
    # (warps_m = 8) fed by a producer warpgroup (384 threads in all); split_k > 1 cuts each tile's K range into
    # that many work items whose fp32 sums moe_splitk_reduce adds (weight-bound problems with few tiles)
    kind: str = "mma"
    # "skinny": decode-sized groups (moe_grouped_gemm_skinny, sm_80+): b's rows as mma's M, read straight from
    # global memory; block_m group rows per pass (8 or 16), block_n weight rows per CTA over warps_n x split_k
    # warps (block_n / warps_n = 16 or 32 rows per warp), block_k 32 (one chunk), ``stages`` (4) chunks of
    # loads issued before their MMAs, warps_m 1: the tiles of ``SKINNY``, the ones the tests build
    kind: str = "mma"
    # tma only: CTAs per cluster along M (2: the pair shares B through TMA multicast)
    cluster_m: int = 1
    # tma only, 128 x 128 tiles: CTAs per cluster splitting each tile's K range (2-4), their fp32 sums added
    # through distributed shared memory (no partial sums in global memory, no reduce launch)
    cluster_k: int = 1
    # skinny: warps of a CTA splitting K (their partial sums meet in shared memory, in a fixed order); tma: work
    # items per tile along K (fp32 partial sums in a workspace, added in split order by moe_splitk_reduce)
    split_k: int = 1

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.split_k != 1 and self.kind not in ("skinny", "tma"):
            raise ValueError(f"split_k is for skinny and tma tiles, got {self.split_k} on a {self.kind} tile")
        if self.kind == "skinny":
            if not (self.block_m in (8, 16) and self.block_k == 32 and self.warps_m == 1
                    and self.split_k in (1, 2, 4, 8) and self.warps_n * self.split_k == 8
                    and self.block_n in (16 * self.warps_n, 32 * self.warps_n) and self.stages == 4
                    and self.min_blocks == 1 and self.cluster_m == 1):
                raise ValueError(f"a skinny tile is 8 or 16 rows x (16 or 32 per warps_n) x 32 with 8 warps "
                                 f"(warps_n x split_k), 4 chunks in flight, got {self}")
            return
        if self.kind == "wgmma" and not (self.block_m in (64, 128) and self.block_n == 256 and self.block_k == 64
                                         and self.warps_m == self.block_m // 16 and self.warps_n == 1):
            raise ValueError(f"a wgmma tile is (64 or 128) x 256 x 64 with block_m / 16 x 1 warps, got {self}")
        if self.cluster_m != 1 and self.kind != "tma":
            raise ValueError(f"cluster_m is for tma tiles, got {self.cluster_m} on a {self.kind} tile")
        if self.cluster_k != 1 and self.kind != "tma":
            raise ValueError(f"cluster_k is for tma tiles, got {self.cluster_k} on a {self.kind} tile")
        if self.kind == "tma":
            if self.cluster_m not in (1, 2):
                raise ValueError(f"cluster_m must be 1 or 2, got {self.cluster_m}")
            most = TMA_MAX_STAGES.get((self.block_m, self.block_n), 0)
            if not (self.block_k == 64 and self.warps_m == self.block_m // 16 and self.warps_n == 1
                    and self.min_blocks == 1 and 2 <= self.stages <= most):
                raise ValueError(f"a tma tile is 128 x 256 x 64 (2-4 stages), 128 x 128 x 64 (2-6 stages) or "
                                 f"64 x (64 or 128) x 64 (2-8 stages) with block_m / 16 x 1 consumer warps, got {self}")
            if self.cluster_m != 1 and (self.block_n != 256 or self.split_k != 1):
                raise ValueError(f"clusters of two run 128 x 256 tiles without split K, got {self}")
            if not 1 <= self.split_k <= TMA_MAX_SPLIT:
                raise ValueError(f"a tma tile's split_k must be 1..{TMA_MAX_SPLIT}, got {self.split_k}")
            if self.cluster_k != 1:
                if not 2 <= self.cluster_k <= TMA_MAX_CLUSTER_K:
                    raise ValueError(f"cluster_k must be 1..{TMA_MAX_CLUSTER_K}, got {self.cluster_k}")
                most = TMA_MAX_STAGES_CK.get((self.block_m, self.block_n), 0)
                if self.split_k != 1 or self.cluster_m != 1 or self.stages > most:
                    raise ValueError(f"clusters along K run 128 x 128 tiles of at most 5 stages (their sums take "
                                     f"the sixth's shared memory) or 64-row tiles of at most 8, without split_k "
                                     f"or cluster_m, got {self}")
            return
        if self.block_k not in (32, 64):
            raise ValueError(f"block_k must be 32 or 64, got {self.block_k}")
        wm, wn = self.block_m // self.warps_m, self.block_n // self.warps_n
        if self.block_m % self.warps_m or self.block_n % self.warps_n or wm % 16 or wn % 16:
            raise ValueError(f"warp tile {self.block_m}/{self.warps_m} x {self.block_n}/{self.warps_n} must be "
                             f"multiples of 16")
        rows_per_pass = self.threads // (self.block_k // 8)
        if self.block_m % rows_per_pass or self.block_n % rows_per_pass:
            raise ValueError(f"block_m and block_n must be multiples of {rows_per_pass} rows (one load pass)")
        if not 2 <= self.stages <= 6:
            raise ValueError(f"stages must be 2..6, got {self.stages}")
        if self.min_blocks not in (1, 2):
            raise ValueError(f"min_blocks must be 1 or 2, got {self.min_blocks}")

    @property
    def needs_arch(self) -> str | None:
        """wgmma and tma tiles fit sm_90a alone (checked by tiling.fits)."""
        return "sm_90a" if self.kind in ("wgmma", "tma") else None

    @property
    def threads(self) -> int:
        """Threads per CTA: the compute warps, plus the producer warpgroup of a tma tile."""
        if self.kind == "skinny":
            return self.warps_n * self.split_k * 32
        return self.warps_m * self.warps_n * 32 + (128 if self.kind == "tma" else 0)

    @property
    def cluster_size(self) -> int:
        """CTAs per cluster (1: no cluster)."""
        return self.cluster_m * self.cluster_k

    @property
    def persistent(self) -> bool:
        """A tma CTA loops over tiles (grid = at most one CTA per SM); the others compute one tile each."""
        return self.kind == "tma"

    def epilogues(self) -> tuple:
        """Epilogues this tile is built with. The wgmma tile's 128 accumulators per thread leave no registers for
        erf's polynomial unrolled over 32 column groups (GELU spilled), so GELU stays on the mma.sync tiles. The
        rotary epilogues run on tma tiles without splits or clusters whose columns hold whole heads."""
        if self.kind == "tma":
            whole = self.split_k == 1 and self.cluster_k == 1 and self.cluster_m == 1
            return (None, "swiglu") + tuple(e for hd, e in ROPE.items() if whole and self.block_n % hd == 0)
        return (None, "swiglu") if self.kind == "wgmma" else NAMED_EPILOGUES

    def smem_bytes(self) -> int:
        """The pipeline buffers (the epilogue's staging tile reuses them) and 16 bytes for the work item; wgmma
        tiles also reserve 1 KiB to align the stages to the 1024-byte swizzle atom. A tma tile keeps its own
        staging buffers (16 KiB per consumer warpgroup, so the next tile's loads overlap the epilogue) and two
        8-byte mbarriers per stage instead of the work item. A skinny tile holds only its warps' partial sums,
        ``[split_k][block_m][block_n + 4]`` fp32, and the list of non-empty groups."""
        if self.kind == "skinny":  # + the list of non-empty groups (MAX_EXPERTS ints) and its count, 16-aligned
            return self.split_k * self.block_m * (self.block_n + 4) * 4 + 4 * (512 + 4)
        pipeline = self.stages * (self.block_m + self.block_n) * self.block_k * 2
        if self.kind == "tma":  # staging (or with cluster_k the fp32 sums) per consumer warpgroup, barriers
            groups = self.block_m // 64
            if self.cluster_k > 1:
                return pipeline + groups * 64 * 128 * 4 + 16 * self.stages + 32 + 1024
            return pipeline + groups * 64 * 128 * 2 + 16 * self.stages + 1024
        return pipeline + 16 + (1024 if self.kind == "wgmma" else 0)

    @property
    def gathers(self) -> bool:
        """The tile can fetch A's rows through an index itself (the layer's token gather fused into its loads):
        skinny tiles, and the unsplit 128 x 256 tma tile alone or in pairs (``moe_grouped_gemm_tma_gather``)."""
        if self.kind == "skinny":
            return True
        return (self.kind == "tma" and (self.block_m, self.block_n) == (128, 256) and self.split_k == 1
                and self.cluster_k == 1)

    @property
    def scatters(self) -> bool:
        """The tile can add its output rows into rows given by an index (the layer's combine fused into its
        down-projection, ``moe_grouped_gemm_tma_pair_scatter``): the 128 x 256 tma tile in pairs. (The single tile
        runs the same code, but its layer at 128 rows per expert lost 1.5-1.9 % to the reductions: not built.)"""
        return self.gathers and self.cluster_m == 2

    def name_expression(self, *, dtype, epilogue: str | None = None, out_dtype=None, gather: bool = False,
                        scatter: bool = False) -> str:
        if epilogue not in EPILOGUES:
            raise ValueError(f"epilogue must be one of {list(EPILOGUES)}, got {epilogue!r}")
        out_c = dtypes.ctype(dtype if out_dtype is None else out_dtype)
        if epilogue not in self.epilogues():
            raise ValueError(f"{self} has no {epilogue} epilogue (it has {list(self.epilogues())})")
        if self.kind == "tma":
            if out_c != dtypes.ctype(dtype):
                raise ValueError(f"a tma tile writes its input dtype, got out_dtype {out_dtype}")
            if gather:
                if not self.gathers or epilogue not in (None, "swiglu"):
                    raise ValueError(f"{self} has no fused gather with epilogue {epilogue!r}")
                kernel = "moe_grouped_gemm_tma_pair_gather" if self.cluster_m == 2 else "moe_grouped_gemm_tma_gather"
                return f"{kernel}<{dtypes.ctype(dtype)}, {self.stages}, {EPILOGUES[epilogue]}>"
            if scatter:  # the layer's down-projection adding its rows into the tokens' (the combine fused)
                if not self.scatters or epilogue is not None:
                    raise ValueError(f"{self} has no fused combine with epilogue {epilogue!r}")
                return f"moe_grouped_gemm_tma_pair_scatter<{dtypes.ctype(dtype)}, {self.stages}, {EPILOGUES[epilogue]}>"
            if self.cluster_m == 2:
                return f"moe_grouped_gemm_tma_pair<{dtypes.ctype(dtype)}, {self.stages}, {EPILOGUES[epilogue]}>"
            head = f"{dtypes.ctype(dtype)}, {self.stages}, {EPILOGUES[epilogue]}"
            if self.cluster_k > 1:
                tile = "" if (self.block_m, self.block_n) == (128, 128) else f", {self.block_n}, {self.block_m}"
                return f"moe_grouped_gemm_tma_ksplit<{head}, {self.cluster_k}{tile}>"
            tile = "" if self.block_m == 128 else f", {self.block_m}"
            return f"moe_grouped_gemm_tma<{head}, {self.block_n}{tile}>"
        if self.kind == "skinny":
            return (f"moe_grouped_gemm_skinny<{dtypes.ctype(dtype)}, {out_c}, {self.block_m}, "
                    f"{self.block_n // (16 * self.warps_n)}, {self.warps_n}, {self.split_k}, {self.stages}, "
                    f"{EPILOGUES[epilogue]}>")
        if self.kind == "wgmma":
            return (f"moe_grouped_gemm_wgmma<{dtypes.ctype(dtype)}, {out_c}, {self.block_m}, {self.stages}, "
                    f"{EPILOGUES[epilogue]}>")
        return (f"moe_grouped_gemm<{dtypes.ctype(dtype)}, {out_c}, {self.block_m}, {self.block_n}, {self.block_k}, "
                f"{self.warps_m}, {self.warps_n}, {self.stages}, {EPILOGUES[epilogue]}, {self.min_blocks}>")

    def work_items(self, problem: GemmProblem, *, exact_one_group: bool = False) -> int:
        """Work items of a tile kind (m-tiles, or pairs in a cluster along M, x n-tiles x K splits): an upper bound
        whatever the group sizes (each group adds at most one partial m-tile), which ``grid`` launches; with
        ``exact_one_group`` the exact count where there is one group (it holds at most ``rows`` rows)."""
        rows_per_item = self.block_m * self.cluster_m
        if exact_one_group and problem.experts == 1:
            m_items = -(-problem.rows // rows_per_item)
        else:
            m_items = problem.rows // rows_per_item + min(problem.experts, problem.rows)
        return max(1, m_items * -(-problem.n // self.block_n) * (self.split_k if self.kind == "tma" else 1))

    def one_wave(self, problem: GemmProblem, grid: int) -> bool:
        """Whether every work item of a tma plan has its own CTA (cluster) in ``grid`` (the CTAs launched). Such
        GEMMs (the 128-token projections of a decode or prefill step) are launched as programmatic dependents
        (cukernels/kernels/pdl.cuh), so their launch and setup overlap the kernel before them. A persistent GEMM
        that loops over items is not: launched that way the large model's b8 / b4 rows ran 12 % / 2 % slower on
        the H100 (cause not found; the kernel's own trigger moved to each CTA's last item changed nothing), and its
        launch is a small share of its time anyway. One group: the exact item count; several: the bound."""
        return self.kind == "tma" and self.work_items(problem, exact_one_group=True) <= grid // self.cluster_size

    def grid(self, problem: GemmProblem, sm_count: int | None = None, clusters: int | None = None) -> int:
        """CTAs to launch: an upper bound of the tiles, whatever the group sizes (each group adds at most one
        partial m-tile); the CTAs past the real count exit at once. A persistent tile launches at most
        ``sm_count`` CTAs (required), which stride over the tiles; a clustered one at most ``clusters`` clusters
        (the device's count of co-resident clusters; default: sm_count / cluster_m)."""
        if self.kind == "skinny":  # the items (n-blocks x group slots), an upper bound: the caller caps it at
            return -(-problem.n // self.block_n) * max(1, min(problem.experts, problem.rows))  # what fits at once
        items = self.work_items(problem)
        if self.persistent:
            if sm_count is None:
                raise ValueError(f"{self}: a persistent tile's grid needs the SM count")
            size = self.cluster_size
            most = int(sm_count) // size if clusters is None else int(clusters)
            return min(items, most) * size
        return items

    def __str__(self) -> str:
        if self.kind == "skinny":
            return (f"GemmConfig(skinny {self.block_m}x{self.block_n}x{self.block_k}, warps {self.warps_n}n x "
                    f"{self.split_k}k, {self.stages} chunks in flight)")
        if self.kind in ("wgmma", "tma"):
            pair = ", clusters of 2 (B multicast)" if self.cluster_m == 2 else ""
            split = f", split K {self.split_k}" if self.split_k > 1 else ""
            split += f", clusters of {self.cluster_k} along K" if self.cluster_k > 1 else ""
            return (f"GemmConfig({self.kind} {self.block_m}x{self.block_n}x{self.block_k}, {self.stages} stages"
                    f"{pair}{split})")
        return (f"GemmConfig({self.block_m}x{self.block_n}x{self.block_k}, {self.warps_m}x{self.warps_n} warps, "
                f"{self.stages} stages, {self.min_blocks}/SM)")


# Preference order: the largest tile that fits first (more reuse per byte of shared memory), then deeper
# pipelines before shallower ones. 128 x 256 x 64 with 8 warps (64 x 64 per warp) is the CUTLASS-style
# sm_80 shape; 128 x 128 (registers capped at 128 so that two CTAs share an SM where shared memory allows)
# where the large tile does not fit or would leave SMs idle.
LARGE = (
    GemmConfig(block_m=128, block_n=256, block_k=64, warps_m=2, warps_n=4, stages=4),
    GemmConfig(block_m=128, block_n=256, block_k=64, warps_m=2, warps_n=4, stages=3),
)
MEDIUM = (
    GemmConfig(block_m=128, block_n=128, block_k=64, warps_m=2, warps_n=4, stages=3, min_blocks=2),
    GemmConfig(block_m=128, block_n=128, block_k=32, warps_m=2, warps_n=4, stages=4, min_blocks=2),
    GemmConfig(block_m=128, block_n=128, block_k=32, warps_m=2, warps_n=4, stages=3, min_blocks=2),
)
SMALL = (
    GemmConfig(block_m=64, block_n=128, block_k=32, warps_m=2, warps_n=2, stages=3),
)
# Hopper (sm_90a only): wgmma from shared memory; 4 stages of 48 KiB
WGMMA = (
    GemmConfig(kind="wgmma", block_m=128, block_n=256, block_k=64, warps_m=8, warps_n=1, stages=4),
    GemmConfig(kind="wgmma", block_m=128, block_n=256, block_k=64, warps_m=8, warps_n=1, stages=3),
)
# Hopper, warp-specialised and persistent (sm_90a and cuda-bindings): 4 stages of 48 KiB + 32 KiB of staging
TMA = (
    GemmConfig(kind="tma", block_m=128, block_n=256, block_k=64, warps_m=8, warps_n=1, stages=4),
    GemmConfig(kind="tma", block_m=128, block_n=256, block_k=64, warps_m=8, warps_n=1, stages=3),
)
# 128 x 128 tma tiles (6 stages of 32 KiB): twice the work items of 128 x 256 where those leave SMs idle
TMA_128 = (
    GemmConfig(kind="tma", block_m=128, block_n=128, block_k=64, warps_m=8, warps_n=1, stages=6),
    GemmConfig(kind="tma", block_m=128, block_n=128, block_k=64, warps_m=8, warps_n=1, stages=4),
)
# the 128 x 128 tile split along K across a cluster (cluster_k set by the planner): the fp32 sums take the
# shared memory of the sixth stage
TMA_128_KSPLIT = GemmConfig(kind="tma", block_m=128, block_n=128, block_k=64, warps_m=8, warps_n=1, stages=5)
# 64-row tma tiles (one consumer warpgroup, 256 threads, 8 stages of 16 / 24 KiB): twice and four times the work
# items of 128 x 128 on a 128-token GEMM, so the weights stream through more SMs; alone or split along K across a
# cluster (cluster_k set)
TMA_64 = (
    GemmConfig(kind="tma", block_m=64, block_n=128, block_k=64, warps_m=4, warps_n=1, stages=8),
    GemmConfig(kind="tma", block_m=64, block_n=64, block_k=64, warps_m=4, warps_n=1, stages=8),
)
# Clusters of two CTAs sharing B by TMA multicast. Until v7.2 each stage's remote release carried a cluster-scope
# fence (MEMBAR.ALL.GPU) and the pair ran 0.72-0.98x TMA[0]; since, 1.01-1.03x where the groups are long
# (docs/perf/grouped_gemm.md v7.2), which tma_ranked takes (as_pair)
TMA_PAIR = (
    GemmConfig(kind="tma", block_m=128, block_n=256, block_k=64, warps_m=8, warps_n=1, stages=4, cluster_m=2),
)
ALL = TMA + TMA_128 + TMA_64 + TMA_PAIR + WGMMA + LARGE + MEDIUM + SMALL
# the preference lists for problems of >= 2 waves of 128 x 256 tiles: with the tma tile (variants() and tuning; on
# sm_90a the planner ranks the tma tiles itself, tma_ranked), without it where the tma tile cannot run
LARGE_NO_TMA = WGMMA + LARGE + MEDIUM + SMALL
LARGE_ORDER = TMA + LARGE_NO_TMA


def _config_from(raw: dict) -> GemmConfig:
    return GemmConfig(**raw)


def _for_device(candidates, spec: DeviceSpec) -> list[GemmConfig]:
    """Keep the two-CTAs-per-SM register cap only where two CTAs' shared memory (plus the 1 KiB the driver
    reserves per CTA) fit in one SM; elsewhere the cap would only cost registers. (wgmma tiles are dropped off
    sm_90a by tiling.fits.)"""
    out = []
    for c in candidates:
        if c.min_blocks == 2 and 2 * (c.smem_bytes() + 1024) > spec.smem_per_sm:
            c = dataclasses.replace(c, min_blocks=1)
        out.append(c)
    return out


def check_arch(spec: DeviceSpec) -> None:
    if tuple(spec.compute_capability) < MIN_CC:
        cc = ".".join(map(str, spec.compute_capability))
        raise tiling.PlanError(
            f"moe.grouped_gemm needs compute capability 8.0+ (mma.sync.m16n8k16 with bf16 and cp.async); "
            f"{spec.name} is {cc} ({spec.arch})")


def plan(problem: GemmProblem, spec: DeviceSpec) -> tiling.Plan:
    """The tile for ``problem`` on ``spec``: a tuned or profile config when there is one; skinny tiles for
    decode-sized groups; on sm_90a (cuda-bindings, plain or SwiGLU, 16-bit output) the tma tile and split K of
    least estimated time (``tma_ranked``); elsewhere 128 x 256 when it leaves at least two waves of CTAs, else
    128 x 128, each with the deepest pipeline that fits ``spec.smem_per_block_optin``."""
    check_arch(spec)
    tuned = tune.lookup(OP, problem, spec, files=tune_files(), types=(GemmConfig,))  # --tune on this GPU
    if tuned is None:
        tuned = tiling.override(spec, OP, _config_from)
    if tuned is not None:
        return tuned
    rope = problem.epilogue in ROPE.values()
    no_tma = f"{spec.name} is {spec.arch}" if spec.arch != "sm_90a" else _tma_unusable(problem)
    if rope and no_tma is not None:
        raise tiling.PlanError(f"the rotary epilogue ({problem.epilogue}) runs on the sm_90a tma tiles only: "
                               f"{no_tma}")
    skinny = None if rope else plan_skinny(problem, spec)
    if skinny is not None:
        return skinny
    if no_tma is None and (problem.epilogue in (None, "swiglu") or rope):
        ranked = tma_ranked(problem, spec)
        why = (f"tma tile of least estimated time ({ranked[0][1]:.1f} us: waves of work items, the weights' bytes, "
               f"split-K's partial sums)")
        if ranked[0][0].cluster_m == 2:
            why += f"; in clusters of 2 sharing B (one group, or groups of >= {PAIR_MIN_GROUP_ROWS} rows on average)"
        if rope:  # the ranking always holds unsplit 128 x 256 and 128 x 128 tiles, which hold whole heads
            why += f"; whole {problem.epilogue[4:]}-column heads per tile, no split"
        return tiling.choose([c for c, _ in ranked if problem.epilogue in c.epilogues()]
                             + [c for c in LARGE_NO_TMA if problem.epilogue in c.epilogues()], spec, reason=why)
    n = problem.n
    est_m_tiles = max(1, problem.rows // 128) + min(problem.experts, max(problem.rows, 1)) // 2
    large_ctas = est_m_tiles * -(-n // 256)
    if large_ctas >= 2 * spec.sm_count and n >= 256:
        why = f"~{large_ctas} CTAs of 128x256 >= 2 waves on {spec.sm_count} SMs"
        no_tma = _tma_unusable(problem)
        candidates, why = (LARGE_NO_TMA, f"{why}; no tma tile: {no_tma}") if no_tma else (LARGE_ORDER, why)
    else:
        candidates, why = MEDIUM + SMALL, f"~{large_ctas} CTAs of 128x256 < 2 waves on {spec.sm_count} SMs"
    candidates = [c for c in _for_device(candidates, spec) if problem.epilogue in c.epilogues()]
    return tiling.choose(candidates, spec, reason=why)



# Decode-sized groups: at most this many rows per non-empty group on average (rows / min(experts, rows)) take the
# skinny tiles, which read each weight once per block_m rows and load a's fragments per warp; above it the
# 128-row tiles win (H100, 2026-11-23, tools sweep of the decode suite's GEMMs: 8 rows per group, skinny 288 us
# vs 306 for 128x128x64; 16 rows, skinny (32-row passes) 2.22 ms vs 2.09).
SKINNY_MAX_ROWS = 8
SKINNY_MIN_CHUNKS = 4  # k-chunks of 32 per warp: a K split stops before a warp's share falls below 128
# A skinny item's weight bytes (block_n rows x K x 2) at most this (0: no bound): a CTA streams an item in ~100+ us
# at these sizes (two CTAs per SM), so items of 2-5.5 MB leave a tail of a few unlucky CTAs' last items (H100,
# docs/perf/grouped_gemm.md v4.7: seed 004 decode T4 -6.7 %, T16 -1.5 %, T64 -1.1 %; other rows' plans unchanged)
SKINNY_MAX_ITEM_BYTES = 3 << 19  # 1.5 MiB
# Items per SM a skinny tile without a K split is chosen to reach first (0: off): two CTAs share an SM, so 8 is ~4
# items per CTA, which balances the persistent grid's tail without the partial sums a K split adds (H100,
# docs/perf/grouped_gemm.md v4.8); tiles that cannot reach it fall back to the rule below (4 CTAs per SM, splits)
SKINNY_UNSPLIT_ITEMS_PER_SM = 8
SKINNY = tuple(GemmConfig(kind="skinny", block_m=bm, block_n=per_warp * (8 // ks), block_k=32, warps_m=1,
                          warps_n=8 // ks, stages=4, split_k=ks)
               for bm in (8, 16) for ks in (1, 2, 4, 8) for per_warp in (32, 16))


def skinny_config(problem: GemmProblem, spec: DeviceSpec) -> tuple[GemmConfig, str]:
    """The skinny tile for ``problem``: block_m about twice the average group (8 or 16 rows, so most groups take one
    pass), then among the tiles whose items stream at most ``SKINNY_MAX_ITEM_BYTES``: the widest without a K split
    that gives ``SKINNY_UNSPLIT_ITEMS_PER_SM`` items per SM over the groups that can be non-empty; else the widest
    CTA (32 weight rows per warp, no K split first) that gives ~4 CTAs per SM; failing that, the split giving the
    most CTAs."""
    groups = max(1, min(problem.experts, problem.rows))
    avg = problem.rows / groups
    block_m = 8 if avg <= 4 else 16
    chunks = -(-problem.k // 32)
    target = 4 * spec.sm_count
    tiles = []  # widest first: 32 then 16 rows per warp at each split
    for split_k in (1, 2, 4, 8):
        if split_k > 1 and chunks // split_k < SKINNY_MIN_CHUNKS:
            break
        tiles += [next(c for c in SKINNY if (c.block_m, c.split_k, c.block_n // c.warps_n) ==
                       (block_m, split_k, per_warp)) for per_warp in (32, 16)]
    small = [c for c in tiles if not SKINNY_MAX_ITEM_BYTES or c.block_n * problem.k * 2 <= SKINNY_MAX_ITEM_BYTES]
    tiles = small or tiles  # no tile small enough (a very long K): the bound is dropped
    if SKINNY_UNSPLIT_ITEMS_PER_SM:
        for cfg in tiles:
            items = cfg.grid(problem)
            if cfg.split_k == 1 and items >= SKINNY_UNSPLIT_ITEMS_PER_SM * spec.sm_count:
                return cfg, (f"~{avg:.1f} rows per group over {groups} groups: {items} items >= "
                             f"{SKINNY_UNSPLIT_ITEMS_PER_SM} per SM without a K split")
    best = None
    for cfg in tiles:
        ctas = cfg.grid(problem)
        if best is None or ctas > best[1]:
            best = (cfg, ctas)
        if ctas >= target:
            return cfg, f"~{avg:.1f} rows per group over {groups} groups: {ctas} CTAs >= {target}"
    cfg, ctas = best
    return cfg, f"~{avg:.1f} rows per group over {groups} groups: {ctas} CTAs, the most a split gives"


@contextlib.contextmanager
def expert_gemms_planned_as(tile: GemmConfig | None = None, *, up: GemmConfig | None = None,
                            down: GemmConfig | None = None):
    """Within the block, every grouped GEMM of several groups with a 16-bit output (a MoE layer's expert GEMMs)
    is planned as ``tile``, or the one with an epilogue (the up-projection) as ``up`` and the others (the
    down-projection) as ``down`` where given; the rest (the router's fp32 GEMM, an expert GEMM given no tile) as
    ``plan`` says. For A/B runs, tests and the sanitizer's cases; a layer built inside keeps the plan it was built
    with (clear moe.layer's cache around it)."""
    real = globals()["plan"]
    up, down = up or tile, down or tile

    def forced(problem: GemmProblem, spec: DeviceSpec) -> tiling.Plan:
        chosen = up if problem.epilogue is not None else down
        if chosen is not None and problem.experts > 1 and problem.out_dtype is None:
            return tiling.Plan(config=chosen, smem_bytes=chosen.smem_bytes(), limit=spec.smem_per_block_optin,
                               reason=f"forced: {chosen}")
        return real(problem, spec)

    globals()["plan"] = forced
    try:
        yield
    finally:
        globals()["plan"] = real


def few_experts_touched(problem: GemmProblem) -> bool:
    """Fewer rows than experts (a decode step of a few tokens): the weight stream is short and covers only some
    experts, so its start and end are what a skinny plan's time is made of. The layer then lists the touched
    experts early and prefetches their weights (GemmCall early=) and runs both expert GEMMs as one launch
    (SkinnyFFN); with every expert touched both measured slower (docs/perf/grouped_gemm.md v4.3, v4.4)."""
    return problem.rows < problem.experts


def plan_skinny(problem: GemmProblem, spec: DeviceSpec) -> tiling.Plan | None:
    """The skinny tile's plan when the groups are decode-sized (None otherwise)."""
    groups = max(1, min(problem.experts, problem.rows))
    if problem.rows == 0 or problem.rows / groups > SKINNY_MAX_ROWS:
        return None
    cfg, why = skinny_config(problem, spec)
    return tiling.choose([cfg], spec, reason=why)


# The tma planner's cost model (H100 measurements of the tma kernel, docs/perf/grouped_gemm.md v5): a 128 x 256
# x 64 stage takes ~0.84 us of one SM's tensor cores (4.2 MFLOP at ~5 TFLOP/s, 660 TFLOP/s over 132 SMs), a
# 128 x 128 stage ~0.47 (10 % less efficient per FLOP: A is re-read per 128 columns); a persistent CTA works
# through its items one after another, so the time is the waves of items times an item's stages; the bytes of
# a and of every touched expert's weights cross DRAM at least once (at ~85 % of the datasheet bandwidth); a
# split adds its fp32 partial sums' write and read-back and the reduce kernel's launch on top. A split the model
# picks on 128-column tiles then runs across a cluster (cluster_k, at most 4) where all its tiles' clusters fit
# at once: measured 1-5 % faster than the same split through global memory (docs/perf/grouped_gemm.md v7).
# The 64-row tiles' stages (fitted to the v8 sweep less a ~6 us fixed cost per call) are for tune's ranking and
# the estimate printed with a plan; the planner takes them by rule (narrow_one_wave).
TMA_STAGE_US = {(128, 256): 0.84, (128, 128): 0.47, (64, 128): 0.30, (64, 64): 0.26}
TMA_MIN_K_TILES = 4  # k tiles per split at the least
SPLIT_LAUNCH_US = 3.0
# the share of the SMs that clusters of 2, 3, 4 CTAs fill (a cluster's CTAs share a GPC): H100 SXM,
# cuOccupancyMaxActiveClusters of the cluster_k kernel = 66, 39, 30 clusters on 132 SMs (2026-11-25)
CLUSTER_FILL = {2: 1.0, 3: 0.886, 4: 0.909}


def cluster_capacity(spec: DeviceSpec, cluster: int) -> int:
    """Clusters of ``cluster`` CTAs (one per SM) that run at once on ``spec``, estimated from ``CLUSTER_FILL``."""
    return int(spec.sm_count * CLUSTER_FILL[cluster]) // cluster


def _tma_m_tiles(problem: GemmProblem, block_m: int = 128) -> int:
    """The ``block_m``-row tiles of ``problem``'s groups, estimated (each group past the first adds about half a
    tile)."""
    groups = max(1, min(problem.experts, problem.rows))
    return -(-problem.rows // block_m) if groups == 1 else problem.rows // block_m + groups // 2 + 1


def tma_estimate_us(problem: GemmProblem, cfg: GemmConfig, spec: DeviceSpec) -> float:
    """Estimated microseconds of ``problem`` on the tma tile ``cfg`` (the planner's cost model above)."""
    items = _tma_m_tiles(problem, cfg.block_m) * -(-problem.n // cfg.block_n) * cfg.split_k
    stage_us = TMA_STAGE_US[(cfg.block_m, cfg.block_n)]
    k_tiles = -(-problem.k // 64)
    if cfg.cluster_k > 1:  # clusters of tiles
        waves = -(-items // cluster_capacity(spec, cfg.cluster_k))
        compute = waves * -(-k_tiles // cfg.cluster_k) * stage_us
    else:
        waves = -(-items // spec.sm_count)
        compute = waves * -(-k_tiles // cfg.split_k) * stage_us
    bw = 0.85 * (spec.peaks.mem_bandwidth_gbs if spec.peaks else 2000.0) * 1e3  # bytes per us
    weight_rows = min(problem.experts, max(problem.rows, 1)) * problem.n
    moved = 2.0 * (problem.rows + weight_rows) * problem.k
    extra = 0.0
    if cfg.split_k > 1:  # the partial sums' write and the reduce's read do not hide under the tiles' work
        extra = SPLIT_LAUNCH_US + 2 * 4.0 * problem.rows * problem.n * cfg.split_k / bw
    return max(compute, moved / bw) + extra


def tma_ranked(problem: GemmProblem, spec: DeviceSpec) -> list[tuple[GemmConfig, float]]:
    """The tma tiles (128 x 256 and 128 x 128, each deepest ring, split K 1..8 while each split keeps at least
    ``TMA_MIN_K_TILES`` k tiles) with their estimated time, fastest first (ties: the wider tile, fewer splits).
    Where the fastest is a split 128 x 128 tile, its split across a cluster (``as_cluster_split``) comes first;
    where it is the unsplit 128 x 256 tile on long groups, the B-multicast pair (``as_pair``)."""
    k_tiles = -(-problem.k // 64)
    out = []
    for order, base in enumerate((TMA[0], TMA_128[0])):
        if base.block_n > 128 and problem.n <= 128:
            continue
        for split in range(1, TMA_MAX_SPLIT + 1):
            if split > 1 and k_tiles // split < TMA_MIN_K_TILES:
                break
            cfg = dataclasses.replace(base, split_k=split)
            out.append((tma_estimate_us(problem, cfg, spec), order, split, cfg))
    out.sort(key=lambda t: t[:3])
    ranked = [(cfg, est) for est, _, _, cfg in out]
    clustered = as_cluster_split(problem, ranked[0][0], spec)
    if clustered is not None:
        ranked.insert(0, (clustered, tma_estimate_us(problem, clustered, spec)))
    pair = as_pair(problem, ranked[0][0], spec)
    if pair is not None:
        ranked.insert(0, (pair, ranked[0][1]))
    narrow = narrow_one_wave(problem, spec)
    if narrow is not None:
        ranked.insert(0, (narrow, tma_estimate_us(problem, narrow, spec)))
    return ranked


# One group of few rows (a 128-token projection): 64-row tiles, the narrowest whose work items all get their own
# SM, beat the 128 x 128 tiles and their splits whatever the cost model says (H100, 2026-11-25, do_bench with the
# L2 flushed, docs/perf/grouped_gemm.md v8: 128 x 768 x 768 9.1 vs 11.6 us, 128 x 6144 x 2048 19.5 vs 22.7); up
# to this many k tiles (128 x 4096 x 11008, 172 k tiles, ran 3 us slower than the 128 x 128 split across clusters)
TMA_64_MAX_K_TILES = 96


def narrow_one_wave(problem: GemmProblem, spec: DeviceSpec) -> GemmConfig | None:
    """The 64 x 64 or 64 x 128 tile (``TMA_64``) for a one-group problem whose items fit one wave on ``spec``;
    None for grouped problems, long K, or more items than SMs."""
    if min(problem.experts, max(problem.rows, 1)) != 1 or -(-problem.k // 64) > TMA_64_MAX_K_TILES:
        return None
    for cfg in sorted(TMA_64, key=lambda c: c.block_n):
        if (cfg.work_items(problem, exact_one_group=True) <= spec.sm_count and problem.epilogue in cfg.epilogues()
                and tiling.fits(cfg, spec) is None):
            return cfg
    return None


def as_cluster_split(problem: GemmProblem, cfg: GemmConfig, spec: DeviceSpec) -> GemmConfig | None:
    """The 128 x 128 split ``cfg`` as a split across clusters of min(split, 4) CTAs (their sums added in
    distributed shared memory, no reduce launch) when every tile's cluster runs at once (``cluster_capacity``);
    None when ``cfg`` is not such a split or the clusters would take a second wave."""
    if cfg.kind != "tma" or cfg.block_n != 128 or cfg.split_k < 2 or cfg.cluster_m != 1:
        return None
    ck = min(cfg.split_k, TMA_MAX_CLUSTER_K)
    if _tma_m_tiles(problem) * -(-problem.n // 128) > cluster_capacity(spec, ck):
        return None
    return dataclasses.replace(TMA_128_KSPLIT, cluster_k=ck)


# The B-multicast pair (TMA_PAIR) in place of the unsplit 128 x 256 tile. H100, 2026-11-26 (v7.2; do_bench cool /
# sustained at the 700 W cap, N 11008 K 4096, pair / TMA[0]): one group of 8192 rows 1.024; a group whose last pair
# holds at most 128 rows ends in tail items (pair_item in the kernel), so the pair wastes no more rows than the tile:
# 8 equal groups of 1,024 rows 1.007 / 1.019, the bench's skewed 8 (gamma, 1,024 on average) 1.008 / 1.020 (0.977 /
# 0.987 before the tail items), routed splits (multinomial, the MoE layer's) of 2,048 rows 0.991-1.062 / 1.010-1.048,
# but the skewed 32 (256 rows on average) 0.967 / 0.984. The host does not know the group sizes (the offsets live
# on the device), so groups must average PAIR_MIN_GROUP_ROWS. And two waves of pairs or more: dense 1024 x 4096 x
# 4096 (64 pairs, one wave) ran 0.974x, 2048 x 4096 x 4096 (128 pairs) 1.009x, the models' larger shapes
# 1.001-1.034x.
PAIR_MIN_GROUP_ROWS = 1024


def as_pair(problem: GemmProblem, cfg: GemmConfig, spec: DeviceSpec) -> GemmConfig | None:
    """``TMA_PAIR[0]`` where ``cfg`` is the unsplit 128 x 256 tile (``TMA[0]``), there are work items for two waves
    of pairs, the rows are one group or groups of at least ``PAIR_MIN_GROUP_ROWS`` rows on average, and the epilogue
    is one the pair has; else None. (Whether it fits ``spec`` is the caller's choice, ``tiling.choose``, as for
    every ranked tile.)"""
    pair = TMA_PAIR[0]
    if cfg != TMA[0] or problem.epilogue not in pair.epilogues():
        return None
    groups = max(1, min(problem.experts, problem.rows))
    waves = pair.work_items(problem, exact_one_group=True) / cluster_capacity(spec, 2)
    return pair if waves >= 2 and (groups == 1 or problem.rows // groups >= PAIR_MIN_GROUP_ROWS) else None


def _tma_unusable(problem: GemmProblem) -> str | None:
    """Why the tma tile cannot run ``problem`` here (None when it can): the tensor maps need cuda-bindings, and
    the kernel addresses b's rows as one int coordinate (experts * N < 2**31)."""
    from cukernels import tma

    if problem.out_dtype == "fp32":
        return "fp32 output"
    if problem.experts * problem.n >= 2**31:
        return f"experts x N = {problem.experts * problem.n} >= 2**31 rows of b"
    return tma.available()


def variants(spec: DeviceSpec) -> list[GemmConfig]:
    """Every config the planner can return on ``spec`` (the first fitting one of each preference list)."""
    check_arch(spec)
    out = []
    for epilogue in NAMED_EPILOGUES:  # the rotary epilogues run on the same tma tiles
        for candidates in (LARGE_ORDER, LARGE_NO_TMA, MEDIUM + SMALL, TMA_128 + LARGE_NO_TMA):
            fitting = [c for c in _for_device(candidates, spec) if epilogue in c.epilogues()]
            cfg = tiling.choose(fitting, spec, reason="").config
            if cfg not in out:
                out.append(cfg)
    ksplits = [dataclasses.replace(TMA_128_KSPLIT, cluster_k=c) for c in range(2, TMA_MAX_CLUSTER_K + 1)]
    return out + [c for c in (*ksplits, *TMA_PAIR, *TMA_64, *SKINNY) if tiling.fits(c, spec) is None]


# ---------------------------------------------------------------- tuning (cukernels/tune.py)


@functools.cache
def tune_files() -> tuple[Path, ...]:
    """What a tuned GEMM config depends on: the kernel, its headers, the compile path and this module."""
    kernels = Path(__file__).parent / "kernels"
    engine = Path(tune.__file__).parent
    return (kernels / "grouped_gemm.cu", *sorted(kernels.glob("*.cuh")), *sorted((engine / "kernels").glob("*.cuh")),
            engine / "compile.py", Path(__file__))


def candidates(problem: GemmProblem, spec: DeviceSpec) -> list[GemmConfig]:
    """The configs ``plan`` chooses among for ``problem`` on ``spec`` (the tuning search space): its heuristic
    choice first (the profile's override where there is one), then every tile of ``ALL`` that fits the device and
    is built with the problem's epilogue, in preference order (256-wide tiles only when n >= 256); on sm_90a the
    four tma tile / split-K pairs the cost model ranks best come right after the heuristic's choice."""
    chosen = tune.heuristic(plan, problem, spec).config
    no_tma = _tma_unusable(problem)
    pool = [c for c in _for_device(ALL, spec) if problem.epilogue in c.epilogues() and tiling.fits(c, spec) is None
            and (c.block_n <= problem.n or c.block_n < 256) and not (c.kind == "tma" and no_tma)]
    if (spec.arch == "sm_90a" and no_tma is None and problem.epilogue in (None, "swiglu")
            and plan_skinny(problem, spec) is None):
        pool = [c for c, _ in tma_ranked(problem, spec)[:4] if tiling.fits(c, spec) is None] + pool
    return [chosen, *dict.fromkeys(c for c in pool if c != chosen)]
