"""``python -m moe.bench``: MoE routing + permutation, gather and combine, checked then timed, beside the same
pipeline in torch (softmax + topk + bincount + argsort; index_select; index_add) when torch is importable.

``--plan [--profile NAME] [--compile]`` needs no GPU: each kernel's config, its shared memory against the limit,
and with ``--compile`` its registers and spills. The GPU run ends with the expert-utilisation figures of each
routing case (load-balance loss, z-loss, usage CV) beside the NumPy reference's.
"""
from __future__ import annotations

import sys
import types

import numpy as np
from tabulate import tabulate

from cukernels import bench, checks, cli, compile, dtypes

from . import configs, dispatch, launch, reference, routing, suites

_KINDS = ("route+permute", "gather", "combine")


# ---------------------------------------------------------------- cases


def case_bytes(kind: str, tokens: int, experts: int, top_k: int, hidden: int | None, itemsize: int) -> int:
    """Fewest bytes one call must move through device memory (read + written)."""
    slots = tokens * top_k
    if kind == "route+permute":  # logits in; weights, ids, sorted slots, inverse out
        return tokens * experts * itemsize + 4 * slots * 4
    if kind == "gather":  # every token row read once, every slot row written
        return (tokens + slots) * hidden * itemsize + slots * 4
    if kind == "combine":  # every slot row read once, every token row written; weights and inverse read
        return (slots + tokens) * hidden * itemsize + slots * 8
    raise ValueError(kind)


def cases_for(shapes, dtype: str) -> list[bench.Case]:
    itemsize = dtypes.from_name(dtype).itemsize
    out = []
    for s in shapes:
        for kind in _KINDS if s.hidden else _KINDS[:1]:
            out.append(bench.Case(
                name=f"{s.name} {kind}",
                params=dict(kind=kind, shape=s.name, tokens=s.tokens, experts=s.experts, top_k=s.top_k,
                            hidden=s.hidden, dtype=dtype),
                tags=s.tags,
                bytes=case_bytes(kind, s.tokens, s.experts, s.top_k, s.hidden, itemsize),
                dtype=dtype))
    return out


# ---------------------------------------------------------------- inputs, references, checks


def make_inputs(case: bench.Case, seed: int):
    p = case.params
    dt = dtypes.from_name(p["dtype"])
    logits = dtypes.random((p["tokens"], p["experts"]), dt, seed=seed, scale=2.0)
    inputs = types.SimpleNamespace(logits=logits)
    if p["kind"] != "route+permute":
        inputs.routing = routing.route(logits, p["top_k"])
        inputs.dispatch = dispatch.permute(inputs.routing)
        rows = inputs.dispatch.rows
        inputs.x = dtypes.random((p["tokens"], p["hidden"]), dt, seed=seed + 1)
        inputs.expert_out = dtypes.random((rows, p["hidden"]), dt, seed=seed + 2)
    return inputs


def make_reference(case: bench.Case, inputs):
    import cupy

    p = case.params
    if p["kind"] == "route+permute":
        return types.SimpleNamespace(route=reference.route(inputs.logits, p["top_k"]),
                                     logits=reference.logits_f32(inputs.logits))
    d = inputs.dispatch
    if p["kind"] == "gather":
        return inputs.x[d.sorted_slots // p["top_k"]]  # exact copy: CuPy fancy indexing is the reference
    y = dtypes.to_float32(inputs.expert_out)
    return (y[d.inverse] * inputs.routing.weights[:, :, None]).sum(axis=1, dtype=cupy.float32)


def _verdict(name: str, ok: bool, reason: str) -> checks.CheckResult:
    return checks.CheckResult(name=name, max_abs=0.0, max_rel=0.0, mean_abs=0.0, rel_l2=0.0, nonfinite=0,
                              passed=bool(ok), reason=reason)


def _sampled_compare(actual, ref, *, tol, name, sample_rows=2048):
    """Unwritten/non-finite elements counted over the whole output on the GPU; values compared on sampled rows."""
    import cupy

    a = actual if isinstance(actual, cupy.ndarray) else dtypes.as_cupy(actual, name=name)[0]
    bad = int((~cupy.isfinite(dtypes.to_float32(a))).sum())
    if bad:
        return _verdict(name, False, f"{bad} non-finite or unwritten elements")
    step = max(1, a.shape[0] // sample_rows)
    return checks.compare(a[::step], ref[::step], tol=tol, name=f"{name} (every {step}th row)")


def _route_outputs(out):
    """(weights, experts, aux, z, sorted_slots, inverse) as CuPy arrays, from ours or torch's pipeline."""
    import cupy

    if isinstance(out, tuple) and isinstance(out[0], routing.Routing):
        r, d = out
        return r.weights, r.experts, r.aux_loss, r.z_loss, d.sorted_slots, d.inverse.ravel()
    return tuple(cupy.from_dlpack(t.contiguous()) for t in out)


def check(case: bench.Case, out, ref) -> list[checks.CheckResult]:
    """Tie-invariant for route: torch.topk does not promise the lower index on equal logits."""
    import cupy

    p = case.params
    if p["kind"] == "gather":
        a = out if isinstance(out, cupy.ndarray) else dtypes.as_cupy(out, name="gather")[0]
        same = bool((a.view(cupy.uint8) == ref.view(cupy.uint8)).all())
        return [_verdict("gathered rows", same, "bitwise equal to x[sorted_slots // top_k]" if same else "differ")]
    if p["kind"] == "combine":
        tol = checks.TOLERANCES[p["dtype"]]
        return [_sampled_compare(out, ref, tol=tol, name="combined rows")]
    weights, experts, aux, z, sorted_slots, inverse = _route_outputs(out)
    x32, ref = ref.logits, ref.route
    e_host = experts.get().astype(np.int64)
    chosen = -np.sort(-np.take_along_axis(x32, e_host, axis=1), axis=1)
    expected = -np.sort(-np.take_along_axis(x32, ref.experts.astype(np.int64), axis=1), axis=1)
    w_sorted = -np.sort(-weights.get().astype(np.float64), axis=1)
    ref_w = -np.sort(-ref.weights, axis=1)
    slots = experts.size
    ids = experts.ravel()
    order_ok = bool((inverse[sorted_slots] == cupy.arange(slots, dtype=inverse.dtype)).all()) and bool(
        (cupy.diff(ids[sorted_slots]) >= 0).all())
    return [
        _verdict("chosen logits", np.array_equal(chosen, expected, equal_nan=True), "the k largest logits per token"),
        checks.compare(w_sorted, ref_w, tol=checks.Tolerance(atol=1e-5, rtol=1e-4), name="weights"),
        checks.compare(np.array([float(aux)]), np.array([ref.aux_loss]), tol=checks.Tolerance(atol=0, rtol=1e-3),
                       name="aux_loss"),
        checks.compare(np.array([float(z)]), np.array([ref.z_loss]), tol=checks.Tolerance(atol=0, rtol=1e-4),
                       name="z_loss"),
        _verdict("permutation", order_ok, "slots grouped by expert; inverse[sorted_slots] == arange"),
    ]


# ---------------------------------------------------------------- implementations


def _ours(case: bench.Case, inputs):
    p = case.params
    if p["kind"] == "route+permute":
        def fn():
            r = routing.route(inputs.logits, p["top_k"])
            return r, dispatch.permute(r)
        return fn
    if p["kind"] == "gather":
        return lambda: dispatch.gather(inputs.x, inputs.dispatch)
    return lambda: dispatch.combine(inputs.expert_out, inputs.dispatch, inputs.routing)


def _torch_unavailable() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not importable (pip install torch for the baseline)"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


def _torch(case: bench.Case, inputs):
    import torch

    p = case.params
    k, experts = p["top_k"], p["experts"]
    if p["kind"] == "route+permute":
        logits = dtypes.like_input(inputs.logits, True)
        tokens = logits.shape[0]

        def fn():
            x = logits.float()
            probs = torch.softmax(x, dim=-1)
            w, ids = torch.topk(probs, k, dim=-1)
            w = w / w.sum(dim=-1, keepdim=True)
            counts = torch.bincount(ids.flatten(), minlength=experts)
            aux = experts * ((counts.float() / (tokens * k)) * probs.mean(dim=0)).sum()
            z = torch.logsumexp(x, dim=-1).square().mean()
            order = torch.argsort(ids.flatten(), stable=True)
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(order.numel(), device=order.device)
            return w, ids.int(), aux, z, order.int(), inverse.int()
        return fn
    token_of_row = dtypes.like_input(inputs.dispatch.sorted_slots // k, True).long()
    if p["kind"] == "gather":
        x = dtypes.like_input(inputs.x, True)
        return lambda: x.index_select(0, token_of_row)
    y = dtypes.like_input(inputs.expert_out, True)
    w_row = dtypes.like_input(inputs.routing.weights.ravel()[inputs.dispatch.sorted_slots], True)

    def fn():
        out = torch.zeros((p["tokens"], p["hidden"]), dtype=torch.float32, device=y.device)
        out.index_add_(0, token_of_row, y.float() * w_row[:, None])
        return out.to(y.dtype)
    return fn


def _torch_peak_memory(fn) -> int:
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return int(peak)


def impls(args) -> list[bench.Impl]:
    return [
        bench.Impl(name="cukernels", prepare=_ours),
        bench.Impl(name="torch", prepare=_torch, baseline=True, unavailable=_torch_unavailable,
                   peak_memory=_torch_peak_memory),
    ]


# ---------------------------------------------------------------- plans


def kernel_plans(case: bench.Case, spec) -> list[tuple[str, object, object]]:
    """(source, name expression, plan) of every kernel one call of ``case`` launches on ``spec``."""
    p = case.params
    dt = dtypes.from_name(p["dtype"])
    if p["kind"] == "route+permute":
        route = configs.plan_route(configs.RouteProblem(tokens=p["tokens"], experts=p["experts"], top_k=p["top_k"],
                                                        dtype=p["dtype"]), spec)
        finish = configs.plan_finish(spec)
        scatter = configs.plan_scatter(spec)
        return [(launch.ROUTE_SOURCE, route.config.name_expression(dtype=dt), route),
                (launch.ROUTE_SOURCE, finish.config.name_expression(), finish),
                (launch.DISPATCH_SOURCE, scatter.config.name_expression(), scatter)]
    rows = dispatch.capacity(p["tokens"], p["top_k"], p["experts"], None)
    if p["kind"] == "gather":
        g = configs.plan_gather(configs.RowsProblem(rows=rows, hidden=p["hidden"], top_k=p["top_k"],
                                                    dtype=p["dtype"]), spec)
        return [(launch.DISPATCH_SOURCE, g.config.name_expression(), g)]
    c = configs.plan_combine(configs.RowsProblem(rows=p["tokens"], hidden=p["hidden"], top_k=p["top_k"],
                                                 dtype=p["dtype"]), spec)
    return [(launch.DISPATCH_SOURCE, c.config.name_expression(dtype=dt), c)]


def plan_rows(cases: list[bench.Case], spec, with_compile: bool) -> list[dict]:
    entries = [(case, *k) for case in cases for k in kernel_plans(case, spec)]
    resources = {}
    if with_compile:
        by_source: dict = {}
        for _, source, expr, _ in entries:
            by_source.setdefault(source, {})[expr] = None
        for source, exprs in by_source.items():
            resources.update({(source, e): r for e, r in compile.compile_offline(source, list(exprs), spec.arch).items()})
    rows = []
    for case, source, expr, plan in entries:
        row = {"case": case.name, "kernel": expr, "config": str(plan.config),
               "smem / limit B": f"{plan.smem_bytes:,} / {plan.limit:,}", "threads": str(plan.config.threads)}
        if with_compile:
            r = resources[(source, expr)]
            row.update({"regs": str(r.registers), "spill B": str(r.spills), "stack B": str(r.stack_bytes)})
        row["why"] = f"{plan.source}: {plan.reason}"
        rows.append(row)
    return rows


# ---------------------------------------------------------------- utilisation


def utilisation(results, args) -> str:
    """aux/z-loss and usage of each routing case on the bench's own inputs (same seeds as ``bench.run``)."""
    cases = _cases(args.suite, args)
    if args.case:
        cases = [c for c in cases if any(s in c.name for s in args.case)]
    rows = []
    for i, case in enumerate(cases):
        if case.params["kind"] != "route+permute":
            continue
        logits = make_inputs(case, args.seed + i).logits
        stats = routing.route(logits, case.params["top_k"]).stats()
        ref = reference.route(logits, case.params["top_k"])
        rows.append({"case": case.name, "aux_loss": f"{stats['aux_loss']:.5f}", "ref aux_loss": f"{ref.aux_loss:.5f}",
                     "z_loss": f"{stats['z_loss']:.4f}", "usage CV": f"{stats['usage_cv']:.4f}",
                     "ref CV": f"{ref.usage_cv:.4f}", "max share": f"{stats['max_share']:.4f}",
                     "min share": f"{stats['min_share']:.4f}", "idle experts": str(stats["idle_experts"])})
    if not rows:
        return ""
    return "expert utilisation (random logits, softmax, renormalised):\n" + tabulate(
        rows, headers="keys", tablefmt="github", disable_numparse=True)


def _cases(suite: str, args) -> list[bench.Case]:
    return cases_for(suites.suite(suite), args.dtype)


OP_BENCH = cli.OpBench(
    prog="python -m moe.bench",
    description=__doc__,
    op=lambda args: bench.Op(name="moe", make_inputs=make_inputs, reference=make_reference, check=check),
    suites=suites.suite_names(),
    default_suite="primary",
    cases=_cases,
    impls=impls,
    default_impls=("cukernels", "torch"),
    plan_rows=plan_rows,
    expected_kind="moe",
    reference_impl="torch",
    extra_output=utilisation,
)


def main(argv=None) -> int:
    return cli.main(OP_BENCH, argv)


if __name__ == "__main__":
    sys.exit(main())
