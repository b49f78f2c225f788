"""Mixture-of-experts building blocks: fused top-k routing with load-balance statistics, the stable permutation
of token slots by expert, gather into expert order, the grouped expert GEMM on tensor cores (SwiGLU / GELU /
row-scale epilogues), the weighted combine back to tokens, and ``MoELayer`` that chains them."""
from .dispatch import Dispatch, combine, gather, permute
from .grouped_gemm import grouped_gemm, interleave_gate_up
from .layer import MoELayer
from .routing import SCORINGS, Routing, route

__all__ = ["Routing", "Dispatch", "route", "permute", "gather", "combine", "SCORINGS", "grouped_gemm",
           "interleave_gate_up", "MoELayer"]
