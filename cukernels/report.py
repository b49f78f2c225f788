"""Views of bench results: a GitHub-markdown table (tabulate), JSON with the environment, a markdown report."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Sequence

from tabulate import tabulate

from .bench import Result


def _fmt(value, spec: str, missing: str = "") -> str:
    return missing if value is None else format(value, spec)


def _mib(n: int | None) -> str:
    return "" if n is None else f"{n / 2**20:,.0f}"


def _error_cell(r: Result) -> str:
    if not r.checks:
        return ""
    worst = max(r.checks, key=lambda c: c["max_abs"])
    verdict = "ok" if all(c["passed"] for c in r.checks) else "FAIL"
    return f"{worst['max_abs']:.2g} / {worst['max_rel']:.2g} {verdict}"


def rows(results: Sequence[Result]) -> list[dict]:
    out = []
    for r in results:
        if r.ok:
            timing = f"{r.median_ms:.4f} ±{100 * r.rel_noise:.1f}%" + (" THROTTLED" if r.throttled else "")
        else:
            timing = f"{r.status}: {r.reason[:80]}"
        out.append({
            "case": r.case,
            "impl": r.impl,
            "median ms": timing,
            "TFLOP/s": _fmt(r.tflops, ".1f"),
            "GB/s": _fmt(r.gbs, ",.0f"),
            "% peak": _fmt(r.pct_peak, ".0f"),
            "x best baseline": "" if r.speedup_vs_best_baseline is None
            else f"{r.speedup_vs_best_baseline:.2f} ({r.best_baseline})",
            "max abs / rel err": _error_cell(r),
            "peak MiB": _mib(r.peak_memory_bytes),
        })
    return out


def table(results: Sequence[Result], extra: Sequence[dict] | None = None) -> str:
    """GitHub-markdown table; ``extra`` adds columns row by row (e.g. expected value, verdict, grade)."""
    data = rows(results)
    if extra is not None:
        data = [{**row, **more} for row, more in zip(data, extra)]
    if not data:
        return "(no results)"
    return tabulate(data, headers="keys", tablefmt="github", disable_numparse=True)


def to_json(results: Sequence[Result], environment: dict, path: str | Path | None = None, **meta) -> str:
    doc = {"environment": environment, **meta, "results": [dataclasses.asdict(r) for r in results]}
    text = json.dumps(doc, indent=1, default=str)
    if path is not None:
        Path(path).write_text(text)
    return text


def environment_markdown(env: dict) -> str:
    gpu = env.get("gpu") or {}
    nvml = env.get("nvml") or {}
    versions = env.get("versions") or {}
    lines = [
        f"- GPU: {gpu.get('name', 'none')} (profile {gpu.get('profile')}, sm_{''.join(map(str, gpu.get('compute_capability', [])))}, "
        f"{gpu.get('sm_count', '?')} SMs, {gpu.get('smem_per_block_optin', 0):,} B shared memory per block opt-in, "
        f"{gpu.get('l2_bytes', 0) / 2**20:.0f} MiB L2)",
        f"- Driver {nvml.get('driver', '?')}, CUDA runtime {versions.get('cuda_runtime', '?')}, NVRTC {versions.get('nvrtc', '?')}, "
        f"CuPy {versions.get('cupy', '?')}" + (f", torch {versions['torch']}" if "torch" in versions else ""),
        f"- Clocks: SM max {nvml.get('sm_clock_max_mhz', '?')} MHz, power limit {nvml.get('power_limit_w', '?')} W",
        f"- Revision {env.get('git_revision')}, measured {env.get('date')}",
    ]
    return "\n".join(lines)
