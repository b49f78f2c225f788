"""``python -m attention.bench``: flash attention checked, then timed, side by side with torch SDPA (flash,
cuDNN, memory-efficient) and the naive attention, scored against the GPU's expected table. ``--backward``
times forward + backward (gradients checked against the fp32 reference), FLOPs counted as 3.5x the forward's.

Thin by design: the options, the check-then-time loop, scoring and reports live in ``cukernels.cli``. This file
says what the cases, inputs, reference and implementations are.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys

from cukernels import bench, checks, cli, compile, device, dtypes, ncu, tiling, tune

from . import decode_bench, suites, varlen_bench
from .api import KERNELS, flash_attention
from . import bwd_configs, configs
from .configs import plan_forward
from .backward import KERNEL_SOURCE as BWD_SOURCE
from .backward import flash_attention_backward
from .bwd_configs import plan_backward
from .backward_reference import attention_backward_reference
from .reference import attention_reference

# --suite NAME: what each holds and where its shapes come from (``attention/suites.py`` tags the cases)
SUITES = {
    "default": "seed004 + grug: what a run with no arguments measures (under a minute on an H200)",
    "seed004": "the 2 shapes of the project's expected-results brief (seed 004), whose H100/A100/A10 times "
               "expected_results/*.toml holds; scored against them",
    "grug": "model shapes of the Grug attention perf report on a GB10 (seed 000): Llama-8B- and Qwen-like GQA, a "
            "125M model at high batch, head dim 256, sliding window + packed documents; causal as in training",
    "quick": "3 small shapes, one per head dim (64, 128, 256): a fast pass",
    "ci": "small odd-sized shapes (ragged tiles, GQA, window, packed documents) that the GPU tests check",
    "overhead": "tiny problems (seq 128) where the host's cost per call is all there is; grades seed 004's "
                "launch overhead < 50 us",
    "decode": "attention over a KV cache (flash_attention_with_kvcache): batch 1/8/64 x cache 1k-128k x 32/8, 32/32, "
              "16/16 heads x 1 or 4 query tokens, contiguous and paged, beside torch SDPA, in GB/s of the copy "
              "bandwidth (attention/decode_bench.py)",
    "varlen": "packed variable-length batches (flash_attention_varlen): 64 sequences of 1-8k tokens, 128k in all, "
              "beside the padded batch (ours dense, torch SDPA) and 64 x 2048 (attention/varlen_bench.py)",
}
# expected-table rows (expected_results/*.toml [[attention]]) by suite case name
_EXPECTED_KEY = {"seed004_b16_s2048_h16_d64": "seed004_a", "seed004_b32_s4096_h32_d128": "seed004_b"}
FWD_BWD_FLOP_FACTOR = 3.5  # forward + backward = 1 + 2.5 forward FLOPs (five matmuls of the backward)
BWD_TOL = {"fp16": checks.Tolerance(atol=2e-3, naive_factor=3.0), "bf16": checks.Tolerance(atol=1.6e-2, naive_factor=3.0)}
_NAIVE_MAX_FLOPS = 5e12  # the naive fp32 attention runs at ~6 TFLOP/s (H200): ~1 s per call; skip larger cases


def _suite_cases(suite: str) -> list[suites.Case]:
    if suite == "default":
        return suites.cases("seed004") + suites.cases("grug")
    return suites.cases(suite)


def _to_bench_case(c: suites.Case, args) -> bench.Case:
    causal = c.causal if args.causal is None else args.causal
    if causal != c.causal:  # --causal / --no-causal; a window keeps its left side, causal closes the right
        window = (c.window[0], 0) if (causal and c.window) else c.window
        c = dataclasses.replace(c, causal=causal, window=window)
    key = _EXPECTED_KEY.get(c.name, c.name)
    name = key + ("_causal" if causal and key.startswith("seed004") else "")
    itemsize = 2
    io_bytes = itemsize * c.head_dim * (2 * c.batch * c.seq_q * c.heads + 2 * c.batch * c.n_seq_kv * c.n_kv_heads)
    backward = bool(getattr(args, "backward", False))
    return bench.Case(name=name, params={**{f: getattr(c, f) for f in ("batch", "seq_q", "heads", "head_dim",
                                                                       "causal", "window", "segments")},
                                         "kv_heads": c.n_kv_heads, "seq_kv": c.n_seq_kv, "seq": c.seq_q,
                                         "suite_case": c.name, "backward": backward},
                      tags=c.tags, flops=c.flops() * (FWD_BWD_FLOP_FACTOR if backward else 1.0),
                      bytes=io_bytes * (2.5 if backward else 1.0), dtype=args.dtype)


def _problem(case: bench.Case):
    p = case.params
    return suites.Case(name=p["suite_case"], batch=p["batch"], seq_q=p["seq_q"], seq_kv=p["seq_kv"],
                       heads=p["heads"], kv_heads=p["kv_heads"], head_dim=p["head_dim"], causal=p["causal"],
                       window=p["window"], segments=p["segments"])


# ---------------------------------------------------------------- inputs, reference, check


def _make_inputs(case: bench.Case, seed: int) -> dict:
    import cupy

    c = _problem(case)
    dt = dtypes.from_name(case.dtype)
    q = dtypes.random((c.batch, c.seq_q, c.heads, c.head_dim), dt, seed=3 * seed)
    k = dtypes.random((c.batch, c.n_seq_kv, c.n_kv_heads, c.head_dim), dt, seed=3 * seed + 1)
    v = dtypes.random((c.batch, c.n_seq_kv, c.n_kv_heads, c.head_dim), dt, seed=3 * seed + 2)
    ids = c.segment_ids(seed)
    inputs = {"q": q, "k": k, "v": v, "segment_ids": None if ids is None else cupy.asarray(ids)}
    if case.params["backward"]:
        inputs["do"] = dtypes.random(q.shape, dt, seed=3 * seed + 7)
    return inputs


def _checked_batches(case: bench.Case) -> list[int]:
    """Batch elements the reference is computed for: the first and the last (the reference is O(S^2))."""
    return sorted({0, case.params["batch"] - 1})


def _reference(case: bench.Case, inputs: dict):
    sel = _checked_batches(case)
    sub = {k: (None if v is None else v[sel]) for k, v in inputs.items()}
    kw = dict(causal=case.params["causal"], window=case.params["window"], segment_ids=sub["segment_ids"])
    if case.params["backward"]:
        grads = attention_backward_reference(sub["do"], sub["q"], sub["k"], sub["v"], **kw)
        naive = attention_backward_reference(sub["do"], sub["q"], sub["k"], sub["v"], round_to=case.dtype, **kw)
        return grads, naive
    ref = attention_reference(sub["q"], sub["k"], sub["v"], **kw)
    naive = attention_reference(sub["q"], sub["k"], sub["v"], round_to=case.dtype, **kw)
    return ref, naive


def _check(case: bench.Case, out, ref_pair) -> list[checks.CheckResult]:
    ref, naive = ref_pair
    sel = _checked_batches(case)
    if case.params["backward"]:
        return [checks.compare(g[sel], r, tol=BWD_TOL[case.dtype], naive=n, name=name)
                for g, r, n, name in zip(out, ref, naive, ("dq", "dk", "dv"))]
    return [checks.compare(out[sel], ref, tol=checks.TOLERANCES[case.dtype], naive=naive, name="o")]


def _poison_bytes(case: bench.Case) -> int:
    p = case.params
    out = 2 * p["batch"] * p["seq_q"] * p["heads"] * p["head_dim"] + (1 << 20)
    return 4 * out if p["backward"] else out


# ---------------------------------------------------------------- implementations


def _ours(case: bench.Case, inputs: dict):
    kw = dict(causal=case.params["causal"], window=case.params["window"], segment_ids=inputs["segment_ids"])
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    if case.params["backward"]:
        do = inputs["do"]

        def fwd_bwd():
            o, lse = flash_attention(q, k, v, return_lse=True, **kw)
            return flash_attention_backward(do, q, k, v, o, lse, **kw)
        return fwd_bwd
    return lambda: flash_attention(q, k, v, **kw)


def _naive(case: bench.Case, inputs: dict):
    kw = dict(causal=case.params["causal"], window=case.params["window"], segment_ids=inputs["segment_ids"])
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    return lambda: attention_reference(q, k, v, round_to=case.dtype, **kw)


def _naive_supports(case: bench.Case) -> str | None:
    if case.params["backward"]:
        return "the naive attention is timed forward only"
    if case.flops > _NAIVE_MAX_FLOPS:
        return f"naive fp32 attention skipped above {_NAIVE_MAX_FLOPS:.1e} FLOP (this case: {case.flops:.1e})"
    return None




def _torch_supports(case: bench.Case) -> str | None:
    p = case.params
    if p["window"] is not None or p["segments"]:
        return "torch SDPA's fused backends take no sliding window or segment-id mask"
    if p["causal"] and p["seq_q"] != p["seq_kv"]:
        return "torch SDPA's is_causal aligns top-left; ours aligns bottom-right"
    return None


def _torch_sdpa(backend_name: str):
    def prepare(case: bench.Case, inputs: dict):
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        tq, tk, tv = (dtypes.like_input(inputs[n], True).transpose(1, 2) for n in ("q", "k", "v"))
        if case.dtype == "fp16":
            tq, tk, tv = (t.view(torch.float16) for t in (tq, tk, tv))
        gqa = case.params["heads"] != case.params["kv_heads"]
        causal = case.params["causal"]
        if case.params["backward"]:
            tq, tk, tv = (t.detach().requires_grad_() for t in (tq, tk, tv))
            tdo = dtypes.like_input(inputs["do"], True).transpose(1, 2)
            if case.dtype == "fp16":
                tdo = tdo.view(torch.float16)

            def fwd_bwd():
                with bench.torch_on_cupy_stream(), sdpa_kernel(backend):
                    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal,
                                                                           enable_gqa=gqa)
                    grads = torch.autograd.grad(out, (tq, tk, tv), tdo)
                return tuple(g.transpose(1, 2) for g in grads)
            return fwd_bwd

        def run():
            with bench.torch_on_cupy_stream(), sdpa_kernel(backend):
                out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal,
                                                                       enable_gqa=gqa)
            return out.transpose(1, 2)

        return run

    return prepare


def _impls(args) -> list[bench.Impl]:
    torch_impls = [
        bench.Impl(name=name, prepare=_torch_sdpa(backend), baseline=True, unavailable=bench.torch_unavailable,
                   supports=_torch_supports)
        for name, backend in (("torch-flash", "FLASH_ATTENTION"), ("torch-cudnn", "CUDNN_ATTENTION"),
                              ("torch-efficient", "EFFICIENT_ATTENTION"))
    ]
    return [bench.Impl(name="ours", prepare=_ours),
            bench.Impl(name="naive", prepare=_naive, baseline=True, supports=_naive_supports),
            *torch_impls]


# ---------------------------------------------------------------- plans


def _plan(case: bench.Case, spec: device.DeviceSpec) -> tiling.Plan:
    if case.params["backward"]:
        return plan_backward(_problem(case).problem(case.dtype), spec)
    return plan_forward(_problem(case).problem(case.dtype), spec)


def _variant(case: bench.Case, cfg) -> tuple:
    """(kernel file, name expression) of the main kernel a plan launches."""
    dt, mask = dtypes.from_name(case.dtype), _problem(case).problem().mask
    if case.params["backward"]:
        return BWD_SOURCE.parent / cfg.source, cfg.name_expression(dtype=dt, mask=mask, dq=True)
    return KERNELS / cfg.source, cfg.name_expression(dtype=dt, mask=mask)


def _plan_rows(cases: list[bench.Case], spec: device.DeviceSpec, with_compile: bool) -> list[dict]:
    """One row per case: the tiles, their shared memory against the limit, the CTA count, and with
    ``with_compile`` the registers and spills of the main kernel; "why" and "kernel" are --verbose columns."""
    rows = []
    for case in cases:
        row = {"case": case.name, "shape": _shape(case)}
        try:
            plan = _plan(case, spec)
        except tiling.PlanError as exc:
            rows.append({**row, "tiles": cli.NO_PLAN, "why": str(exc)})
            continue
        cfg, p = plan.config, case.params
        if p["backward"]:  # the dK/dV kernel's grid: KV tiles x kv heads x batch
            ctas = math.ceil((p["seq_kv"] or p["seq_q"]) / cfg.block_n) * p["kv_heads"] * p["batch"]
        else:
            ctas = math.ceil(p["seq_q"] / cfg.block_m) * p["heads"] * p["batch"]
        source, expr = _variant(case, cfg)
        row.update({"tiles": str(cfg).replace(" | ", "; "), "smem / limit B": cli.smem_cell(plan),
                    "CTAs": f"{ctas:,}"})
        if with_compile:
            try:
                row.update(cli.resource_cells(compile.compile_offline(source, [expr], spec.arch)[expr]))
            except compile.CompileError as exc:
                row.update({"regs": "compile error", "spill B": str(exc).splitlines()[0]})
        rows.append({**row, "kernel": expr, "why": plan.reason})
    return rows


def _shape(case: bench.Case) -> str:
    p = case.params
    if "length" in p:  # a decode case
        return decode_bench.shape(case)
    if "lengths" in p:  # a packed (varlen) case
        return varlen_bench.shape(case)
    mask = "causal" if p["causal"] else "full"
    if p["window"]:
        mask += "+win{},{}".format(*p["window"])
    if p["segments"]:
        mask += "+seg"
    kv = f"/{p['kv_heads']}" if p["kv_heads"] != p["heads"] else ""
    sk = f"x{p['seq_kv']}" if p["seq_kv"] != p["seq_q"] else ""
    return f"B{p['batch']} S{p['seq_q']}{sk} H{p['heads']}{kv} D{p['head_dim']} {mask}"


def _plan_of(case: bench.Case) -> str | None:
    try:
        return str(_plan(case, device.current()))
    except tiling.PlanError as exc:
        return f"no plan: {exc}"


def _memory_table(results: list[bench.Result], args) -> str:
    """Seed 004's memory table, measured: peak extra device memory of ours against the naive attention's and what
    a fully materialised fp32 score matrix [B, H, Sq, Skv] alone would take."""
    from tabulate import tabulate

    rows = []
    for case in dict.fromkeys(r.case for r in results):
        mine = next((r for r in results if r.case == case and r.impl == "ours" and r.ok), None)
        if mine is None:
            continue
        p = mine.params
        naive = next((r for r in results if r.case == case and r.impl == "naive" and r.ok), None)
        scores = 4 * p["batch"] * p["heads"] * p["seq_q"] * p["seq_kv"]
        rows.append({"case": case, "ours peak MiB": f"{mine.peak_memory_bytes / 2**20:,.0f}",
                     "naive peak MiB": "" if naive is None else f"{naive.peak_memory_bytes / 2**20:,.0f}",
                     "[B,H,S,S] fp32 scores MiB": f"{scores / 2**20:,.0f}",
                     "reduction vs scores": f"{scores / max(mine.peak_memory_bytes, 1):.1f}x"})
    if not rows:
        return ""
    return "Peak extra device memory (ours is O(S): output + LSE):\n" + tabulate(rows, headers="keys",
                                                                                   tablefmt="github")


# ---------------------------------------------------------------- --tune / --sweep, --ncu (cukernels/tune.py, ncu.py)


def _tunables(case: bench.Case, spec: device.DeviceSpec, args) -> list:
    """The forward (or, with --backward, the backward alone, after one forward) of a case, every feasible config
    through the API's ``plan=``, checked on the case's inputs against the fp32 reference."""
    label = "backward" if case.params.get("backward") else "forward"
    if "suite_case" not in case.params:
        return [tune.NotTunable(label=label, reason="only the training-shape cases are tuned")]
    problem = _problem(case).problem(case.dtype)
    mod = bwd_configs if case.params["backward"] else configs
    planner = plan_backward if case.params["backward"] else plan_forward

    def run(cfg, inputs):
        kw = dict(causal=case.params["causal"], window=case.params["window"], segment_ids=inputs["segment_ids"])
        q, k, v, plan = inputs["q"], inputs["k"], inputs["v"], tune.explicit(cfg, spec)
        if not case.params["backward"]:
            return lambda: flash_attention(q, k, v, plan=plan, **kw)
        o, lse = flash_attention(q, k, v, return_lse=True, **kw)
        return lambda: flash_attention_backward(inputs["do"], q, k, v, o, lse, plan=plan, **kw)

    try:
        heuristic = tune.heuristic(planner, problem, spec)
    except tiling.PlanError as exc:
        return [tune.NotTunable(label=label, reason=str(exc))]
    return [tune.Tunable(op=mod.OP if case.params["backward"] else configs.TUNE_OP, label=label, problem=problem,
                         candidates=mod.candidates(problem, spec), heuristic=heuristic, files=mod.tune_files(),
                         run=run)]


def _ncu_targets(cases: list[bench.Case], args) -> list:
    """Forward and backward of one case (the first asked for, else seed 004's first), each its main kernels."""
    case = next((c for c in cases if "suite_case" in c.params), None)
    name = case.name if case else "seed004_a"
    run = ["--suite", args.suite if case else "seed004", "--case", name, "--impl", "ours", "--dtype", args.dtype]
    return [ncu.Target(name=f"attention forward ({name})", bench_args=run, kernel_regex="flash_fwd",
                       launch_skip=2, launch_count=1),
            ncu.Target(name=f"attention backward ({name})", bench_args=[*run, "--backward"],
                       kernel_regex="flash_bwd", launch_skip=6, launch_count=3)]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--causal", dest="causal", action="store_true", default=None,
                        help="force causal masking on every case (default: each case's own)")
    parser.add_argument("--no-causal", dest="causal", action="store_false", help="force non-causal")
    parser.add_argument("--backward", action="store_true",
                        help="time forward + backward (gradients checked; FLOPs = 3.5x the forward's)")
    tune.add_arguments(parser)
    ncu.add_arguments(parser)


OP = cli.OpBench(
    prog="python -m attention.bench",
    description=__doc__.split("\n\n")[0],
    op=lambda args: bench.Op(name="attention", make_inputs=_make_inputs, reference=_reference, check=_check,
                             poison_bytes=_poison_bytes),
    suites=SUITES,
    default_suite="default",
    cases=lambda suite, args: (decode_bench.cases(suite, args) if suite == "decode"
                               else varlen_bench.cases(suite, args) if suite == "varlen"
                               else [_to_bench_case(c, args) for c in _suite_cases(suite)]),
    describe=_shape,
    shape_legend="shape: B batch, S sequence [x kv sequence], H heads [/ kv heads], D head dim, mask",
    impls=_impls,
    default_impls=("ours", "torch-flash", "torch-cudnn", "naive"),
    plan_rows=_plan_rows,
    plan_details=("kernel", "why"),
    plan_of=_plan_of,
    expected_kind="attention",
    expected_fields={"ours": ("target_ms",), "torch-flash": ("torch_flash_ms", "reference_ms"),
                     "torch-cudnn": ("torch_cudnn_ms",), "torch-efficient": ("torch_efficient_ms",),
                     "naive": ("pytorch_native_ms",)},
    # seed 004's and the anchors' rows are forward times: forward + backward rows have no expected value
    expected_key=lambda case: None if case.params["backward"] else ("attention", case.name),
    reference_impl="torch-flash",
    add_arguments=_add_arguments,
    extra_output=_memory_table,
)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    suite = next((a.split("=", 1)[1] if "=" in a else nxt for a, nxt in zip(argv, argv[1:] + [""])
                  if a == "--suite" or a.startswith("--suite=")), None)
    # the decode and varlen suites have their own inputs, implementations and tables (attention/decode_bench.py,
    # attention/varlen_bench.py)
    own = {"decode": decode_bench.OP, "varlen": varlen_bench.OP}.get(suite)
    if own is None and tune.requested(OP, argv):
        return tune.run_cli(OP, argv, _tunables)
    if own is None and ncu.requested(OP, argv):
        return ncu.run_cli(OP, argv, _ncu_targets)
    return cli.main(own or OP, argv)


if __name__ == "__main__":
    sys.exit(main())
