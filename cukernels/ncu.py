"""``--ncu`` and ``--nsys`` on the benches: Nsight Compute metrics of our kernels, scored against seed 004.

``--ncu`` re-runs the bench itself for one case under Nsight Compute (``ncu --target-processes all --kernel-name
regex:... --launch-skip N --launch-count M --metrics ... --csv``), once per target (attention forward and
backward; grouped GEMM and router), collects per kernel SM throughput, tensor-pipe utilisation, DRAM throughput,
achieved occupancy and L2 hit rate, and scores them against seed 004's "Profiling Metrics" utilisation targets
(``TARGETS``, with their provenance). With no ``ncu`` on PATH it says so and exits 0. ``--nsys`` runs the bench
under Nsight Systems and writes a timeline (``.nsys-rep``) plus the kernel summary, or says that ``nsys`` is
missing.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent

# what we report -> the ncu metric names that stand for it, in order; a kernel's value is the first reported one,
# except the tensor pipe: mma.sync kernels load the hmma pipe, Hopper's wgmma kernels the gmma pipe, so the larger
# of the two that ncu reports is the kernel's tensor utilisation
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sm": ("SM throughput %", ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)),
    "tensor": ("tensor pipe %", ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                                 "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active")),
    "dram": ("DRAM throughput %", ("dram__throughput.avg.pct_of_peak_sustained_elapsed",
                                   "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed")),
    "occupancy": ("achieved occupancy %", ("sm__warps_active.avg.pct_of_peak_sustained_active",)),
    "l2_hit": ("L2 hit rate %", ("lts__t_sector_hit_rate.pct",)),
}
_MAX_OF = {"tensor"}

# Seed 004 ("Expected Benchmark Results"), section "Profiling Metrics": the "Compute Utilization" table (target SM
# and tensor-core utilisation per operation) and the "Memory Bandwidth" table (target bandwidth utilisation). The
# seed gives no target for occupancy or the L2 hit rate: they are reported, not scored. Which of our kernels is
# which operation is this project's reading: the attention kernels are "Flash Attention"; the grouped expert GEMM
# is "MoE GEMM" for compute and "Large GEMM" for bandwidth (the profiled case is 8192 x 11008 x 4096); routing
# (moe_route, moe_route_finish, moe_permute_scatter) is "Router", which has no bandwidth row; the backward's
# preprocess and dQ conversion and MoE gather/combine are "Element-wise ops" (bandwidth only).
PROVENANCE = ("seed 004 (/work/shared/seeds/004_*.txt, 'Profiling Metrics': 'Compute Utilization' and 'Memory "
              "Bandwidth' tables); operation of each kernel: cukernels/ncu.py ROLES")
TARGETS: dict[str, dict] = {
    "attention": {"operation": "Flash Attention", "sm": 60.0, "tensor": 70.0, "dram": 70.0},
    "moe_gemm": {"operation": "MoE GEMM (bandwidth: Large GEMM)", "sm": 80.0, "tensor": 85.0, "dram": 80.0},
    "router": {"operation": "Router", "sm": 40.0, "tensor": None, "dram": None},
    "elementwise": {"operation": "Element-wise ops", "sm": None, "tensor": None, "dram": 75.0},
}
ROLES: tuple[tuple[str, str], ...] = (
    (r"flash_bwd_preprocess|flash_bwd_dq_convert|moe_gather|moe_combine", "elementwise"),
    (r"flash_fwd|flash_bwd|flash_decode", "attention"),
    (r"moe_grouped_gemm", "moe_gemm"),
    (r"moe_route|moe_permute", "router"),
)


def role(kernel: str) -> str | None:
    for pattern, name in ROLES:
        if re.search(pattern, kernel):
            return name
    return None


# ---------------------------------------------------------------- parsing ncu's CSV


def _number(text: str) -> float | None:
    t = (text or "").strip().replace(",", "")
    if not t or t.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


def _csv_lines(text: str) -> list[str]:
    """The CSV part of ncu's stdout: from the header (``"ID",...``) on, lines that start with a quote (the
    profiled program's own output and ``==PROF==`` lines interleave with it)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    return [line for line in lines[start:] if line.startswith('"')]


def parse_csv(text: str) -> list[dict]:
    """Kernel launches in ncu's CSV (``--csv``; the default "details" page, one row per metric, or ``--page
    raw``, one row per launch with a units row): ``[{"id", "kernel", "metrics": {name: value}}]`` in launch
    order. Values with thousands separators parse; "n/a" and unparsable ones are left out."""
    lines = _csv_lines(text)
    if not lines:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    kernel_col = col.get("Kernel Name", col.get("Function Name"))
    if kernel_col is None:
        return []
    launches: dict[str, dict] = {}
    if "Metric Name" in col and "Metric Value" in col:  # details page: one metric per row
        for r in body:
            if len(r) < len(header) or r[0] == header[0]:
                continue
            launch = launches.setdefault(r[col["ID"]], {"id": r[col["ID"]], "kernel": r[kernel_col], "metrics": {}})
            value = _number(r[col["Metric Value"]])
            if value is not None:
                launch["metrics"][r[col["Metric Name"]]] = value
    else:  # raw page: metric names as columns, a units row first
        metric_cols = [(i, name) for i, name in enumerate(header) if "__" in name]
        for r in body:
            if len(r) < len(header) or not r[col["ID"]].strip() or r[0] == header[0]:
                continue
            launches[r[col["ID"]]] = {"id": r[col["ID"]], "kernel": r[kernel_col],
                                      "metrics": {name: v for i, name in metric_cols
                                                  if (v := _number(r[i])) is not None}}
    return list(launches.values())


def summarize(metrics: dict[str, float]) -> dict[str, float | None]:
    """Our five figures from one launch's ncu metrics (see ``METRICS``)."""
    out: dict[str, float | None] = {}
    for key, (_, names) in METRICS.items():
        values = [metrics[n] for n in names if n in metrics]
        out[key] = (max(values) if key in _MAX_OF else values[0]) if values else None
    return out


def score(kernel: str, figures: dict[str, float | None]) -> dict:
    """Each figure against seed 004's target for the kernel's operation: "meets" or "below" (">= target"), "" where
    the seed has no target or ncu gave no figure."""
    name = role(kernel)
    target = TARGETS.get(name or "", {})
    out = {"role": name, "operation": target.get("operation", ""), "targets": {}, "verdicts": {}}
    for key in ("sm", "tensor", "dram"):
        t, v = target.get(key), figures.get(key)
        out["targets"][key] = t
        out["verdicts"][key] = "" if t is None or v is None else ("meets" if v >= t else "below")
    return out


# ---------------------------------------------------------------- running ncu / nsys


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    """One ncu run: the bench with ``bench_args`` (one case), profiling ``launch_count`` launches of the kernels
    matching ``kernel_regex`` after skipping ``launch_skip`` (the check call and the first warm-up)."""

    name: str
    bench_args: Sequence[str]
    kernel_regex: str
    launch_skip: int = 2
    launch_count: int = 1


_QUIET = ["--budget-ms", "30", "--rounds", "1", "--expected", "none"]  # the profiled run only needs the launches


def ncu_command(exe: str, module: str, target: Target, metrics: Sequence[str]) -> list[str]:
    return [exe, "--target-processes", "all", "--kernel-name", f"regex:{target.kernel_regex}",
            "--launch-skip", str(target.launch_skip), "--launch-count", str(target.launch_count),
            "--metrics", ",".join(metrics), "--csv", sys.executable, "-m", module, *target.bench_args, *_QUIET]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def all_metric_names() -> list[str]:
    return [n for _, names in METRICS.values() for n in names]


_UNKNOWN = re.compile(r"[Ff]ailed to find metrics?:?\s*\"?([A-Za-z0-9_.]+)")


def profile(exe: str, module: str, target: Target, *, timeout: int = 900) -> dict:
    """Run one target under ncu; metric names this ncu/GPU does not know are dropped and the run repeated. A run
    past ``timeout`` seconds, or one that exits non-zero (ncu passes on the bench's status: a failed check is 1),
    is reported in ``error``."""
    metrics = all_metric_names()
    for _ in range(3):
        cmd = ncu_command(exe, module, target, metrics)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=ROOT)
        except subprocess.TimeoutExpired:
            return {"target": target.name, "command": " ".join(cmd), "returncode": None, "launches": [], "csv": "",
                    "error": f"ncu ran past its {timeout} s timeout and was stopped; nothing was profiled"}
        text = proc.stdout + "\n" + proc.stderr
        unknown = set(_UNKNOWN.findall(text)) & set(metrics)
        if unknown and len(unknown) < len(metrics):
            metrics = [m for m in metrics if m not in unknown]
            continue
        break
    launches = parse_csv(proc.stdout)
    error = ""
    if "ERR_NVGPUCTRPERM" in text:
        error = ("ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM): run as root or allow "
                 "profiling for all users (NVreg_RestrictProfilingToAdminUsers=0)")
    elif not launches:
        error = f"ncu profiled no kernel matching {target.kernel_regex!r} (exit {proc.returncode}): " + \
            " | ".join(line for line in text.splitlines() if "ERROR" in line or "WARN" in line)[:400]
    elif proc.returncode != 0:
        error = f"the profiled run exited {proc.returncode} (its kernels' figures are below): " + \
            " | ".join(line for line in text.splitlines() if "ERROR" in line or "FAIL" in line)[:400]
    return {"target": target.name, "command": " ".join(cmd), "returncode": proc.returncode, "launches": launches,
            "csv": "\n".join(_csv_lines(proc.stdout)), "error": error}


def rows_of(profiled: Sequence[dict]) -> list[dict]:
    rows = []
    for p in profiled:
        if p["error"]:
            rows.append({"target": p["target"], "kernel": "", "error": p["error"]})
        for launch in p["launches"]:
            figures = summarize(launch["metrics"])
            rows.append({"target": p["target"], "kernel": launch["kernel"], "figures": figures,
                         **score(launch["kernel"], figures)})
    return rows


def _pct(v) -> str:
    return "" if v is None else f"{v:.1f}"


def table(rows: Sequence[dict]) -> str:
    from tabulate import tabulate

    out = []
    for r in rows:
        if "error" in r:
            out.append({"target": r["target"], "kernel": f"ERROR: {r['error']}"[:120]})
            continue
        f, t, v = r["figures"], r["targets"], r["verdicts"]

        def cell(key):
            if t.get(key) is None:
                return _pct(f[key])
            return f"{_pct(f[key])} ({v[key] or 'n/a'} >{t[key]:g})"
        kernel = r["kernel"].split("(")[0]
        out.append({"target": r["target"], "kernel": kernel[:70], "seed 004 operation": r["operation"],
                    METRICS["sm"][0]: cell("sm"), METRICS["tensor"][0]: cell("tensor"),
                    METRICS["dram"][0]: cell("dram"), METRICS["occupancy"][0]: _pct(f["occupancy"]),
                    METRICS["l2_hit"][0]: _pct(f["l2_hit"])})
    if not out:
        return "(no kernels profiled)"
    keys = list(dict.fromkeys(k for r in out for k in r))
    return tabulate([{k: r.get(k, "") for k in keys} for r in out], headers="keys", tablefmt="github",
                    disable_numparse=True)


NO_NCU = ("ncu (Nsight Compute) is not on PATH, so nothing was profiled. Install Nsight Compute (it ships with the "
          "CUDA toolkit, or `apt install nsight-compute`) and put `ncu` on PATH, then run this again.")
NO_NSYS = ("nsys (Nsight Systems) is not on PATH, so no timeline was written. Install Nsight Systems (`apt install "
           "nsight-systems`, or from the CUDA toolkit) and put `nsys` on PATH, then run this again.")


def add_arguments(parser) -> None:
    g = parser.add_argument_group("profiling (cukernels/ncu.py)")
    g.add_argument("--ncu", action="store_true",
                   help="re-run this bench for one case under Nsight Compute and score our kernels' SM, tensor-pipe "
                        "and DRAM utilisation against seed 004's targets (--json PATH writes them)")
    g.add_argument("--nsys", metavar="PREFIX", nargs="?", const="cukernels_timeline",
                   help="run this bench under Nsight Systems and write PREFIX.nsys-rep (a timeline) and the kernel "
                        "summary")


def requested(ob, argv) -> bool:
    from . import cli

    args = cli.parser_for(ob).parse_args(argv)
    return bool(getattr(args, "ncu", False) or getattr(args, "nsys", None))


def _is_nsys(arg: str) -> bool:
    """``--nsys`` or an abbreviation of it that argparse accepts (``--nsy``), with or without ``=value``."""
    name = arg.split("=", 1)[0]
    return len(name) > 2 and "--nsys".startswith(name)


def _without_nsys(argv: Sequence[str]) -> list[str]:
    """``argv`` less ``--nsys [PREFIX]`` in any spelling argparse accepts, so the child is not profiled again."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if _is_nsys(a):
            skip = "=" not in a and i + 1 < len(argv) and not argv[i + 1].startswith("-")
            continue
        out.append(a)
    return out


def run_nsys(ob, argv: Sequence[str], prefix: str, exe: str | None = None) -> int:
    from . import cli

    exe = exe or shutil.which("nsys")
    if exe is None:
        print(f"{ob.prog}: {NO_NSYS}", file=sys.stderr)
        return cli.EXIT_OK
    module = ob.prog.split()[-1]
    cmd = [exe, "profile", "--trace", "cuda,nvtx,osrt", "--force-overwrite", "true", "-o", prefix,
           sys.executable, "-m", module, *_without_nsys(argv)]
    print("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, env=_env(), cwd=os.getcwd())
    rep = Path(prefix + ".nsys-rep")
    if proc.returncode != 0 or not rep.exists():
        print(f"{ob.prog}: nsys exited {proc.returncode}; no timeline at {rep}", file=sys.stderr)
        return cli.EXIT_FAILED
    stats = subprocess.run([exe, "stats", "--report", "cuda_gpu_kern_sum", "--force-export", "true", str(rep)],
                           capture_output=True, text=True)
    if stats.returncode == 0:
        Path(prefix + "_kernels.txt").write_text(stats.stdout)
        print(stats.stdout[-6000:])
        print(f"kernel summary: {prefix}_kernels.txt")
    print(f"timeline: {rep} (open it in Nsight Systems)")
    return cli.EXIT_OK


def run_cli(ob, argv: Sequence[str] | None, targets: Callable, *, exe: str | None = None) -> int:
    """``--ncu`` / ``--nsys`` of a bench (``targets(cases, args)``: its ``Target`` list)."""
    from . import cli, device, environment

    argv = list(sys.argv[1:] if argv is None else argv)
    args = cli.parser_for(ob).parse_args(argv)
    try:
        _, cases = cli._check_options(ob, args)
    except cli.UsageError as exc:
        return cli.usage_error(ob.prog, exc)
    if args.nsys:
        return run_nsys(ob, argv, args.nsys)
    exe = exe or shutil.which("ncu")
    if exe is None:
        print(f"{ob.prog}: {NO_NCU}", file=sys.stderr)
        return cli.EXIT_OK
    if not device.gpu_available():
        return cli.no_gpu(ob.prog, "Nsight Compute profiles kernels on a GPU.")
    module = ob.prog.split()[-1]
    profiled = []
    for t in targets(cases, args):
        print(f"ncu: {t.name} ...", file=sys.stderr, flush=True)
        profiled.append(profile(exe, module, t))
    rows = rows_of(profiled)
    print(f"{ob.prog} --ncu: {device.current().name}; targets: {PROVENANCE}")
    print(table(rows))
    print("cells: measured % (meets/below seed 004's target); occupancy and L2 hit rate have no seed target")
    if args.json:
        doc = {"environment": environment.collect(), "provenance": PROVENANCE, "targets": TARGETS,
               "metrics": {k: list(names) for k, (_, names) in METRICS.items()}, "rows": rows, "runs": profiled}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
        print(f"json: {args.json}")
    return cli.EXIT_FAILED if any(p["error"] for p in profiled) else cli.EXIT_OK
