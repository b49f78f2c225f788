"""Named attention shapes, shared by tests and benches (one registry, no shape typed twice).

Tags: ``seed004`` (the two shapes of seed 004's timing table, the expected-results brief that
``expected_results/`` transcribes), ``grug`` (the model shapes of seed 000, the Grug attention perf report on a
GB10), ``quick`` (a fast bench pass), ``ci`` (small shapes for GPU tests), ``overhead`` (tiny problems, where the
host's cost per call is all there is). ``python -m attention.bench --list`` prints each suite, what it is, and its
cases.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .configs import FwdProblem


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    batch: int
    seq_q: int
    heads: int
    head_dim: int
    kv_heads: int | None = None  # None: same as heads
    seq_kv: int | None = None  # None: same as seq_q
    causal: bool = False
    window: tuple[int, int] | None = None
    segments: int = 0  # > 0: packed documents, about this many per sequence
    tags: tuple[str, ...] = ()

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def n_seq_kv(self) -> int:
        return self.seq_kv or self.seq_q

    def problem(self, dtype: str = "bf16") -> FwdProblem:
        return FwdProblem(batch=self.batch, seq_q=self.seq_q, seq_kv=self.n_seq_kv, heads=self.heads,
                          kv_heads=self.n_kv_heads, head_dim=self.head_dim, dtype=dtype, causal=self.causal,
                          window=self.window, segments=self.segments > 0)

    def flops(self) -> float:
        """The FLOP floor used for TFLOP/s: 4 * B * H * Sq * Skv * D (two matmuls), halved when causal.
        Windows and segment ids are not discounted: the figure stays comparable with dense attention."""
        f = 4.0 * self.batch * self.heads * self.seq_q * self.n_seq_kv * self.head_dim
        return f / 2 if self.causal else f

    def kwargs(self) -> dict:
        return {"causal": self.causal, "window": self.window}

    def segment_ids(self, seed: int = 0) -> np.ndarray | None:
        """int32 [batch, seq] ids of packed documents (sorted, contiguous), or None without segments."""
        if not self.segments:
            return None
        if self.n_seq_kv != self.seq_q:
            raise ValueError(f"{self.name}: segment ids need seq_q == seq_kv")
        return packed_segment_ids(self.batch, self.seq_q, self.segments, seed=seed)


def packed_segment_ids(batch: int, seq: int, segments: int, *, seed: int = 0) -> np.ndarray:
    """Random document boundaries (``segments`` documents per row at most), ids 0, 1, 2, ... along the row."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((batch, seq), dtype=np.int32)
    for b in range(batch):
        cuts = np.sort(rng.choice(np.arange(1, seq), size=min(segments - 1, seq - 1), replace=False))
        starts = np.zeros(seq, dtype=np.int32)
        starts[cuts] = 1
        ids[b] = np.cumsum(starts)
    return ids


_CASES = [
    # seed 004's table
    Case(name="seed004_b16_s2048_h16_d64", batch=16, seq_q=2048, heads=16, head_dim=64, tags=("seed004",)),
    Case(name="seed004_b32_s4096_h32_d128", batch=32, seq_q=4096, heads=32, head_dim=128, tags=("seed004",)),
    # seed 000 ("grug") model shapes, causal as in training
    Case(name="llama8b", batch=1, seq_q=4096, heads=32, kv_heads=8, head_dim=128, causal=True, tags=("grug",)),
    Case(name="llama8b_long", batch=1, seq_q=8192, heads=32, kv_heads=8, head_dim=128, causal=True,
         tags=("grug",)),
    Case(name="qwen", batch=4, seq_q=4096, heads=16, kv_heads=8, head_dim=128, causal=True, tags=("grug",)),
    Case(name="hb125m", batch=16, seq_q=2048, heads=8, kv_heads=8, head_dim=128, causal=True, tags=("grug",)),
    Case(name="hd256", batch=8, seq_q=2048, heads=4, kv_heads=4, head_dim=256, causal=True, tags=("grug",)),
    Case(name="swa_seg", batch=4, seq_q=4096, heads=16, kv_heads=8, head_dim=128, causal=True,
         window=(1024, 0), segments=4, tags=("grug",)),
    # quick bench pass
    Case(name="quick_d64", batch=4, seq_q=1024, heads=8, head_dim=64, tags=("quick",)),
    Case(name="quick_d128_causal", batch=4, seq_q=1024, heads=8, kv_heads=2, head_dim=128, causal=True,
         tags=("quick",)),
    Case(name="quick_d256", batch=2, seq_q=1024, heads=4, head_dim=256, tags=("quick",)),
    # small GPU-test shapes
    Case(name="ci_d64", batch=2, seq_q=257, heads=4, head_dim=64, tags=("ci",)),
    Case(name="ci_d128_gqa_causal", batch=2, seq_q=300, seq_kv=513, heads=8, kv_heads=2, head_dim=128,
         causal=True, tags=("ci",)),
    Case(name="ci_d256_window", batch=1, seq_q=333, heads=2, head_dim=256, window=(64, 32), tags=("ci",)),
    Case(name="ci_d128_segments", batch=2, seq_q=400, heads=4, kv_heads=1, head_dim=128, segments=3,
         tags=("ci",)),
    # launch overhead (seed 004: < 50 us per kernel launch): the kernels take a few microseconds, the host the rest
    *(Case(name=f"overhead_d{d}{'_causal' if causal else ''}", batch=1, seq_q=128, heads=8, head_dim=d,
           causal=causal, tags=("overhead",)) for d in (64, 128) for causal in (False, True)),
    Case(name="overhead_d128_gqa_causal", batch=1, seq_q=128, heads=8, kv_heads=2, head_dim=128, causal=True,
         tags=("overhead",)),
]
_BY_NAME = {c.name: c for c in _CASES}
assert len(_BY_NAME) == len(_CASES), "duplicate case names"


def all_cases() -> list[Case]:
    return list(_CASES)


def cases(tag: str) -> list[Case]:
    found = [c for c in _CASES if tag in c.tags]
    if not found:
        tags = sorted({t for c in _CASES for t in c.tags})
        raise ValueError(f"unknown suite tag {tag!r}; known tags: {', '.join(tags)}")
    return found


def get(name: str) -> Case:
    if name not in _BY_NAME:
        raise ValueError(f"unknown attention case {name!r}; known: {', '.join(_BY_NAME)}")
    return _BY_NAME[name]
