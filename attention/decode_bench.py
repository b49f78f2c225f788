"""``python -m attention.bench --suite decode``: attention over a KV cache (one or a few query tokens per
sequence) checked, then timed beside torch SDPA (flash and cuDNN backends) on the same contiguous cache, with
our paged cache (pages of 16 and 256, shuffled) beside the contiguous one. The table after the results gives
GB/s of K/V read and the share of the device's copy bandwidth measured in the same process.

The grid is the inference issue's: batch {1, 8, 64} x cache length {1k, 8k, 32k, 128k} x heads {32/8 d128,
32/32 d128, 16/16 d64} x seq_q {1, 4}, bf16, every sequence full (torch cannot express ragged lengths).
Queries attend to the whole cache (no causal mask: torch's is_causal aligns top-left, so seq_q = 4 rows would
not be the same function); a row whose cache does not fit the device is skipped and says how much it needs.
Ours runs with ``check_values=False``, as a serving loop would (the lengths were checked when the cache was
made).
"""
from __future__ import annotations

import functools

from cukernels import bench, checks, cli, device, dtypes, tiling

from .decode_configs import DecodeProblem, plan_call
from .kvcache import flash_attention_with_kvcache, kvcache_reference

HEADS = ((32, 8, 128), (32, 32, 128), (16, 16, 64))
PAGES = (16, 256)


def cases(suite: str, args) -> list[bench.Case]:
    out = []
    for batch in (1, 8, 64):
        for length in (1024, 8192, 32768, 131072):
            for heads, kv_heads, dim in HEADS:
                for seq_q in (1, 4):
                    kv_bytes = 2 * batch * length * kv_heads * dim * 2
                    name = f"decode_b{batch}_L{length // 1024}k_h{heads}-{kv_heads}_d{dim}_q{seq_q}"
                    out.append(bench.Case(
                        name=name, tags=("decode",), dtype=args.dtype,
                        params=dict(batch=batch, length=length, heads=heads, kv_heads=kv_heads, head_dim=dim,
                                    seq_q=seq_q),
                        flops=4.0 * batch * heads * seq_q * length * dim,
                        bytes=kv_bytes + 4 * batch * seq_q * heads * dim))
    return out


def shape(case: bench.Case) -> str:
    p = case.params
    return f"B{p['batch']} L{p['length']} H{p['heads']}/{p['kv_heads']} D{p['head_dim']} q{p['seq_q']}"


def _cache_bytes(case: bench.Case) -> int:
    p = case.params
    return 2 * p["batch"] * p["length"] * p["kv_heads"] * p["head_dim"] * 2


@functools.cache
def _device_bytes() -> int:
    import cupy

    return int(cupy.cuda.Device().mem_info[1])


def _fits(case: bench.Case) -> str | None:
    need = _cache_bytes(case) + (1 << 30)  # K and V, the paged variants are views of them; 1 GiB of slack
    if need > _device_bytes() - (2 << 30):
        return f"the cache needs {need / 2**30:.0f} GiB of the device's {_device_bytes() / 2**30:.0f} GiB"
    return None


def _random_bf16_chunked(shape, dt, seed):
    """Random data made one batch element at a time (the float32 intermediate of a whole 30 GB cache would not
    fit beside it)."""
    import cupy

    out = cupy.empty(shape, dtype=dt)
    for b in range(shape[0]):
        out[b] = dtypes.random(shape[1:], dt, seed=seed * 1000 + b)
    return out


def make_inputs(case: bench.Case, seed: int) -> dict | None:
    import cupy

    if _fits(case):
        return None  # every implementation skips the case and says why
    p = case.params
    dt = dtypes.from_name(case.dtype)
    b, n, kvh, d = p["batch"], p["length"], p["kv_heads"], p["head_dim"]
    q = dtypes.random((b, p["seq_q"], p["heads"], d), dt, seed=3 * seed)
    k = _random_bf16_chunked((b, n, kvh, d), dt, 3 * seed + 1)
    v = _random_bf16_chunked((b, n, kvh, d), dt, 3 * seed + 2)
    lens = cupy.full((b,), n, dtype=cupy.int32)
    return {"q": q, "k": k, "v": v, "lens": lens}


def _checked(case: bench.Case) -> list[int]:
    return sorted({0, case.params["batch"] - 1})


def reference(case: bench.Case, inputs: dict | None):
    if inputs is None:
        return None
    sel = _checked(case)
    return kvcache_reference(inputs["q"][sel], inputs["k"][sel], inputs["v"][sel], inputs["lens"][sel])[0]


def check(case: bench.Case, out, ref) -> list[checks.CheckResult]:
    import cupy

    out = out if isinstance(out, cupy.ndarray) else dtypes.as_cupy(out, name="o")[0]
    return [checks.compare(out[_checked(case)], ref, tol=checks.Tolerance(atol=8e-3, rtol=2e-2), name="o")]


def _paged(inputs: dict, page: int, seed: int):
    """The contiguous cache seen as pages (no copy) and a block table that visits each sequence's pages in a
    shuffled order: every key is attended once, in another order, and with no mask the output is the same."""
    import cupy
    import numpy as np

    k, v = inputs["k"], inputs["v"]
    b, n, kvh, d = k.shape
    per_seq = n // page
    rng = np.random.default_rng(seed)
    table = np.stack([i * per_seq + rng.permutation(per_seq) for i in range(b)]).astype(np.int32)
    return (k.reshape(b * per_seq, page, kvh, d), v.reshape(b * per_seq, page, kvh, d), cupy.asarray(table))


def _ours(page: int | None):
    def prepare(case: bench.Case, inputs: dict):
        q, lens = inputs["q"], inputs["lens"]
        if page is None:
            k, v, table = inputs["k"], inputs["v"], None
        else:
            k, v, table = _paged(inputs, page, seed=page)
        return lambda: flash_attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table,
                                                    check_values=False)
    return prepare


def _torch(backend_name: str):
    def prepare(case: bench.Case, inputs: dict):
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        tq, tk, tv = (dtypes.like_input(inputs[n], True).transpose(1, 2) for n in ("q", "k", "v"))
        gqa = case.params["heads"] != case.params["kv_heads"]

        def run():
            with bench.torch_on_cupy_stream(), sdpa_kernel(backend):
                out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, enable_gqa=gqa)
            return out.transpose(1, 2)
        return run
    return prepare




def impls(args) -> list[bench.Impl]:
    return [bench.Impl(name="ours", prepare=_ours(None), supports=_fits),
            *[bench.Impl(name=f"ours-paged{p}", prepare=_ours(p), supports=_fits, plan_of=_paged_plan_of)
              for p in PAGES],
            bench.Impl(name="torch-flash", prepare=_torch("FLASH_ATTENTION"), baseline=True,
                       unavailable=bench.torch_unavailable, supports=_fits),
            bench.Impl(name="torch-cudnn", prepare=_torch("CUDNN_ATTENTION"), baseline=True,
                       unavailable=bench.torch_unavailable, supports=_fits)]


def _problem(case: bench.Case, paged: bool = False) -> DecodeProblem:
    p = case.params
    return DecodeProblem(batch=p["batch"], seq_q=p["seq_q"], heads=p["heads"], kv_heads=p["kv_heads"],
                         head_dim=p["head_dim"], max_keys=p["length"], dtype=case.dtype, paged=paged)


def plan_rows(cases_: list[bench.Case], spec: device.DeviceSpec, with_compile: bool) -> list[dict]:
    from cukernels import compile

    from .kvcache import SOURCE

    rows = []
    for case in cases_:
        try:
            dp, pp = plan_call(_problem(case), spec), plan_call(_problem(case, paged=True), spec)
        except tiling.PlanError as exc:
            rows.append({"case": case.name, "config": f"no plan: {exc}"})
            continue
        row = {"case": case.name, "config": _config_text(dp), "splits": dp.splits,
               "smem / limit B": f"{dp.plan.smem_bytes:,} / {dp.plan.limit:,}",
               "paged config": _config_text(pp), "paged splits": pp.splits}
        if with_compile:  # the contiguous and the paged instance (one for every page size)
            exprs = [plan.config.name_expression(dtype=dtypes.from_name(case.dtype), paged=paged, pair=plan.pair,
                                                 cluster=plan.cluster) for plan, paged in ((dp, False), (pp, True))]
            res = compile.compile_offline(SOURCE, exprs, spec.arch)
            row.update({"regs": " / ".join(str(res[e].registers) for e in exprs),
                        "spill B": " / ".join(str(res[e].spills) for e in exprs)})
        rows.append(row)
    return rows


def _config_text(dp) -> str:
    return f"{dp.config}{' (heads in pairs)' if dp.pair else ''}"


def plan_of(case: bench.Case, paged: bool = False) -> str | None:
    try:
        dp = plan_call(_problem(case, paged), device.current())  # the bench's caches hold their heads adjacent
    except tiling.PlanError as exc:
        return f"no plan: {exc}"
    return f"{_config_text(dp)}, {dp.splits} splits{' (one cluster)' if dp.cluster > 1 else ''}"


def _paged_plan_of(case: bench.Case) -> str | None:
    return plan_of(case, paged=True)


def bandwidth_table(results: list[bench.Result], args) -> str:
    """GB/s of K/V read per row and its share of the copy bandwidth measured now, in this process."""
    from tabulate import tabulate

    from cukernels import bandwidth

    ok = [r for r in results if r.ok and r.gbs]
    if not ok:
        return ""
    copy = bandwidth.measure_copy()
    ceiling = copy.tb_per_s * 1e3
    rows = [{"case": r.case, "impl": r.impl, "ms": f"{r.median_ms:.4f}", "GB/s": f"{r.gbs:,.0f}",
             "% of copy": f"{100 * r.gbs / ceiling:.0f}%",
             "vs best torch": "" if r.speedup_vs_best_baseline is None else f"{r.speedup_vs_best_baseline:.2f}x"}
            for r in ok]
    return (f"K/V read against the copy bandwidth measured in this process ({ceiling:,.0f} GB/s, "
            f"read + written):\n" + tabulate(rows, headers="keys", tablefmt="github"))


OP = cli.OpBench(
    prog="python -m attention.bench",
    description=__doc__.split("\n\n")[0],
    op=lambda args: bench.Op(name="attention-decode", make_inputs=make_inputs, reference=reference, check=check,
                             poison_bytes=lambda case: 2 * case.params["batch"] * case.params["seq_q"]
                             * case.params["heads"] * case.params["head_dim"] + (1 << 20)),
    suites={"decode": "attention over a KV cache: batch 1/8/64 x cache 1k-128k x 32/8, 32/32, 16/16 heads x 1 or 4 "
                      "query tokens, contiguous and paged (16, 256), beside torch SDPA on the contiguous cache"},
    default_suite="decode",
    cases=cases,
    impls=impls,
    default_impls=("ours", "ours-paged16", "ours-paged256", "torch-flash", "torch-cudnn"),
    plan_rows=plan_rows,
    plan_of=plan_of,
    expected_kind="",
    reference_impl="torch-cudnn",
    describe=shape,
    extra_output=bandwidth_table,
)
