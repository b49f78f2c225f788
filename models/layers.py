"""The decoder-only transformer of ``models.configs``, three ways over one set of weights (torch CUDA tensors):

- ``OursModel``: RMSNorm (fused with the residual add) and rotary from kernels/norm_rope.cu (rotary inside the QKV
  projection's epilogue where the sm_90a tma tiles run), the projections and
  the dense SwiGLU FFN through ``moe.grouped_gemm`` as one group (``offsets=None``: no offsets read on the GPU
  before the first loads; the gate/up projection
  with the SwiGLU epilogue on interleaved gate/up rows), attention through ``attention.flash_attention`` (causal,
  GQA by strided views of the fused QKV output, nothing copied), the MoE FFN through ``moe.MoELayer``. Every op
  runs on torch's current stream with memory from torch's allocator, so a forward captures into a CUDA graph
  (``capture``).
- ``TorchModel(attention="naive")``: what a user writes in eager PyTorch: F.linear projections, attention as
  matmul -> causal mask -> softmax (fp32) -> matmul with K/V repeated for GQA, MoE as a per-expert loop (the
  counts copied to the host). ``TorchModel(attention="sdpa", moe="grouped")``: the best torch pieces:
  ``F.scaled_dot_product_attention`` (torch picks the backend), cuBLAS through F.linear, ``torch._grouped_mm`` for
  the experts; ``torch.compile`` of its forward is the bench's other baseline.

A forward takes the embedded hidden states ``[batch, seq, hidden]`` (bf16) and returns the final RMSNorm's output
of the same shape: the vocabulary is excluded (``models.configs``). ``probe(section)`` is a context manager per
op, ``"attention"``, ``"ffn"`` (the dense FFN or the MoE layer), ``"proj"`` (QKV and output projections) or
``"rest"`` (norms, rotary, residuals, copies): ``SectionTimer`` records CUDA events there for the op split.

Weights (``init_weights``), per layer: attn_norm, ffn_norm ``[hidden]``; w_qkv ``[1, (heads + 2 kv_heads) *
head_dim, hidden]`` (q rows, then k, then v); w_o ``[1, hidden, heads * head_dim]``; dense: w_gate_up ``[1, 2I,
hidden]`` (row 2j gate j, row 2j+1 up j: ``moe.interleave_gate_up``'s layout), w_down ``[1, hidden, I]``; MoE: the
same per expert ``[experts, ...]`` and router ``[hidden, experts]``. All bf16, in torch Linear layout.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math

from attention import flash_attention
from moe import MoELayer, gemm_configs, grouped_gemm
from moe.grouped_gemm import rotary_unavailable

from .configs import ModelConfig
from .norm_rope import rms_norm, rotary_, rotary_tables

try:
    import torch
    import torch.nn.functional as F

    from moe.torch import torch_moe_swiglu
except ImportError:  # configs and --list need no torch; building or running a model does
    torch = F = torch_moe_swiglu = None

SECTIONS = ("attention", "ffn", "proj", "rest")
_NULL = contextlib.nullcontext()


def no_probe(section: str):
    return _NULL


@dataclasses.dataclass(kw_only=True)
class LayerWeights:
    attn_norm: object
    w_qkv: object
    w_o: object
    ffn_norm: object
    w_gate_up: object
    w_down: object
    router: object = None  # MoE only


@dataclasses.dataclass(kw_only=True)
class Weights:
    layers: list
    final_norm: object


def init_weights(cfg: ModelConfig, *, seed: int = 0, device="cuda") -> Weights:
    """Random weights (normal, scaled by 1/sqrt(fan-in); norm gains 1 + 0.1 N(0, 1)), made on the GPU in fp32 and
    rounded to bf16, one tensor at a time."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, scale=1.0, offset=0.0):
        t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        return t.mul_(scale).add_(offset).to(torch.bfloat16)

    h, d, inter = cfg.hidden, cfg.head_dim, cfg.intermediate
    e = cfg.experts if cfg.ffn == "moe" else 1
    layers = []
    for _ in range(cfg.layers):
        layers.append(LayerWeights(
            attn_norm=randn(h, scale=0.1, offset=1.0),
            w_qkv=randn(1, cfg.qkv_width, h, scale=h ** -0.5),
            w_o=randn(1, h, cfg.heads * d, scale=(cfg.heads * d) ** -0.5),
            ffn_norm=randn(h, scale=0.1, offset=1.0),
            w_gate_up=randn(e, 2 * inter, h, scale=h ** -0.5),
            w_down=randn(e, h, inter, scale=inter ** -0.5),
            router=randn(h, cfg.experts, scale=h ** -0.5) if cfg.ffn == "moe" else None))
    return Weights(layers=layers, final_norm=randn(h, scale=0.1, offset=1.0))


class _Model:
    """What the three forwards share: the config, the weights and the rotary tables per sequence length."""

    def __init__(self, cfg: ModelConfig, weights: Weights):
        self.cfg, self.w = cfg, weights
        self._tables: dict = {}

    def tables(self, seq: int, like):
        """(cos, sin) float32 ``[seq, head_dim / 2]`` on like's device, made once per length (before a capture)."""
        key = (seq, like.device)
        if key not in self._tables:
            self._tables[key] = rotary_tables(seq, self.cfg.head_dim, self.cfg.rope_theta, like=like)
        return self._tables[key]

    def __call__(self, x, probe=no_probe):
        return self.forward(x, probe)


# ---------------------------------------------------------------- ours


class OursModel(_Model):
    name = "ours"

    def __init__(self, cfg: ModelConfig, weights: Weights):
        super().__init__(cfg, weights)
        # rotary in the QKV projection's epilogue where the tma tiles run (sm_90a), else its own kernel
        self._fused_rotary = rotary_unavailable() is None and cfg.head_dim in gemm_configs.ROPE
        self._moe = None
        if cfg.ffn == "moe":
            self._moe = [MoELayer(lw.router, lw.w_gate_up, lw.w_down, cfg.top_k) for lw in weights.layers]

    def forward(self, x, probe=no_probe):
        cfg = self.cfg
        batch, seq, hidden = x.shape
        tokens, heads, kv, d = batch * seq, cfg.heads, cfg.kv_heads, cfg.head_dim
        nh, eps = heads + 2 * kv, cfg.norm_eps
        off = None  # one group of all rows: the dense GEMM
        cos, sin = self.tables(seq, x)
        with probe("rest"):
            resid = x.reshape(tokens, hidden).clone()  # the residual stream, updated in place by the norms
        delta = None
        for i, lw in enumerate(self.w.layers):
            with probe("rest"):
                h = (rms_norm(resid, lw.attn_norm, eps=eps) if delta is None
                     else rms_norm(delta, lw.attn_norm, eps=eps, residual=resid))
            with probe("proj"):
                if self._fused_rotary:  # q and k rotated in the projection's epilogue
                    qkv = grouped_gemm(h, lw.w_qkv, off, rotary=(cos, sin, (heads + kv) * d))
                else:
                    qkv = grouped_gemm(h, lw.w_qkv, off)
            if not self._fused_rotary:
                with probe("rest"):
                    rotary_(qkv.view(tokens, nh, d), cos, sin, seq=seq, rot_heads=heads + kv)
            q4 = qkv.view(batch, seq, nh, d)
            with probe("attention"):
                o = flash_attention(q4[:, :, :heads], q4[:, :, heads:heads + kv], q4[:, :, heads + kv:], causal=True)
            with probe("proj"):
                delta = grouped_gemm(o.view(tokens, heads * d), lw.w_o, off)
            with probe("rest"):
                h = rms_norm(delta, lw.ffn_norm, eps=eps, residual=resid)
            with probe("ffn"):
                if self._moe is not None:
                    delta = self._moe[i](h)
                else:
                    delta = grouped_gemm(grouped_gemm(h, lw.w_gate_up, off, epilogue="swiglu"), lw.w_down, off)
        with probe("rest"):
            out = rms_norm(delta, self.w.final_norm, eps=eps, residual=resid)
        return out.view(batch, seq, hidden)

    def capture(self, x) -> "CapturedForward":
        return CapturedForward(self, x)


class CapturedForward:
    """One forward of ``model`` on a fixed input shape captured with ``torch.cuda.graph``; ``replay()`` runs it on
    ``input`` (a copy of x made at capture; ``input.copy_(x)`` feeds new values) and returns ``output``. Two
    eager forwards on a side stream first compile, plan and make every constant (offsets, rotary tables)."""

    def __init__(self, model: _Model, x):
        self.input = x.clone()
        side = torch.cuda.Stream(device=x.device)
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                model(self.input)
        torch.cuda.current_stream(x.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.output = model(self.input)

    def replay(self):
        self.graph.replay()
        return self.output


# ---------------------------------------------------------------- torch


def torch_rms_norm(x, weight, eps: float):
    """fp32 statistics, the output rounded to x's dtype (as the kernel)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def torch_rotary(t, cos, sin):
    """neox half-rotation of t ``[batch, seq, heads, head_dim]`` in fp32, rounded once (as the kernel)."""
    half = t.shape[-1] // 2
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    a, b = t[..., :half].float(), t[..., half:].float()
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1).to(t.dtype)


class TorchModel(_Model):
    """Eager torch; ``attention``: "naive" (matmul-softmax-matmul) or "sdpa"; ``moe``: "loop" (per expert, counts
    on the host) or "grouped" (``torch._grouped_mm``)."""

    def __init__(self, cfg: ModelConfig, weights: Weights, *, attention: str = "naive", moe: str = "loop"):
        if attention not in ("naive", "sdpa") or moe not in ("loop", "grouped"):
            raise ValueError(f"attention must be naive or sdpa, moe loop or grouped; got {attention!r}, {moe!r}")
        super().__init__(cfg, weights)
        self.attention_kind, self.moe_kind = attention, moe
        self._masks: dict = {}
        if cfg.ffn == "moe":
            self._routers = [lw.router.float() for lw in weights.layers]  # logits in fp32, as MoELayer's

    def attention(self, q, k, v):
        """q ``[batch, seq, heads, d]``, k/v ``[batch, seq, kv_heads, d]`` -> ``[batch, seq, heads, d]``, causal."""
        group = q.shape[2] // k.shape[2]
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        if group > 1:
            kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
        if self.attention_kind == "sdpa":
            return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True).transpose(1, 2)
        seq = q.shape[1]
        key = (seq, q.device)
        if key not in self._masks:
            self._masks[key] = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
        scores = torch.matmul(qh, kh.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        scores = scores.masked_fill(self._masks[key], float("-inf"))
        p = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.matmul(p, vh).transpose(1, 2)

    def dense_ffn(self, h, lw):
        gu = F.linear(h, lw.w_gate_up[0])
        return F.linear(F.silu(gu[:, 0::2]) * gu[:, 1::2], lw.w_down[0])

    def moe_ffn(self, h, i: int, lw):
        return torch_moe_swiglu(h, h.float() @ self._routers[i], self.cfg.top_k, lw.w_gate_up, lw.w_down,
                                grouped=self.moe_kind == "grouped")

    def forward(self, x, probe=no_probe):
        cfg = self.cfg
        batch, seq, hidden = x.shape
        tokens, heads, kv, d = batch * seq, cfg.heads, cfg.kv_heads, cfg.head_dim
        eps = cfg.norm_eps
        cos, sin = self.tables(seq, x)
        resid = x.reshape(tokens, hidden)
        for i, lw in enumerate(self.w.layers):
            with probe("rest"):
                h = torch_rms_norm(resid, lw.attn_norm, eps)
            with probe("proj"):
                qkv = F.linear(h, lw.w_qkv[0]).view(batch, seq, heads + 2 * kv, d)
            with probe("rest"):
                q = torch_rotary(qkv[:, :, :heads], cos, sin)
                k = torch_rotary(qkv[:, :, heads:heads + kv], cos, sin)
            with probe("attention"):
                o = self.attention(q, k, qkv[:, :, heads + kv:])
            with probe("proj"):
                a = F.linear(o.reshape(tokens, heads * d), lw.w_o[0])
            with probe("rest"):
                resid = resid + a
                h = torch_rms_norm(resid, lw.ffn_norm, eps)
            with probe("ffn"):
                f = self.moe_ffn(h, i, lw) if cfg.ffn == "moe" else self.dense_ffn(h, lw)
            with probe("rest"):
                resid = resid + f
        with probe("rest"):
            out = torch_rms_norm(resid, self.w.final_norm, eps)
        return out.view(batch, seq, hidden)


# ---------------------------------------------------------------- op split


class SectionTimer:
    """CUDA events around each probed op of one forward, summed per section (``SECTIONS``) after a sync. The
    events themselves cost a little host time per op; the split is of one instrumented forward."""

    def __init__(self):
        self._pairs: list = []

    @contextlib.contextmanager
    def __call__(self, section: str):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        self._pairs.append((section, start, end))

    def totals_ms(self) -> dict[str, float]:
        torch.cuda.synchronize()
        out = dict.fromkeys(SECTIONS, 0.0)
        for section, start, end in self._pairs:
            out[section] += start.elapsed_time(end)
        return out
