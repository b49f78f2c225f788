"""The command line shared by ``python -m attention.bench`` and ``python -m moe.bench``.

An op describes itself with an ``OpBench`` (its suites, implementations, plan rows, expected-table kind); this
module does the rest: options, ``--list``, plan mode with no GPU, the check-then-time loop, scoring against the
expected table (each row, and the run's kernel launch overhead), and the table / JSON / markdown / plot outputs.

Every entry point (the benches, ``python -m cukernels``, ``tools/sanitize.py``) ends with the same exit status:
``EXIT_OK`` (0) when it did its work, and also when no GPU is visible (``no_gpu``: a message on stderr says what
can be done without one); ``EXIT_FAILED`` (1) when a result failed its check; ``EXIT_USAGE`` (2) for a bad option
or value (``usage_error``: the message names what would be accepted).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tabulate import tabulate

from . import bench, compile, device, environment, report, score, tiling

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2  # argparse's own status for a bad option
EXIT_NO_GPU = EXIT_OK  # nothing to measure is not a failure: CI runs the benches on machines with no GPU

_LIST_WIDTH = 116
NO_PLAN = "no plan"  # the tiles cell of a plan row the planner refused; its "why" says the reason


class UsageError(ValueError):
    """A bad option value; the message names the option, the value and what would be accepted."""


def usage_error(prog: str, message: object) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def no_gpu(prog: str, instead: str) -> int:
    """The one message and status of an entry point that needs a GPU and finds none; ``instead`` says what can be
    done without one."""
    print(f"{prog}: No CUDA GPU is visible to CuPy, so nothing can be measured here. {instead}", file=sys.stderr)
    return EXIT_NO_GPU


def profile_spec(name: str) -> device.DeviceSpec:
    """The profile ``name`` stands for (any case, a unique prefix, an NVML name), or a ``UsageError``."""
    try:
        return device.profile(name)
    except device.UnknownProfileError as exc:
        raise UsageError(f"--profile: {exc}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpBench:
    prog: str
    description: str
    op: Callable[[argparse.Namespace], bench.Op]
    suites: Mapping[str, str]  # suite name -> what it holds and where its shapes come from (``--list``)
    default_suite: str
    cases: Callable[[str, argparse.Namespace], list[bench.Case]]  # (suite, args) -> cases
    describe: Callable[[bench.Case], str] = lambda case: ""  # a case's shape in a few words, for --list
    shape_legend: str = ""  # what the letters of ``describe`` mean
    impls: Callable[[argparse.Namespace], list[bench.Impl]]  # every implementation this op knows
    default_impls: Sequence[str]
    plan_rows: Callable[[list[bench.Case], device.DeviceSpec, bool], list[dict]]  # (cases, spec, compile)
    plan_details: Sequence[str] = ("why",)  # plan columns shown with --verbose only (always in --json)
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
    p.add_argument("--list", action="store_true", help="list the suites, what they are, and their cases; then exit")
    p.add_argument("--suite", default=ob.default_suite, choices=list(ob.suites),
                   help="named case suite (default: %(default)s; --list says what each holds)")
    p.add_argument("--case", action="append", metavar="PART",
                   help="only cases whose name contains PART (repeatable; --list shows the names)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"], help="element type")
    p.add_argument("--impl", default=",".join(ob.default_impls),
                   help="comma-separated implementations, or 'all' (default: %(default)s)")
    p.add_argument("--plan", action="store_true", help="show the planner's choice per case and exit (no GPU needed)")
    p.add_argument("--profile", help="with --plan: a GPU profile, any case or a unique prefix "
                                     f"({', '.join(device.profile_names())})")
    p.add_argument("--compile", action="store_true", help="with --plan: compile each variant offline (regs, spills)")
    p.add_argument("-v", "--verbose", action="store_true", help="with --plan: add the planner's reason for each row")
    p.add_argument("--expected", default="auto",
                   help=f"expected table: auto, none, or one of {', '.join(score.table_names()) or '(none)'}")
    p.add_argument("--json", metavar="PATH", help="write results and environment as JSON (with --plan: the plan)")
    p.add_argument("--markdown", metavar="PATH", help="write a markdown report")
    p.add_argument("--plot", metavar="DIR", help="write PNG plots (needs matplotlib)")
    p.add_argument("--budget-ms", type=float, default=300.0, help="timing budget per implementation and case")
    p.add_argument("--rounds", type=int, default=bench.ROUNDS,
                   help="rounds, spread over the run, of a row timed with host time, unsettled by its first round "
                        "or throttled in it; its noise includes the spread of their medians (default %(default)s)")
    p.add_argument("--interleave", action=argparse.BooleanOptionalAction, default=True,
                   help="time a device-time case's implementations in --rounds rounds taken in turn, the order "
                        "rotated each round (default); --no-interleave: one block each, in --impl order (the "
                        "first block runs on the coolest clock: 4-17 %% in its favour on long grids of a warm H100)")
    p.add_argument("--sustained", type=float, default=0.0, metavar="SECONDS",
                   help="also call each row back to back for SECONDS in all (two passes, order reversed in the second) "
                        "and report time, energy (mJ), power and SM clock per call there: where a card settles at "
                        "its power limit, time per call follows energy per call (default 0: off)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the inputs")
    ob.add_arguments(p)
    return p


def _select_impls(ob: OpBench, args) -> list[bench.Impl]:
    known = {i.name: i for i in ob.impls(args)}
    names = list(known) if args.impl == "all" else [n.strip() for n in args.impl.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UsageError(f"--impl {','.join(unknown) or repr(args.impl)}: unknown; known: {', '.join(known)}, all")
    return [known[n] for n in names]


def _cases(ob: OpBench, args) -> list[bench.Case]:
    cases = ob.cases(args.suite, args)
    if not args.case:
        return cases
    for part in args.case:
        if not any(part in c.name for c in cases):
            elsewhere = {}  # suite -> its size: the smallest one that has the case is the one to suggest
            for name in ob.suites:
                others = ob.cases(name, args)
                if name != args.suite and any(part in c.name for c in others):
                    elsewhere[name] = len(others)
            hint = (f"it is in suite {', '.join(elsewhere)} (add --suite {min(elsewhere, key=elsewhere.get)})"
                    if elsewhere else "no other suite has it either")
            raise UsageError(f"--case {part}: no case of suite {args.suite} contains it; {hint}. The cases of "
                             f"{args.suite}: {', '.join(c.name for c in cases)} (all suites: {ob.prog} --list)")
    return [c for c in cases if any(part in c.name for part in args.case)]


def _list(ob: OpBench, args) -> int:
    """The suites (a line or two each) and every case once, with its shape and the suites that hold it."""
    print(f"{ob.prog} suites (--suite NAME; with no --suite: {ob.default_suite}):")
    width = max(map(len, ob.suites))
    in_suites: dict[str, tuple[bench.Case, list[str]]] = {}
    for name, what in ob.suites.items():
        cases = ob.cases(name, args)
        head = f"  {name:<{width}}  {len(cases):>2} cases  "
        print(textwrap.fill(what, width=_LIST_WIDTH, initial_indent=head, subsequent_indent=" " * len(head)))
        for c in cases:
            in_suites.setdefault(c.name, (c, []))[1].append(name)
    print("\ncases (--case PART: the cases of the suite whose name contains PART):")
    if ob.shape_legend:
        print(ob.shape_legend)
    rows = [{"case": name, "shape": ob.describe(c), "suites": ", ".join(s)} for name, (c, s) in in_suites.items()]
    print(tabulate(rows, headers="keys", tablefmt="github", disable_numparse=True))
    return EXIT_OK


def smem_cell(plan: tiling.Plan) -> str:
    """A plan's shared memory against the device's limit, NO when it would not fit (the planners never plan that)."""
    return f"{plan.smem_bytes:,} / {plan.limit:,}" + ("" if plan.smem_bytes <= plan.limit else " NO")


def resource_cells(r: compile.Resources) -> dict[str, str]:
    """An offline compile's registers and spills (and the local-memory stack, where there is one) as plan cells."""
    stack = f" (stack {r.stack_bytes})" if r.stack_bytes else ""
    return {"regs": str(r.registers), "spill B": f"{r.spills}{stack}"}


def _plan(ob: OpBench, args, cases: list[bench.Case]) -> int:
    if args.profile:
        spec = profile_spec(args.profile)
    elif device.gpu_available():
        spec = device.current()
    else:
        raise UsageError(f"--plan with no GPU needs --profile NAME; known: {', '.join(device.profile_names())}")
    rows = ob.plan_rows(cases, spec, args.compile)
    title = (f"{ob.prog} --plan: {spec.name} ({spec.key or 'live'}, {spec.arch}), "
             f"shared memory limit {spec.smem_per_block_optin:,} B per block")
    print(title)
    shown = rows if args.verbose else [{k: v for k, v in r.items() if k not in ob.plan_details} for r in rows]
    print(tabulate(shown, headers="keys", tablefmt="github", disable_numparse=True))
    if not args.verbose:
        for why in dict.fromkeys(r["why"] for r in rows if r.get("tiles") == NO_PLAN):
            print(f"{NO_PLAN}: {why}")
        print("(--verbose: the planner's reason for each row; --json PATH: the plan as data)")
    if args.json:
        doc = {"title": title, "profile": spec.key, "arch": spec.arch, "limits": spec.limits(), "rows": rows}
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
    return EXIT_OK


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


def _expected_choice(name: str) -> str:
    """auto, none, or a table name; a profile name that stands for a table's GPU (``H100``) is taken for it."""
    tables = score.table_names()
    if name in ("auto", "none", *tables):
        return name
    try:
        key = device.profile(name).key
    except device.UnknownProfileError:
        key = None
    if key in tables:
        return key
    raise UsageError(f"--expected {name}: no such table; known: {', '.join(tables)}, auto, none")


def _check_options(ob: OpBench, args) -> tuple[list[bench.Impl], list[bench.Case]]:
    """Every option checked before anything runs (a GPU or not): the implementations and cases asked for."""
    if not args.plan and (args.profile or args.compile or args.verbose):
        raise UsageError("--profile, --compile and --verbose go with --plan")
    if args.rounds < 1:
        raise UsageError(f"--rounds {args.rounds}: needs at least 1")
    if not (args.sustained >= 0 and math.isfinite(args.sustained)):
        raise UsageError(f"--sustained {args.sustained}: needs a number of seconds >= 0")
    if args.sustained and args.plan:
        raise UsageError("--sustained times rows; it does not go with --plan")
    args.expected = _expected_choice(args.expected)
    return _select_impls(ob, args), _cases(ob, args)


def main(ob: OpBench, argv: Sequence[str] | None = None) -> int:
    args = parser_for(ob).parse_args(argv)
    try:
        if args.list:
            return _list(ob, args)
        impls, cases = _check_options(ob, args)
        if args.plan:
            return _plan(ob, args, cases)
    except UsageError as exc:
        return usage_error(ob.prog, exc)
    if not device.gpu_available():
        return no_gpu(ob.prog, f"Without one: `{ob.prog} --plan --profile h200 --compile` shows the tiles each case "
                               f"gets on a GPU profile ({', '.join(device.profile_names())}); `{ob.prog} --list` "
                               "the suites and cases.")
    spec = device.current()
    table = score.select_table(spec, args.expected)
    t0 = time.perf_counter()
    results = bench.run(ob.op(args), cases, impls, seed=args.seed, budget_ms=args.budget_ms,
                        rounds=args.rounds, plan_of=ob.plan_of, interleave=args.interleave,
                        sustained_s=args.sustained)
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
                       scores=extra, launch_overhead=overhead,
                       timing="turns" if args.interleave else "blocks")  # how device-time cases were timed
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
    return EXIT_FAILED if failed else EXIT_OK
