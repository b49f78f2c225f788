"""``python -m moe.bench``: the MoE pieces checked then timed beside what a user would run instead — routing +
permutation (and routing alone, on the ``overhead`` suite), gather and combine beside the same pipeline in torch
(softmax + topk + bincount + argsort; index_select; index_add); the grouped expert GEMM beside cuBLAS (one GEMM,
or a per-expert loop); the whole ``MoELayer`` beside torch's per-expert cuBLAS loop and ``torch._grouped_mm``.
torch baselines are skipped with a reason when torch is missing; cuBLAS through CuPy is always there (fp16; bf16
through torch's cuBLAS).

``--plan [--profile NAME] [--compile]`` needs no GPU: each kernel's config, its shared memory against the limit,
and with ``--compile`` its registers and spills. The GPU run ends with the expert-utilisation figures of each
routing case (load-balance loss, z-loss, usage CV) beside the NumPy reference's.

``--suite ep [--gpus N]``: the expert-parallel layer over the node's GPUs, one process per GPU (``moe/ep_bench.py``,
its own options: ``--suite ep --help``).
"""
from __future__ import annotations

import dataclasses

import sys
import types

import numpy as np
from tabulate import tabulate

from cukernels import bench, checks, cli, compile, dtypes, ncu, tiling, tune

from . import configs, dispatch, ep_bench, gemm_configs, launch, reference, routing, suites
from .grouped_gemm import SOURCE as GEMM_SOURCE
from .grouped_gemm import (SkinnyDecode, SkinnyFFN, decode_name_expression, ffn_name_expression, grouped_gemm,
                           tma_gathers, tma_scatters)
from .layer import MoELayer

_KINDS = ("route+permute", "gather", "combine", "layer")
_ROUTING = ("route", "route+permute")  # the kinds whose input is the router logits alone


# ---------------------------------------------------------------- cases


def case_bytes(kind: str, tokens: int, experts: int, top_k: int, hidden: int | None, itemsize: int) -> int:
    """Fewest bytes one call must move through device memory (read + written)."""
    slots = tokens * top_k
    if kind in _ROUTING:  # logits in; weights, ids (with the permutation also sorted slots, inverse) out
        return tokens * experts * itemsize + (4 if kind == "route+permute" else 2) * slots * 4
    if kind == "gather":  # every token row read once, every slot row written
        return (tokens + slots) * hidden * itemsize + slots * 4
    if kind == "combine":  # every slot row read once, every token row written; weights and inverse read
        return (slots + tokens) * hidden * itemsize + slots * 8
    raise ValueError(kind)


def layer_flops(tokens: int, top_k: int, hidden: int, inter: int) -> float:
    """SwiGLU experts: gate+up (2 * inter wide) and down, for every routed token slot."""
    return 2.0 * tokens * top_k * (hidden * 2 * inter + inter * hidden)


def cases_for(shapes, dtype: str) -> list[bench.Case]:
    itemsize = dtypes.from_name(dtype).itemsize
    out = []
    for s in shapes:
        if isinstance(s, suites.GemmShape):
            out.append(bench.Case(
                name=s.name, params=dict(kind="gemm", shape=s.name, rows=s.rows, n=s.n, k=s.k, experts=s.experts,
                                         split=s.split, dtype=dtype),
                tags=s.tags, flops=2.0 * s.rows * s.n * s.k,
                bytes=itemsize * (s.rows * s.k + s.experts * s.n * s.k + s.rows * s.n), dtype=dtype))
            continue
        kinds = ("layer",) if s.layer_only else _KINDS if s.intermediate else _KINDS[:3] if s.hidden else _KINDS[:1]
        for kind in (("route",) if s.route_alone else ()) + kinds:
            params = dict(kind=kind, shape=s.name, tokens=s.tokens, experts=s.experts, top_k=s.top_k,
                          hidden=s.hidden, dtype=dtype)
            if kind == "layer":
                params["intermediate"] = s.intermediate
                flops = layer_flops(s.tokens, s.top_k, s.hidden, s.intermediate)
                nbytes = itemsize * s.experts * 3 * s.hidden * s.intermediate + 2 * itemsize * s.tokens * s.hidden
            else:
                flops, nbytes = 0.0, case_bytes(kind, s.tokens, s.experts, s.top_k, s.hidden, itemsize)
            out.append(bench.Case(name=f"{s.name} {kind}", params=params, tags=s.tags, flops=flops, bytes=nbytes,
                                  dtype=dtype))
    return out


# ---------------------------------------------------------------- inputs, references, checks


def gemm_offsets(rows: int, experts: int, split: str, seed: int = 0) -> np.ndarray:
    """Group offsets: one group, equal groups (the first ``rows % experts`` one row larger), or random
    (gamma-distributed) sizes, some possibly empty."""
    if split == "one":
        return np.array([0, rows], np.int32)
    if split == "equal":
        counts = np.full(experts, rows // experts, np.int64)
        counts[:rows % experts] += 1
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    w = np.random.default_rng(seed).gamma(2.0, size=experts)
    counts = np.floor(w / w.sum() * rows).astype(np.int64)
    counts[0] += rows - counts.sum()
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


_LAYERS: dict = {}


def _layer(shape: str, dtype: str) -> MoELayer:
    """One set of random expert weights per (shape dims, dtype), reused across cases (8.7 GB at seed 004's size)."""
    s = suites.shape(shape)
    key = (s.hidden, s.intermediate, s.experts, s.top_k, dtype)
    if key not in _LAYERS:
        import cupy

        _LAYERS.clear()  # and give its memory back before the next one is made (seed 004's weights are 8.7 GB)
        cupy.get_default_memory_pool().free_all_blocks()
        if "torch" in sys.modules:
            sys.modules["torch"].cuda.empty_cache()
        dt = dtypes.from_name(dtype)
        h, inter = s.hidden, s.intermediate
        router = cupy.random.default_rng(7).standard_normal((h, s.experts), dtype=cupy.float32) / np.sqrt(h)
        w_gu = dtypes.random((s.experts, 2 * inter, h), dt, seed=8, scale=1 / np.sqrt(h))
        w_down = dtypes.random((s.experts, h, inter), dt, seed=9, scale=1 / np.sqrt(inter))
        _LAYERS[key] = MoELayer(router, w_gu, w_down, s.top_k)
    return _LAYERS[key]


def make_inputs(case: bench.Case, seed: int):
    p = case.params
    dt = dtypes.from_name(p["dtype"])
    if p["kind"] == "gemm":
        import cupy

        off = gemm_offsets(p["rows"], p["experts"], p["split"], seed)
        return types.SimpleNamespace(a=dtypes.random((p["rows"], p["k"]), dt, seed=seed),
                                     b=dtypes.random((p["experts"], p["n"], p["k"]), dt, seed=seed + 1,
                                                     scale=1 / np.sqrt(p["k"])),
                                     offsets=off, offsets_d=cupy.asarray(off))
    if p["kind"] == "layer":
        return types.SimpleNamespace(layer=_layer(p["shape"], p["dtype"]),
                                     x=dtypes.random((p["tokens"], p["hidden"]), dt, seed=seed))
    logits = dtypes.random((p["tokens"], p["experts"]), dt, seed=seed, scale=2.0)
    inputs = types.SimpleNamespace(logits=logits)
    if p["kind"] not in _ROUTING:
        inputs.routing = routing.route(logits, p["top_k"])
        inputs.dispatch = dispatch.permute(inputs.routing)
        rows = inputs.dispatch.rows
        inputs.x = dtypes.random((p["tokens"], p["hidden"]), dt, seed=seed + 1)
        inputs.expert_out = dtypes.random((rows, p["hidden"]), dt, seed=seed + 2)
    return inputs


def make_reference(case: bench.Case, inputs):
    import cupy

    p = case.params
    if p["kind"] in ("gemm", "layer"):
        return inputs  # checked on sampled rows against an fp32 reference built in check()
    if p["kind"] in _ROUTING:
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
    """(weights, experts, aux, z) and, after a permutation, (sorted_slots, inverse) as CuPy arrays, from ours (a
    ``Routing``, or it and a ``Dispatch``) or torch's pipeline."""
    import cupy

    if isinstance(out, routing.Routing):
        return out.weights, out.experts, out.aux_loss, out.z_loss
    if isinstance(out[0], routing.Routing):
        r, d = out
        return (*_route_outputs(r), d.sorted_slots, d.inverse.ravel())
    return tuple(cupy.from_dlpack(t.contiguous()) for t in out)


def _gemm_check(out, inputs, dtype: str, *, experts_to_check=4, rows_per_expert=64, seed=0) -> checks.CheckResult:
    """fp32 reference on sampled rows of a few non-empty experts (first, last and random ones)."""
    import cupy

    a, b, off = inputs.a, inputs.b, inputs.offsets
    out = out if isinstance(out, cupy.ndarray) else dtypes.as_cupy(out, name="out")[0]
    rng = np.random.default_rng(seed)
    nonempty = [e for e in range(len(off) - 1) if off[e + 1] > off[e]]
    picks = sorted({nonempty[0], nonempty[-1], *rng.choice(nonempty, min(len(nonempty), experts_to_check)).tolist()})
    got, ref = [], []
    for e in picks:
        rows = cupy.asarray(np.sort(rng.choice(np.arange(off[e], off[e + 1]), min(rows_per_expert, off[e + 1] - off[e]),
                                               replace=False)))
        ref.append(dtypes.to_float32(a[rows]) @ dtypes.to_float32(b[e]).T)
        got.append(out[rows])
    ref = cupy.concatenate(ref).astype(cupy.float64)
    naive = dtypes.to_float32(dtypes.from_float32(ref.astype(cupy.float32), dtypes.from_name(dtype)))
    return checks.compare(cupy.concatenate(got), ref, tol=checks.Tolerance(atol=1e-2), naive=naive,
                          name=f"sampled rows of {len(picks)} experts")


def _layer_check(out, inputs, dtype: str, sample: int = 32, seed: int = 0) -> checks.CheckResult:
    """fp32 reference layer on sampled tokens (every expert they route to), as rel-L2 against a bound."""
    import cupy

    layer, x = inputs.layer, inputs.x
    out = out if isinstance(out, cupy.ndarray) else dtypes.as_cupy(out, name="out")[0]
    rng = np.random.default_rng(seed)
    tok = cupy.asarray(np.sort(rng.choice(x.shape[0], min(sample, x.shape[0]), replace=False)))
    xt = dtypes.to_float32(x[tok])
    logits = (xt @ dtypes.to_float32(layer.router_b[0]).T).get()
    sel = np.argsort(-logits, axis=1, kind="stable")[:, : layer.top_k]
    prob = np.exp(logits - logits.max(axis=1, keepdims=True))
    w = np.take_along_axis(prob, sel, axis=1)
    w /= w.sum(axis=1, keepdims=True)
    ref = cupy.zeros(xt.shape, dtype=cupy.float32)
    for e in np.unique(sel):
        ti, ki = np.nonzero(sel == e)
        h = xt[cupy.asarray(ti)] @ dtypes.to_float32(layer.w_gate_up[int(e)]).T
        act = h[:, 0::2] / (1 + cupy.exp(-h[:, 0::2])) * h[:, 1::2]
        y = act @ dtypes.to_float32(layer.w_down[int(e)]).T
        ref[cupy.asarray(ti)] += y * cupy.asarray(w[ti, ki], dtype=cupy.float32)[:, None]
    got = dtypes.to_float32(out[tok])
    rel = float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref))
    bound = 2e-2 if dtype == "bf16" else 5e-3
    finite = bool(cupy.isfinite(got).all())
    return _verdict("layer output", finite and rel <= bound,
                    f"rel_l2 {rel:.2e} (bound {bound:g}) on {sample} sampled tokens" + ("" if finite else ", non-finite"))


def check(case: bench.Case, out, ref) -> list[checks.CheckResult]:
    """Tie-invariant for route: torch.topk does not promise the lower index on equal logits."""
    import cupy

    p = case.params
    if p["kind"] == "gemm":
        return [_gemm_check(out, ref, p["dtype"])]
    if p["kind"] == "layer":
        return [_layer_check(out, ref, p["dtype"])]
    if p["kind"] == "gather":
        a = out if isinstance(out, cupy.ndarray) else dtypes.as_cupy(out, name="gather")[0]
        same = bool((a.view(cupy.uint8) == ref.view(cupy.uint8)).all())
        return [_verdict("gathered rows", same, "bitwise equal to x[sorted_slots // top_k]" if same else "differ")]
    if p["kind"] == "combine":
        tol = checks.TOLERANCES[p["dtype"]]
        return [_sampled_compare(out, ref, tol=tol, name="combined rows")]
    weights, experts, aux, z, *permutation = _route_outputs(out)
    x32, ref = ref.logits, ref.route
    e_host = experts.get().astype(np.int64)
    chosen = -np.sort(-np.take_along_axis(x32, e_host, axis=1), axis=1)
    expected = -np.sort(-np.take_along_axis(x32, ref.experts.astype(np.int64), axis=1), axis=1)
    w_sorted = -np.sort(-weights.get().astype(np.float64), axis=1)
    ref_w = -np.sort(-ref.weights, axis=1)
    verdicts = [
        _verdict("chosen logits", np.array_equal(chosen, expected, equal_nan=True), "the k largest logits per token"),
        checks.compare(w_sorted, ref_w, tol=checks.Tolerance(atol=1e-5, rtol=1e-4), name="weights"),
        checks.compare(np.array([float(aux)]), np.array([ref.aux_loss]), tol=checks.Tolerance(atol=0, rtol=1e-3),
                       name="aux_loss"),
        checks.compare(np.array([float(z)]), np.array([ref.z_loss]), tol=checks.Tolerance(atol=0, rtol=1e-4),
                       name="z_loss"),
    ]
    if p["kind"] == "route":
        return verdicts
    sorted_slots, inverse = permutation
    slots = experts.size
    ids = experts.ravel()
    order_ok = bool((inverse[sorted_slots] == cupy.arange(slots, dtype=inverse.dtype)).all()) and bool(
        (cupy.diff(ids[sorted_slots]) >= 0).all())
    return verdicts + [_verdict("permutation", order_ok, "slots grouped by expert; inverse[sorted_slots] == arange")]


# ---------------------------------------------------------------- implementations


def _ours(case: bench.Case, inputs):
    p = case.params
    if p["kind"] == "gemm":
        return lambda: grouped_gemm(inputs.a, inputs.b, inputs.offsets_d)
    if p["kind"] == "layer":
        return lambda: inputs.layer(inputs.x)
    if p["kind"] == "route":
        return lambda: routing.route(inputs.logits, p["top_k"])
    if p["kind"] == "route+permute":
        def fn():
            r = routing.route(inputs.logits, p["top_k"])
            return r, dispatch.permute(r)
        return fn
    if p["kind"] == "gather":
        return lambda: dispatch.gather(inputs.x, inputs.dispatch)
    return lambda: dispatch.combine(inputs.expert_out, inputs.dispatch, inputs.routing)




def _torch(case: bench.Case, inputs):
    import torch

    p = case.params
    k, experts = p["top_k"], p["experts"]
    if p["kind"] in _ROUTING:
        logits = dtypes.like_input(inputs.logits, True)
        tokens = logits.shape[0]

        def route():
            x = logits.float()
            probs = torch.softmax(x, dim=-1)
            w, ids = torch.topk(probs, k, dim=-1)
            w = w / w.sum(dim=-1, keepdim=True)
            counts = torch.bincount(ids.flatten(), minlength=experts)
            aux = experts * ((counts.float() / (tokens * k)) * probs.mean(dim=0)).sum()
            z = torch.logsumexp(x, dim=-1).square().mean()
            return w, ids, aux, z
        if p["kind"] == "route":
            return route

        def route_permute():
            w, ids, aux, z = route()
            order = torch.argsort(ids.flatten(), stable=True)
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(order.numel(), device=order.device)
            return w, ids.int(), aux, z, order.int(), inverse.int()
        return route_permute
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


def _cublas(case: bench.Case, inputs):
    """cuBLAS on the same groups: one GEMM, or a loop over the non-empty experts. fp16 through CuPy; bf16 through
    torch's cuBLAS (CuPy has no bf16 dtype)."""
    import cupy

    p = case.params
    off = inputs.offsets
    groups = [(e, int(off[e]), int(off[e + 1])) for e in range(p["experts"]) if off[e + 1] > off[e]]
    if p["dtype"] == "fp16":
        a, b = inputs.a, inputs.b
        mm, empty = cupy.matmul, lambda: cupy.empty((p["rows"], p["n"]), dtype=a.dtype)
    else:
        import torch

        a, b = dtypes.like_input(inputs.a, True), dtypes.like_input(inputs.b, True)
        mm, empty = torch.matmul, lambda: torch.empty((p["rows"], p["n"]), dtype=a.dtype, device=a.device)

    def fn():
        out = empty()
        for e, lo, hi in groups:
            mm(a[lo:hi], b[e].T, out=out[lo:hi])
        return out
    return fn


def _cublas_supports(case: bench.Case) -> str | None:
    if case.params["kind"] != "gemm":
        return "cuBLAS is the baseline of the grouped GEMM cases"
    if case.params["dtype"] == "bf16" and bench.torch_unavailable():
        return "bf16 cuBLAS needs torch (CuPy has no bf16 dtype)"
    return None


def _torch_layer(grouped: bool):
    """torch's MoE layer: router (fp32 logits), softmax + top-k, argsort, then a per-expert cuBLAS loop (counts copied to the
    host, as eager PyTorch MoE code does) or ``torch._grouped_mm``, then a weighted ``index_add``."""

    def prepare(case: bench.Case, inputs):
        from .torch import torch_moe_swiglu

        layer, top_k = inputs.layer, case.params["top_k"]
        x = dtypes.like_input(inputs.x, True)
        router = dtypes.like_input(layer.router_b[0], True).T
        w_gu, w_down = dtypes.like_input(layer.w_gate_up, True), dtypes.like_input(layer.w_down, True)

        logits = _fp32_logits(router)

        def fn():
            return torch_moe_swiglu(x, logits(x), top_k, w_gu, w_down, grouped=grouped)
        return fn
    return prepare


def _fp32_logits(router):
    """x @ router accumulated and returned in fp32, as our layer routes on (bf16 logits would round near-tied
    experts apart and route some tokens elsewhere than the reference): cuBLAS with an fp32 output where torch has
    ``mm(..., out_dtype=)``, else both operands upcast."""
    import torch

    try:
        torch.mm(router.T[:1], router, out_dtype=torch.float32)
        return lambda x: torch.mm(x, router, out_dtype=torch.float32)
    except (TypeError, RuntimeError):
        router32 = router.float()
        return lambda x: x.float() @ router32


def _torch_grouped(case: bench.Case, inputs):
    """``torch._grouped_mm``: the layer baseline, or on a grouped GEMM case the same groups in one call (b as
    ``[experts, K, N]`` column-major views, the layout it takes, offsets as the groups' ends)."""
    if case.params["kind"] == "layer":
        return _torch_layer(grouped=True)(case, inputs)
    import torch

    a, b = dtypes.like_input(inputs.a, True), dtypes.like_input(inputs.b, True).transpose(1, 2)
    ends = torch.as_tensor(inputs.offsets[1:], dtype=torch.int32, device=a.device)
    return lambda: torch._grouped_mm(a, b, offs=ends)


def _only(kinds, why):
    return lambda case: None if case.params["kind"] in kinds else why


def _grouped_mm_missing() -> str | None:
    missing = bench.torch_unavailable()
    if missing:
        return missing
    import torch

    return None if hasattr(torch, "_grouped_mm") else "this torch has no torch._grouped_mm"


def impls(args) -> list[bench.Impl]:
    pieces = (*_ROUTING, "gather", "combine")
    return [
        bench.Impl(name="ours", prepare=_ours),
        bench.Impl(name="torch", prepare=_torch, baseline=True, unavailable=bench.torch_unavailable,
                   supports=_only(pieces, "the torch pipeline covers routing, gather and combine")),
        bench.Impl(name="cublas", prepare=_cublas, baseline=True, supports=_cublas_supports),
        bench.Impl(name="torch-loop", prepare=_torch_layer(grouped=False), baseline=True,
                   unavailable=bench.torch_unavailable,
                   supports=_only(("layer",), "a layer baseline")),
        bench.Impl(name="torch-grouped", prepare=_torch_grouped, baseline=True,
                   unavailable=_grouped_mm_missing,
                   supports=_only(("layer", "gemm"), "a layer and grouped GEMM baseline")),
    ]


# ---------------------------------------------------------------- plans


def kernel_plans(case: bench.Case, spec) -> list[tuple[str, object, object]]:
    """(source, name expression, plan) of every kernel one call of ``case`` launches on ``spec``."""
    p = case.params
    dt = dtypes.from_name(p["dtype"])
    if p["kind"] == "gemm":
        g = gemm_configs.plan(gemm_configs.GemmProblem(rows=p["rows"], n=p["n"], k=p["k"], experts=p["experts"],
                                                       dtype=p["dtype"]), spec)
        return [(GEMM_SOURCE, g.config.name_expression(dtype=dt), g)]
    if p["kind"] == "layer":
        tokens, k, h, inter, e = p["tokens"], p["top_k"], p["hidden"], p["intermediate"], p["experts"]
        up_problem = gemm_configs.GemmProblem(rows=tokens * k, n=2 * inter, k=h, experts=e, epilogue="swiglu",
                                              dtype=p["dtype"])
        up = gemm_configs.plan(up_problem, spec)
        down_problem = gemm_configs.GemmProblem(rows=tokens * k, n=h, k=inter, experts=e, dtype=p["dtype"])
        down = gemm_configs.plan(down_problem, spec)
        if SkinnyFFN.planned(up.config, down.config, up_problem):
            # one launch of both (its shared memory: the larger of the two tiles' partial sums)
            larger = max((up, down), key=lambda pl: pl.config.smem_bytes())
            router = gemm_configs.plan(gemm_configs.GemmProblem(rows=tokens, n=e, k=h, experts=1, dtype=p["dtype"],
                                                                out_dtype="fp32"), spec)
            if SkinnyDecode.planned(router.config, True):  # and the router GEMM, routing and permutation with them
                smem = SkinnyDecode.smem_bytes(router.config, up.config, down.config)
                return [(GEMM_SOURCE, decode_name_expression(router.config, up.config, down.config, dt, e),
                         dataclasses.replace(larger, smem_bytes=smem))]
            return [(GEMM_SOURCE, ffn_name_expression(up.config, down.config, dt), larger)]
        # the instances the layer launches: the token gather and the combine fused where the tiles take them
        gather = tma_gathers(up.config, "swiglu")
        scatter = tma_scatters(down.config, down_problem, k)
        return [(GEMM_SOURCE, up.config.name_expression(dtype=dt, epilogue="swiglu", gather=gather), up),
                (GEMM_SOURCE, down.config.name_expression(dtype=dt, scatter=scatter), down)]
    if p["kind"] in _ROUTING:
        route = configs.plan_route(configs.RouteProblem(tokens=p["tokens"], experts=p["experts"], top_k=p["top_k"],
                                                        dtype=p["dtype"]), spec)
        plans = [(launch.ROUTE_SOURCE, route.config.name_expression(dtype=dt), route)]
        if not route.config.finish:  # decode-sized routing finishes in its one block
            finish = configs.plan_finish(spec)
            plans.append((launch.ROUTE_SOURCE, finish.config.name_expression(), finish))
        if p["kind"] == "route":
            return plans
        scatter = configs.plan_scatter(spec)
        return plans + [(launch.DISPATCH_SOURCE, scatter.config.name_expression(), scatter)]
    rows = dispatch.capacity(p["tokens"], p["top_k"], p["experts"], None)
    if p["kind"] == "gather":
        g = configs.plan_gather(configs.RowsProblem(rows=rows, hidden=p["hidden"], top_k=p["top_k"],
                                                    dtype=p["dtype"]), spec)
        return [(launch.DISPATCH_SOURCE, g.config.name_expression(), g)]
    c = configs.plan_combine(configs.RowsProblem(rows=p["tokens"], hidden=p["hidden"], top_k=p["top_k"],
                                                 dtype=p["dtype"]), spec)
    return [(launch.DISPATCH_SOURCE, c.config.name_expression(dtype=dt), c)]


def _tiles(config) -> str:
    """A config without its class name, which the kernel column already says: "warps=8, tokens_per_warp=1"."""
    text = str(config)
    name = type(config).__name__
    if text.startswith(name + "(") and text.endswith(")"):
        text = text[len(name) + 1 : -1]
    return text or "fixed"


def plan_rows(cases: list[bench.Case], spec, with_compile: bool) -> list[dict]:
    """One row per kernel a case launches: the kernel, its tiles, shared memory against the limit and with
    ``with_compile`` registers and spills; the instance, threads and the planner's reason are --verbose columns."""
    entries, refused = [], []
    for case in cases:
        try:
            entries += [(case, *k) for k in kernel_plans(case, spec)]
        except tiling.PlanError as exc:  # e.g. the tensor-core GEMM on sm_75: said, not hidden
            refused.append({"case": case.name, "tiles": cli.NO_PLAN, "why": str(exc)})
    resources = {}
    if with_compile:
        by_source: dict = {}
        for _, source, expr, _ in entries:
            by_source.setdefault(source, {})[expr] = None
        for source, exprs in by_source.items():
            resources.update({(source, e): r for e, r in compile.compile_offline(source, list(exprs), spec.arch).items()})
    rows = []
    for case, source, expr, plan in entries:
        row = {"case": case.name, "kernel": expr.split("<")[0], "tiles": _tiles(plan.config),
               "smem / limit B": cli.smem_cell(plan)}
        if with_compile:
            row.update(cli.resource_cells(resources[(source, expr)]))
        rows.append({**row, "instance": expr, "threads": str(plan.config.threads),
                     "why": f"{plan.source}: {plan.reason}"})
    return rows + refused


# ---------------------------------------------------------------- utilisation


def utilisation(results, args) -> str:
    """aux/z-loss and usage of each routing case on the bench's own inputs (same seeds as ``bench.run``)."""
    cases = _cases(args.suite, args)
    if args.case:
        cases = [c for c in cases if any(s in c.name for s in args.case)]
    rows = []
    for case in cases:
        if case.params["kind"] != "route+permute":
            continue
        logits = make_inputs(case, bench.case_seed(case, args.seed)).logits
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


# --suite NAME: what each holds and where its shapes come from (``moe/suites.py`` tags the shapes)
SUITES = {
    "primary": "routing + seed004 + gemm: what a run with no arguments measures",
    "seed004": "the MoE layer of the project's expected-results brief (seed 004: hidden 4096, intermediate 11008, "
               "32 experts, top-2) at its 3 batch x sequence sizes, every piece and the whole layer; the layer is "
               "scored against expected_results/*.toml",
    "routing": "routing + permutation alone at 32768 tokens: 32 experts top-2 and 256 experts top-8",
    "gemm": "the grouped expert GEMM at seed 004's up-projection size (8192 x 11008 x 4096): one group, 8 and 32 "
            "equal and random (gamma) groups; against cuBLAS (one GEMM or a per-group loop) and torch._grouped_mm",
    "dense": "one-group GEMMs of models.bench's dense models (medium, large: QKV, output, gate/up, down projections) "
             "at 128, 2048 and 8192 tokens, against cuBLAS: the tile grid and split-K choices of the tma planner",
    "quick": "small shapes: a fast pass over every piece but the whole layer",
    "ci": "small shapes with odd sizes (1000 tokens, 60 experts, top-4; 256 experts, top-8) that the GPU tests "
          "check",
    "overhead": "a tiny problem (16 tokens) where the host's cost per call is all there is; grades seed 004's "
                "launch overhead < 50 us",
    "decode": "decode-sized layers (1, 4, 16, 64, 256 tokens): 64 experts top-8 (hidden 2048, intermediate 1408) "
              "and seed 004's configuration; the table after the run gives GB/s on the bytes of the experts the "
              "step touches against the copy bandwidth measured in the same process",
    "all": "every suite above",
}


def _describe(case: bench.Case) -> str:
    p = case.params
    if p["kind"] == "gemm":
        return f"{p['rows']}x{p['n']}x{p['k']}, {p['experts']} group{'s' if p['experts'] > 1 else ''} ({p['split']})"
    dims = "".join(f" {letter}{p[key]}" for letter, key in (("H", "hidden"), ("I", "intermediate"))
                   if p.get(key))
    return f"T{p['tokens']} E{p['experts']} top{p['top_k']}{dims}"


def _expected_key(case: bench.Case) -> tuple[str, str] | None:
    """seed 004's MoE rows are whole layers: "seed004_b16x2048 layer" -> ("moe", "B16_S2048")."""
    p = case.params
    if p["kind"] != "layer" or not p["shape"].startswith("seed004_b"):
        return None
    batch, seq = p["shape"].removeprefix("seed004_b").split("x")
    return "moe", f"B{batch}_S{seq}"


def router_share(results, args) -> str:
    """Seed 004's "router overhead": route + permute time over the whole layer's, per seed 004 batch."""
    ours = {r.case: r for r in results if r.impl == "ours" and r.ok}
    rows = []
    for name, r in ours.items():
        if not name.endswith(" layer") or "seed004" not in r.tags:  # seed 004 batches only: a tiny layer is host time
            continue
        shape = name.removesuffix(" layer")
        route = ours.get(f"{shape} route+permute")
        if route is not None:
            rows.append({"shape": shape, "route+permute ms": f"{route.median_ms:.4f}",
                         "layer ms": f"{r.median_ms:.3f}",
                         "router share": f"{100 * route.median_ms / r.median_ms:.2f}%"})
    if not rows:
        return ""
    return ("router share of the layer time (seed 004 target < 5 %, excellent < 2 %):\n"
            + tabulate(rows, headers="keys", tablefmt="github", disable_numparse=True))


def touched_bytes(inputs, top_k: int) -> tuple[int, int]:
    """(experts a layer case's tokens route to, the bytes a forward must read at least: those experts' weights,
    the router's, x and the output), from the layer's own router GEMM and routing on the case's inputs."""
    import cupy

    layer, x = inputs.layer, inputs.x
    tokens = int(x.shape[0])
    logits = grouped_gemm(x, layer.router_b, cupy.asarray([0, tokens], dtype=cupy.int32), out_dtype=np.float32)
    touched = int(cupy.unique(routing.route(logits, top_k).experts).size)
    es = layer.w_gate_up.dtype.itemsize
    per_expert = es * (layer.w_gate_up.shape[1] * layer.hidden + layer.hidden * layer.intermediate)
    return touched, touched * per_expert + es * layer.router_b.size + 2 * es * tokens * layer.hidden


def decode_table(results, args) -> str:
    """Decode-sized layers: GB/s on the touched experts' bytes, over our device time (``held_ms`` where the case
    is timed with host time because the torch layers synchronise) and as called, against the copy bandwidth
    measured in this process (issue 14's target: >= 70 %), and the speed-up on each torch layer."""
    cases = _cases(args.suite, args)
    if args.case:
        cases = [c for c in cases if any(s in c.name for s in args.case)]
    by = {(r.case, r.impl): r for r in results if r.ok}
    rows, copy = [], None
    for case in cases:
        ours = by.get((case.name, "ours"))
        if "decode" not in case.tags or ours is None:
            continue
        if copy is None:
            from cukernels import bandwidth

            copy = bandwidth.measure_copy().tb_per_s * 1e3
        touched, nbytes = touched_bytes(make_inputs(case, bench.case_seed(case, args.seed)), case.params["top_k"])
        # the torch layers synchronise, so the case is timed with host time; our own call is held apart from it
        device_ms = ours.held_ms or ours.median_ms
        row = {"case": case.name, "touched experts": f"{touched}/{case.params['experts']}",
               "MB": f"{nbytes / 1e6:,.1f}", "ours ms": f"{ours.median_ms:.4f}",
               "held ms": "" if ours.held_ms is None else f"{ours.held_ms:.4f}",
               "% of copy": f"{100 * nbytes / (device_ms * 1e6) / copy:.0f}%"}
        if ours.as_called_ms:
            row["as called ms"] = f"{ours.as_called_ms:.4f}"
            row["% as called"] = f"{100 * nbytes / (ours.as_called_ms * 1e6) / copy:.0f}%"
        for impl in ("torch-loop", "torch-grouped"):
            r = by.get((case.name, impl))
            row[f"vs {impl}"] = "" if r is None else f"{r.median_ms / ours.median_ms:.2f}x"
            if r is not None and r.as_called_ms and ours.as_called_ms:
                row[f"vs {impl}"] += f" ({r.as_called_ms / ours.as_called_ms:.2f}x called)"
        rows.append(row)
    if not rows:
        return ""
    return (f"decode layers: bytes of the touched experts (+ router, x, out) over our device time (held ms where the "
            f"case is timed with host time; ours ms otherwise), against the copy bandwidth measured in this process "
            f"({copy:,.0f} GB/s read + written; target >= 70 %); 'vs' columns on the case's common timing:\n"
            + tabulate(rows, headers="keys", tablefmt="github", disable_numparse=True))


def _extra(results, args) -> str:
    return "\n\n".join(x for x in (utilisation(results, args), router_share(results, args),
                                    decode_table(results, args)) if x)


# ---------------------------------------------------------------- --tune / --sweep, --ncu (cukernels/tune.py, ncu.py)


def _gemm_tunable(label: str, problem, spec, inputs=None, out_dtype=None):
    """One grouped GEMM, every feasible tile through ``grouped_gemm(config=...)``. A layer's GEMMs are tuned on
    inputs of their own (equal groups, as routing random tokens gives), each candidate checked against the
    heuristic's output; the tuned entry is keyed by the GEMM's problem, which the layer's cache miss plans. The
    problem holds no group split, so ``..._E32_equal`` and ``..._E32_random`` share one entry: the first tuned in a
    run keeps it and the other reports "same key" (``tune.tune_case``)."""
    def run(cfg, x):
        return lambda: grouped_gemm(x.a, x.b, x.offsets_d, epilogue=problem.epilogue, out_dtype=out_dtype, config=cfg)

    try:
        heuristic = tune.heuristic(gemm_configs.plan, problem, spec)
    except tiling.PlanError as exc:
        return tune.NotTunable(label=label, reason=str(exc))
    return tune.Tunable(op=gemm_configs.OP, label=label, problem=problem, heuristic=heuristic, run=run,
                        candidates=gemm_configs.candidates(problem, spec), files=gemm_configs.tune_files(),
                        inputs=inputs, dtype=problem.dtype)


def _gemm_inputs(problem):
    def make(seed: int):
        import cupy

        dt = dtypes.from_name(problem.dtype)
        return types.SimpleNamespace(
            a=dtypes.random((problem.rows, problem.k), dt, seed=seed),
            b=dtypes.random((problem.experts, problem.n, problem.k), dt, seed=seed + 1, scale=1 / np.sqrt(problem.k)),
            offsets_d=cupy.asarray(gemm_offsets(problem.rows, problem.experts, "equal" if problem.experts > 1
                                                else "one")))
    return make


def _tunables(case: bench.Case, spec, args) -> list:
    p = case.params
    G = gemm_configs.GemmProblem
    if p["kind"] == "gemm":
        return [_gemm_tunable("grouped GEMM", G(rows=p["rows"], n=p["n"], k=p["k"], experts=p["experts"],
                                                dtype=p["dtype"]), spec)]
    if p["kind"] == "layer":
        rows, e, h, inter = p["tokens"] * p["top_k"], p["experts"], p["hidden"], p["intermediate"]
        gemms = (("router GEMM (fp32 logits)", G(rows=p["tokens"], n=e, k=h, experts=1, dtype=p["dtype"]), np.float32),
                 ("up GEMM (swiglu)", G(rows=rows, n=2 * inter, k=h, experts=e, dtype=p["dtype"], epilogue="swiglu"),
                  None),
                 ("down GEMM", G(rows=rows, n=h, k=inter, experts=e, dtype=p["dtype"]), None))
        return [_gemm_tunable(label, g, spec, _gemm_inputs(g), out) for label, g, out in gemms]
    why = ("route() takes no config; its planner's candidates differ in warps per block only" if p["kind"] in _ROUTING
           else "the planner has a single config for it")
    return [tune.NotTunable(label=p["kind"], reason=why)]


def _ncu_targets(cases: list[bench.Case], args) -> list:
    """The grouped GEMM (seed 004's up-projection size, 32 equal groups) and the router (route + permute at seed
    004's 16 x 2048 tokens), each in its own run of this bench."""
    run = ["--impl", "ours", "--dtype", args.dtype]
    return [ncu.Target(name="grouped GEMM (gemm_8192x11008x4096_E32_equal)", kernel_regex="moe_grouped_gemm",
                       bench_args=["--suite", "gemm", "--case", "E32_equal", *run], launch_skip=2, launch_count=1),
            ncu.Target(name="router (seed004_b16x2048 route+permute)", kernel_regex="moe_route|moe_permute",
                       bench_args=["--suite", "seed004", "--case", "seed004_b16x2048 route+permute", *run],
                       launch_skip=6, launch_count=3)]


def _add_arguments(parser) -> None:
    tune.add_arguments(parser)
    ncu.add_arguments(parser)


OP_BENCH = cli.OpBench(
    prog="python -m moe.bench",
    description=__doc__,
    op=lambda args: bench.Op(name="moe", make_inputs=make_inputs, reference=make_reference, check=check),
    suites=SUITES,
    default_suite="primary",
    cases=_cases,
    describe=_describe,
    shape_legend="shape: T tokens, E experts, top-k, H hidden, I intermediate; a GEMM: rows x n x k, groups",
    impls=impls,
    default_impls=("ours", "torch", "cublas", "torch-loop", "torch-grouped"),
    plan_rows=plan_rows,
    plan_details=("instance", "threads", "why"),
    expected_kind="moe",
    expected_fields={"ours": ("expected_ms", "target_ms"), "torch-loop": ("loop_cublas_ms",),
                     "torch-grouped": ("grouped_mm_ms",)},
    reference_impl=None,
    expected_key=_expected_key,
    reference_of=lambda case: {"gemm": "cublas", "layer": "torch-loop"}.get(case.params["kind"], "torch"),
    extra_output=_extra,
    add_arguments=_add_arguments,
)


def main(argv=None) -> int:
    if ep_bench.selected(sys.argv[1:] if argv is None else argv):  # expert parallelism: its own processes
        return ep_bench.main(argv)
    if tune.requested(OP_BENCH, argv):
        return tune.run_cli(OP_BENCH, argv, _tunables)
    if ncu.requested(OP_BENCH, argv):
        return ncu.run_cli(OP_BENCH, argv, _ncu_targets)
    return cli.main(OP_BENCH, argv)


if __name__ == "__main__":
    sys.exit(main())
