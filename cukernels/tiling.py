"""Tile configs and the planner protocol.

A config is a frozen, keyword-only dataclass that knows its own cost (``smem_bytes()``, ``threads``) and its
template instance (``name_expression(...)``). A planner turns a problem and a ``DeviceSpec`` into a ``Plan``:
the chosen config, its shared-memory bytes against the device's opt-in limit, and why it was chosen. No plan
ever exceeds the limit: ``choose`` walks candidates in preference order and takes the first that fits, and a
tuned override from the profile is validated against the same limit (a bad override raises).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

from .device import DeviceSpec


class PlanError(ValueError):
    """No config fits the device, or a requested/overridden config does not."""


@runtime_checkable
class TileConfig(Protocol):
    @property
    def threads(self) -> int: ...

    def smem_bytes(self) -> int: ...

    def name_expression(self, **kw: Any) -> str: ...


@runtime_checkable
class Planner(Protocol):
    def __call__(self, problem: Any, spec: DeviceSpec) -> "Plan": ...


def fits(config: TileConfig, spec: DeviceSpec) -> str | None:
    """None when ``config`` fits ``spec``, else the reason it does not. A config built on arch-specific
    instructions names its target in ``needs_arch`` (e.g. ``"sm_90a"`` for wgmma) and fits nowhere else."""
    needs = getattr(config, "needs_arch", None)
    if needs is not None and spec.arch != needs:
        return f"needs {needs}, {spec.name} compiles for {spec.arch}"
    smem = config.smem_bytes()
    if smem > spec.smem_per_block_optin:
        return f"{smem:,} B shared memory > {spec.smem_per_block_optin:,} B per block on {spec.name}"
    if config.threads > spec.max_threads_per_block:
        return f"{config.threads} threads > {spec.max_threads_per_block} per block on {spec.name}"
    return None


def check_fits(config: TileConfig, spec: DeviceSpec) -> None:
    if (why := fits(config, spec)) is not None:
        raise PlanError(f"{config} does not fit: {why}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    config: Any
    smem_bytes: int
    limit: int
    reason: str
    source: str = "heuristic"  # or "profile override"

    def __str__(self) -> str:
        return (
            f"{self.config} | smem {self.smem_bytes:,} / {self.limit:,} B "
            f"({100 * self.smem_bytes / self.limit:.0f}%) | {self.source}: {self.reason}"
        )


def choose(candidates: Iterable[TileConfig], spec: DeviceSpec, *, reason: str) -> Plan:
    """The first candidate, in preference order, that fits ``spec``."""
    rejected = []
    for config in candidates:
        why = fits(config, spec)
        if why is None:
            note = reason if not rejected else f"{reason}; skipped {len(rejected)}, first: {rejected[0]}"
            return Plan(config=config, smem_bytes=config.smem_bytes(), limit=spec.smem_per_block_optin, reason=note)
        rejected.append(f"{config} ({why})")
    raise PlanError(f"no tile config fits {spec.name}: " + "; ".join(rejected or ["no candidates"]))


def override(spec: DeviceSpec, op: str, make_config: Callable[[dict], TileConfig]) -> Plan | None:
    """A tuned config for ``op`` from the device's profile, validated like any other; None when there is none."""
    raw = spec.overrides.get(op)
    if raw is None:
        return None
    try:
        config = make_config(dict(raw))
    except (TypeError, ValueError) as exc:
        raise PlanError(f"profile {spec.key!r} override for {op!r} is invalid: {exc}") from exc
    check_fits(config, spec)
    return Plan(
        config=config,
        smem_bytes=config.smem_bytes(),
        limit=spec.smem_per_block_optin,
        reason=f"tuned for {spec.key} in profiles/{spec.key}.toml [overrides.{op}]",
        source="profile override",
    )
