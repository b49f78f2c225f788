"""``python -m models.bench``: seed 004's end-to-end rows (small, medium, large decoder-only models at its batch and
sequence sizes; ``models.configs`` states what the seed leaves open) as one prefill forward, ours beside PyTorch.

Implementations, one process, the same weights and input:

- ``ours``: ``OursModel`` eager; ``ours-graph``: the same forward captured with ``torch.cuda.graph``, replayed;
- ``torch-naive``: eager torch, matmul-softmax-matmul attention with a causal mask, F.linear, MoE as a per-expert
  loop -- seed 004's "PyTorch naive", the reference of the check and of the "> 40 % speedup" gate;
- ``torch-best``: SDPA (torch picks the backend), F.linear (cuBLAS), ``torch._grouped_mm`` for MoE;
  ``torch-compiled``: ``torch.compile`` of that forward (its row says why when compiling fails);
  ``torch-compiled-graph``: the compiled forward captured with ``torch.cuda.graph`` and replayed, as ours-graph is
  (the fair pair for it where the host is the bottleneck).

Every output is checked against torch-naive's before timing (relative L2 error of the final hidden states,
bounded by twice torch-best's own error against it or a floor, whichever is larger) and ours again after. Times are
the one timer's (``cukernels.timing.benchmark``) with nothing held and no L2 flush: a whole forward as called back
to back, host time included where the host is the bottleneck (eager small models), which is what the CUDA graph
removes. Each row adds tokens/s, torch's peak memory during one forward (ours-graph: one replay after the capture),
the speedup over torch-naive against the seed's gate, the ratio to the faster torch-best, the expected time
(expected_results/, ``[[end_to_end]]``) and one instrumented forward's split by op (attention / FFN or MoE / QKV+O
GEMMs / the rest) from CUDA events. ``--out PATH`` writes the results as JSON; without it nothing is written.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from tabulate import tabulate

from cukernels import bench, cli, device, environment, score, timing

from . import configs
from .layers import SECTIONS, CapturedForward, OursModel, SectionTimer, TorchModel, init_weights

PROG = "python -m models.bench"
IMPLS = ("ours", "ours-graph", "torch-naive", "torch-best", "torch-compiled", "torch-compiled-graph")
BASELINES = ("torch-naive", "torch-best", "torch-compiled", "torch-compiled-graph")
BEST_TORCH = ("torch-best", "torch-compiled", "torch-compiled-graph")  # the best torch pipeline: the fastest of these
NAIVE = "torch-naive"
REL_L2_FLOOR = 3e-2  # bf16 end to end: a wrong kernel is off by O(1), rounding differences by ~1e-2
GATE_PCT = 40.0  # seed 004 "Performance Gates": End-to-End > 40 % speedup vs PyTorch naive (if no table says)


@dataclasses.dataclass(kw_only=True)
class ModelResult:
    case: str
    model: str
    impl: str
    batch: int
    seq: int
    tokens: int
    status: str  # ok | failed-check | error | skipped
    reason: str = ""
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    rel_noise: float | None = None
    samples: int = 0
    tokens_per_s: float | None = None
    tflops: float | None = None
    peak_mib: float | None = None  # torch's max_memory_allocated during one forward or replay (weights included)
    extra_mib: float | None = None  # that peak less what was allocated before the forward
    rel_l2_vs_naive: float | None = None
    check_bound: float | None = None
    speedup_vs_naive: float | None = None
    gate: str = ""
    x_best_torch: float | None = None  # the fastest of BEST_TORCH over this
    split_ms: dict = dataclasses.field(default_factory=dict)
    expected_ms: float | None = None
    vs_expected: str = ""
    clocks: dict = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# ---------------------------------------------------------------- command line


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--list", action="store_true", help="list the models, their assumptions and cases; then exit")
    p.add_argument("--model", action="append", metavar="NAME",
                   help=f"only this model's rows (repeatable): {', '.join(configs.BENCH_MODELS)} "
                        "(default: the seed 004 models small, medium, large)")
    p.add_argument("--case", action="append", metavar="NAME",
                   help="only this row (repeatable), by its name in --list (e.g. large_b1_s128); with --model, "
                        "that model's rows only")
    p.add_argument("--quick", action="store_true", help="one small row (small_b1_s128)")
    p.add_argument("--out", metavar="PATH",
                   help="write the results as JSON to PATH (e.g. docs/results/h100/models.json); without it, none")
    p.add_argument("--no-graph", action="store_true", help="skip ours-graph (the CUDA-graph capture)")
    p.add_argument("--no-compile", action="store_true",
                   help="skip torch-compiled and torch-compiled-graph (compiling takes minutes)")
    p.add_argument("--expected", default="auto",
                   help=f"expected table: auto, none, or one of {', '.join(score.table_names())}")
    p.add_argument("--budget-ms", type=float, default=2000.0, help="timing budget per row (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the input")
    return p


def selected_cases(args) -> list[configs.ModelCase]:
    if args.quick and (args.model or args.case):
        raise cli.UsageError("--quick runs one small row; leave out --model and --case, or --quick")
    if args.quick:
        return list(configs.QUICK)
    if args.case and not args.model:
        names = list(configs.BENCH_MODELS)
    else:
        names = args.model or [m for m in configs.BENCH_MODELS if configs.MODELS[m].seed_row]
    unknown = [n for n in names if n not in configs.BENCH_MODELS]
    if unknown:
        raise cli.UsageError(f"--model {', '.join(unknown)}: unknown; known: {', '.join(configs.BENCH_MODELS)}")
    cases = configs.cases_of(names)
    if args.case:
        known = {c.name for c in cases}
        unknown = [n for n in args.case if n not in known]
        if unknown:
            raise cli.UsageError(f"--case {', '.join(unknown)}: unknown; known: {', '.join(sorted(known))}")
        cases = [c for c in cases if c.name in args.case]
    return cases


def list_models() -> int:
    print(f"{PROG} models (--model NAME; with none: the seed 004 models):")
    for name in configs.BENCH_MODELS:
        m = configs.MODELS[name]
        origin = "seed 004" if m.seed_row else "not in seed 004"
        print(f"\n  {name} ({origin}): {m.layers} layers, hidden {m.hidden}, {m.heads} heads, "
              f"{m.params() / 1e9:.2f} B parameters\n    {m.assumptions()}")
    rows = [{"case": c.name, "batch": c.batch, "seq": c.seq, "tokens": c.tokens,
             "GFLOP": f"{c.model.flops(c.batch, c.seq) / 1e9:,.0f}", "tags": ", ".join(c.tags)}
            for c in configs.CASES.values() if c.model.name in configs.BENCH_MODELS]
    print("\ncases (--quick: small_b1_s128):")
    print(tabulate(rows, headers="keys", tablefmt="github", disable_numparse=True))
    return cli.EXIT_OK




# ---------------------------------------------------------------- expected rows


def expected_rows(spec, choice: str) -> tuple[list[dict], str]:
    """seed 004's ``[[end_to_end]]`` rows for this GPU, and a note on where they came from. A table without them
    (H200's measured table) hands over to the profile's documented fallback (H100)."""
    table = score.select_table(spec, choice)
    if table is None:
        return [], "no expected table"
    rows = table.rows("end_to_end")
    if not rows and choice == "auto" and spec.expected_fallback:
        fb = score.select_table(spec, spec.expected_fallback)
        if fb is not None and fb.rows("end_to_end"):
            return fb.rows("end_to_end"), f"{table.note}; its end-to-end rows from {fb.key} (documented fallback)"
    return rows, table.note


def gate_pct(spec, choice: str) -> float:
    table = score.select_table(spec, choice)
    doc = table.doc if table else {}
    return float(doc.get("validation", {}).get("end_to_end_min_speedup_vs_naive_pct", GATE_PCT))


def find_expected(rows: list[dict], case: configs.ModelCase) -> dict | None:
    m = case.model
    for row in rows:
        if (row.get("model"), row.get("batch"), row.get("seq")) == (m.name, case.batch, case.seq) \
                and (row.get("layers"), row.get("hidden"), row.get("heads")) == (m.layers, m.hidden, m.heads):
            return row
    return None


# ---------------------------------------------------------------- one case


def rel_l2(out, ref) -> float:
    diff = (out.float() - ref).norm()
    return float(diff / ref.norm())


def _measure_peak(fn):
    """(output, peak MiB, extra MiB) of one call, from torch's allocator statistics."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return out, peak / 2**20, (peak - base) / 2**20


def _error_text(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]


def run_case(case: configs.ModelCase, weights, impls: list[str], args, progress=sys.stderr) -> list[ModelResult]:
    import torch

    cfg = case.model
    base = dict(case=case.name, model=cfg.name, batch=case.batch, seq=case.seq, tokens=case.tokens)
    gen = torch.Generator(device="cuda").manual_seed(args.seed + 1)
    x = torch.randn(case.batch, case.seq, cfg.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    has_grouped = hasattr(torch, "_grouped_mm")
    models = {"ours": OursModel(cfg, weights), NAIVE: TorchModel(cfg, weights, attention="naive", moe="loop"),
              "torch-best": TorchModel(cfg, weights, attention="sdpa", moe="grouped" if has_grouped else "loop")}
    results: dict[str, ModelResult] = {}
    fns: dict = {}
    peaks: dict = {}
    compiled: dict = {}  # the compiled forward, shared by torch-compiled and torch-compiled-graph

    def say(msg):
        if progress is not None:
            print(f"\r\033[K{case.name}: {msg}", end="", file=progress, flush=True)

    def prepare(impl):
        """The callable of ``impl`` and its first output (peak memory measured on that call)."""
        if impl in models:
            fn = models[impl]
        elif impl == "ours-graph":
            # the capture's two eager warm-up forwards are not a replay's memory: the peak is one replay's, the
            # stats reset after the capture (a capture runs nothing: that replay computes the output)
            graph = models["ours"].capture(x)
            out, peak, extra = _measure_peak(graph.replay)
            peaks[impl] = (peak, extra)
            return graph.replay, out
        else:  # torch-compiled, torch-compiled-graph
            if "forward" not in compiled:
                torch._dynamo.reset()  # one compiled forward at a time: no recompile limit across cases
                forward = torch.compile(models["torch-best"].forward)
                try:
                    forward(x)
                except Exception as exc:
                    raise RuntimeError(f"torch.compile failed: {_error_text(exc)}") from None
                compiled["forward"] = forward
            forward = compiled["forward"]
            if impl == "torch-compiled-graph":
                try:
                    fn = CapturedForward(forward, x).replay
                except Exception as exc:
                    raise RuntimeError(f"capturing the compiled forward failed: {_error_text(exc)}") from None
            else:
                fn = lambda: forward(x)  # noqa: E731
            out, peak, extra = _measure_peak(fn)
            peaks[impl] = (peak, extra)
            return fn, out
        call = lambda: fn(x)  # noqa: E731
        out, peak, extra = _measure_peak(call)
        peaks[impl] = (peak, extra)
        return call, out

    with torch.inference_mode():
        outputs = {}
        for impl in [NAIVE] + [i for i in impls if i != NAIVE]:
            if impl not in impls:
                continue
            say(f"check {impl}")
            try:
                fns[impl], out = prepare(impl)
                outputs[impl] = out.float()
                results[impl] = ModelResult(**base, impl=impl, status="ok")
            except Exception as exc:
                results[impl] = ModelResult(**base, impl=impl, status="error", reason=_error_text(exc))
            torch.cuda.empty_cache()
        ref_impl = NAIVE if NAIVE in outputs else "torch-best" if "torch-best" in outputs else None
        if ref_impl is None:
            for r in results.values():
                if r.ok:
                    r.status, r.reason = "error", "no torch reference output to check against"
        else:
            ref = outputs[ref_impl]
            best_err = rel_l2(outputs["torch-best"], ref) if "torch-best" in outputs and ref_impl == NAIVE else 0.0
            bound = max(REL_L2_FLOOR, 2 * best_err)
            for impl, out in outputs.items():
                r = results[impl]
                if impl == ref_impl:
                    continue
                err = rel_l2(out, ref)
                # torch's own pipelines within the floor; ours within the floor or twice torch-best's error
                r.rel_l2_vs_naive, r.check_bound = err, (REL_L2_FLOOR if impl in BASELINES else bound)
                if not err <= r.check_bound:
                    r.status = "failed-check"
                    r.reason = f"relative L2 error {err:.3g} against {ref_impl}'s output, above {r.check_bound:.3g}"
        del outputs
        for impl, fn in fns.items():
            r = results[impl]
            if not r.ok:
                continue
            say(f"time {impl}")

            def timed(fn=fn):  # torch enqueues where the timer records its events (CuPy's current stream)
                with bench.torch_on_cupy_stream():
                    return fn()
            try:
                t = timing.benchmark(timed, warmup_ms=50.0, budget_ms=args.budget_ms, min_samples=5, max_samples=200,
                                     rel_noise_target=0.01, flush_l2=False, hold=False)
            except Exception as exc:
                r.status, r.reason = "error", _error_text(exc)
                continue
            r.median_ms, r.p20_ms, r.p80_ms, r.rel_noise = t.median_ms, t.p20_ms, t.p80_ms, t.rel_noise
            r.samples, r.clocks = t.samples, t.clocks
            r.tokens_per_s = case.tokens / (t.median_ms * 1e-3)
            r.tflops = cfg.flops(case.batch, case.seq) / (t.median_ms * 1e-3) / 1e12
            r.peak_mib, r.extra_mib = peaks.get(impl, (None, None))
            if impl.startswith("ours") and ref_impl is not None:  # correctness after timing
                err = rel_l2(fn().float(), ref)
                if not err <= r.check_bound:
                    r.status = "failed-check"
                    r.reason = f"after timing: relative L2 error {err:.3g} above {r.check_bound:.3g}"
        for impl in ("ours", NAIVE, "torch-best"):  # one instrumented forward each: the split by op
            r = results.get(impl)
            if r is None or not r.ok:
                continue
            say(f"split {impl}")
            probe = SectionTimer()
            models[impl](x, probe)
            r.split_ms = probe.totals_ms()
    if compiled:
        torch._dynamo.reset()  # the compiled graph holds this model's weights
    if progress is not None:
        print("\r\033[K", end="", file=progress, flush=True)
    return [results[i] for i in impls if i in results]


# ---------------------------------------------------------------- scoring and output


def score_case(rows: list[ModelResult], case: configs.ModelCase, expected: dict | None, spec, gate: float) -> None:
    by = {r.impl: r for r in rows if r.ok}
    naive = by.get(NAIVE)
    best = min((by[i] for i in BEST_TORCH if i in by), key=lambda r: r.median_ms, default=None)
    for r in rows:
        if not r.ok:
            continue
        if naive is not None and r.impl != NAIVE:
            r.speedup_vs_naive = naive.median_ms / r.median_ms
            if r.impl.startswith("ours"):
                r.gate = "PASS" if 100 * (r.speedup_vs_naive - 1) > gate else "FAIL"
        if best is not None and r.impl.startswith("ours"):
            r.x_best_torch = best.median_ms / r.median_ms
        if expected is not None and r.impl.startswith("ours"):
            r.expected_ms = float(expected["expected_ms"])
            pl = score.plausibility(r.expected_ms, flops=case.model.flops(case.batch, case.seq),
                                    bytes_moved=2.0 * case.model.params(), spec=spec)
            r.vs_expected = (f"IMPLAUSIBLE: {pl.arithmetic}" if pl.level == "implausible"
                             else score.verdict(r.median_ms, r.rel_noise or 0.0, r.expected_ms))


def _split_cell(r: ModelResult) -> str:
    total = sum(r.split_ms.values())
    if not total:
        return ""
    return " / ".join(f"{100 * r.split_ms[s] / total:.0f}" for s in SECTIONS)


def table(results: list[ModelResult]) -> str:
    rows = []
    for r in results:
        if r.ok:
            ms = f"{r.median_ms:.3f} ±{100 * (r.rel_noise or 0):.1f}%"
        else:
            ms = f"{r.status}: {r.reason[:70]}"
        rows.append({
            "case": r.case, "impl": r.impl, "ms": ms,
            "tokens/s": "" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}",
            "TFLOP/s": "" if r.tflops is None else f"{r.tflops:.0f}",
            "peak MiB": "" if r.peak_mib is None else f"{r.peak_mib:,.0f} (+{r.extra_mib:,.0f})",
            "rel err": "" if r.rel_l2_vs_naive is None else f"{r.rel_l2_vs_naive:.1e}",
            "x naive": "" if r.speedup_vs_naive is None else f"{r.speedup_vs_naive:.2f}",
            "gate": r.gate,
            "x best torch": "" if r.x_best_torch is None else f"{r.x_best_torch:.2f}",
            "expected ms": "" if r.expected_ms is None else f"{r.expected_ms:g}",
            "vs expected": r.vs_expected[:40],
            "split % " + "/".join(s[:4] for s in SECTIONS): _split_cell(r),
        })
    return tabulate(rows, headers="keys", tablefmt="github", disable_numparse=True)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.list:
        return list_models()
    try:
        cases = selected_cases(args)
        if args.expected not in ("auto", "none", *score.table_names()):
            raise cli.UsageError(f"--expected {args.expected}: no such table; known: "
                                 f"{', '.join(score.table_names())}, auto, none")
        if args.budget_ms <= 0:
            raise cli.UsageError(f"--budget-ms {args.budget_ms:g}: must be > 0")
    except cli.UsageError as exc:
        return cli.usage_error(PROG, exc)
    if not device.gpu_available():
        return cli.no_gpu(PROG, f"Without one: `{PROG} --list` shows the models, their assumptions and cases.")
    missing = bench.torch_unavailable()
    if missing:  # like moe.bench's torch baselines, a missing torch is not a failure: nothing runs, exit 0
        print(f"{PROG}: {missing}: the models run on torch tensors and their baselines are torch. Install the "
              "extra: python -m pip install -e \".[torch]\"", file=sys.stderr)
        return cli.EXIT_OK
    import torch

    spec = device.current()
    exp_rows, note = expected_rows(spec, args.expected)
    gate = gate_pct(spec, args.expected)
    impls = [i for i in IMPLS if not (args.no_graph and i == "ours-graph")
             and not (args.no_compile and i.startswith("torch-compiled"))]
    t0 = time.perf_counter()
    results: list[ModelResult] = []
    weights, weights_of = None, None
    for case in cases:
        if weights_of != case.model.name:
            weights = None  # the last model's weights go first
            torch.cuda.empty_cache()
            weights, weights_of = init_weights(case.model, seed=args.seed), case.model.name
        rows = run_case(case, weights, impls, args)
        score_case(rows, case, find_expected(exp_rows, case), spec, gate)
        results += rows
    weights = None
    print(f"{PROG}: {spec.name}; expected: {note}; gate: ours > {gate:g} % faster than {NAIVE}; "
          f"{time.perf_counter() - t0:.0f} s")
    print(table(results))
    print(f"split: % of one instrumented forward in {', '.join(SECTIONS)} (attention; FFN or MoE layer; QKV and "
          "output projections; norms, rotary, residuals). Times: whole forward as called back to back, no hold, "
          "no L2 flush.")
    if args.out:
        write_json(Path(args.out), results, cases, note, gate, argv)
    failed = [r for r in results if r.impl.startswith("ours") and r.status in ("failed-check", "error")]
    return cli.EXIT_FAILED if failed else cli.EXIT_OK


def write_json(out: Path, results: list[ModelResult], cases, note: str, gate: float, argv) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"environment": environment.collect(), "command": " ".join([PROG, *(argv if argv is not None
                                                                             else sys.argv[1:])]),
           "expected_table": note, "gate_pct": gate, "rel_l2_floor": REL_L2_FLOOR,
           "models": {c.model.name: {**dataclasses.asdict(c.model), "assumptions": c.model.assumptions(),
                                     "params": c.model.params()} for c in cases},
           "results": [dataclasses.asdict(r) for r in results]}
    out.write_text(json.dumps(doc, indent=1, default=str))
    print(f"results: {out}")


if __name__ == "__main__":
    sys.exit(main())
