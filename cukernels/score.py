"""Expected tables per GPU, scoring, grades and plausibility.

``expected_results/<gpu>.toml`` holds expected timings with their provenance (seed 004's tables for H100, A100
and A10; measured runs for H200). The GPU is matched through its profile; a profile may name a fallback table
(H200 -> H100), and the output says so. Each measured row gets: the expected value, a verdict against it
(SAME / FASTER / SLOWER within the measured noise), the percent of the reference and a grade by the table's
boundaries. An expected entry that would need more than the device's peak FLOP/s or bandwidth is marked
implausible, with the arithmetic, instead of being used. The run as a whole gets seed 004's kernel launch overhead
line (``launch_overhead``).
"""
from __future__ import annotations

import dataclasses
import functools
import tomllib
from importlib import resources

from .device import DeviceSpec

DEFAULT_GRADES = {"A": 0.80, "B": 0.70, "C": 0.60, "D": 0.40}  # seed 004, "Grade Boundaries"


@functools.cache
def _tables() -> dict[str, dict]:
    out = {}
    for entry in resources.files("expected_results").iterdir():
        if entry.name.endswith(".toml"):
            doc = tomllib.loads(entry.read_text())
            out[doc["gpu"]] = doc
    return out


def table_names() -> list[str]:
    return sorted(_tables())


@dataclasses.dataclass(frozen=True)
class Table:
    key: str
    doc: dict
    note: str  # how it was chosen, e.g. "no H200 table; using h100_sxm (fallback)"

    def rows(self, kind: str) -> list[dict]:
        return list(self.doc.get(kind, []))

    def find(self, kind: str, case: str) -> dict | None:
        for row in self.rows(kind):
            if row.get("case") == case:
                return row
        return None

    @property
    def grades(self) -> dict[str, float]:
        g = self.doc.get("grades", {})
        return {k: float(g[k]) for k in ("A", "B", "C", "D") if k in g} or dict(DEFAULT_GRADES)


def select_table(spec: DeviceSpec | None, choice: str = "auto") -> Table | None:
    """``auto``: the table of the device's profile, else its documented fallback; ``none``; or a table name."""
    tables = _tables()
    if choice == "none":
        return None
    if choice != "auto":
        if choice not in tables:
            raise ValueError(f"--expected {choice!r}: no such table; known: {', '.join(sorted(tables))}, auto, none")
        return Table(choice, tables[choice], f"table {choice} (asked for)")
    if spec is None or spec.key is None:
        return None
    if spec.key in tables:
        return Table(spec.key, tables[spec.key], f"table {spec.key} (matches the GPU)")
    fb = spec.expected_fallback
    if fb and fb in tables:
        return Table(fb, tables[fb], f"no table for {spec.key}; using {fb} as its documented fallback")
    return None


def grade(fraction_of_reference: float | None, boundaries: dict[str, float] | None = None) -> str:
    """Seed 004's grade: A > 80 % of the reference, B > 70 %, C > 60 %, D > 40 %, else F."""
    if fraction_of_reference is None:
        return ""
    for letter, bound in sorted((boundaries or DEFAULT_GRADES).items(), key=lambda kv: -kv[1]):
        if fraction_of_reference > bound:
            return letter
    return "F"


def verdict(measured_ms: float, rel_noise: float, expected_ms: float) -> str:
    """SAME when the expected time lies within the measured noise band (at least 2 %), else FASTER/SLOWER."""
    band = max(rel_noise, 0.02) * measured_ms
    if abs(measured_ms - expected_ms) <= band:
        return "SAME"
    return "FASTER" if measured_ms < expected_ms else "SLOWER"


# Dense GEMMs through cuBLAS reach about 70-80 % of the datasheet tensor peak (H200 here: 680-750 of 989 TFLOP/s,
# docs/results/h200/anchors-2026-11-21.json); an expected time that needs more than this share of the peak is
# doubtful, more than the peak is impossible.
ACHIEVABLE_FRACTION = 0.80


@dataclasses.dataclass(frozen=True)
class Plausibility:
    level: str  # "plausible" | "doubtful" | "implausible"
    arithmetic: str

    @property
    def plausible(self) -> bool:
        return self.level != "implausible"


def plausibility(expected_ms: float, *, flops: float, bytes_moved: float, spec: DeviceSpec,
                 dtype: str = "bf16") -> Plausibility:
    """Does ``expected_ms`` need more than the device's peak FLOP/s or bandwidth (implausible), or more than
    ``ACHIEVABLE_FRACTION`` of it (doubtful)? The arithmetic comes with the answer."""
    if spec.peaks is None or expected_ms <= 0:
        return Plausibility("plausible", "no peaks known for this device")
    seconds = expected_ms * 1e-3
    shares, parts = [], []
    if flops and spec.peaks.tflops(dtype) > 0:
        need, peak = flops / seconds / 1e12, spec.peaks.tflops(dtype)
        shares.append(need / peak)
        parts.append(f"{flops / 1e12:.2f} TFLOP in {expected_ms:g} ms = {need:.0f} TFLOP/s, "
                     f"{100 * need / peak:.0f}% of the {peak:.0f} TFLOP/s {dtype} peak")
    if bytes_moved and spec.peaks.mem_bandwidth_gbs > 0:
        need, peak = bytes_moved / seconds / 1e12, spec.peaks.mem_bandwidth_gbs / 1e3
        shares.append(need / peak)
        parts.append(f"{bytes_moved / 1e9:.2f} GB in {expected_ms:g} ms = {need:.2f} TB/s, "
                     f"{100 * need / peak:.0f}% of the {peak:.2f} TB/s peak")
    worst = max(shares, default=0.0)
    level = "implausible" if worst > 1.0 else "doubtful" if worst > ACHIEVABLE_FRACTION else "plausible"
    return Plausibility(level, "; ".join(parts) or "no work counted")


def launch_overhead(results, table: Table | None) -> dict | None:
    """Seed 004's "average kernel launch overhead < 50 µs", graded from the run: the host time our calls spend per
    kernel they launch, i.e. the host µs per call (``Result.host_us``) summed over every passing row of our
    implementations (not the baselines) over the kernels those calls launch (``Result.launches``; a row without a
    count counts as one launch), beside the mean host µs per call. Run on an ``overhead`` suite, whose problems
    are tiny, the host cost is all a call costs; on other suites it is the same cost beside larger kernels. None
    when no such row was measured; no verdict without an expected table."""
    ours = [r for r in results if r.ok and not r.baseline and r.host_us is not None]
    if not ours:
        return None
    target = table.doc.get("utilisation", {}).get("kernel_launch_overhead_target_us") if table else None
    launches = sum(max(r.launches or 0, 1) for r in ours)
    measured = sum(r.host_us for r in ours) / launches
    return {"measured_us": measured, "per_call_us": sum(r.host_us for r in ours) / len(ours), "launches": launches,
            "target_us": target, "rows": len(ours), "impls": sorted({r.impl for r in ours}),
            "uncounted_rows": sum(not r.launches for r in ours),
            "unheld_rows": sum(r.host_us_held is False for r in ours),
            "verdict": "" if target is None else "PASS" if measured < target else "FAIL"}
