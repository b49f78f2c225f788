"""Mixture-of-experts building blocks: fused top-k routing with load-balance statistics, the stable permutation
of token slots by expert, gather into expert order and the weighted combine back to tokens."""
from .dispatch import Dispatch, combine, gather, permute
from .routing import SCORINGS, Routing, route

__all__ = ["Routing", "Dispatch", "route", "permute", "gather", "combine", "SCORINGS"]
