"""What the A/B tools (tools/layer_ab.py, tools/decode_ab.py) share: a variant is ``NAME[:item,item,...]`` where an
item is ``module.attr=value`` (a Python literal set on that module attribute for the variant), ``-DMACRO=V`` (the
variant's kernels built with that preprocessor definition) or a tool's own ``key=value`` forcing; ``Attributes``
sets a variant's attributes and puts the tree's values back."""
from __future__ import annotations

import ast
import importlib
from typing import Callable


def parse_variant(text: str, special: Callable[[str, str, str], tuple | None] | None = None
                  ) -> tuple[str, list[tuple[str, str, object]]]:
    """``NAME[:item,...]`` -> (name, [(module, attr, value) | ("define", "-DMACRO=V", None) | special's tuple]).
    ``special(item, key, value)`` claims a tool's own ``key=value`` items (returning its tuple) or passes (None);
    anything else must be ``module.attr=literal``."""
    name, _, body = text.partition(":")
    sets = []
    for item in filter(None, body.split(",")):
        item = item.strip()
        if item.startswith("-D"):  # a preprocessor definition for the variant's kernel builds
            sets.append(("define", item, None))
            continue
        target, eq, value = (part.strip() for part in item.partition("="))
        claimed = special(item, target, value) if special is not None and eq else None
        if claimed is not None:
            sets.append(claimed)
            continue
        module, dot, attr = target.rpartition(".")
        if not (eq and dot and module and attr):
            raise SystemExit(f"--variant {text!r}: expected NAME[:module.attr=value,...], got {item!r}")
        try:
            literal = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise SystemExit(f"--variant {text!r}: {value!r} is not a Python literal") from None
        sets.append((module, attr, literal))
    return name, sets


def defines(sets) -> tuple[str, ...]:
    """A variant's ``-DMACRO=V`` items."""
    return tuple(a for m, a, _ in sets if m == "define")


class Attributes:
    """The module attributes any variant sets: ``apply(sets)`` puts every one back to the tree's value, then sets
    this variant's; ``restore()`` puts them all back. ``kinds``: the tuples' first fields that are not modules
    (``define`` and the tool's own)."""

    def __init__(self, variants: dict, kinds: tuple[str, ...] = ("define",)):
        self.kinds = kinds
        self.saved = {(m, a): getattr(importlib.import_module(m), a) for sets in variants.values()
                      for m, a, _ in sets if m not in kinds}

    def restore(self) -> None:
        for (m, a), v in self.saved.items():
            setattr(importlib.import_module(m), a, v)

    def apply(self, sets) -> None:
        self.restore()
        for m, a, v in sets:
            if m not in self.kinds:
                setattr(importlib.import_module(m), a, v)


def rotated(names: list, r: int) -> list:
    """Round ``r``'s order of the variants: the list rotated by ``r``, so no variant always runs first or after the
    same one."""
    k = r % len(names)
    return names[k:] + names[:k]


def compare_outputs(outs: dict, ref: str) -> dict:
    """``outs``: variant -> [first output, second output] (bf16 bits): each first output's rel L2 against the
    reference variant's and whether it is bitwise equal to it, and whether each variant gave the same bits twice."""
    import cupy

    from cukernels import dtypes

    f32 = dtypes.bf16_to_float32
    base = f32(outs[ref][0])
    return {"rel_l2_vs_" + ref: {n: float(cupy.linalg.norm(f32(o[0]) - base) / cupy.linalg.norm(base))
                                 for n, o in outs.items()},
            "bitwise_vs_" + ref: {n: bool((o[0] == outs[ref][0]).all()) for n, o in outs.items()},
            "same_over_calls": {n: bool((o[0] == o[1]).all()) for n, o in outs.items()}}


def time_rounds(fns: dict, rounds: int, *, rep_ms: int = 100, sustained_s: float = 0.0) -> dict:
    """Every function of ``fns`` (name -> fn) timed in ``rounds`` rounds, the order ``rotated`` each round and
    0.3 s between measurements: triton's do_bench (``rep_ms``; its L2 flush is a write) and the engine's held timer
    (L2 flushed by a read), in us; with ``sustained_s`` > 0 the first two rounds also call it back to back for
    that long (``cukernels.timing.sustained``: time and energy per call where the card settles at its power limit)."""
    import time

    import triton

    from cukernels import timing

    out = {"do_bench_us": {n: [] for n in fns}, "held_us": {n: [] for n in fns}, "sustained": {n: [] for n in fns}}
    for r in range(rounds):
        for name in rotated(list(fns), r):
            time.sleep(0.3)
            fn = fns[name]
            out["do_bench_us"][name].append(round(triton.testing.do_bench(fn, warmup=25, rep=rep_ms) * 1e3, 2))
            out["held_us"][name].append(round(timing.benchmark(fn, budget_ms=60).median_ms * 1e3, 2))
            if r < 2 and sustained_s > 0:
                out["sustained"][name].append(timing.sustained(fn, sustained_s))
    return out
