"""Benchmarks of the grouped expert GEMM (against cuBLAS through CuPy) and of the MoE layer (against torch's
per-expert cuBLAS loop when torch is importable). Correctness is checked on sampled rows before anything is
timed; timings come from ``cukernels.timing.benchmark`` (CUDA events, L2 flushed between samples).

    python -m moe.grouped_gemm_bench [--quick]

FLOP floor of a grouped GEMM: 2 * rows * N * K (SwiGLU counts the full interleaved N). Byte floor: a, every
non-empty expert's weight and the output, each moved once.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import numpy as np

from cukernels import checks, device, dtypes, timing

from . import gemm_configs
from .grouped_gemm import grouped_gemm
from .layer import MoELayer

GEMM_M, GEMM_N, GEMM_K, GEMM_EXPERTS = 8192, 11008, 4096, 32
TORCH_LAYER_MS = {"seed004_b4x512": 3.5, "seed004_b16x2048": 33.0, "seed004_b32x2048": 62.7}  # brief of issue 6


# shapes outside the planner's lists, timed to see whether they should join them
EXPLORE = (
    gemm_configs.GemmConfig(block_m=256, block_n=128, block_k=64, warps_m=4, warps_n=2, stages=4),
    gemm_configs.GemmConfig(block_m=128, block_n=256, block_k=32, warps_m=2, warps_n=4, stages=6),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmResult:
    case: str
    dtype: str
    impl: str
    config: str
    ms: float
    noise: float
    tflops: float
    ratio_to_cublas: float | None
    check: str
    throttled: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerResult:
    shape: str
    dtype: str
    impl: str
    ms: float
    noise: float
    tflops: float
    speedup_vs_torch: float | None
    check: str


def _splits(rows, experts, how, seed=0):
    if how == "one":
        return np.array([0, rows], np.int32)
    if how == "equal":
        return (np.arange(experts + 1) * (rows // experts)).astype(np.int32)
    rng = np.random.default_rng(seed)
    w = rng.gamma(2.0, size=experts)
    counts = np.floor(w / w.sum() * rows).astype(np.int64)
    counts[0] += rows - counts.sum()
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


def _sampled_check(out, a, b, off, dtype, *, experts_to_check=4, rows_per_expert=64, seed=0):
    """fp32 reference (CuPy) on sampled rows of a few non-empty experts; error vs the rounded reference."""
    import cupy

    rng = np.random.default_rng(seed)
    nonempty = [e for e in range(len(off) - 1) if off[e + 1] > off[e]]
    picks = sorted(set([nonempty[0], nonempty[-1]] + list(rng.choice(nonempty, min(len(nonempty), experts_to_check)))))
    got, ref = [], []
    for e in picks:
        rows = np.sort(rng.choice(np.arange(off[e], off[e + 1]), min(rows_per_expert, off[e + 1] - off[e]), replace=False))
        r = cupy.asarray(rows)
        ref.append(dtypes.to_float32(a[r]) @ dtypes.to_float32(b[e]).T)
        got.append(out[r])
    ref = cupy.concatenate(ref).get().astype(np.float64)
    got = cupy.concatenate(got)
    naive = dtypes.to_float32(dtypes.from_float32(ref.astype(np.float32), dtype))
    return checks.compare(got, ref, tol=checks.Tolerance(atol=1e-2, naive_factor=2.0), naive=naive, name="gemm")


def run_gemm_cases(*, dtype_names=("fp16", "bf16"), splits=("one", "equal", "random"), configs=None,
                   budget_ms=400.0, verbose=True) -> list[GemmResult]:
    """M=8192 N=11008 K=4096: one group and split over 32 experts; ours (planner's tile and ``configs``) vs cuBLAS
    (fp16 ``cupy.matmul``: one GEMM, and a per-expert loop)."""
    import cupy

    spec = device.current()
    m, n, k, experts = GEMM_M, GEMM_N, GEMM_K, GEMM_EXPERTS
    flop = 2.0 * m * n * k
    results: list[GemmResult] = []
    cands = list(configs) if configs is not None else [c for c in (gemm_configs.LARGE[0], gemm_configs.MEDIUM[0])
                                                       + EXPLORE if c.smem_bytes() <= spec.smem_per_block_optin]
    for name in dtype_names:
        dt = dtypes.from_name(name)
        a = dtypes.random((m, k), dt, seed=1)
        b = dtypes.random((experts, n, k), dt, seed=2, scale=1 / np.sqrt(k))
        for how in splits:
            off = _splits(m, experts, how)
            e_used = len(off) - 1
            bb = b[:e_used]
            off_d = cupy.asarray(off)
            case = f"{m}x{n}x{k} {'1 group' if how == 'one' else f'{experts} experts {how}'}"
            cublas_ms = None
            if dt == dtypes.FP16:  # cuBLAS through CuPy has no bf16: fp16 is the comparison
                ref_out = cupy.empty((m, n), dt)

                def cublas():
                    for e in range(e_used):
                        if off[e + 1] > off[e]:
                            cupy.matmul(a[off[e]:off[e + 1]], bb[e].T, out=ref_out[off[e]:off[e + 1]])

                cublas()
                t = timing.benchmark(cublas, budget_ms=budget_ms)
                cublas_ms = t.median_ms
                results.append(GemmResult(case=case, dtype=name, impl="cuBLAS (cupy.matmul" + (")" if how == "one" else
                                          ", per-expert loop)"), config="-", ms=t.median_ms, noise=t.rel_noise,
                                          tflops=flop / t.median_ms / 1e9, ratio_to_cublas=1.0, check="reference",
                                          throttled=t.throttled))
            plan_cfg = gemm_configs.plan(gemm_configs.GemmProblem(rows=m, n=n, k=k, experts=e_used, dtype=name), spec).config
            for cfg in dict.fromkeys([plan_cfg] + cands):
                checks.poison_pool(m * n * 2 + (1 << 20))
                out = grouped_gemm(a, bb, off_d, config=cfg)
                chk = _sampled_check(out, a, bb, off, dt)
                if not chk.passed:
                    results.append(GemmResult(case=case, dtype=name, impl="ours", config=str(cfg), ms=float("nan"),
                                              noise=0.0, tflops=0.0, ratio_to_cublas=None, check="FAIL " + chk.reason,
                                              throttled=False))
                    continue
                t = timing.benchmark(lambda: grouped_gemm(a, bb, off_d, config=cfg), budget_ms=budget_ms)
                recheck = _sampled_check(grouped_gemm(a, bb, off_d, config=cfg), a, bb, off, dt, seed=1)
                tag = "planned " if cfg == plan_cfg else ""
                results.append(GemmResult(case=case, dtype=name, impl=f"ours {tag}".strip(), config=str(cfg),
                                          ms=t.median_ms, noise=t.rel_noise, tflops=flop / t.median_ms / 1e9,
                                          ratio_to_cublas=(cublas_ms / t.median_ms) if cublas_ms else None,
                                          check=("pass" if recheck.passed else "FAIL after timing")
                                          + f" max_abs {chk.max_abs:.2g}", throttled=t.throttled))
            if verbose:
                for r in results[-(len(cands) + 2):]:
                    if r.case == case and r.dtype == name:
                        print(f"  {r.case} {r.dtype} {r.impl} {r.config}: {r.ms:.3f} ms {r.tflops:.0f} TFLOP/s",
                              flush=True)
        del a, b
        cupy.get_default_memory_pool().free_all_blocks()
    return results


# ---------------------------------------------------------------- layer


def _torch_layer(x, router, w_gu, w_down, top_k):
    """torch's per-expert cuBLAS loop (host sync for the counts, as eager PyTorch MoE code does)."""
    import torch
    import torch.nn.functional as F

    logits = x.float() @ router
    w, sel = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    flat = sel.flatten()
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=w_gu.shape[0]).tolist()
    tok = order // top_k
    xs = x[tok]
    ys = torch.empty_like(xs)
    start = 0
    for e, c in enumerate(counts):
        if c:
            h = xs[start:start + c] @ w_gu[e].T
            ys[start:start + c] = (F.silu(h[:, 0::2]) * h[:, 1::2]) @ w_down[e].T
            start += c
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    out.index_add_(0, tok, ys.float() * w.flatten()[order, None])
    return out.to(x.dtype)


def _layer_check(out, x, layer, sample=32, seed=0):
    """fp32 CuPy reference of sampled tokens (every expert they use); rel-L2 and max error vs the output."""
    import cupy

    w_gu, w_down, top_k, dtype = layer.w_gate_up, layer.w_down, layer.top_k, layer.dtype
    rng = np.random.default_rng(seed)
    tok = np.sort(rng.choice(x.shape[0], sample, replace=False))
    xt = dtypes.to_float32(x[cupy.asarray(tok)])
    logits = (xt @ dtypes.to_float32(layer.router_b[0]).T).get()
    sel = np.argsort(-logits, axis=1, kind="stable")[:, :top_k]
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    w = np.take_along_axis(p, sel, axis=1)
    w /= w.sum(axis=1, keepdims=True)
    ref = cupy.zeros(xt.shape, dtype=cupy.float32)
    for e in np.unique(sel):
        ti, ki = np.nonzero(sel == e)
        h = xt[cupy.asarray(ti)] @ dtypes.to_float32(w_gu[int(e)]).T
        act = h[:, 0::2] / (1 + cupy.exp(-h[:, 0::2])) * h[:, 1::2]
        y = act @ dtypes.to_float32(w_down[int(e)]).T
        ref[cupy.asarray(ti)] += y * cupy.asarray(w[ti, ki], dtype=cupy.float32)[:, None]
    got = dtypes.to_float32(out[cupy.asarray(tok)])
    rel = float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref))
    bound = 2e-2 if dtype == dtypes.BF16 else 5e-3
    finite = bool(cupy.isfinite(got).all())
    return finite and rel <= bound, f"rel_l2 {rel:.2e} (bound {bound:g}) on {sample} tokens"


def run_layer_cases(shapes=None, *, dtype_names=("bf16",), with_torch=True, budget_ms=600.0,
                    verbose=True) -> list[LayerResult]:
    """seed 004's MoE layer (hidden 4096, intermediate 11008, 32 experts, top-2, SwiGLU) at its batches."""
    import cupy

    from . import suites

    shapes = shapes or suites.suite("seed004")
    torch = None
    if with_torch:
        try:
            import torch
        except ImportError:
            torch = None
    results = []
    for name in dtype_names:
        dt = dtypes.from_name(name)
        shp = shapes[0]
        h, inter, experts, top_k = shp.hidden, shp.intermediate, shp.experts, shp.top_k
        router = cupy.random.default_rng(7).standard_normal((h, experts), dtype=cupy.float32) / np.sqrt(h)
        w_gu = dtypes.random((experts, 2 * inter, h), dt, seed=8, scale=1 / np.sqrt(h))
        w_down = dtypes.random((experts, h, inter), dt, seed=9, scale=1 / np.sqrt(inter))
        layer = MoELayer(router, w_gu, w_down, top_k)
        for shp in shapes:
            x = dtypes.random((shp.tokens, h), dt, seed=10)
            flop = 2.0 * shp.tokens * top_k * (h * 2 * inter + inter * h)
            checks.poison_pool(shp.tokens * h * 2 + (1 << 20))
            out = layer(x)
            ok, why = _layer_check(out, x, layer)
            t = timing.benchmark(lambda: layer(x), budget_ms=budget_ms) if ok else None
            torch_ms = None
            if torch is not None:
                xt = dtypes.like_input(x, True)
                rt = dtypes.like_input(dtypes.to_float32(layer.router_b[0]).T.copy(), True)
                gut, dnt = dtypes.like_input(w_gu, True), dtypes.like_input(w_down, True)
                tt = timing.benchmark(lambda: _torch_layer(xt, rt, gut, dnt, top_k), budget_ms=budget_ms)
                torch_ms = tt.median_ms
                tout = dtypes.as_cupy(_torch_layer(xt, rt, gut, dnt, top_k), name="torch_out")[0]
                tok_ok, tok_why = _layer_check(tout, x, layer)
                results.append(LayerResult(shape=shp.name, dtype=name, impl="torch per-expert loop", ms=tt.median_ms,
                                           noise=tt.rel_noise, tflops=flop / tt.median_ms / 1e9, speedup_vs_torch=1.0,
                                           check=("pass " if tok_ok else "FAIL ") + tok_why))
            results.append(LayerResult(shape=shp.name, dtype=name, impl="ours MoELayer",
                                       ms=t.median_ms if t else float("nan"), noise=t.rel_noise if t else 0.0,
                                       tflops=flop / t.median_ms / 1e9 if t else 0.0,
                                       speedup_vs_torch=(torch_ms / t.median_ms) if (t and torch_ms) else None,
                                       check=("pass " if ok else "FAIL ") + why))
            if verbose:
                for r in results[-2:]:
                    print(f"  {r.shape} {r.dtype} {r.impl}: {r.ms:.2f} ms {r.tflops:.0f} TFLOP/s {r.check}", flush=True)
            del x, out
            cupy.get_default_memory_pool().free_all_blocks()
    return results


def table(results) -> str:
    from tabulate import tabulate

    rows = [dataclasses.asdict(r) for r in results]
    return tabulate(rows, headers="keys", floatfmt=".3f")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m moe.grouped_gemm_bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fp16 only, one group and one split; no layer")
    p.add_argument("--no-layer", action="store_true", help="grouped GEMM cases only")
    p.add_argument("--layer-only", action="store_true", help="MoE layer cases only")
    p.add_argument("--splits", default="one,equal,random", help="comma list of one, equal, random")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    spec = device.current()
    print(f"{spec.name} ({spec.arch}, {spec.sm_count} SMs, {spec.smem_per_block_optin:,} B smem/block)")
    splits = ("one", "equal") if args.quick else tuple(args.splits.split(","))
    gemm = [] if args.layer_only else run_gemm_cases(dtype_names=("fp16",) if args.quick else ("fp16", "bf16"),
                                                     splits=splits)
    layer = [] if (args.quick or args.no_layer) else run_layer_cases()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gemm": [dataclasses.asdict(r) for r in gemm], "layer": [dataclasses.asdict(r) for r in layer]},
                      f, indent=1)
    if gemm:
        print(table(gemm))
    if layer:
        print(table(layer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
