"""Tile configs of attention over a KV cache (kernels/flash_decode.cu) and the planner: the CTA shape and the
number of key splits.

A ``DecodeConfig`` is one instance of ``flash_decode``: ``warps`` warps, each taking 16 keys of every stage of a
``stages``-deep cp.async ring (a stage holds ``16 * warps`` keys of K and of V), one 16-row tile of packed query
rows. Shared memory: the Q tile plus the ring, 2-byte elements (dynamic), and a paged cache's per-group offsets
(static); the warps' merge reuses the ring. With ``warp_pipe`` each warp copies its own 16 keys of every stage
(``use_warp_pipe`` decides where).

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
# the cp.async ring: 2..MAX_STAGES stages. 5-8 are valid instances (0 spills) but never planned: on the H100
# (2026-11-26, held, interleaved) 4 x 5/6/8 and 8 x 5/6 ran within 0.7 % of 4 x 4 at B8 L1k d64, and 4 x 5/6 no
# faster than 4 x 4 at B64 L128k
MAX_STAGES = 8
# fewer keys per split and the pipeline's fill and the combine outweigh the parallelism; 2 (was 4 before the
# combine's loads went out together): B1 L1k 8 splits beat 4 by 2-8 % (plan_splits)
MIN_STAGES_PER_SPLIT = 2
# sm_90: split counts whose splits merge through distributed shared memory as one cluster (flash_decode_cluster)
# instead of partials in global memory and a counter (portable cluster sizes: up to 8), where a split holds at
# most CLUSTER_MAX_SPLIT_KEYS keys. Measured on an H100 (2026-11-25, held, bf16): the merge's latency is most of
# a short call (B1 L1k 32/8 q1 12.4 -> 10.7 us, q4 17.1 -> 11.8, d64 11.5 -> 10.4; B8 L1k 32/8 q4 28.6 -> 24.4;
# B1 L8k d64 25.7 -> 24.6), level at 2-4k keys per split (B1 L8k 32/32, L32k d64), 3 % slower at 8k keys per
# split (B1 L32k 32/32 189 -> 195 us: a cluster's CTAs are placed within one GPC, so a long streaming split
# loses to free placement)
CLUSTER_SPLITS = (2, 4, 8)
CLUSTER_MAX_SPLIT_KEYS = 4096
SHORT_CACHE_KEYS = 2048  # search_space: head dim >= 128 keeps the 3-stage ring (two CTAs per SM) up to this many keys
# plan_splits: on sm_90 a cache of at most this many keys whose unsplit grid fills at most a quarter of the SMs is
# split for half the SMs (see there); 0 turns it off
SHORT_SPLIT_KEYS = 1024
W8_MAX_BANDWIDTH_GBS = 4000.0  # search_space: 8 x 3 on short caches from two waves (H100: yes, H200: no)
# search_space: a paged cache at head dim 64 takes the 8 x 3 ring where a CTA streams at least this many keys
# (estimated as keys x min(waves, 1): the splits fill about one wave); shorter streams are faster on 4 x 4 (H100)
PAGED_D64_W8_MIN_CTA_KEYS = 6144


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
    warp_pipe: bool = False  # each warp copies its own 16 keys of a stage: warp barriers (flash_decode's WARP_PIPE)

    source = "flash_decode.cu"

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim}")
        if self.warps not in (2, 4, 8) or not 2 <= self.stages <= MAX_STAGES:
            raise ValueError(f"warps must be 2, 4 or 8 and stages 2..{MAX_STAGES}, got {self.warps}, {self.stages}")

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def keys_per_stage(self) -> int:
        return 16 * self.warps

    def dynamic_smem_bytes(self) -> int:
        # Q tile and the K/V ring in 2-byte elements
        return 2 * self.head_dim * (ROWS_PER_TILE + 2 * self.stages * self.keys_per_stage)

    def smem_bytes(self) -> int:
        # and a paged instance's K and V offsets (8 bytes each) per 16-key group of two blocks of stages, in static
        # shared memory (an array behind the ring measured 7-9 % slower at B1 L8k 32/8 q4)
        return self.dynamic_smem_bytes() + 16 * 2 * self.stages * self.warps

    def name_expression(self, *, dtype, paged: bool, pair: bool = False, cluster: int = 1) -> str:
        args = (f"{dtypes.ctype(dtype)},{self.head_dim},{self.warps},{self.stages},{'true' if paged else 'false'},"
                f"{'true' if pair else 'false'}")
        pipe = ",true" if self.warp_pipe else ""
        return f"flash_decode_cluster<{args},{cluster}{pipe}>" if cluster > 1 else f"flash_decode<{args}{pipe}>"

    def __str__(self) -> str:
        return f"DecodeConfig(d{self.head_dim} w{self.warps} s{self.stages}{' pipe' if self.warp_pipe else ''})"


def search_space(head_dim: int, waves: float = 0.0, paged: bool = False, keys: int = 0,
                 bandwidth_gbs: float = 0.0) -> list[DecodeConfig]:
    """Preference order, then the configs that fit smaller shared memories. ``waves`` is the grid before any split
    (batch x kv heads x row tiles) over the SM count. Measured on an H100 (2026-11-23, held time, bf16):

    - head dim 64: under one wave, 4 warps and 4 stages (64 keys per stage, 67 KB: the rows' 128 bytes leave room
      for several CTAs per SM) beat 8 warps by 0.5-5 % (B8 L128k q4 1354 vs 1418 us); from one wave up, 8 warps
      and 4 stages (one CTA per SM) beat it by 2-3 % (B64 L8k/32k);
    - head dim 128 and up: from two waves up (every SM has work for several CTAs), a 4-stage ring (one CTA per SM)
      beats 3 stages by 0.4-2 % (B64 L32k 32/32 10968 vs 11203 us); under that, 3 stages (two CTAs per SM) win by
      0-1.5 %; on short caches (<= SHORT_CACHE_KEYS keys) 3 stages beat 4 at any grid (B64 L1k 32/8 q1 103.9 vs
      105.5 us, 2026-11-25), and from two waves up, on a device of at most ``W8_MAX_BANDWIDTH_GBS`` (``bandwidth_gbs``,
      the profile's HBM figure), 8 warps x 3 stages (one CTA per SM, 128 keys per stage) beat 4 warps x 3 stages
      by 0-1.3 % on all six B64 L1k rows of an H100 (d64 in pairs q1 105.4 -> 104.3 us, 32/8 q4 108.7 -> 107.3;
      2026-11-26, held, interleaved) while losing 0.5-1.5 % at 8k-32k keys and on one wave (B8 L1k 32/32); on an
      H200 (4.8 TB/s) the same rows ran 0.2-2 % slower with it (d64 in pairs q1 76.8 -> 78.4 us);
    - a paged cache takes the same plan under two waves: its page ids are read once per 16-key group, ahead of
      the copies that use them (flash_decode), so its copies no longer wait on the block table (before
      that change a paged cache needed a second CTA per SM to hide the lookups; now one per SM with the
      contiguous cache's splits is 1-13 % faster, B1 L8k 32/8 q4 34.0 vs 38.9 us); from two waves up it keeps
      the 3-stage rings that let two CTAs share an SM (B64: 1 % faster at L8k-32k, ~5 % at L1k);
    - a paged cache at head dim 64 with ``keys`` >= 8k per sequence: 8 warps x 3 stages (twice the 16-key groups
      in flight of 4 x 4: with pages of 16 a head's rows are 128-byte pieces of 32 KB pages), paged / contiguous
      at pages of 16 1.07-1.12 -> 0.97-1.05 (B1 L8k-128k, B8 L8k-128k), pages of 256 0.98-1.03; a 1k cache keeps
      4 x 4 (its more splits: 1.11 vs 1.17). Since the page lookups go a block of stages at a time (2026-11-27,
      flash_decode), only where a CTA streams ``PAGED_D64_W8_MIN_CTA_KEYS`` keys or more (keys x min(waves, 1),
      about the split's keys): shorter streams run 1.5-4 % faster on 4 x 4, longer ones on pages of 16 2-2.5 %
      slower (on pages of 256 within 2 % either way)
      (16/16 heads, shuffled pages of 16 / 256, paged / contiguous, 8 x 3 -> 4 x 4, same process, H100: B1 L8k
      (1k keys a CTA) 1.108 -> 1.068 / 1.085 -> 1.049, B1 L32k (4k) 1.086 -> 1.068 / 1.058 -> 1.043; B2 L32k (8k)
      1.034 -> 1.056 / 1.021 -> 1.039, B8 L8k (8k) 1.052 -> 1.070, B1 L128k (16k) 1.023 -> 1.047 / 1.020 ->
      1.015, B4 L32k (16k) 1.035 -> 1.053)."""
    if head_dim == 64 and paged and (waves >= 2 or keys * min(waves, 1.0) >= PAGED_D64_W8_MIN_CTA_KEYS):
        first = [(8, 3)]
    elif head_dim == 64:
        first = [(4, 4), (8, 4), (8, 3)] if waves < 1 else [(8, 4), (8, 3)]
    elif waves >= 2 and not paged and keys > SHORT_CACHE_KEYS:
        first = [(4, 4)]
    elif waves >= 2 and not paged and 0 < bandwidth_gbs <= W8_MAX_BANDWIDTH_GBS:
        first = [(8, 3)]
    else:
        first = []
    return [DecodeConfig(head_dim=head_dim, warps=w, stages=s) for w, s in first + [(4, 3), (4, 2), (2, 3), (2, 2)]]


# flash_decode's WARP_PIPE where use_warp_pipe says so; None = the rule, True / False = every call (A/B runs)
WARP_PIPE: bool | None = None
# use_warp_pipe: CTAs that stream at most this many keys (a split's)
WARP_PIPE_MAX_SPLIT_KEYS = 1024


def use_warp_pipe(problem: DecodeProblem, split_keys: int, spec: DeviceSpec) -> bool:
    """Whether each warp copies only its own 16 keys of every stage (flash_decode's WARP_PIPE: a warp barrier per
    stage, a paged cache's page ids in the warp's lanes) instead of the CTA copying each stage together (a CTA
    barrier per stage, page offsets looked up a block of stages at a time into shared memory): on sm_90 (where it
    was measured), for a paged cache or head dim 256 where a CTA streams at most ``WARP_PIPE_MAX_SPLIT_KEYS`` keys.
    Measured on an H100
    (2026-11-27, stop 65, held, 5 rotated rounds, one process per head dim; docs/results/h100/stop65/warp_pipe/),
    pipe / CTA copies: pages of 16 at B1 L1k 0.94-0.97 (32/8, 32/32 q1 / q4, 16/16 d64), B1 L8k d64 (1,024 keys a
    CTA) 0.98-0.99, B8 L1k 0.98-0.99, head dim 256 B1 L8k 0.85 (0.95 contiguous), B8 / B64 L1k d256 0.98-0.99;
    CTAs streaming 2k keys or more level to 2 % slower on either cache (B1 L8k 32/32 paged 1.02, B1 L32k d64
    1.01, B2 / B4 L32k d64 paged 1.01-1.02), and contiguous caches at head dim 64 / 128 level to 3.5 % slower
    (B1 L1k 32/32 1.03-1.04)."""
    if WARP_PIPE is not None:
        return WARP_PIPE
    return (spec.compute_capability >= (9, 0) and (problem.paged or problem.head_dim == 256)
            and split_keys <= WARP_PIPE_MAX_SPLIT_KEYS)


def plan_decode(problem: DecodeProblem, spec: DeviceSpec) -> tiling.Plan:
    if spec.compute_capability < MIN_COMPUTE_CAPABILITY:
        raise tiling.PlanError(f"attention over a KV cache needs mma.sync bf16 and cp.async (sm_80+); "
                               f"{spec.name} is sm_{spec.compute_capability[0]}{spec.compute_capability[1]}")
    tuned = tiling.override(spec, OP, lambda raw: DecodeConfig(head_dim=problem.head_dim, **raw))
    if tuned is not None:
        return tuned
    waves = problem.batch * problem.kv_heads * problem.row_tiles / spec.sm_count
    return tiling.choose(search_space(problem.head_dim, waves, problem.paged, problem.max_keys,
                                      spec.peaks.mem_bandwidth_gbs if spec.peaks else 0.0), spec,
                         reason="the ring and warps measured fastest for this head dim and grid")


def paired(problem: DecodeProblem, spec: DeviceSpec, heads_adjacent: bool = True) -> DecodeProblem | None:
    """The problem the kernel runs when head-dim-64 KV heads go in pairs (flash_decode's PAIR: heads 2p and 2p + 1
    read as one 256-byte row per key), or None. Pairs are taken when the unpaired grid already fills the GPU (a
    pair halves the CTAs), the two heads of a pair are adjacent in memory (``heads_adjacent``: the cache's head
    stride is 64 elements) and both heads' query rows fit one 16-row tile. Measured on an H100 (2026-11-23):
    the head-dim-64 rows of 128 bytes stream at ~2.98 TB/s where 256-byte rows of the same cache bytes (32/8
    heads, d128) reach ~3.11 TB/s."""
    if problem.head_dim != 64 or problem.kv_heads % 2 or not heads_adjacent:
        return None
    if problem.seq_q * 2 * (problem.heads // problem.kv_heads) > ROWS_PER_TILE:
        return None
    if problem.batch * problem.kv_heads * problem.row_tiles < spec.sm_count:
        return None
    return dataclasses.replace(problem, kv_heads=problem.kv_heads // 2, head_dim=128)


def plan_splits(problem: DecodeProblem, config: DecodeConfig, spec: DeviceSpec) -> int:
    """Splits per sequence: the fewest whose grid reaches 95 % of the best wave efficiency over 1..MAX_SPLITS
    (FlashAttention's heuristic) counting one CTA per SM, each split keeping at least MIN_STAGES_PER_SPLIT stages
    of keys. Measured on an H100 (one sequence, 32/8 heads, d128): 12-16 splits of an 8k-32k cache beat 26-32 by
    5-8 %. The floor of two stages binds only on short caches: B1 L1k 32/8 takes 8 splits of two stages, which
    beat 4 of four by 2-3 % contiguous and 4-8 % paged (held, 2026-11-25, under the timer's old memset flush; 4 was
    the floor while the last split's merge read the partials one row at a time; under the read flush, 2026-11-27:
    8.99 against 9.54 us). On sm_90 a cache of at most SHORT_SPLIT_KEYS keys whose unsplit grid fills at most a
    quarter of the SMs (one sequence) is split for half the SMs: B1 L1k 32/32 2 splits beat 4 by 3.8 / 5.1 % (q1 /
    q4) and 16/16 d64 4 beat 8 by 3.4 / 2.4 %, paged level (H100, held under the read flush, 5 rotated rounds,
    2026-11-27); 32/8 keeps 8 (64 CTAs already), and B8 32/8 (a grid of 64) keeps 2, which beat 1 by 2-3 %."""
    # one CTA per SM, contiguous or paged: its ring keeps enough loads in flight (two per SM measured slower)
    slots = spec.sm_count
    base = problem.batch * problem.kv_heads * problem.row_tiles
    if problem.max_keys <= SHORT_SPLIT_KEYS and spec.compute_capability >= (9, 0) and 4 * base <= spec.sm_count:
        slots = max(1, spec.sm_count // 2)
    max_useful = max(1, min(MAX_SPLITS, problem.max_keys // (MIN_STAGES_PER_SPLIT * config.keys_per_stage)))
    if base >= slots:
        return 1

    def efficiency(s: int) -> float:
        waves = base * s / slots
        return waves / -(-waves // 1)

    best = max(efficiency(s) for s in range(1, max_useful + 1))
    return next(s for s in range(1, max_useful + 1) if efficiency(s) >= 0.95 * best)


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """Everything a call needs from the planner: the problem the kernel runs (``paired`` or the caller's), the
    tile plan, and the key splits (``splits`` of ``split_keys`` keys, whole stages, none empty)."""

    problem: DecodeProblem
    plan: tiling.Plan
    splits: int
    split_keys: int
    pair: bool
    cluster: int = 1  # > 1: the splits of a tile are one thread block cluster (flash_decode_cluster)

    @property
    def config(self) -> DecodeConfig:
        return self.plan.config


def plan_call(problem: DecodeProblem, spec: DeviceSpec, *, heads_adjacent: bool = True,
              num_splits: int | None = None) -> DecodePlan:
    """The one planning path of ``flash_attention_with_kvcache`` (and of the bench's --plan): head pairs, tile
    config, splits (``num_splits`` overrides the heuristic; either is cut so that no split is empty)."""
    pair = paired(problem, spec, heads_adjacent)
    kp = pair or problem
    plan = plan_decode(kp, spec)
    tiling.check_fits(plan.config, spec)
    splits = int(num_splits) if num_splits is not None else plan_splits(kp, plan.config, spec)
    keys = plan.config.keys_per_stage
    split_keys = -(-(-(-kp.max_keys // splits)) // keys) * keys
    splits = min(splits, -(-kp.max_keys // split_keys))
    if use_warp_pipe(kp, split_keys, spec):  # the same ring and splits, each warp copying its own keys
        plan = dataclasses.replace(plan, config=dataclasses.replace(plan.config, warp_pipe=True),
                                   reason=plan.reason + "; each warp copies its own keys")
    clustered = (spec.compute_capability >= (9, 0) and splits in CLUSTER_SPLITS
                 and split_keys <= CLUSTER_MAX_SPLIT_KEYS)
    cluster = splits if clustered else 1
    return DecodePlan(problem=kp, plan=plan, splits=splits, split_keys=split_keys, pair=pair is not None,
                      cluster=cluster)
