"""Views of bench results: a GitHub-markdown table (tabulate), JSON with the environment, a markdown report."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Sequence

from tabulate import tabulate

from . import bench
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


def _sustained_cells(r: Result) -> dict:
    """The columns of a run with ``--sustained``: the call back to back for seconds (bench.run(sustained_s))."""
    st = r.sustained if r.ok else None
    if not st or st.get("ms_per_call") is None:
        return dict.fromkeys(("sustained µs/call", "mJ/call", "W", "SM MHz", "x best baseline sustained"), "")
    x = st.get("speedup_vs_best_baseline")
    return {
        "sustained µs/call": f"{1e3 * st['ms_per_call']:,.1f}" + (" THROTTLED" if st.get("throttled") else ""),
        "mJ/call": _fmt(st.get("mj_per_call"), ",.2f"),
        "W": _fmt(st.get("power_w"), ".0f"),
        "SM MHz": _fmt(st.get("sm_clock_mean_mhz"), ".0f"),
        "x best baseline sustained": "" if x is None else f"{x:.2f} ({st.get('best_baseline')})",
    }


def rows(results: Sequence[Result]) -> list[dict]:
    sustained = any(r.sustained for r in results)
    out = []
    for r in results:
        if r.ok:
            timing = f"{r.median_ms:.4f} ±{100 * r.rel_noise:.1f}%" + (" THROTTLED" if r.throttled else "")
            if r.clocks.get("held") is False:
                timing += " host-incl"  # an implementation of this case synchronises: all timed with host time
            called = _fmt(r.as_called_ms, ".4f")
            host = "" if r.host_us is None else f"{r.host_us:.1f}" + ("" if r.host_us_held else " syncs")
            if not bench.host_consistent(r.host_us, r.as_called_ms, r.host_us_held):
                host += " > called"  # over the wall time per call in every take: the host was disturbed
        else:
            timing, called, host = f"{r.status}: {r.reason[:80]}", "", ""
        out.append({
            "case": r.case,
            "impl": r.impl,
            "median ms": timing,
            "as called ms": called,
            "host µs": host,  # "syncs": the call waits for the device, timed unheld with the wait included
            "TFLOP/s": _fmt(r.tflops, ".1f"),
            "GB/s": _fmt(r.gbs, ",.0f"),
            "% peak": _fmt(r.pct_peak, ".0f"),
            "x best baseline": "" if r.speedup_vs_best_baseline is None
            else f"{r.speedup_vs_best_baseline:.2f} ({r.best_baseline})",
            "max abs / rel err": _error_cell(r),
            "peak MiB": _mib(r.peak_memory_bytes),
            **(_sustained_cells(r) if sustained else {}),
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


def launch_overhead_line(overhead: dict | None) -> str:
    """``score.launch_overhead`` as the line printed after the table."""
    if overhead is None:
        return ""
    o = overhead
    verdict = (f"target < {o['target_us']:g} µs: {o['verdict']}" if o["target_us"] is not None
               else "no expected table, no target")
    line = (f"kernel launch overhead (seed 004): {o['measured_us']:.1f} µs per kernel launch, the host µs per call "
            f"of {o['rows']} rows of {', '.join(o['impls'])} over the {o['launches']} kernels they launch "
            f"({o['per_call_us']:.1f} µs per call); {verdict}")
    if o["uncounted_rows"]:
        line += f" ({o['uncounted_rows']} rows without a launch count: one launch each)"
    if o["unheld_rows"]:
        line += f" ({o['unheld_rows']} rows wait for the device: their host µs includes the wait)"
    return line


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


def plots(results: Sequence[Result], cases: dict, out_dir: Path) -> list[Path]:
    """PNG plots (matplotlib): throughput per case and implementation, speedup over the best baseline, and
    throughput against sequence length when the cases vary it. Returns the files written ([] without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: --plot needs matplotlib (pip install 'cukernels[plot]'); no plots written")
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    ok = [r for r in results if r.ok]
    case_names = list(dict.fromkeys(r.case for r in ok))
    impl_names = list(dict.fromkeys(r.impl for r in ok))
    written = []
    metric, label = ("tflops", "TFLOP/s") if any(r.tflops for r in ok) else ("gbs", "GB/s")

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(case_names)), 4))
    width = 0.8 / max(1, len(impl_names))
    for k, impl in enumerate(impl_names):
        vals = [next((getattr(r, metric) or 0 for r in ok if r.case == c and r.impl == impl), 0) for c in case_names]
        ax.bar([i + k * width for i in range(len(case_names))], vals, width, label=impl)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(case_names))], case_names, rotation=30, ha="right")
    ax.set_ylabel(label)
    ax.legend()
    ax.set_title(f"{label} by case")
    fig.tight_layout()
    written.append(out_dir / f"{metric}_by_case.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    ours = [r for r in ok if not r.baseline and r.speedup_vs_best_baseline]
    if ours:
        fig, ax = plt.subplots(figsize=(max(6, 1.0 * len(ours)), 4))
        ax.bar([f"{r.case}\n{r.impl}" for r in ours], [r.speedup_vs_best_baseline for r in ours])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel("speedup over the best baseline (x)")
        ax.tick_params(axis="x", labelsize=7)
        fig.tight_layout()
        written.append(out_dir / "speedup.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

    seqs = {c: cases[c].params.get("seq") or cases[c].params.get("seq_q") for c in case_names if c in cases}
    if len({v for v in seqs.values() if v}) > 2:
        fig, ax = plt.subplots(figsize=(6, 4))
        for impl in impl_names:
            pts = sorted((seqs[r.case], getattr(r, metric)) for r in ok if r.impl == impl and seqs.get(r.case))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.set_ylabel(label)
        ax.legend()
        fig.tight_layout()
        written.append(out_dir / f"{metric}_vs_seq.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def markdown(results: Sequence[Result], scores: Sequence[dict], env: dict, path: Path, *, title: str, command: str,
             expected_note: str, plots_dir: str | None = None, extra: str = "") -> None:
    """A report in the spirit of seed 003's template: hardware, command, tables, plots, notes on noise/throttling."""
    ok = [r for r in results if r.ok]
    noisy = [r for r in ok if (r.rel_noise or 0) > 0.02]
    throttled = [r for r in ok if r.throttled]
    clocks = [r.clocks for r in ok if r.clocks.get("sm_clock_min_mhz")]
    lines = [f"# {title}", "", "## Hardware and software", "", environment_markdown(env), "",
             "## Command", "", f"```\n{command}\n```", "", f"Expected values: {expected_note}.", "",
             "## Results", "", table(results, scores), ""]
    if extra:
        lines += ["", extra, ""]
    if plots_dir:
        pngs = sorted(Path(plots_dir).glob("*.png"))
        if pngs:
            lines += ["## Plots", ""]
            rel_base = path.parent.resolve()
            for png in pngs:
                try:
                    rel = png.resolve().relative_to(rel_base)
                except ValueError:
                    rel = png.resolve()
                lines.append(f"![{png.stem}]({rel})")
            lines.append("")
    lines += ["## Noise and throttling", ""]
    unheld = sorted({r.case for r in ok if r.clocks.get("held") is False})
    lines.append("- Times are device time (the stream is held until the work is enqueued) except in cases where an "
                 "implementation synchronises the host; there every implementation includes host time "
                 f"(\"host-incl\"): {', '.join(unheld) or 'none'}.")
    lines.append("- \"as called ms\" is the wall time per call of back-to-back calls with one synchronisation at "
                 "the end (no flush, nothing held): what a user gets. \"host µs\" is the host's time per call, taken "
                 "with the stream held (the Python and launch cost); \"syncs\" marks a call that waits for the device, "
                 "timed without the hold.")
    lines.append(f"- Relative noise (half the p20–p80 spread over the median; rows timed in rounds: below): "
                 f"median over rows {100 * _median([r.rel_noise or 0 for r in ok]):.1f}%; {len(noisy)} rows above 2%.")
    pooled = [r for r in ok if r.round_medians_ms]
    if pooled:
        worst = max(pooled, key=lambda r: r.round_noise or 0)
        lines.append(f"- {len(pooled)} rows (host-incl, unsettled by one round, or throttled) were timed in "
                     f"{len(worst.round_medians_ms)} rounds spread over the run; their noise is the larger of the "
                     "samples' spread and half the range of the round medians over the median (widest: "
                     f"{worst.case} / {worst.impl}, rounds "
                     f"{', '.join(f'{m:.4f}' for m in worst.round_medians_ms)} ms, ±{100 * worst.round_noise:.1f}%).")
    if clocks:
        lines.append(f"- SM clock during timing: {min(c['sm_clock_min_mhz'] for c in clocks)}–"
                     f"{max(c['sm_clock_max_mhz'] for c in clocks)} MHz.")
    reasons = sorted({x for r in ok for x in r.clocks.get("throttle_reasons", [])})
    lines.append(f"- Throttle reasons seen: {', '.join(reasons) or 'none'}; rows with a power/thermal slowdown: "
                 f"{len(throttled)}.")
    failed = [r for r in results if r.status in ("failed-check", "error")]
    if failed:
        lines += ["", "## Failures", ""] + [f"- {r.case} / {r.impl}: {r.status}: {r.reason}" for r in failed]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else 0.0
