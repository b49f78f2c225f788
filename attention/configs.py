"""Forward-kernel tile configs and the planner that picks one for a problem on a device.

Heuristic choice (``plan_forward``), the search space (``search_space``) and tuned choices (profile overrides,
``[overrides."attention.fwd".head_dim_128]`` etc.) are kept apart. Every config the planner can return fits the
device's opt-in shared memory per block; ``tests/test_attention_cpu.py`` compiles each one offline for every
profile's arch and checks ptxas reports no spills.
"""
from __future__ import annotations

import dataclasses
import functools

from pathlib import Path

from cukernels import dtypes, tiling, tune
from cukernels.device import DeviceSpec

HEAD_DIMS = (64, 128, 256)
MASK_WINDOW = 1  # causal and/or sliding window (kernel template bit, see kernels/flash_fwd.cu)
MASK_SEGMENTS = 2
MASK_VARLEN = 4  # packed sequences by cu_seqlens (kernels/common.cuh); never with MASK_SEGMENTS
MASK_KINDS = (0, MASK_WINDOW, MASK_SEGMENTS, MASK_WINDOW | MASK_SEGMENTS, MASK_VARLEN, MASK_VARLEN | MASK_WINDOW)
MIN_COMPUTE_CAPABILITY = (8, 0)  # cp.async and mma.sync m16n8k16 (bf16 included)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FwdConfig:
    """One instance of ``flash_fwd``: BLOCK_M query rows per CTA (16 or 32 per warp: 32 reuses each K/V
    fragment twice, halving shared-memory reads per MMA), BLOCK_N KV rows per pipeline stage, STAGES K/V tiles
    in flight. Shared memory: Q tile + STAGES x (K tile + V tile), 2-byte elements."""

    head_dim: int
    block_m: int
    block_n: int
    warps: int
    stages: int = 2

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim}")
        if self.warps < 1 or self.block_m not in (16 * self.warps, 32 * self.warps):
            raise ValueError(f"block_m must be 16 or 32 * warps (each warp owns 16 or 32 query rows), got "
                             f"{self.block_m} with {self.warps} warps")
        if self.block_n < 16 or self.block_n % 16:
            raise ValueError(f"block_n must be a positive multiple of 16, got {self.block_n}")
        if self.stages < 2:
            raise ValueError(f"stages must be >= 2, got {self.stages}")
        chunks = self.head_dim // 8
        if (self.block_n * chunks) % self.threads or (self.block_m * chunks) % self.threads:
            raise ValueError(f"{self}: tiles must split evenly into 16-byte copies over {self.threads} threads")

    source = "flash_fwd.cu"  # in attention/kernels

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def smem_bytes(self) -> int:
        return 2 * self.head_dim * (self.block_m + 2 * self.stages * self.block_n)

    def name_expression(self, *, dtype, mask: int = 0) -> str:
        check_mask(mask)
        return (f"flash_fwd<{dtypes.ctype(dtype)},{self.head_dim},{self.block_m},{self.block_n},"
                f"{self.warps},{self.stages},{mask}>")

    def __str__(self) -> str:
        return (f"FwdConfig(d{self.head_dim} m{self.block_m} n{self.block_n} "
                f"w{self.warps} s{self.stages})")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FwdWgmmaConfig:
    """One instance of ``flash_fwd_wgmma`` (kernels/flash_fwd_sm90.cu, sm_90a only): ``warpgroups`` x 64 query
    rows per CTA, BLOCK_N KV rows per stage. Shared memory: Q tile + STAGES x (K + V tiles), 2-byte elements,
    plus 1 KiB to align the tiles to the 1024-byte swizzle atom."""

    head_dim: int
    block_n: int
    warpgroups: int = 2
    stages: int = 2

    source = "flash_fwd_sm90.cu"
    needs_arch = "sm_90a"  # wgmma: the planner (tiling.fits) offers this tile on Hopper alone

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim}")
        if self.block_n not in (64, 128, 256):
            raise ValueError(f"block_n must be 64, 128 or 256 (a wgmma N), got {self.block_n}")
        if self.warpgroups not in (1, 2) or self.stages < 2:
            raise ValueError(f"warpgroups must be 1 or 2 and stages >= 2, got {self.warpgroups}, {self.stages}")
        if (128 * self.warpgroups // (self.head_dim // 8)) % 8:
            raise ValueError(f"{self}: one copy pass of all threads must cover a multiple of 8 rows "
                             f"(head_dim 256 needs 2 warpgroups)")

    @property
    def block_m(self) -> int:
        return 64 * self.warpgroups

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    def smem_bytes(self) -> int:
        return 2 * self.head_dim * (self.block_m + 2 * self.stages * self.block_n) + 1024

    def name_expression(self, *, dtype, mask: int = 0) -> str:
        check_mask(mask)
        return (f"flash_fwd_wgmma<{dtypes.ctype(dtype)},{self.head_dim},{self.block_n},{self.warpgroups},"
                f"{self.stages},{mask}>")

    def __str__(self) -> str:
        return f"FwdWgmmaConfig(d{self.head_dim} m{self.block_m} n{self.block_n} wg{self.warpgroups} s{self.stages})"


@dataclasses.dataclass(frozen=True, kw_only=True)
class FwdTmaConfig:
    """One instance of ``flash_fwd_tma`` (kernels/flash_fwd_tma.cu, sm_90a only): warp-specialised, 64 query rows
    per consumer warpgroup (two, or three or four at head dim 64: 128, 192 or 256 rows per CTA, four with 64-key
    stages; or one: 64 rows, two CTAs per SM, or three with ``ctas_per_sm`` 3 and 64-key stages at head dim 64) and
    BLOCK_N KV rows per stage of an mbarrier ring filled by TMA from a producer warpgroup; ``persistent``: a CTA per
    SM takes the query tiles in rounds (not for packed batches: ``kernel_masks``). Shared memory: Q tile + STAGES x
    (K + V tiles) (+ O's staging rows when persistent), 1 KiB to align them to the swizzle atom, and the barriers
    (Q, full K, full V and empty per stage; Q empty when persistent). Needs cuda-bindings for the tensor maps and q/k/v
    strides a tensor map can describe (``FwdProblem.tma_layout``)."""

    head_dim: int
    block_n: int
    stages: int = 2
    pingpong: bool = True  # the consumers take turns issuing their GEMMs (softmax of one under the other's MMAs)
    consumers: int = 2  # consumer warpgroups; three (160 registers each) or four (112, 64-key stages) hold head dim
    # 64's accumulators only; one: 64-row CTAs, two per SM (no pingpong, not persistent)
    persistent: bool = False  # a CTA per SM over the query tiles (next tile's Q and K/V under this one's end)
    ctas_per_sm: int = 0  # 0: the consumers' own (two with one consumer, else one); 3: one consumer at head dim 64
    # with 64-key stages (80 registers a thread at launch, 128 per consumer)

    source = "flash_fwd_tma.cu"
    needs_arch = "sm_90a"
    tensor_maps = True  # q/k/v through TMA: see servable()

    @property
    def block_m(self) -> int:
        return 64 * self.consumers

    @property
    def threads(self) -> int:
        return 128 * (self.consumers + 1)

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim}")
        if self.block_n not in (64, 80, 128):
            raise ValueError(f"block_n must be 64, 80 or 128, got {self.block_n}")
        if self.stages < 2:
            raise ValueError(f"stages must be >= 2, got {self.stages}")
        if (self.consumers not in (1, 2, 3, 4) or (self.consumers >= 3 and self.head_dim != 64)
                or (self.consumers == 4 and self.block_n != 64)):
            raise ValueError(f"consumers must be 1, 2 (or 3 at head dim 64, 4 there with 64-key stages), got "
                             f"{self.consumers} at head dim {self.head_dim}, block_n {self.block_n}")
        if self.consumers == 1 and (self.pingpong or self.persistent):
            raise ValueError("one consumer warpgroup (two CTAs per SM) takes neither pingpong nor persistent")
        if self.ctas_per_sm not in (0, 3) or (self.ctas_per_sm and (self.consumers != 1 or self.head_dim != 64
                                                                     or self.block_n != 64)):
            raise ValueError("ctas_per_sm: 0 or 3 (one consumer at head dim 64 with 64-key stages: the 80 registers "
                             f"a thread has at launch), got {self.ctas_per_sm} for {self}")

    def smem_bytes(self) -> int:
        o_staging = self.block_m if self.persistent else 0  # persistent: O's own staging rows (else Q's)
        return (2 * self.head_dim * (self.block_m + 2 * self.stages * self.block_n + o_staging) + 1024
                + 8 * (1 + 4 * self.stages + self.persistent))

    def name_expression(self, *, dtype, mask: int = 0) -> str:
        check_mask(mask)
        pp = "true" if self.pingpong else "false"
        tail = ",true" if self.persistent else f",false,{self.ctas_per_sm}" if self.ctas_per_sm else ""
        return (f"flash_fwd_tma<{dtypes.ctype(dtype)},{self.head_dim},{self.block_n},{self.stages},{pp},{mask},"
                f"{self.consumers}{tail}>")

    def __str__(self) -> str:
        return (f"FwdTmaConfig(d{self.head_dim} m{self.block_m} n{self.block_n} s{self.stages}"
                f"{'' if self.pingpong else ' no-pp'}{' persistent' if self.persistent else ''}"
                f"{f' {self.ctas_per_sm}/SM' if self.ctas_per_sm else ''})")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FwdProblem:
    batch: int
    seq_q: int
    seq_kv: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str = "bf16"  # "fp16" | "bf16"
    causal: bool = False
    window: tuple[int, int] | None = None
    segments: bool = False
    varlen: bool = False  # packed: batch = sequences, seq_q / seq_kv = the packed totals (attention/varlen.py)
    tma_layout: bool = True  # q/k/v (and a backward's dO) strides a tensor map can describe (no stride 0 along an
    # axis longer than 1)

    @property
    def mask(self) -> int:
        return mask_of(causal=self.causal, window=self.window, segments=self.segments, varlen=self.varlen)

    def query_tiles(self, rows: int) -> int:
        """Query tiles of ``rows`` rows over the whole batch: for a packed batch an upper bound (each sequence
        adds at most one partial tile), the grid size of its kernels."""
        if self.varlen:
            return self.seq_q // rows + self.batch
        return self.batch * -(-self.seq_q // rows)

    def kv_tiles(self, rows: int) -> int:
        """As ``query_tiles`` for the keys."""
        if self.varlen:
            return self.seq_kv // rows + self.batch
        return self.batch * -(-self.seq_kv // rows)

    def window_bounds(self) -> tuple[int, int]:
        """(left, right) in kv positions as the kernels take them; 'unbounded' becomes a span larger than any
        sequence, and causal means right = 0."""
        unbounded = self.seq_q + self.seq_kv
        left, right = self.window if self.window is not None else (-1, -1)
        if self.causal:
            right = 0
        return (unbounded if left < 0 else left), (unbounded if right < 0 else right)


# Candidates (block_m, block_n, warps, stages) in preference order, per head dim. Registers, not shared memory,
# bound occupancy (about 8 warps per SM at ~200-255 registers), so the tile with the fewest shared-memory reads
# per MMA that ptxas fits without spills comes first; smaller ones exist for devices with less shared memory
# (GB10/consumer 101,376 B).
_CANDIDATES = {
    64: ((128, 32, 4, 3), (128, 128, 8, 2), (128, 64, 8, 2), (64, 64, 4, 2)),
    128: ((128, 64, 8, 2), (128, 32, 8, 2), (64, 64, 4, 2), (64, 32, 4, 2)),
    256: ((128, 32, 8, 2), (128, 16, 8, 2), (64, 16, 4, 2)),
}


# Hopper (sm_90a): (block_n, warpgroups, stages); 128-row tiles first, 64-row ones for small grids. At head dim
# 256 one warpgroup spills (48-240 B: 128 O accumulators per thread under the same 255-register cap), so small
# grids there take the mma.sync 64-row tile.
# Hopper with tensor maps (cuda-bindings): (block_n, stages, consumer warpgroups, pingpong) of the warp-specialised
# kernel, first choice on sm_90a, in preference order. Measured on H100 (docs/perf/attention.md, --sweep): with K and
# V freed separately 2-4 stages are within 2 % of each other; 128 keys per stage beat 64 by 10-18 %. The 128-row tile
# also wins on small grids (64 CTAs at head dim 256: 1.8x the mma.sync 64-row tile; head dim 64 with 256 CTAs: equal
# to the 64-row wgmma tile), so it stays first. Head dim 64: three consumers (192 rows per CTA, 1.5x the rows per
# K/V stage) run seed004_a 1.17x faster than two (0.595 vs 0.696 ms), where the 128-row tile is better without
# pingpong (0.644 ms at 2 stages); ``plan_forward`` takes the 192-row tile only where whole waves favour it. Last,
# the 64-row tile of one consumer, two CTAs per SM, for small grids without a mask (``_ONE_CONSUMER_WAVES``).
_TMA_CANDIDATES = {
    64: ((128, 3, 3, True), (128, 2, 2, False), (128, 4, 3, True), (128, 3, 2, False), (128, 4, 2, False),
         (128, 3, 3, False), (128, 4, 3, False), (128, 2, 2, True), (128, 3, 2, True), (128, 4, 2, True),
         (128, 2, 1, False)),
    128: ((128, 2, 2, True), (128, 3, 2, True), (64, 3, 2, True), (128, 2, 2, False), (128, 3, 2, False),
          (64, 3, 2, False)),
    256: ((80, 2, 2, True), (64, 2, 2, True), (64, 2, 2, False)),
}
# Head dim 256: 80-key stages first (FlashAttention-3's tile there), 230,472 B of shared memory at two stages, so
# only where 227 KB fit (H100, H200); measured on H100 (docs/perf/attention.md v3.7) 1.01-1.07x the 64-key tile
# (interleaved ratios to cuDNN), bf16 and fp16, causal and not. (At head dim 128, 80 keys lost to 128: 0.85-0.90x.)
# persistent TMA tiles (a CTA per SM over the query tiles), after the others: planned first under a causal/window
# mask and at head dim 128 (plan_forward); none at head dim 256 (O's own staging rows do not fit beside 2 stages)
_TMA_PERSISTENT = {64: ((128, 2, 2, False),), 128: ((128, 2, 2, True),), 256: ()}
# rows per second of a 192-row tile over a 128-row one at head dim 64 (H100, seed004_a, same run)
_ROWS_192_GAIN = 1.17
# Head dim 64 without a mask: the one-consumer 64-row tile (two CTAs per SM) is planned where the grid has at most
# _ONE_CONSUMER_FEW_WAVES waves of 128-row tiles (any keys), or at most _ONE_CONSUMER_WAVES waves and at most
# _ONE_CONSUMER_KEYS keys. Measured on H100 after lazy rescaling gave the 192-row tile 6 % (docs/perf/attention.md
# v3.11, interleaved rounds, 64 / best other tile): B1-B4 x 1024-4096 at 1-2 waves 1.02-1.41x (B1 x 4096 x 8 heads
# 0.961 / 0.918x cuDNN); B8 x 1024 (4 waves) level (0.907 / 0.907); B4 x 2048, B1 x 4096 x 16 heads, B2 x 4096
# (4 waves) 0.95-0.98x; more waves lose more (B8 x 4096 x 16 heads 0.88x). (v3.4 before it: up to 4 waves and
# 2,048 keys.)
_ONE_CONSUMER_FEW_WAVES = 2
_ONE_CONSUMER_WAVES = 4
_ONE_CONSUMER_KEYS = 1024
# Head dim 64, the 64-row one-consumer tile with 64-key stages at three CTAs per SM ((block_n, stages); planned under a
# plain causal mask below _CAUSAL_192_KEYS on grids of at least _THREE_PER_SM_WAVES full waves of it: a CTA's start
# and store, and the ~0.8 us the block scheduler takes to start the next CTA on an SM (docs/perf/attention.md v3.13),
# run under two other CTAs' loops instead of one. H100: 1.05-1.11x the two-per-SM tile on causal B4-B16 x 1-2k keys;
# on 256 CTAs (B2 S1024 H8, under one wave) 0.92x.
_TMA_THREE_PER_SM = {64: ((64, 2),), 128: (), 256: ()}
_THREE_PER_SM_WAVES = 1
# Head dim 64, the 256-row tile: four consumers (112 registers each, the producer 24) over 64-key stages
# ((block_n, stages, pingpong)); planned without a mask (v3.15)
_TMA_FOUR_CONSUMERS = {64: ((64, 4, True),), 128: (), 256: ()}
# Without a mask (v3.14, v3.15), by rounds of CTAs on the busiest SM. On grids where the one-consumer tile is planned
# (_ONE_CONSUMER_*), with n 64-row CTAs on the busiest SM: the 192-row tile where its CTAs fit one wave and n > 2
# (H100: 1.10-1.30x the 64-row tile), else the 256-row tile where it takes fewer rounds than three per SM
# (n = 4, 7, 8: 1.00-1.12x), else three per SM where that takes fewer rounds than two per SM (n = 3, 5, 6:
# 1.04-1.25x), else two per SM. On larger grids the 128-, 192- or 256-row tile with the least rounds x
# _ROWS_LONGER (a CTA's time over a 128-row CTA's: rows over each tile's measured rate; the 256-row tile's taken 5 %
# above its measured 1.07x the 192-row tile's, as a margin: its rounds must save that much).
_ROWS_LONGER = {128: 1.0, 192: 1.5 / _ROWS_192_GAIN, 256: 2.0 / _ROWS_192_GAIN * 1.07 * 1.05}
# Head dim 64 under a causal mask without a window, on a padded batch (segment ids or not): the 192-row tile from
# this many keys, the 64-row tile of one consumer below. Measured on H100 (v3.11, without segment ids), 192 / 64 rows:
# 4,096 keys 1.00-1.08x (B4 H8, B8 H16), 8,192-16,384 keys 1.06-1.17x; 2,048 keys 0.95-1.00x, 1,024 keys 0.88x.
_CAUSAL_192_KEYS = 4096

_WGMMA_CANDIDATES = {
    64: ((128, 2, 2), (128, 1, 2)),
    128: ((128, 2, 2), (128, 1, 2)),
    256: ((64, 2, 2),),
}


def search_space(head_dim: int) -> list:
    """Every config the planner may consider for ``head_dim``, in preference order: the wgmma tiles (which fit
    sm_90a alone, ``needs_arch``: the warp-specialised TMA tiles first), then the mma.sync tiles that run on every
    sm_80+ GPU."""
    return ([FwdTmaConfig(head_dim=head_dim, block_n=n, stages=s, consumers=c, pingpong=pp)
             for n, s, c, pp in _TMA_CANDIDATES[head_dim]]
            + [FwdTmaConfig(head_dim=head_dim, block_n=n, stages=s, consumers=1, pingpong=False, ctas_per_sm=3)
               for n, s in _TMA_THREE_PER_SM[head_dim]]
            + [FwdTmaConfig(head_dim=head_dim, block_n=n, stages=s, consumers=4, pingpong=pp)
               for n, s, pp in _TMA_FOUR_CONSUMERS[head_dim]]
            + [FwdTmaConfig(head_dim=head_dim, block_n=n, stages=s, consumers=c, pingpong=pp, persistent=True)
               for n, s, c, pp in _TMA_PERSISTENT[head_dim]]
            + [FwdWgmmaConfig(head_dim=head_dim, block_n=n, warpgroups=w, stages=s)
             for n, w, s in _WGMMA_CANDIDATES[head_dim]]
            + [FwdConfig(head_dim=head_dim, block_m=m, block_n=n, warps=w, stages=s)
               for m, n, w, s in _CANDIDATES[head_dim]])


def plannable(spec: DeviceSpec, head_dim: int) -> list:
    """Every config ``plan_forward`` can return on ``spec`` for ``head_dim`` (mma.sync, wgmma and TMA tiles): the
    first fitting candidate in each of its preference orders, and the profile's override if any. CPU tests compile
    exactly these (and test_planned_configs_are_plannable checks plan_forward against them)."""
    if tuple(spec.compute_capability) < MIN_COMPUTE_CAPABILITY:
        return []
    found = []
    probe = FwdProblem(batch=1, seq_q=1, seq_kv=1, heads=1, kv_heads=1, head_dim=head_dim)
    tuned = _override(probe, spec)
    if tuned is not None:
        found.append(tuned.config)
    space = search_space(head_dim)
    no_tma = [c for c in space if not needs_tensor_maps(c)]  # without cuda-bindings, or a stride 0
    two_consumers = sorted(space, key=lambda c: getattr(c, "consumers", 2) == 3)  # head dim 64, fewer waves
    one_consumer = sorted(space, key=lambda c: getattr(c, "consumers", 2) != 1)  # head dim 64, small grids
    three_per_sm = sorted(one_consumer, key=lambda c: getattr(c, "ctas_per_sm", 0) != 3)  # head dim 64, causal
    four_consumers = sorted(space, key=lambda c: getattr(c, "consumers", 2) != 4)  # head dim 64, no mask
    persistent = sorted(space, key=lambda c: not getattr(c, "persistent", False))
    for order in (space, no_tma, sorted(no_tma, key=lambda c: c.block_m != 64), two_consumers, one_consumer,
                  three_per_sm, four_consumers, persistent):
        fitting = [c for c in order if tiling.fits(c, spec) is None]
        if fitting and fitting[0] not in found:
            found.append(fitting[0])
    return found


def tma_unusable(problem: FwdProblem) -> str | None:
    """Why the TMA tiles cannot run ``problem`` here (None when they can): tensor maps need cuda-bindings and
    strides they can describe."""
    from cukernels import tma

    if not problem.tma_layout:
        return "a q/k/v (or dO) stride of 0 along an axis longer than 1 (tensor maps need positive strides)"
    return tma.available()


def needs_tensor_maps(config) -> bool:
    """Whether ``config``'s kernel takes its inputs as tensor maps (``tensor_maps = True`` on the class: the
    warp-specialised TMA tiles of the forward and the backward)."""
    return getattr(config, "tensor_maps", False)


def mask_of(*, causal: bool = False, window=None, segments: bool = False, varlen: bool = False) -> int:
    """The kernel mask kind (MASK_KINDS) of a call's options: causal or a window that bounds a side, segment ids,
    a packed batch."""
    windowed = causal or (window is not None and tuple(window) != (-1, -1))
    return (MASK_WINDOW if windowed else 0) | (MASK_SEGMENTS if segments else 0) | (MASK_VARLEN if varlen else 0)


def kernel_masks(config) -> tuple[int, ...]:
    """The mask kinds ``config`` has a kernel for: a persistent tile none with a packed batch (its CTAs map their
    tiles from the sequences). (The 192-row tile had none with a causal/window mask on a padded batch until v3.11:
    its registers spilled there in v3.2; none spill since, and plan_forward plans it under a plain causal mask.)"""
    masks = MASK_KINDS
    if getattr(config, "persistent", False):
        masks = tuple(m for m in masks if not m & MASK_VARLEN)
    return masks


def servable(configs, problem: FwdProblem) -> list:
    """``configs`` that have a kernel for ``problem``'s mask (``kernel_masks``), without the tensor-map tiles when
    they cannot run ``problem`` here (``tma_unusable``)."""
    configs = [c for c in configs if problem.mask in kernel_masks(c)]
    if tma_unusable(problem) is None:
        return configs
    return [c for c in configs if not needs_tensor_maps(c)]


def check_servable(config, problem: FwdProblem) -> None:
    """A plan handed in with a tensor-map tile that cannot run ``problem`` here: ValueError naming why."""
    if needs_tensor_maps(config) and (why := tma_unusable(problem)):
        raise ValueError(f"plan {config} needs tensor maps, which cannot serve these inputs: {why}")
    if problem.mask not in kernel_masks(config):
        raise ValueError(f"plan {config} has no kernel for mask kind {problem.mask} (causal/window 1, segments 2, "
                         f"packed 4): it serves {kernel_masks(config)}")


def check_mask(mask: int) -> None:
    if mask not in MASK_KINDS:
        raise ValueError(f"mask must be one of {MASK_KINDS}, got {mask}")


def tma_tiles(spec: DeviceSpec, head_dim: int) -> list[FwdTmaConfig]:
    """The warp-specialised TMA tiles of ``head_dim`` that fit ``spec`` (none off sm_90a): what tests and the
    sanitizer force, since the planner takes only the first."""
    return [c for c in search_space(head_dim) if isinstance(c, FwdTmaConfig) and tiling.fits(c, spec) is None]


def _override(problem: FwdProblem, spec: DeviceSpec) -> tiling.Plan | None:
    raw = spec.overrides.get("attention.fwd")
    if raw is None:
        return None
    per_dim = raw.get(f"head_dim_{problem.head_dim}")
    if per_dim is None:
        return None
    narrowed = dataclasses.replace(spec, overrides={"attention.fwd": per_dim})
    return tiling.override(narrowed, "attention.fwd", lambda d: FwdConfig(head_dim=problem.head_dim, **d))


# A persistent grid's tiles under a causal/window mask go by weight across heads (by_weight) where the K/V of the
# whole batch fit in this share of L2 (the rounds then read every head's keys at once), else head by head; where the
# order left has its busiest CTA this much over the mean, the planner takes a one-tile-per-CTA grid instead (the
# hardware hands out the next tile as a CTA ends). H100 (docs/perf/attention.md v3.5): by weight 1.38-1.75x head by
# head where that left a CTA 1.5-1.8x the mean (K/V of 17-34 MB), 0.99-1.02x on balanced grids; with 67 MB of K/V
# by weight lost 13 % on a balanced grid (B16 S2048 H16 d64) and won where head by head was 1.54x off balance, as
# did one tile per CTA.
_BY_WEIGHT_L2_SHARE = 0.7
# Head dim 128 without a mask: the persistent tile only where the keys are at most _D128_PERSISTENT_KEYS and the grid
# has more than _D128_PERSISTENT_WAVES waves of 128-row tiles; one tile per CTA with pingpong elsewhere. Measured on
# H100 (v3.12, interleaved, one tile / persistent): B8 S1024 H8 0.98-0.995x, B16 S1024 H16 0.96-0.98x; B4 S1024 H8/2
# (2 waves) 1.01-1.02x, 2,048-16,384 keys 0.99-1.12x (median 1.02-1.03x; B1 S8192 H32/8 0.97-0.99x the exception).
_D128_PERSISTENT_KEYS = 1024
_D128_PERSISTENT_WAVES = 2
_PERSISTENT_MAX_IMBALANCE = 1.15


def _kv_fits_l2(problem: FwdProblem, spec: DeviceSpec) -> bool:
    """The batch's K and V fit ``_BY_WEIGHT_L2_SHARE`` of L2 (a grid may then read every head's keys at once)."""
    kv_bytes = problem.batch * problem.kv_heads * problem.seq_kv * problem.head_dim * 2 * 2
    return kv_bytes <= _BY_WEIGHT_L2_SHARE * spec.l2_bytes


def tile_order(problem: FwdProblem, config, spec: DeviceSpec, grid: int) -> bool:
    """flash_fwd_tma's ``by_weight``: a persistent grid's order (``persistent_order``); a grid of one tile per CTA
    under a causal mask whose K/V fit L2 numbers its tiles heaviest first across heads (the hardware launches CTAs
    in that order, so the longest tiles start first: 1.03-1.31x head by head on H100, 2026-11-26), else head by
    head (the CTAs launched together share few heads' K/V: without a mask, by weight ran the small grids 3-6 %
    slower; with 67 MB of K/V 0.59x). Not measured under other windows (head by head there). Never for a packed
    batch (its CTAs map their tiles from the sequences)."""
    if config.persistent:
        return persistent_order(problem, config, spec, grid)[0]
    # (the grid is then (heads, batch, query tiles): batch is its y dimension, at most 65,535)
    return problem.causal and not problem.mask & MASK_VARLEN and problem.batch <= 65535 and _kv_fits_l2(problem, spec)


def persistent_order(problem: FwdProblem, config, spec: DeviceSpec, grid: int | None = None) -> tuple[bool, float]:
    """(by_weight, imbalance) of ``config``'s persistent grid over ``problem``: whether flash_fwd_tma numbers its
    tiles heaviest first across heads (a causal/window mask whose K/V fit ``_BY_WEIGHT_L2_SHARE`` of L2), and the
    busiest CTA's KV tiles over the mean under that order (rounds of ``grid`` CTAs, every other one reversed, as the
    kernel's tile_at). ``grid``: the resident grid (default: one CTA per SM, at most the tiles)."""
    import numpy as np

    bm, bn = config.block_m, config.block_n
    sq, skv, hb = problem.seq_q, problem.seq_kv, problem.heads * problem.batch
    n_m = -(-sq // bm)
    tiles = n_m * hb
    if grid is None:
        grid = min(tiles, spec.sm_count)
    windowed = bool(problem.mask & MASK_WINDOW)
    by_weight = windowed and _kv_fits_l2(problem, spec)
    t = np.arange(tiles, dtype=np.int64)
    m = n_m - 1 - (t // hb if by_weight else t % n_m)
    left, right = problem.window_bounds()
    shift = skv - sq
    first = np.maximum(0, m * bm + shift - left) // bn
    last = np.minimum(skv - 1, np.minimum((m + 1) * bm, sq) - 1 + shift + right)
    weight = np.where(last >= first * bn, last // bn - first + 1, 0) if windowed else np.full(tiles, -(-skv // bn))
    r, c = t // grid, t % grid
    cta = np.where(r % 2 == 1, grid - 1 - c, c)
    loads = np.bincount(cta, weights=weight, minlength=grid)
    return bool(by_weight), float(loads.max() / max(loads.mean(), 1e-9))


def plan_forward(problem: FwdProblem, spec: DeviceSpec) -> tiling.Plan:
    """The forward config for ``problem`` on ``spec``: a profile override if there is one, else the first
    candidate that fits, preferring 64-row query tiles when 128-row ones would leave SMs idle."""
    if tuple(spec.compute_capability) < MIN_COMPUTE_CAPABILITY:
        cc = "%d.%d" % tuple(spec.compute_capability)
        raise tiling.PlanError(
            f"flash attention needs compute capability 8.0+ (cp.async, mma.sync m16n8k16); {spec.name} is {cc}"
        )
    if problem.head_dim not in HEAD_DIMS:
        raise tiling.PlanError(f"head_dim must be one of {HEAD_DIMS}, got {problem.head_dim}")
    no_tma = tma_unusable(problem)
    tuned = tune.lookup(TUNE_OP, problem, spec, files=tune_files(), types=(FwdConfig, FwdWgmmaConfig, FwdTmaConfig))
    if tuned is None:  # no config tuned on this GPU (--tune): the profile's override or the heuristic
        tuned = _override(problem, spec)
    if tuned is not None and servable([tuned.config], problem):
        return tuned
    candidates = servable(search_space(problem.head_dim), problem)
    causal_192 = (problem.head_dim == 64 and problem.causal and problem.window is None
                  and not problem.mask & MASK_VARLEN and problem.seq_kv >= _CAUSAL_192_KEYS)
    if problem.mask & MASK_WINDOW and not problem.mask & MASK_VARLEN and not causal_192:
        # the 192-row tile under a causal/window mask on a padded batch only where measured (v3.11)
        candidates = [c for c in candidates if getattr(c, "consumers", 2) != 3]
    ctas_128 = problem.heads * problem.query_tiles(128)
    reason = f"fastest spill-free tile for head_dim {problem.head_dim} that fits"
    if no_tma and spec.arch == "sm_90a":
        reason += f" (no TMA tile: {no_tma})"
    tma_first = any(needs_tensor_maps(c) and tiling.fits(c, spec) is None for c in candidates)
    persistent = [c for c in candidates if getattr(c, "persistent", False)]
    others = [c for c in candidates if c not in persistent]
    candidates = others + persistent  # last, but where measured faster:
    fitting_persistent = [c for c in persistent if tiling.fits(c, spec) is None]
    windowed = bool(problem.mask & MASK_WINDOW)
    balance = (persistent_order(problem, fitting_persistent[0], spec)[1]
               if tma_first and fitting_persistent and windowed else 1.0)
    if tma_first and problem.head_dim == 64 and problem.causal and not problem.mask & MASK_VARLEN:
        # measured on H100 (docs/perf/attention.md v3.6): under a causal mask one tile per CTA beat the persistent
        # 128-row tile at every size tried: with the K/V in L2 launched heaviest first across heads (tile_order,
        # 1.03-1.10x), without head by head (1.03-1.11x, seed004_a's shape 0.84 -> 0.94x cuDNN); v3.11: the
        # one-consumer 64-row tile beat the 128-row one (with or without pingpong, or persistent) at every size
        # from 1,024 to 16,384 keys, 1.02-1.13x (v3.6 had planned the 128-row tile past 2,048 keys), and the
        # 192-row tile of three consumers beat both from 4,096 keys (_CAUSAL_192_KEYS)
        in_l2 = _kv_fits_l2(problem, spec)
        consumers = 3 if causal_192 else 1
        # v3.13: three 64-row CTAs per SM on a plain causal mask where they fill the SMs at least once
        three = (consumers == 1 and problem.window is None and not problem.segments
                 and problem.heads * problem.query_tiles(64) >= _THREE_PER_SM_WAVES * 3 * spec.sm_count)
        candidates = sorted(candidates, key=lambda c: (getattr(c, "consumers", 2) != consumers,
                                                       (getattr(c, "ctas_per_sm", 0) == 3) != three))
        reason = (f"one {64 * consumers}-row TMA tile per CTA{', three CTAs per SM' if three else ''}, "
                  f"{'heaviest first across heads' if in_l2 else 'head by head'} "
                  f"(causal, {problem.seq_kv} keys, K/V {'in' if in_l2 else 'not in'} L2); " + reason)
    elif tma_first and balance > _PERSISTENT_MAX_IMBALANCE:
        reason = (f"one tile per CTA: the persistent grid's busiest CTA would carry {balance:.2f}x the mean "
                  f"(> {_PERSISTENT_MAX_IMBALANCE}); " + reason)
    elif (tma_first and fitting_persistent
            and (windowed or (problem.head_dim == 128 and ctas_128 > spec.sm_count
                              and (problem.mask != 0 or (problem.seq_kv <= _D128_PERSISTENT_KEYS
                                                         and ctas_128 > _D128_PERSISTENT_WAVES * spec.sm_count))))):
        # measured on H100 (docs/perf/attention.md v3.2): under a causal mask the persistent tile's rounds pair
        # heavy and light query tiles (1.0-1.4x the one-tile-per-CTA grid); at head dim 128 without a mask v3.2
        # measured it 1.00-1.04x, but v3.12 (after the early first loads and lazy rescaling) found the one-tile
        # pingpong grid faster except on many waves of 1,024-key rows; at head dim 64 without one it is not faster
        candidates = persistent + others
        reason = "persistent warp-specialised TMA tile (causal/window mask or head dim 128); " + reason
    elif tma_first and problem.head_dim == 64:
        waves = {m: -(-problem.heads * problem.query_tiles(m) // spec.sm_count) for m in (128, 192, 256)}
        cost = {m: waves[m] * _ROWS_LONGER[m] for m in waves}
        rows = min((128, 192, 256) if problem.mask == 0 else (128, 192), key=lambda m: (cost[m], m == 256))
        few = waves[128] <= _ONE_CONSUMER_FEW_WAVES or (waves[128] <= _ONE_CONSUMER_WAVES
                                                        and problem.seq_kv <= _ONE_CONSUMER_KEYS)
        # 64-row CTAs on the busiest SM, the rounds they take at two and at three per SM, and whether the 192-row
        # tiles fit one wave (v3.14, v3.15)
        per_sm = -(-problem.heads * problem.query_tiles(64) // spec.sm_count)
        rounds = {k: -(-per_sm // k) for k in (2, 3)}
        one_wave_192 = waves[192] == 1
        if problem.mask == 0 and few and per_sm > 2 and one_wave_192:
            candidates = sorted(candidates, key=lambda c: getattr(c, "consumers", 2) != 3)
            reason = (f"warp-specialised TMA tile of 192 rows in one wave (two CTAs per SM of 64 rows would take "
                      f"{rounds[2]} rounds), no mask; " + reason)
        elif problem.mask == 0 and few and waves[256] < rounds[3]:
            candidates = sorted(candidates, key=lambda c: getattr(c, "consumers", 2) != 4)
            reason = (f"warp-specialised TMA tile of 256 rows: {waves[256]} rounds of it against "
                      f"{rounds[3]} of three 64-row CTAs per SM, no mask; " + reason)
        elif problem.mask == 0 and few:
            three = rounds[3] < rounds[2]
            candidates = sorted(candidates, key=lambda c: (getattr(c, "consumers", 2) != 1,
                                                           (getattr(c, "ctas_per_sm", 0) == 3) != three))
            reason = (f"warp-specialised TMA tile of 64 rows, {'three' if three else 'two'} CTAs per SM: "
                      f"{per_sm} CTAs on an SM, {waves[128]} waves of 128 rows, {problem.seq_kv} keys, no mask; "
                      + reason)
        else:
            if rows == 128:
                candidates = sorted(candidates, key=lambda c: getattr(c, "consumers", 2) in (3, 4))
            elif rows == 256:
                candidates = sorted(candidates, key=lambda c: getattr(c, "consumers", 2) != 4)
            reason = (f"warp-specialised TMA tile of {rows} rows: waves of 128 / 192 / 256 rows "
                      f"{waves[128]} / {waves[192]} / {waves[256]}, x {_ROWS_LONGER[192]:.2f} / "
                      f"{_ROWS_LONGER[256]:.2f} as long each; " + reason)
    elif tma_first:
        reason = "warp-specialised TMA tile (first on sm_90a, any grid); " + reason
    elif ctas_128 < spec.sm_count:
        candidates = sorted(candidates, key=lambda c: c.block_m != 64)
        reason = f"{ctas_128} CTAs of 128 rows < {spec.sm_count} SMs: 64-row query tiles first; " + reason
    elif problem.mask & MASK_WINDOW and problem.head_dim == 128 and spec.arch != "sm_90a":
        # measured on H200 (docs/perf/attention.md): with causal/window masks 64-row tiles waste less work on
        # the diagonal and balance better, 3-5% (swa_seg 23%) faster than 128-row ones
        candidates = sorted(candidates, key=lambda c: c.block_m != 64)
        reason = "causal/window mask: 64-row query tiles first; " + reason
    return tiling.choose(candidates, spec, reason=reason)


# ---------------------------------------------------------------- tuning (cukernels/tune.py)

TUNE_OP = "attention.fwd"


@functools.cache
def tune_files() -> tuple[Path, ...]:
    """What a tuned forward config depends on: the forward kernels, the headers they include, the compile path
    and this module (their text hashes to the tuned cache's kernel revision)."""
    kernels = Path(__file__).parent / "kernels"
    engine = Path(tune.__file__).parent
    return (*sorted(kernels.glob("flash_fwd*.cu")), *sorted(kernels.glob("*.cuh")),
            *sorted((engine / "kernels").glob("*.cuh")), engine / "compile.py", Path(__file__))


def candidates(problem: FwdProblem, spec: DeviceSpec) -> list:
    """The configs ``plan_forward`` chooses among for ``problem`` on ``spec`` (the tuning search space): its
    heuristic choice first (the profile's override where there is one), then every other tile of the search space
    that fits the device, in the planner's preference order."""
    chosen = tune.heuristic(plan_forward, problem, spec).config
    return [chosen, *(c for c in servable(search_space(problem.head_dim), problem)
                      if c != chosen and tiling.fits(c, spec) is None)]
