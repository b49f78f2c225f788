"""Backward-kernel tile configs and ``plan_backward``, independent of the forward's tiles.

A ``BwdConfig`` names both kernels the backward may launch (kernels/flash_bwd.cu):

- ``flash_bwd_dkdv``: a CTA per (KV tile of ``block_n`` rows, kv head, batch) looping over query tiles of
  ``block_m`` rows with ``warps`` warps and a ``stages``-deep Q/dO ring; by default it also adds dQ with fp32
  atomics.
- ``flash_bwd_dq`` (deterministic mode only): a CTA per (query tile of ``dq_block_m`` rows, head, batch) looping
  over KV tiles of ``dq_block_n`` rows, ``dq_block_m / 16`` warps.

``smem_bytes()`` is the larger of the two kernels' dynamic shared memory, so a plan fits whichever mode runs.
Every candidate the planner can return compiles without spills for every profile's arch
(tests/test_attention_bwd_cpu.py). block_m and block_n differ on purpose in several candidates: the segment-id
tile ranges are computed per kernel with that kernel's own tile sizes (seed 000's failure was a mask built
with one tile size and compared with another).
"""
from __future__ import annotations

import dataclasses
import functools

from pathlib import Path

from cukernels import dtypes, tiling, tune
from cukernels.device import DeviceSpec

from .configs import (HEAD_DIMS, MASK_VARLEN, MASK_WINDOW, MIN_COMPUTE_CAPABILITY, FwdProblem,
                      check_mask, servable, tma_unusable)

OP = "attention.bwd"


@dataclasses.dataclass(frozen=True, kw_only=True)
class BwdConfig:
    head_dim: int
    block_m: int  # query rows per step of the dK/dV kernel
    block_n: int  # KV rows per dK/dV CTA
    warps: int
    stages: int = 2
    dq_block_m: int = 64  # query rows per CTA of the deterministic dQ kernel (16 per warp)
    dq_block_n: int = 64  # KV rows per step of the dQ kernel

    source = "flash_bwd.cu"  # in attention/kernels: the dK/dV kernel's file (the other kernels live there too)

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim}")
        if self.block_m not in (32, 64, 128):
            raise ValueError(f"block_m must be 32, 64 or 128 (P/dS tile swizzle), got {self.block_m}")
        if self.block_n < 16 or self.block_n % 16 or self.warps % (self.block_n // 16):
            raise ValueError(f"block_n must be a multiple of 16 and warps ({self.warps}) a multiple of "
                             f"block_n / 16, got block_n={self.block_n}")
        wc = self.warps // (self.block_n // 16)
        if (self.block_m // wc) % 16 or (self.head_dim // wc) % 16:
            raise ValueError(f"{self}: {wc} warps per 16 kv rows leave slices that are not multiples of 16")
        rq = min(self.block_m // 16, self.warps)
        if self.warps % rq or (self.block_m // 16) % rq or (self.head_dim // (self.warps // rq)) % 32:
            raise ValueError(f"{self}: dQ warp grid does not divide the tile")
        self._check_stages_and_dq((1, 2))

    def _check_stages_and_dq(self, stages: tuple[int, ...]) -> None:
        """The ring depth (``stages`` allowed) and the deterministic dQ kernel's tiles, checked by every config."""
        if self.stages not in stages:
            raise ValueError(f"stages must be one of {stages}, got {self.stages}")
        if self.dq_block_m not in (16, 32, 64, 128) or self.dq_block_n < 16 or self.dq_block_n % 16:
            raise ValueError(f"dq_block_m must be 16..128 (16 per warp) and dq_block_n a multiple of 16, got "
                             f"{self.dq_block_m}, {self.dq_block_n}")

    @property
    def dq_warps(self) -> int:
        return self.dq_block_m // 16

    @property
    def threads(self) -> int:
        return 32 * max(self.warps, self.dq_warps)

    def dkdv_smem_bytes(self) -> int:
        d, m, n, s = self.head_dim, self.block_m, self.block_n, self.stages
        return 2 * (2 * n * d + 2 * s * m * d + 2 * n * m) + 2 * 4 * s * m  # K, V, Q/dO ring, P, dS; lse2, D

    def dq_smem_bytes(self) -> int:
        d = self.head_dim
        return 2 * (2 * self.dq_block_m * d + 2 * 2 * self.dq_block_n * d)  # Q, dO; two stages of K, V

    def smem_bytes(self) -> int:
        return max(self.dkdv_smem_bytes(), self.dq_smem_bytes())

    def dq_kv_rows(self, mask: int) -> int:
        """KV rows per step of the dQ kernel: ``dq_block_n``, except 16 for a packed batch with a window at head
        dim 256, where the per-sequence lengths take registers that a wider step needs (ptxas spills 40 B on
        sm_90a at 32 rows)."""
        if self.head_dim == 256 and mask & MASK_VARLEN and mask & MASK_WINDOW:
            return min(self.dq_block_n, 16)
        return self.dq_block_n

    def name_expression(self, *, dtype, mask: int = 0, kernel: str = "dkdv", dq: bool = True) -> str:
        check_mask(mask)
        t = dtypes.ctype(dtype)
        if kernel == "dkdv":
            return (f"flash_bwd_dkdv<{t},{self.head_dim},{self.block_m},{self.block_n},{self.warps},"
                    f"{self.stages},{mask},{'true' if dq else 'false'}>")
        if kernel == "dq":
            return (f"flash_bwd_dq<{t},{self.head_dim},{self.dq_block_m},{self.dq_kv_rows(mask)},{self.dq_warps},"
                    f"{mask}>")
        raise ValueError(f"kernel must be 'dkdv' or 'dq', got {kernel!r}")

    def name_expressions(self, *, dtype, mask: int) -> dict[str, list[str]]:
        """Every tile-dependent kernel instance this config may launch for (dtype, mask), by source file (in
        attention/kernels): the dK/dV kernel with and without dQ atomics, and the deterministic dQ kernel."""
        out = {self.source: [self.name_expression(dtype=dtype, mask=mask, dq=True),
                             self.name_expression(dtype=dtype, mask=mask, dq=False)]}
        out.setdefault("flash_bwd.cu", []).append(self.name_expression(dtype=dtype, mask=mask, kernel="dq"))
        return out

    def __str__(self) -> str:
        return (f"BwdConfig(d{self.head_dim} m{self.block_m} n{self.block_n} w{self.warps} s{self.stages} "
                f"| dq m{self.dq_block_m} n{self.dq_block_n})")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BwdWgmmaConfig(BwdConfig):
    """The Hopper dK/dV kernel (kernels/flash_bwd_sm90.cu, ``flash_bwd_dkdv_wgmma``, sm_90a only): ``warpgroups``
    x 64 KV rows per CTA (``block_n``), query tiles of ``block_m`` rows, every product on wgmma, dQ by fp32
    vector reductions. Deterministic mode pairs its atomics-free instance with flash_bwd.cu's dQ kernel
    (``dq_block_m`` / ``dq_block_n``). Head dims 64 and 128: each warpgroup owns 64 KV rows. Head dim 256
    (``flash_bwd_dkdv_wgmma_pair``): two warpgroups share one 64-row KV tile, one computing S^T and the other
    dP^T, each accumulating half of the head dim of dK and dV (block_n = 64, block_m = 64)."""

    block_n: int = dataclasses.field(init=False, default=0)  # derived from warpgroups (not a parameter)
    warps: int = dataclasses.field(init=False, default=0)  # 4 x warpgroups
    warpgroups: int = 2

    source = "flash_bwd_sm90.cu"
    needs_arch = "sm_90a"  # wgmma: the planner (tiling.fits) offers this tile on Hopper alone

    @property
    def pair(self) -> bool:
        """Head dim 256: the two warpgroups share one KV tile (flash_bwd_dkdv_wgmma_pair)."""
        return self.head_dim == 256

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim}")
        if self.block_m not in (64, 128) or (self.pair and self.block_m != 64):
            raise ValueError(f"block_m must be 64 or 128 (a wgmma N; 64 at head dim 256), got {self.block_m}")
        if self.warpgroups not in (1, 2) or (self.pair and self.warpgroups != 2):
            raise ValueError(f"warpgroups must be 1 or 2 (2 at head dim 256), got {self.warpgroups}")
        object.__setattr__(self, "block_n", 64 if self.pair else 64 * self.warpgroups)
        object.__setattr__(self, "warps", 4 * self.warpgroups)
        dq_n = self.head_dim * (self.block_m // 64) // self.warpgroups
        if not self.pair and (self.warpgroups % (self.block_m // 64) or dq_n not in (64, 128)):
            raise ValueError(f"{self}: the dQ tile ({self.block_m} x {self.head_dim}) does not split into one "
                             f"64 x 64/128 slice per warpgroup")
        self._check_stages_and_dq((2, 3))

    def dkdv_smem_bytes(self) -> int:
        d, m, n, s = self.head_dim, self.block_m, self.block_n, self.stages
        # K, V, the Q/dO ring, dS^T; lse2, D; 1 KiB to align the tiles to the 1024-byte swizzle atom; the pair
        # kernel's fp32 P^T hand-off
        return 2 * (2 * n * d + 2 * s * m * d + n * m) + 2 * 4 * s * m + 1024 + (4 * n * m if self.pair else 0)

    def name_expression(self, *, dtype, mask: int = 0, kernel: str = "dkdv", dq: bool = True) -> str:
        if kernel != "dkdv":
            return super().name_expression(dtype=dtype, mask=mask, kernel=kernel, dq=dq)
        check_mask(mask)
        t, flag = dtypes.ctype(dtype), "true" if dq else "false"
        if self.pair:
            return f"flash_bwd_dkdv_wgmma_pair<{t},{self.head_dim},{self.block_m},{self.stages},{mask},{flag}>"
        return (f"flash_bwd_dkdv_wgmma<{t},{self.head_dim},{self.block_m},{self.warpgroups},{self.stages},{mask},"
                f"{flag}>")

    def __str__(self) -> str:
        return (f"BwdWgmmaConfig(d{self.head_dim} m{self.block_m} n{self.block_n} wg{self.warpgroups} "
                f"s{self.stages} | dq m{self.dq_block_m} n{self.dq_block_n})")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BwdTmaConfig(BwdConfig):
    """The Hopper dK/dV kernels fed by TMA (kernels/flash_bwd_tma.cu, sm_90a only). Head dims 64 and 128
    (``flash_bwd_tma``, warp-specialised): a producer warp loads K and V once and Q, dO, lse2, D per step by TMA
    into a ``stages``-deep mbarrier ring; two consumer warpgroups of 64 KV rows each (``block_n`` = 128) run the
    products of ``BwdWgmmaConfig``'s kernel, and dQ goes through shared memory into the fp32 accumulator by TMA
    reductions. Head dim 256 (``flash_bwd_tma_pair``, ``pair``): two warpgroups share one 64-row KV tile (block_m
    64): one computes S^T and P^T, the other dP^T and dS^T (P^T handed over in fp32 through shared memory), and
    both dK / dV / dQ on their head-dim halves, with the same TMA ring (a producer warpgroup beside them) and dQ
    reductions.
    Needs cuda-bindings and q/k/v/dO strides a tensor map can describe (``FwdProblem.tma_layout``).
    Deterministic mode pairs its instance without dQ with flash_bwd.cu's dQ kernel."""

    block_n: int = dataclasses.field(init=False, default=128)
    warps: int = dataclasses.field(init=False, default=12)  # a producer and two consumer warpgroups

    source = "flash_bwd_tma.cu"
    needs_arch = "sm_90a"
    tensor_maps = True  # q/k/v/dO and the dQ accumulator through TMA: see configs.servable()

    @property
    def pair(self) -> bool:
        """Head dim 256: two warpgroups share one 64-row KV tile (flash_bwd_tma_pair)."""
        return self.head_dim == 256

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim}")
        if self.block_m not in (64, 128) or (self.head_dim != 64 and self.block_m != 64):
            raise ValueError(f"block_m must be 64 or 128 (64 at head dims 128 and 256: registers), got "
                             f"{self.block_m}")
        if self.pair:  # two consumer warpgroups on one 64-row KV tile, and the producer warpgroup
            object.__setattr__(self, "block_n", 64)
        self._check_stages_and_dq((2,) if self.pair else (2, 3))

    def dkdv_smem_bytes(self) -> int:
        d, m, n, s = self.head_dim, self.block_m, self.block_n, self.stages
        if self.pair:  # K, V, the Q/dO ring, dS^T, two fp32 dQ staging boxes (64 x 32: also the fp32 P^T hand-off
            boxes = 2 * 64 * 32 * 4  # of n x m), lse2/D, barriers
            assert boxes == 4 * n * m
            return 2 * (2 * n * d + 2 * s * m * d + n * m) + boxes + 2 * 4 * s * m + 8 * (1 + 2 * s) + 1024
        # K, V, the Q/dO ring, two dS^T tiles, the fp32 dQ staging boxes, lse2/D, the barriers, 1 KiB alignment
        return 2 * (2 * n * d + 2 * s * m * d + 2 * n * m) + 4 * m * d + 2 * 4 * s * m + 8 * (1 + 2 * s) + 1024

    def name_expression(self, *, dtype, mask: int = 0, kernel: str = "dkdv", dq: bool = True) -> str:
        if kernel != "dkdv":
            return super().name_expression(dtype=dtype, mask=mask, kernel=kernel, dq=dq)
        check_mask(mask)
        name = "flash_bwd_tma_pair" if self.pair else "flash_bwd_tma"
        return (f"{name}<{dtypes.ctype(dtype)},{self.head_dim},{self.block_m},{self.stages},{mask},"
                f"{'true' if dq else 'false'}>")

    def __str__(self) -> str:
        return (f"BwdTmaConfig(d{self.head_dim} m{self.block_m} n{self.block_n} s{self.stages}"
                f"{' pair' if self.pair else ''} | dq m{self.dq_block_m} n{self.dq_block_n})")


# (block_m, block_n, warps, stages, dq_block_m, dq_block_n), preference order per head dim. Registers bound
# these tiles (dK and dV accumulators stay in registers for the whole CTA): with one 8-warp CTA per SM, ptxas
# spills at head_dim 128 with 128-row KV tiles, so 64 x 64 it is (the kernel also limits unrolling of the
# head-dim loop of S^T/dP^T and of the dQ step so that hoisted ldmatrix addresses do not spill). Later candidates are for A100 (166,912 B) and
# GB10/consumer parts (101,376 B).
_CANDIDATES = {
    64: ((64, 128, 8, 2, 64, 64), (64, 64, 4, 2, 64, 64)),
    128: ((64, 64, 8, 2, 64, 64), (64, 64, 8, 1, 64, 64)),
    256: ((64, 64, 8, 1, 64, 32), (32, 64, 8, 2, 64, 32), (32, 32, 4, 1, 64, 16)),
}


# Hopper (sm_90a): (block_m, warpgroups, stages, dq_block_m, dq_block_n) of the wgmma dK/dV kernels, before
# the mma.sync tiles (head dim 256: the pair kernel, 64 x 64 tiles).
_WGMMA_CANDIDATES = {
    64: ((128, 2, 2, 64, 64),),
    128: ((64, 2, 2, 64, 64),),
    256: ((64, 2, 2, 64, 32),),
}


# Hopper with tensor maps: (block_m, stages, dq_block_m, dq_block_n) of the warp-specialised TMA kernel, first.
# Head dim 128 on three stages since the kernel issues the next step's S^T mid-step (docs/perf/attention.md v5.4:
# 1.5-3 % over two stages then).
_TMA_CANDIDATES = {
    64: ((128, 2, 64, 64), (64, 2, 64, 64), (64, 3, 64, 64)),
    128: ((64, 3, 64, 64), (64, 2, 64, 64)),
    256: ((64, 2, 64, 32),),
}


def search_space(head_dim: int) -> list[BwdConfig]:
    """Every config the planner may consider for ``head_dim``, in preference order: the wgmma tiles (sm_90a
    alone, ``needs_arch``), then the mma.sync tiles that run on every sm_80+ GPU."""
    return ([BwdTmaConfig(head_dim=head_dim, block_m=m, stages=s, dq_block_m=qm, dq_block_n=qn)
             for m, s, qm, qn in _TMA_CANDIDATES[head_dim]]
            + [BwdWgmmaConfig(head_dim=head_dim, block_m=m, warpgroups=w, stages=s, dq_block_m=qm, dq_block_n=qn)
               for m, w, s, qm, qn in _WGMMA_CANDIDATES[head_dim]]
            + [BwdConfig(head_dim=head_dim, block_m=m, block_n=n, warps=w, stages=s, dq_block_m=qm, dq_block_n=qn)
               for m, n, w, s, qm, qn in _CANDIDATES[head_dim]])


def plan_backward(problem: FwdProblem, spec: DeviceSpec, *, deterministic: bool = False) -> tiling.Plan:
    """The backward config for ``problem`` on ``spec``: a profile override (``[overrides."attention.bwd".
    head_dim_128]``) if there is one, else the first candidate whose shared memory fits the device.
    ``deterministic`` skips the tuned cache: its entries were timed with dQ atomics (the dK/dV kernel's ``dq``
    instance), while a deterministic call runs the separate dQ kernel, which tuning never timed."""
    if tuple(spec.compute_capability) < MIN_COMPUTE_CAPABILITY:
        cc = "%d.%d" % tuple(spec.compute_capability)
        raise tiling.PlanError(f"flash attention backward needs compute capability 8.0+ (cp.async, mma.sync "
                               f"m16n8k16); {spec.name} is {cc}")
    if problem.head_dim not in HEAD_DIMS:
        raise tiling.PlanError(f"head_dim must be one of {HEAD_DIMS}, got {problem.head_dim}")
    no_tma = tma_unusable(problem)
    tuned = None if deterministic else tune.lookup(OP, problem, spec, files=tune_files(),
                                                   types=(BwdConfig, BwdWgmmaConfig, BwdTmaConfig))
    if tuned is not None and servable([tuned.config], problem):  # tuned on this GPU (--tune --backward)
        return tuned
    raw = spec.overrides.get(OP, {}).get(f"head_dim_{problem.head_dim}")
    if raw is not None:
        narrowed = dataclasses.replace(spec, overrides={OP: raw})
        return tiling.override(narrowed, OP, lambda d: BwdConfig(head_dim=problem.head_dim, **d))
    kv_ctas = problem.kv_heads * problem.kv_tiles(128)
    reason = (f"largest spill-free backward tiles for head_dim {problem.head_dim} that fit ({kv_ctas} dK/dV CTAs at "
              f"128 kv rows)")
    if no_tma and spec.arch == "sm_90a":
        reason += f" (no TMA tile: {no_tma})"
    return tiling.choose(servable(search_space(problem.head_dim), problem), spec, reason=reason)


# ---------------------------------------------------------------- tuning (cukernels/tune.py)


@functools.cache
def tune_files() -> tuple[Path, ...]:
    """What a tuned backward config depends on: the backward kernels, the headers they include, the compile path,
    this module and the forward's (its problem and mask kinds)."""
    kernels = Path(__file__).parent / "kernels"
    engine = Path(tune.__file__).parent
    return (*sorted(kernels.glob("flash_bwd*.cu")), *sorted(kernels.glob("*.cuh")),
            *sorted((engine / "kernels").glob("*.cuh")), engine / "compile.py", Path(__file__),
            Path(__file__).with_name("configs.py"))


def candidates(problem: FwdProblem, spec: DeviceSpec) -> list[BwdConfig]:
    """The configs ``plan_backward`` chooses among for ``problem`` on ``spec`` (the tuning search space): its
    heuristic choice first (the profile's override where there is one), then every other tile of the search space
    that fits the device, in preference order."""
    chosen = tune.heuristic(plan_backward, problem, spec).config
    return [chosen, *(c for c in servable(search_space(problem.head_dim), problem)
                      if c != chosen and tiling.fits(c, spec) is None)]


def tma_tiles(spec: DeviceSpec, head_dim: int) -> list[BwdTmaConfig]:
    """The TMA backward tiles of ``head_dim`` that fit ``spec`` (none off sm_90a): what tests and the sanitizer
    force one by one."""
    return [c for c in search_space(head_dim) if isinstance(c, BwdTmaConfig) and tiling.fits(c, spec) is None]
