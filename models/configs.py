"""Model configurations and the named cases of ``python -m models.bench``.

Seed 004's "End-to-End Inference Benchmarks" name three decoder-only models by layers, hidden size and heads
alone. What else a forward needs is an assumption, stated here once (``ModelConfig.assumptions``) and repeated in
the provenance of the expected rows (expected_results/*.toml, ``[[end_to_end]]``):

- bf16 weights and activations, fp32 accumulation; a prefill forward (causal self-attention over the whole
  sequence, every sequence of a batch the same length), no KV cache written, no backward;
- vocabulary excluded: the input is the embedded hidden states ``[batch, seq, hidden]``, the output the final
  RMSNorm's; no embedding lookup, no LM head (the seed gives no vocabulary size);
- pre-norm Llama-style blocks: RMSNorm -> fused QKV projection -> rotary (neox half-rotation, theta 10000) ->
  causal attention -> output projection -> residual; RMSNorm -> FFN -> residual; no biases;
- multi-head attention (kv_heads = heads: the seed states no GQA), head_dim = hidden / heads;
- dense SwiGLU FFN, intermediate = 8/3 * hidden rounded up to a multiple of 256 (the Llama rule: 2048, 5632 and
  11008 for small, medium and large).

``medium-moe`` is not a seed row: the medium model with GQA (4 KV heads) and a mixture-of-experts FFN, 8 SwiGLU
experts of intermediate 2816, top-2 (the active FFN FLOPs of dense medium), for the MoE path end to end.
``tiny`` and ``tiny-moe`` are the test models (tests/test_models_gpu.py).
"""
from __future__ import annotations

import dataclasses
import math

FFN_KINDS = ("swiglu", "moe")
GEMM_MULTIPLE = 16  # N and K of every projection: moe.grouped_gemm needs multiples of 8 (16 for the SwiGLU N)


def llama_intermediate(hidden: int, multiple: int = 256) -> int:
    """8/3 * hidden rounded up to a multiple of ``multiple`` (Llama's FFN width rule)."""
    return multiple * math.ceil(8 * hidden / 3 / multiple)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: str  # "swiglu" (dense) or "moe"
    intermediate: int  # FFN width (per expert for "moe")
    experts: int = 0
    top_k: int = 0
    dtype: str = "bf16"
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    seed_row: bool = False  # one of seed 004's three models

    def __post_init__(self):
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def qkv_width(self) -> int:
        """Output width of the fused QKV projection: q heads, then k heads, then v heads."""
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    def validate(self) -> None:
        if self.ffn not in FFN_KINDS:
            raise ValueError(f"{self.name}: ffn must be one of {FFN_KINDS}, got {self.ffn!r}")
        if min(self.layers, self.hidden, self.heads, self.kv_heads, self.intermediate) < 1:
            raise ValueError(f"{self.name}: layers, hidden, heads, kv_heads, intermediate must be >= 1")
        if self.hidden % self.heads:
            raise ValueError(f"{self.name}: hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if self.head_dim not in (64, 128, 256):
            raise ValueError(f"{self.name}: head_dim {self.head_dim} is not one flash attention takes (64, 128, 256)")
        for what, n in (("hidden", self.hidden), ("intermediate", self.intermediate)):
            if n % GEMM_MULTIPLE:
                raise ValueError(f"{self.name}: {what} {n} must be a multiple of {GEMM_MULTIPLE} (grouped GEMM N/K)")
        if self.ffn == "moe" and not 1 <= self.top_k <= self.experts:
            raise ValueError(f"{self.name}: an MoE FFN needs 1 <= top_k <= experts, got {self.top_k}, {self.experts}")
        if self.ffn == "swiglu" and (self.experts or self.top_k):
            raise ValueError(f"{self.name}: a dense FFN has no experts")
        if self.dtype != "bf16":
            raise ValueError(f"{self.name}: only bf16 models are built, got {self.dtype!r}")

    def params(self) -> int:
        """Weights of the layers and the final norm (no embedding, no LM head)."""
        h, d = self.hidden, self.head_dim
        attn = h * self.qkv_width + self.heads * d * h + 2 * h
        ffn = 3 * h * self.intermediate
        if self.ffn == "moe":
            ffn = self.experts * ffn + h * self.experts
        return self.layers * (attn + ffn) + h

    def flops(self, batch: int, seq: int) -> float:
        """Matmul FLOPs of one prefill forward: projections, FFN (active experts only), causal attention counted
        as half of the full QK^T and PV (what a causal kernel does)."""
        tokens = batch * seq
        h, d = self.hidden, self.head_dim
        proj = 2.0 * tokens * (h * self.qkv_width + self.heads * d * h)
        active = self.top_k if self.ffn == "moe" else 1
        ffn = 2.0 * tokens * active * 3 * h * self.intermediate
        router = 2.0 * tokens * h * self.experts
        attn = 0.5 * 4.0 * batch * self.heads * seq * seq * d
        return self.layers * (proj + ffn + router + attn)

    def assumptions(self) -> str:
        """What the forward assumes beyond layers/hidden/heads, in a sentence (also in the expected tables)."""
        attn = "MHA" if self.kv_heads == self.heads else f"GQA {self.heads} q / {self.kv_heads} kv heads"
        ffn = (f"dense SwiGLU FFN, intermediate {self.intermediate}" if self.ffn == "swiglu" else
               f"MoE FFN, {self.experts} SwiGLU experts of intermediate {self.intermediate}, top-{self.top_k} "
               "(softmax, renormalised)")
        return (f"{self.dtype} prefill forward (causal), pre-norm RMSNorm (eps {self.norm_eps:g}), fused QKV, "
                f"rotary neox theta {self.rope_theta:g}, {attn}, head_dim {self.head_dim}, {ffn}, no biases, "
                "vocabulary excluded (hidden states in and out, no embedding or LM head)")


def _dense(name: str, layers: int, hidden: int, heads: int, **kw) -> ModelConfig:
    return ModelConfig(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn="swiglu",
                       intermediate=llama_intermediate(hidden), **kw)


MODELS: dict[str, ModelConfig] = {m.name: m for m in (
    _dense("small", 12, 768, 12, seed_row=True),
    _dense("medium", 24, 2048, 16, seed_row=True),
    _dense("large", 32, 4096, 32, seed_row=True),
    ModelConfig(name="medium-moe", layers=24, hidden=2048, heads=16, kv_heads=4, ffn="moe", intermediate=2816,
                experts=8, top_k=2),
    _dense("tiny", 2, 256, 4),
    ModelConfig(name="tiny-moe", layers=2, hidden=256, heads=4, kv_heads=2, ffn="moe", intermediate=384, experts=4,
                top_k=2),
)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelCase:
    model: ModelConfig
    batch: int
    seq: int
    tags: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.model.name}_b{self.batch}_s{self.seq}"

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


# seed 004's rows (batch, seq) per model; medium-moe runs the medium model's
_SHAPES = {"small": ((1, 128), (4, 512), (16, 2048)), "medium": ((1, 128), (4, 512), (8, 1024)),
           "large": ((1, 128), (4, 512), (8, 2048)), "medium-moe": ((1, 128), (4, 512), (8, 1024)),
           "tiny": ((2, 64),), "tiny-moe": ((2, 64),)}

CASES: dict[str, ModelCase] = {}
for _name, _shapes in _SHAPES.items():
    for _b, _s in _shapes:
        _m = MODELS[_name]
        _c = ModelCase(model=_m, batch=_b, seq=_s, tags=("seed004",) if _m.seed_row else ("extra",))
        CASES[_c.name] = _c

SEED004 = [c for c in CASES.values() if "seed004" in c.tags]
QUICK = [CASES["small_b1_s128"]]
BENCH_MODELS = ("small", "medium", "large", "medium-moe")  # what --model accepts (tiny ones are for the tests)


def model(name: str) -> ModelConfig:
    if name not in MODELS:
        raise KeyError(f"no model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name]


def cases_of(names) -> list[ModelCase]:
    """The cases of the named models, in registry order."""
    wanted = set(names)
    return [c for c in CASES.values() if c.model.name in wanted]
