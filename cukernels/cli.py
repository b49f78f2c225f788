"""The command line shared by ``python -m attention.bench`` and ``python -m moe.bench``.

An op describes itself with an ``OpBench`` (its suites, implementations, plan rows, expected-table kind); this
module does the rest: options, plan mode with no GPU, the check-then-time loop, scoring against the expected
table (each row, and the run's kernel launch overhead), and the table / JSON / markdown / plot outputs.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from tabulate import tabulate

from . import bench, device, environment, report, score


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpBench:
    prog: str
    description: str
    op: Callable[[argparse.Namespace], bench.Op]
    suites: Sequence[str]
    default_suite: str
    cases: Callable[[str, argparse.Namespace], list[bench.Case]]  # (suite, args) -> cases
    impls: Callable[[argparse.Namespace], list[bench.Impl]]  # every implementation this op knows
    default_impls: Sequence[str]
    plan_rows: Callable[[list[bench.Case], device.DeviceSpec, bool], list[dict]]  # (cases, spec, compile)
    plan_of: Callable[[bench.Case], str | None] = lambda case: None  # the chosen config, for results
    expected_kind: str = ""  # rows of the expected table ("attention", "moe", "gemm")
    # per implementation, the expected-row fields that hold its expected time (first present wins)
    expected_fields: dict[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    reference_impl: str | None = None  # the live reference for "percent of reference" and grades
    reference_of: Callable[[bench.Case], str | None] | None = None  # per case, when it depends on the case
    # (kind, row name) of a case in the expected table; default (expected_kind, case.name)
    expected_key: Callable[[bench.Case], tuple[str, str] | None] | None = None
    add_arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None
    extra_output: Callable[[list[bench.Result], argparse.Namespace], str] = lambda results, args: ""


def parser_for(ob: OpBench) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=ob.prog, description=ob.description)
    p.add_argument("--suite", default=ob.default_suite, choices=list(ob.suites), help="named case suite")
    p.add_argument("--case", action="append", help="only cases whose name contains this (repeatable)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"], help="element type")
    p.add_argument("--impl", default=",".join(ob.default_impls),
                   help="comma-separated implementations, or 'all' (default: %(default)s)")
    p.add_argument("--plan", action="store_true", help="show the planner's choice per case and exit (no GPU needed)")
    p.add_argument("--profile", help=f"with --plan: a GPU profile ({', '.join(device.profile_names())})")
    p.add_argument("--compile", action="store_true", help="with --plan: compile each variant offline (regs, spills)")
    p.add_argument("--expected", default="auto",
                   help=f"expected table: auto, none, or one of {', '.join(score.table_names()) or '(none)'}")
    p.add_argument("--json", metavar="PATH", help="write results and environment as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write a markdown report")
    p.add_argument("--plot", metavar="DIR", help="write PNG plots (needs matplotlib)")
    p.add_argument("--budget-ms", type=float, default=300.0, help="timing budget per implementation and case")
    p.add_argument("--rounds", type=int, default=bench.ROUNDS,
                   help="rounds, spread over the run, of a row timed with host time or unsettled by its first round; "
                        "its noise includes the spread of their medians (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the inputs")
    ob.add_arguments(p)
    return p


def _select_impls(ob: OpBench, args) -> list[bench.Impl]:
    known = {i.name: i for i in ob.impls(args)}
    names = list(known) if args.impl == "all" else [n.strip() for n in args.impl.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"error: --impl {','.join(unknown)}: unknown; known: {', '.join(known)}, all")
    return [known[n] for n in names]


def _cases(ob: OpBench, args) -> list[bench.Case]:
    cases = ob.cases(args.suite, args)
    if args.case:
        cases = [c for c in cases if any(s in c.name for s in args.case)]
        if not cases:
            raise SystemExit(f"error: --case {args.case}: no case of suite {args.suite} matches")
    return cases


def _plan(ob: OpBench, args) -> int:
    if args.profile:
        try:
            spec = device.profile(args.profile)
        except device.UnknownProfileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    elif device.gpu_available():
        spec = device.current()
    else:
        print("error: --plan with no GPU needs --profile NAME; known: " + ", ".join(device.profile_names()),
              file=sys.stderr)
        return 2
    rows = ob.plan_rows(_cases(ob, args), spec, args.compile)
    print(f"{ob.prog} --plan: {spec.name} ({spec.key or 'live'}, {spec.arch}), "
          f"shared memory limit {spec.smem_per_block_optin:,} B per block")
    print(tabulate(rows, headers="keys", tablefmt="github", disable_numparse=True))
    return 0


def score_rows(ob: OpBench, results: list[bench.Result], spec: device.DeviceSpec, cases: dict[str, bench.Case],
               table: score.Table | None) -> list[dict]:
    """Expected value, verdict, percent of reference and grade for every result row."""
    def ref_name(case_name: str) -> str | None:
        case = cases.get(case_name)
        return ob.reference_of(case) if (ob.reference_of and case) else ob.reference_impl

    def expected_row(case: bench.Case | None) -> dict | None:
        if table is None or case is None:
            return None
        key = ob.expected_key(case) if ob.expected_key else ((ob.expected_kind, case.name) if ob.expected_kind
                                                             else None)
        return table.find(*key) if key else None

    live_ref = {r.case: r for r in results if r.ok and r.impl == ref_name(r.case)}
    out = []
    for r in results:
        row: dict[str, Any] = {"expected ms": "", "vs expected": "", "% of ref": "", "grade": ""}
        case = cases.get(r.case)
        exp = expected_row(case)
        if exp is not None and r.ok and case is not None:
            fields = ob.expected_fields.get(r.impl, ("expected_ms",))
            expected_ms = next((exp[f] for f in fields if f in exp), None)
            if expected_ms is not None:
                pl = score.plausibility(expected_ms, flops=case.flops, bytes_moved=case.bytes, spec=spec,
                                        dtype=case.dtype)
                row["expected ms"] = f"{expected_ms:g}"
                if pl.level == "implausible":
                    row["vs expected"] = f"IMPLAUSIBLE: {pl.arithmetic}"
                else:
                    row["vs expected"] = score.verdict(r.median_ms, r.rel_noise or 0.0, expected_ms)
                    if pl.level == "doubtful":
                        row["vs expected"] += f" (expected is doubtful: {pl.arithmetic})"
        ref = live_ref.get(r.case)
        if r.ok and not r.baseline and ref is not None:
            frac = ref.median_ms / r.median_ms
            row["% of ref"] = f"{100 * frac:.0f}% of {ref.impl}"
            row["grade"] = score.grade(frac, table.grades if table else None)
        out.append(row)
    return out


def main(ob: OpBench, argv: Sequence[str] | None = None) -> int:
    args = parser_for(ob).parse_args(argv)
    if args.plan:
        return _plan(ob, args)
    if args.profile or args.compile:
        print("error: --profile and --compile go with --plan", file=sys.stderr)
        return 2
    if not device.gpu_available():
        print(f"No CUDA GPU is visible to CuPy, so nothing can be measured here. To see what this GPU-less machine "
              f"can check: `{ob.prog} --plan --profile h200 --compile` (profiles: {', '.join(device.profile_names())}).",
              file=sys.stderr)
        return 0
    impls = _select_impls(ob, args)
    cases = _cases(ob, args)
    spec = device.current()
    table = score.select_table(spec, args.expected)
    t0 = time.perf_counter()
    if args.rounds < 1:
        print(f"error: --rounds {args.rounds}: needs at least 1", file=sys.stderr)
        return 2
    results = bench.run(ob.op(args), cases, impls, seed=args.seed, budget_ms=args.budget_ms,
                        rounds=args.rounds, plan_of=ob.plan_of)
    env = environment.collect()
    by_name = {c.name: c for c in cases}
    extra = score_rows(ob, results, spec, by_name, table)
    print(f"{ob.prog}: suite {args.suite}, {args.dtype}, {spec.name}; "
          f"{'expected: ' + table.note if table else 'no expected table'}; {time.perf_counter() - t0:.0f} s")
    print(report.table(results, extra))
    overhead = score.launch_overhead(results, table)
    more = "\n\n".join(x for x in (report.launch_overhead_line(overhead), ob.extra_output(results, args)) if x)
    if more:
        print(more)
    if any(r.throttled for r in results):
        print("note: some rows ran with the clock pulled down (power/thermal): marked THROTTLED")
    if args.json:
        report.to_json(results, env, args.json, suite=args.suite, expected_table=table.note if table else None,
                       scores=extra, launch_overhead=overhead)
    if args.plot:
        for path in report.plots(results, by_name, Path(args.plot)):
            print(f"plot: {path}")
    if args.markdown:
        report.markdown(results, extra, env, Path(args.markdown), title=f"{ob.prog} --suite {args.suite}",
                        command=" ".join([ob.prog, *(argv if argv is not None else sys.argv[1:])]),
                        expected_note=table.note if table else "no expected table", plots_dir=args.plot,
                        extra=more)
        print(f"report: {args.markdown}")
    failed = [r for r in results if r.status in ("failed-check", "error") and not r.baseline]
    return 1 if failed else 0
