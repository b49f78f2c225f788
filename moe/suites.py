"""Named MoE shapes, shared by the tests and ``python -m moe.bench``. No shape is typed twice.

A shape with ``hidden`` also exercises gather and combine (expert rows of ``hidden`` elements), one with
``intermediate`` the whole layer. Seed 004's MoE configuration is hidden 4096, intermediate 11008, 32 experts,
top-2, at batch x sequence 4x512, 16x2048, 32x2048. The ``overhead`` shape is tiny: a call of it costs its host time.
``python -m moe.bench --list`` prints each suite, what it is, and its cases.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoEShape:
    name: str
    tokens: int
    experts: int
    top_k: int
    hidden: int | None = None
    intermediate: int | None = None
    route_alone: bool = False  # also a case of routing without the permutation
    layer_only: bool = False  # the whole layer alone (decode sizes: the pieces are all host time)
    tags: tuple[str, ...] = ()


def _seed004(batch: int, seq: int) -> MoEShape:
    return MoEShape(name=f"seed004_b{batch}x{seq}", tokens=batch * seq, experts=32, top_k=2, hidden=4096,
                    intermediate=11008, tags=("seed004", "primary"))


# Decode-sized layers (issue 14): a 64-expert top-8 model (hidden 2048, intermediate 1408: the expert size of
# Qwen1.5-MoE / DeepSeek-V2-Lite class models) and seed 004's configuration, at 1-256 tokens per step
DECODE_TOKENS = (1, 4, 16, 64, 256)


def _decode(tokens: int, label: str, experts: int, top_k: int, hidden: int, inter: int) -> MoEShape:
    return MoEShape(name=f"decode_{label}_T{tokens}", tokens=tokens, experts=experts, top_k=top_k, hidden=hidden,
                    intermediate=inter, layer_only=True, tags=("decode",))


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmShape:
    """A grouped GEMM: ``rows`` x ``n`` x ``k`` split over ``experts`` groups ("one", "equal" or "random" sizes)."""

    name: str
    rows: int
    n: int
    k: int
    experts: int
    split: str
    tags: tuple[str, ...] = ()


def _gemm(split: str, experts: int = 32) -> GemmShape:
    experts = 1 if split == "one" else experts
    return GemmShape(name=f"gemm_8192x11008x4096_{'1group' if split == 'one' else f'E{experts}_{split}'}",
                     rows=8192, n=11008, k=4096, experts=experts, split=split, tags=("gemm", "primary"))


# The projections of models.bench's dense models (one group: QKV, output, gate/up, down of medium and large) at
# 128 tokens (weight-bound), 2048 and 8192: where a 128 x 256 tile grid leaves SMs idle
_DENSE_MODELS = {"medium": (2048, 5632, 6144), "large": (4096, 11008, 12288)}  # (hidden, intermediate, qkv):
# models.configs (tests/test_models_cpu.py checks they agree)


def _dense() -> list[GemmShape]:
    out = []
    for model, (hidden, inter, qkv) in _DENSE_MODELS.items():
        for rows in (128, 2048, 8192):
            for what, n, k in (("qkv", qkv, hidden), ("o", hidden, hidden), ("gateup", 2 * inter, hidden),
                               ("down", hidden, inter)):
                out.append(GemmShape(name=f"dense_{model}_{what}_M{rows}", rows=rows, n=n, k=k, experts=1,
                                     split="one", tags=("dense",)))
    return out


SHAPES: tuple[MoEShape | GemmShape, ...] = (
    MoEShape(name="route_T32768_E32_top2", tokens=32768, experts=32, top_k=2, tags=("routing", "primary")),
    MoEShape(name="route_T32768_E256_top8", tokens=32768, experts=256, top_k=8, tags=("routing", "primary")),
    _seed004(4, 512),
    _seed004(16, 2048),
    _seed004(32, 2048),
    _gemm("one"),
    _gemm("equal", 8),
    _gemm("random", 8),
    _gemm("equal"),
    _gemm("random"),
    GemmShape(name="quick_gemm_1000x512x256_E8", rows=1000, n=512, k=256, experts=8, split="random",
              tags=("quick",)),
    MoEShape(name="quick_T256_E8_top2", tokens=256, experts=8, top_k=2, hidden=256, tags=("quick", "ci")),
    MoEShape(name="quick_T1000_E60_top4", tokens=1000, experts=60, top_k=4, hidden=384, tags=("quick", "ci")),
    MoEShape(name="ci_T4096_E256_top8", tokens=4096, experts=256, top_k=8, hidden=1024, tags=("ci",)),
    *(_decode(t, "E64top8", 64, 8, 2048, 1408) for t in DECODE_TOKENS),
    *(_decode(t, "seed004", 32, 2, 4096, 11008) for t in DECODE_TOKENS),
    # launch overhead (seed 004: < 50 us per kernel launch): every piece and the layer, on problems the kernels finish at once
    MoEShape(name="overhead_T16_E8_top2", tokens=16, experts=8, top_k=2, hidden=256, intermediate=512,
             route_alone=True, tags=("overhead",)),
    *_dense(),
)

SUITES = {
    "quick": "quick",
    "ci": "ci",
    "routing": "routing",
    "seed004": "seed004",
    "primary": "primary",
    "gemm": "gemm",
    "dense": "dense",
    "overhead": "overhead",
    "decode": "decode",
}


def suite_names() -> list[str]:
    return [*SUITES, "all"]


def suite(name: str) -> list[MoEShape | GemmShape]:
    if name == "all":
        return list(SHAPES)
    if name not in SUITES:
        raise ValueError(f"unknown MoE suite {name!r}; known: {', '.join(suite_names())}")
    return [s for s in SHAPES if SUITES[name] in s.tags]


def shape(name: str) -> MoEShape:
    for s in SHAPES:
        if s.name == name:
            return s
    raise ValueError(f"unknown MoE shape {name!r}; known: {', '.join(s.name for s in SHAPES)}")
