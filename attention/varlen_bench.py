"""``python -m attention.bench --suite varlen``: attention over packed variable-length batches
(``flash_attention_varlen``) checked per sequence, then timed beside the same sequences padded to the longest:
our dense forward and torch SDPA (flash and cuDNN backends) on the padded batch. ``--backward`` times the
backward alone (the forward ran once when the row was prepared): ours packed, ours padded, torch's autograd of
padded SDPA.

Cases (causal, bf16 unless --dtype): 64 sequences whose lengths are drawn log-uniformly between 1 and 8192 and
scaled to 131,072 tokens in all (fixed seed, so every run has the same lengths), at 16 heads d128, 32/8 heads
d128 (GQA), 16 heads d64 and 8 heads d256; and 64 sequences of exactly 2048 tokens (the same total), where padding
costs nothing: the dense forward's throughput on equal total tokens, for the packed rows to be compared against.
Causal, because a right-padded batch computes each real row exactly under a causal mask (its keys end before the
padding), so every row of the table computes the same function.

FLOPs are the useful ones of the real sequences (4 d h per visible query-key pair, 2.5x that for the backward),
for every row: a padded row's TFLOP/s is what its time buys of the real work. Ours runs with
``check_values=False``, as a training loop would (the offsets were made by the data loader).
"""
from __future__ import annotations

import functools

import numpy as np

from cukernels import bench, checks, cli, device, dtypes, tiling

from .configs import FwdProblem, plan_forward
from .varlen import flash_attention_varlen, flash_attention_varlen_backward

SEQUENCES, TOTAL, LONGEST = 64, 131072, 8192
HEADS = ((16, 16, 128), (32, 8, 128), (16, 16, 64), (8, 8, 256))


@functools.cache
def mixed_lengths(seed: int = 2026) -> tuple[int, ...]:
    """64 lengths drawn log-uniformly from [1, 8192] (many short sequences, a few long ones, as packed training
    data has), scaled to 131,072 in all while staying within [1, 8192]."""
    rng = np.random.default_rng(seed)
    raw = np.exp(rng.uniform(0.0, np.log(LONGEST), SEQUENCES))
    scale = TOTAL / raw.sum()
    for _ in range(50):  # rescale the sequences under the cap until the capped total is reached
        lens = np.clip(np.round(raw * scale), 1, LONGEST).astype(np.int64)
        free = lens < LONGEST
        short = TOTAL - lens.sum()
        if abs(short) <= SEQUENCES or not free.any():
            break
        scale *= 1 + short / max(1, lens[free].sum())
    order = np.argsort(-lens)
    i = 0
    while lens.sum() != TOTAL:  # rounding: move the rest onto the sequences with room, longest first
        j = order[i % SEQUENCES]
        step = 1 if lens.sum() < TOTAL else -1
        if 1 <= lens[j] + step <= LONGEST:
            lens[j] += step
        i += 1
    return tuple(int(x) for x in lens)


def _pairs(lens, causal: bool) -> int:
    return int(sum(n * (n + 1) // 2 if causal else n * n for n in lens))


def cases(suite: str, args) -> list[bench.Case]:
    backward = bool(getattr(args, "backward", False))
    out = []
    for kind, lens in (("mixed", mixed_lengths()), ("equal", (TOTAL // SEQUENCES,) * SEQUENCES)):
        for heads, kv_heads, dim in HEADS:
            if kind == "equal" and (heads, kv_heads, dim) != (16, 16, 128):
                continue
            flops = 4.0 * heads * dim * _pairs(lens, True) * (2.5 if backward else 1.0)
            name = f"varlen_{kind}_T128k_h{heads}-{kv_heads}_d{dim}" + ("_bwd" if backward else "")
            out.append(bench.Case(
                name=name, tags=("varlen",), dtype=args.dtype, flops=flops,
                params=dict(kind=kind, lengths=lens, heads=heads, kv_heads=kv_heads, head_dim=dim, causal=True,
                            backward=backward)))
    return out


def shape(case: bench.Case) -> str:
    p = case.params
    lens = p["lengths"]
    return (f"{len(lens)} seqs {min(lens)}..{max(lens)} (T {sum(lens)}) H{p['heads']}/{p['kv_heads']} "
            f"D{p['head_dim']} causal")


def _selected(case: bench.Case) -> list[int]:
    """The sequences checked against the reference: the shortest, the longest and one in between."""
    lens = case.params["lengths"]
    order = sorted(range(len(lens)), key=lambda b: lens[b])
    return sorted({order[0], order[len(order) // 2], order[-1]})


def make_inputs(case: bench.Case, seed: int) -> dict:
    import cupy

    p = case.params
    lens = np.asarray(p["lengths"])
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    total, longest, batch = int(cu[-1]), int(lens.max()), len(lens)
    dt = dtypes.from_name(case.dtype)
    h, kvh, d = p["heads"], p["kv_heads"], p["head_dim"]
    q = dtypes.random((total, h, d), dt, seed=4 * seed)
    k = dtypes.random((total, kvh, d), dt, seed=4 * seed + 1)
    v = dtypes.random((total, kvh, d), dt, seed=4 * seed + 2)
    do = dtypes.random((total, h, d), dt, seed=4 * seed + 3) if p["backward"] else None
    # padded [batch, longest, heads, d]: row t of sequence b at (b, t); the padding is zeros
    rows = np.concatenate([np.arange(n) + b * longest for b, n in enumerate(lens)])
    index = cupy.asarray(rows)

    def padded(x):
        out = cupy.zeros((batch * longest,) + x.shape[1:], dtype=x.dtype)
        out[index] = x
        return out.reshape(batch, longest, *x.shape[1:])

    inputs = {"q": q, "k": k, "v": v, "do": do, "cu": cupy.asarray(cu), "longest": longest, "index": index,
              "padded": {n: padded(x) for n, x in (("q", q), ("k", k), ("v", v), ("do", do)) if x is not None}}
    return inputs


def _packed(out, index):
    """An output in the packed layout: a padded [batch, longest, ...] one has its real rows taken out."""
    x = dtypes.as_cupy(out, name="output")[0]
    if x.ndim == 4:
        x = x.reshape(-1, *x.shape[2:])[index]
    return x


def reference(case: bench.Case, inputs: dict) -> dict:
    """fp32 reference outputs (or gradients) of the selected sequences, and the row index that unpads."""
    import cupy

    from .backward_reference import attention_backward_reference, attention_forward_reference
    from .reference import attention_reference

    cu = np.concatenate([[0], np.cumsum(case.params["lengths"])])
    seqs = {}
    for b in _selected(case):
        r = slice(int(cu[b]), int(cu[b + 1]))
        q, k, v = (inputs[n][r][None] for n in ("q", "k", "v"))
        if case.params["backward"]:  # one kv head (and its q heads) at a time: fp32 scores of 8k rows are large
            group = case.params["heads"] // case.params["kv_heads"]
            grads = [cupy.empty((x.shape[1],) + x.shape[2:], dtype=cupy.float32) for x in (q, k, v)]
            for h in range(case.params["kv_heads"]):
                qs, ks = slice(h * group, (h + 1) * group), slice(h, h + 1)
                qh, kh, vh, doh = q[:, :, qs], k[:, :, ks], v[:, :, ks], inputs["do"][r][None][:, :, qs]
                o, _ = attention_forward_reference(qh, kh, vh, causal=True)
                o = dtypes.from_float32(o, dtypes.from_name(case.dtype))
                dq, dk, dv = attention_backward_reference(doh, qh, kh, vh, o=o, causal=True)
                grads[0][:, qs], grads[1][:, ks], grads[2][:, ks] = dq[0], dk[0], dv[0]
            seqs[b] = grads
        else:
            seqs[b] = [attention_reference(q, k, v, causal=True)[0]]
        cupy.get_default_memory_pool().free_all_blocks()
    return {"index": inputs["index"], "seqs": seqs}


def check(case: bench.Case, out, ref: dict) -> list[checks.CheckResult]:
    cu = np.concatenate([[0], np.cumsum(case.params["lengths"])])
    outs = out if isinstance(out, (tuple, list)) else (out,)
    names = ("dq", "dk", "dv") if case.params["backward"] else ("o",)
    tol = checks.Tolerance(atol=2e-2 if case.params["backward"] else 8e-3, rtol=2e-2)
    results = []
    for i, name in enumerate(names):
        x = _packed(outs[i], ref["index"])
        for b, refs in ref["seqs"].items():
            r = slice(int(cu[b]), int(cu[b + 1]))
            results.append(checks.compare(x[r], refs[i], tol=tol, name=f"{name}[seq {b}]"))
    return results


def _ours_packed(case: bench.Case, inputs: dict):
    q, k, v, cu, longest = inputs["q"], inputs["k"], inputs["v"], inputs["cu"], inputs["longest"]
    if not case.params["backward"]:
        return lambda: flash_attention_varlen(q, k, v, cu, cu, longest, longest, causal=True, check_values=False)
    o, lse = flash_attention_varlen(q, k, v, cu, cu, longest, longest, causal=True, return_lse=True)
    do = inputs["do"]
    return lambda: flash_attention_varlen_backward(do, q, k, v, o, lse, cu, cu, longest, longest, causal=True,
                                                   check_values=False)


def _ours_padded(case: bench.Case, inputs: dict):
    from .api import flash_attention
    from .backward import flash_attention_backward

    pq, pk, pv = (inputs["padded"][n] for n in ("q", "k", "v"))
    if not case.params["backward"]:
        return lambda: flash_attention(pq, pk, pv, causal=True)
    o, lse = flash_attention(pq, pk, pv, causal=True, return_lse=True)
    pdo = inputs["padded"]["do"]
    return lambda: flash_attention_backward(pdo, pq, pk, pv, o, lse, causal=True)


def _torch(backend_name: str):
    def prepare(case: bench.Case, inputs: dict):
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        tq, tk, tv = (dtypes.like_input(inputs["padded"][n], True).transpose(1, 2) for n in ("q", "k", "v"))
        if case.dtype == "fp16":
            tq, tk, tv = (t.view(torch.float16) for t in (tq, tk, tv))
        gqa = case.params["heads"] != case.params["kv_heads"]

        def forward():
            with bench.torch_on_cupy_stream(), sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=gqa)

        if not case.params["backward"]:
            return lambda: forward().transpose(1, 2)
        tq, tk, tv = (t.detach().requires_grad_() for t in (tq, tk, tv))
        tdo = dtypes.like_input(inputs["padded"]["do"], True).transpose(1, 2)
        if case.dtype == "fp16":
            tdo = tdo.view(torch.float16)
        out = forward()

        def backward():
            with bench.torch_on_cupy_stream():
                grads = torch.autograd.grad(out, (tq, tk, tv), tdo, retain_graph=True)
            return tuple(g.transpose(1, 2) for g in grads)
        return backward
    return prepare




def impls(args) -> list[bench.Impl]:
    return [bench.Impl(name="ours", prepare=_ours_packed),
            bench.Impl(name="ours-padded", prepare=_ours_padded),
            bench.Impl(name="torch-flash", prepare=_torch("FLASH_ATTENTION"), baseline=True,
                       unavailable=bench.torch_unavailable),
            bench.Impl(name="torch-cudnn", prepare=_torch("CUDNN_ATTENTION"), baseline=True,
                       unavailable=bench.torch_unavailable)]


def _problem(case: bench.Case) -> FwdProblem:
    p = case.params
    return FwdProblem(batch=len(p["lengths"]), seq_q=sum(p["lengths"]), seq_kv=sum(p["lengths"]), heads=p["heads"],
                      kv_heads=p["kv_heads"], head_dim=p["head_dim"], dtype=case.dtype, causal=True, varlen=True)


def plan_rows(cases_: list[bench.Case], spec: device.DeviceSpec, with_compile: bool) -> list[dict]:
    from cukernels import compile

    from .api import KERNELS
    from .bwd_configs import plan_backward

    rows = []
    for case in cases_:
        problem = _problem(case)
        try:
            plan = plan_backward(problem, spec) if case.params["backward"] else plan_forward(problem, spec)
        except tiling.PlanError as exc:
            rows.append({"case": case.name, "config": f"no plan: {exc}"})
            continue
        row = {"case": case.name, "config": str(plan.config), "smem / limit B": f"{plan.smem_bytes:,} / {plan.limit:,}"}
        if with_compile:
            dt = dtypes.from_name(case.dtype)
            if case.params["backward"]:
                exprs = plan.config.name_expressions(dtype=dt, mask=problem.mask)
            else:
                exprs = {plan.config.source: [plan.config.name_expression(dtype=dt, mask=problem.mask)]}
            res = [r for src, ex in exprs.items()
                   for r in compile.compile_offline(KERNELS / src, ex, spec.arch).values()]
            row.update({"regs": "/".join(str(r.registers) for r in res), "spill B": sum(r.spills for r in res)})
        rows.append(row)
    return rows


def plan_of(case: bench.Case) -> str | None:
    from .bwd_configs import plan_backward

    spec = device.current()
    try:
        plan = plan_backward(_problem(case), spec) if case.params["backward"] else plan_forward(_problem(case), spec)
    except tiling.PlanError as exc:
        return f"no plan: {exc}"
    return str(plan.config)


def summary_table(results: list[bench.Result], args) -> str:
    """The issue's comparisons: packed against padded (ours), and the packed rows' useful TFLOP/s against the
    dense equal-length row's."""
    from tabulate import tabulate

    by = {(r.case, r.impl): r for r in results if r.ok and r.median_ms}
    dense = next((r for (c, i), r in by.items() if "_equal_" in c and i == "ours-padded"), None)
    rows = []
    for (c, i), r in by.items():
        if i != "ours":
            continue
        padded = by.get((c, "ours-padded"))
        torch_best = min((by[(c, t)].median_ms for t in ("torch-flash", "torch-cudnn") if (c, t) in by), default=None)
        rows.append({"case": c, "ours ms": f"{r.median_ms:.3f}", "TFLOP/s": f"{r.tflops:.0f}",
                     "x our padded": "" if padded is None else f"{padded.median_ms / r.median_ms:.2f}x",
                     "x torch padded": "" if torch_best is None else f"{torch_best / r.median_ms:.2f}x",
                     "/ dense TFLOP/s": "" if dense is None or not dense.tflops else f"{r.tflops / dense.tflops:.2f}"})
    if not rows:
        return ""
    return ("packed against padded, and against the dense forward on equal lengths (the equal row's ours-padded "
            "is the dense kernel on 64 x 2048):\n" + tabulate(rows, headers="keys", tablefmt="github"))


OP = cli.OpBench(
    prog="python -m attention.bench",
    description=__doc__.split("\n\n")[0],
    op=lambda args: bench.Op(name="attention-varlen", make_inputs=make_inputs, reference=reference,
                             check=check),
    suites={"varlen": "packed variable-length batches: 64 sequences of 1-8k tokens (128k in all) at 16, 32/8 heads "
                      "d128, 16 heads d64, 8 heads d256, and 64 x 2048, causal; beside the padded batch (ours "
                      "dense, torch SDPA flash/cuDNN); --backward times the backward alone"},
    default_suite="varlen",
    cases=cases,
    impls=impls,
    default_impls=("ours", "ours-padded", "torch-flash", "torch-cudnn"),
    plan_rows=plan_rows,
    plan_of=plan_of,
    expected_kind="",
    reference_impl="torch-flash",
    describe=shape,
    add_arguments=lambda parser: parser.add_argument(
        "--backward", action="store_true", help="time the backward alone (the forward runs once per row)"),
    extra_output=summary_table,
)
