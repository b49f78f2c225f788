"""``flash_attention_backward``: validation (before any device work), planning, launch; ``bench_rows`` times
forward + backward against torch SDPA.

Inputs follow the forward (api.py): do, q, o ``[batch, seq_q, heads, head_dim]``, k, v ``[batch, seq_kv, kv_heads,
head_dim]``, one dtype (fp16 or bf16 = CuPy uint16 bits), lse float32 ``[batch, heads, seq_q]`` (natural log, as
``flash_attention(..., return_lse=True)`` returns it). Returns dq like q and dk, dv like k (kv_heads heads: a GQA
group's gradients are summed), new contiguous arrays.

Launches (kernels/flash_bwd.cu): preprocess (D = rowsum(dO * O), lse in log2 units, zeroed fp32 dQ accumulator)
-> dK/dV kernel (one CTA per KV tile and kv head, looping over the group's q heads, so dK/dV need no workspace and
no reduction; adds dQ with fp32 atomics) -> dQ conversion. ``deterministic=True`` replaces the atomics by a
separate dQ kernel (one CTA per query tile, fixed KV order): bit-identical results run to run, about 1.4x the
tensor-core work.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from cukernels import compile as _compile
from cukernels import device as _device
from cukernels import dtypes

from . import api
from .bwd_configs import BwdConfig, plan_backward
from .configs import MASK_SEGMENTS, FwdProblem

KERNEL_SOURCE = Path(__file__).parent / "kernels" / "flash_bwd.cu"
_SEQ_PAD = 128  # lse2 / D rows are padded to a multiple of every block_m


def validate_backward(do, q, k, v, o, lse, *, causal=False, window=None, segment_ids=None, softmax_scale=None,
                      deterministic=False) -> FwdProblem:
    """The forward's checks for q, k, v and the masks, plus do, o (like q) and lse (float32 [batch, heads,
    seq_q]); raises ``ValueError``/``TypeError`` naming the argument. No device work."""
    problem = api.validate(q, k, v, causal=causal, window=window, segment_ids=segment_ids,
                           softmax_scale=softmax_scale)
    qshape = (problem.batch, problem.seq_q, problem.heads, problem.head_dim)
    qdev = api._describe(q, "q")[3]
    for name, x in (("do", do), ("o", o)):
        shape, dt, strides, dev, dtype_text = api._describe(x, name)
        if shape != qshape:
            raise ValueError(f"{name} must have q's shape {list(qshape)}, got {list(shape)}")
        if dt != problem.dtype:
            raise TypeError(f"{name} must have q's dtype ({problem.dtype}), got {dtype_text}")
        api._check_strides(name, shape, strides)
        if dev != qdev:
            raise ValueError(f"{name} is on device {dev}, q on {qdev}")
    if lse is None or not hasattr(lse, "shape") or not hasattr(lse, "dtype"):
        raise TypeError(f"lse must be a float32 cupy.ndarray or torch CUDA tensor, got {type(lse).__name__}")
    lshape = tuple(int(s) for s in lse.shape)
    if lshape != (problem.batch, problem.heads, problem.seq_q):
        raise ValueError(f"lse must have shape [batch, heads, seq_q] = {[problem.batch, problem.heads, problem.seq_q]}"
                         f", got {list(lshape)}")
    if type(lse).__module__.startswith("torch"):
        ok, ldev = str(lse.dtype) == "torch.float32", (lse.device.index if lse.device.type == "cuda" else None)
    else:
        ok = np.dtype(lse.dtype) == np.float32
        ldev = lse.device.id if type(lse).__module__.startswith("cupy") else None
    if not ok:
        raise TypeError(f"lse must be float32 (natural-log LSE from the forward), got {lse.dtype}")
    if ldev != qdev:
        raise ValueError(f"lse is on device {ldev}, q on {qdev}")
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic must be a bool, got {deterministic!r}")
    return problem


def flash_attention_backward(do, q, k, v, o, lse, *, causal=False, window=None, segment_ids=None,
                             softmax_scale=None, deterministic=False, plan=None):
    """Gradients (dq, dk, dv) of ``o = flash_attention(q, k, v, ...)`` given dO; masks and scale as in the
    forward. Rows with no visible key (lse = -inf) contribute nothing. ``plan``: a ``cukernels.tiling.Plan``
    of a ``BwdConfig`` to use instead of ``plan_backward``'s."""
    launch, dq, dk, dv, was_torch = prepare_backward(do, q, k, v, o, lse, causal=causal, window=window,
                                                     segment_ids=segment_ids, softmax_scale=softmax_scale,
                                                     deterministic=deterministic, plan=plan)
    launch()
    return tuple(dtypes.like_input(x, was_torch) for x in (dq, dk, dv))


def _strides(arr) -> tuple[np.int64, np.int64, np.int64]:
    return tuple(np.int64(s // arr.itemsize) for s in arr.strides[:3])


def prepare_backward(do, q, k, v, o, lse, *, causal=False, window=None, segment_ids=None, softmax_scale=None,
                     deterministic=False, plan=None):
    """Validate, plan, compile and allocate once; ``(launch, dq, dk, dv, was_torch)`` where ``launch()`` enqueues
    every kernel of the backward on the current stream. Benchmarks time ``launch`` alone."""
    problem = validate_backward(do, q, k, v, o, lse, causal=causal, window=window, segment_ids=segment_ids,
                                softmax_scale=softmax_scale, deterministic=deterministic)
    import cupy

    arrs = {}
    was_torch = False
    for name, x in (("do", do), ("q", q), ("k", k), ("v", v), ("o", o)):
        arrs[name], wt = dtypes.as_cupy(x, name=name)
        was_torch = was_torch or (wt and name == "q")
        if arrs[name].data.ptr % 16:
            raise ValueError(f"{name}'s data pointer must be 16-byte aligned, got address {arrs[name].data.ptr:#x}")
    lse_c = cupy.ascontiguousarray(dtypes.as_cupy(lse, name="lse")[0])

    device_id = arrs["q"].device.id
    with cupy.cuda.Device(device_id):
        spec = _device.current()
        if plan is None:
            plan = plan_backward(problem, spec)
        cfg: BwdConfig = plan.config
        if not isinstance(cfg, BwdConfig) or cfg.head_dim != problem.head_dim:
            raise ValueError(f"plan must hold a BwdConfig for head_dim {problem.head_dim}, got {cfg}")
        dtype = dtypes.from_name(problem.dtype)
        mask = problem.mask
        B, Sq, H, D = problem.batch, problem.seq_q, problem.heads, problem.head_dim
        Skv, KVH = problem.seq_kv, problem.kv_heads
        seq_pad = -(-Sq // _SEQ_PAD) * _SEQ_PAD
        pre = _compile.kernel(KERNEL_SOURCE, f"flash_bwd_preprocess<{dtypes.ctype(dtype)},{D}>")
        dkdv = _compile.kernel(KERNEL_SOURCE.parent / cfg.source, cfg.name_expression(dtype=dtype, mask=mask, dq=not deterministic))
        if deterministic:
            dqk = _compile.kernel(KERNEL_SOURCE, cfg.name_expression(dtype=dtype, mask=mask, kernel="dq"))
        else:
            conv = _compile.kernel(KERNEL_SOURCE, f"flash_bwd_dq_convert<{dtypes.ctype(dtype)}>")

        dq = cupy.empty((B, Sq, H, D), dtype=dtype)
        dk = cupy.empty((B, Skv, KVH, D), dtype=dtype)
        dv = cupy.empty((B, Skv, KVH, D), dtype=dtype)
        lse2 = cupy.empty((B, H, seq_pad), dtype=cupy.float32)
        dsum = cupy.empty((B, H, seq_pad), dtype=cupy.float32)
        dq_accum = None if deterministic else cupy.empty((B, Sq, H, D), dtype=cupy.float32)
        null = np.uint64(0)

        steps = []  # (kernel, grid, block, args, smem)
        do_c, o_c = arrs["do"], arrs["o"]
        rows = B * seq_pad * H
        steps.append((pre, ((rows + 7) // 8,), (256,),
                      (o_c, do_c, lse_c, lse2, dsum, null if dq_accum is None else dq_accum, *_strides(o_c),
                       *_strides(do_c), np.int32(B), np.int32(Sq), np.int32(seq_pad), np.int32(H)), 0))

        def tile_ranges(block_m, block_n):
            if not mask & MASK_SEGMENTS:
                return lse2, lse2, lse2, lse2  # unused by the kernel instance; any pointer will do
            if isinstance(segment_ids, (tuple, list)):
                q_ids = cupy.ascontiguousarray(dtypes.as_cupy(segment_ids[0], name="segment_ids[0]")[0])
                kv_ids = cupy.ascontiguousarray(dtypes.as_cupy(segment_ids[1], name="segment_ids[1]")[0])
            else:
                q_ids = kv_ids = cupy.ascontiguousarray(dtypes.as_cupy(segment_ids, name="segment_ids")[0])
            ranges = _compile.kernel(api.KERNEL_SOURCE, "tile_id_range")
            outs = []
            # each kernel's ranges are built with that kernel's own tile sizes (seed 000's mask-shape bug)
            for ids, seq, tile in ((q_ids, Sq, block_m), (kv_ids, Skv, block_n)):
                count = -(-seq // tile)
                out = cupy.empty((B, count, 2), dtype=cupy.int32)
                steps.append((ranges, ((B * count + 127) // 128,), (128,),
                              (ids, out, np.int32(seq), np.int32(tile), np.int32(count), np.int32(B)), 0))
                outs.append(out)
            return q_ids, kv_ids, outs[0], outs[1]

        left, right = api._window_bounds(problem)
        scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)
        tail = (*_strides(arrs["q"]), *_strides(arrs["k"]), *_strides(arrs["v"]), *_strides(do_c),
                np.int32(Sq), np.int32(Skv), np.int32(seq_pad), np.int32(H), np.int32(H // KVH),
                np.int32(left), np.int32(right), np.float32(scale * math.log2(math.e)), np.float32(scale))
        q_ids, kv_ids, q_rng, kv_rng = tile_ranges(cfg.block_m, cfg.block_n)
        steps.append((dkdv, (-(-Skv // cfg.block_n), KVH, B), (32 * cfg.warps,),
                      (arrs["q"], arrs["k"], arrs["v"], do_c, lse2, dsum, null if dq_accum is None else dq_accum,
                       dk, dv, q_ids, kv_ids, q_rng, kv_rng, *tail), cfg.dkdv_smem_bytes()))
        if deterministic:
            q_ids, kv_ids, q_rng, kv_rng = tile_ranges(cfg.dq_block_m, cfg.dq_block_n)
            steps.append((dqk, (-(-Sq // cfg.dq_block_m), H, B), (32 * cfg.dq_warps,),
                          (arrs["q"], arrs["k"], arrs["v"], do_c, lse2, dsum, dq, q_ids, kv_ids, q_rng, kv_rng,
                           *tail), cfg.dq_smem_bytes()))
        else:
            pairs = B * Sq * H * D // 2
            steps.append((conv, (min(-(-pairs // 256), 32 * spec.sm_count),), (256,),
                          (dq_accum, dq, np.int64(pairs), np.float32(scale)), 0))

    def launch():
        with cupy.cuda.Device(device_id):
            for kern, grid, block, args, smem in steps:
                kern.launch(grid, block, args, smem=smem)

    return launch, dq, dk, dv, was_torch


# ---------------------------------------------------------------- forward + backward timing


def _flops_fwd_bwd(case) -> float:
    return 3.5 * case.flops()


def bench_rows(case_names=None, *, dtype: str = "bf16", budget_ms: float = 400.0, impls=("ours", "torch-flash",
                                                                                            "torch-cudnn")):
    """Time forward + backward per suite case (default: the ``seed004`` and ``grug`` suites): ours
    (flash_attention + flash_attention_backward, launches only) and torch SDPA flash / cuDNN (forward +
    ``backward``). TFLOP/s count 3.5x the forward FLOPs (4 B H Sq Skv D, halved when causal). Each row also
    carries our gradients' relative L2 error against torch-flash's (or, where torch cannot run the case, the
    fp32 reference on batch element 0). Returns a list of dicts."""
    import cupy

    from cukernels import timing

    from . import suites
    from .backward_reference import attention_backward_reference

    cases = ([suites.get(n) for n in case_names] if case_names
             else suites.cases("seed004") + suites.cases("grug"))
    rows = []
    for c in cases:
        dt = dtypes.from_name(dtype)
        q = dtypes.random((c.batch, c.seq_q, c.heads, c.head_dim), dt, seed=1)
        k = dtypes.random((c.batch, c.n_seq_kv, c.n_kv_heads, c.head_dim), dt, seed=2)
        v = dtypes.random((c.batch, c.n_seq_kv, c.n_kv_heads, c.head_dim), dt, seed=3)
        do = dtypes.random(q.shape, dt, seed=4)
        ids = c.segment_ids(0)
        seg = None if ids is None else cupy.asarray(ids)
        kw = dict(causal=c.causal, window=c.window, segment_ids=seg)
        fwd, o, lse, _ = api.prepare(q, k, v, **kw)
        fwd()
        bwd, dq, dk, dv, _ = prepare_backward(do, q, k, v, o, lse, **kw)
        row = {"case": c.name, "shape": f"B{c.batch} S{c.seq_q} H{c.heads}/{c.n_kv_heads} D{c.head_dim}"
                                        f"{' causal' if c.causal else ''}{' win' if c.window else ''}"
                                        f"{' seg' if ids is not None else ''}",
               "plan": str(plan_backward(c.problem(dtype), _device.current()).config)}
        flops = _flops_fwd_bwd(c)
        results = {}
        if "ours" in impls:
            t = timing.benchmark(lambda: (fwd(), bwd()), budget_ms=budget_ms)
            results["ours"] = t
            row["ours ms"] = round(t.median_ms, 3)
            row["ours TFLOP/s"] = round(flops / t.median_ms / 1e9, 1)
        torch_grads = None
        torch_ok = c.window is None and ids is None
        for name, backend in (("torch-flash", "FLASH_ATTENTION"), ("torch-cudnn", "CUDNN_ATTENTION")):
            if name not in impls:
                continue
            if not torch_ok:
                row[f"{name} ms"] = "n/a (mask)"
                continue
            try:
                t, grads = _time_torch(backend, q, k, v, do, c, dtype, budget_ms)
            except Exception as exc:  # a backend refusing a shape is reported, not fatal
                row[f"{name} ms"] = f"error: {type(exc).__name__}: {str(exc)[:60]}"
                continue
            results[name] = t
            row[f"{name} ms"] = round(t.median_ms, 3)
            row[f"{name} ms (torch events, no L2 flush)"] = round(t.clocks["torch_events_ms"], 3)
            row[f"{name} TFLOP/s"] = round(flops / t.median_ms / 1e9, 1)
            if name == "torch-flash":
                torch_grads = grads
        if "ours" in results and "torch-flash" in results:
            row["ours / torch-flash"] = round(results["torch-flash"].median_ms / results["ours"].median_ms, 3)
        # correctness of what was timed
        bwd()
        cupy.cuda.get_current_stream().synchronize()
        if torch_grads is not None:
            row["rel_l2 vs torch-flash"] = max(_rel_l2(a, b) for a, b in zip((dq, dk, dv), torch_grads))
        else:
            sel = slice(0, 1)
            ref = attention_backward_reference(do[sel], q[sel], k[sel], v[sel], causal=c.causal, window=c.window,
                                               segment_ids=None if seg is None else seg[sel])
            row["rel_l2 vs fp32 ref (b0)"] = max(_rel_l2(a[sel], r) for a, r in zip((dq, dk, dv), ref))
        rows.append(row)
        del fwd, bwd, q, k, v, do, o, lse, dq, dk, dv
        cupy.get_default_memory_pool().free_all_blocks()
    return rows


def _rel_l2(a, b) -> float:
    import cupy

    a = dtypes.to_float32(cupy.asarray(a)).astype(cupy.float64)
    b = cupy.asarray(b).astype(cupy.float64)
    return float(cupy.linalg.norm(a - b) / max(float(cupy.linalg.norm(b)), 1e-30))


def _time_torch(backend_name, q, k, v, do, c, dtype, budget_ms):
    import cupy
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from cukernels import timing

    backend = getattr(SDPBackend, backend_name)

    def as_t(x):
        t = dtypes.like_input(x, True)
        return t.view(torch.float16) if dtype == "fp16" else t

    tq, tk, tv, tdo = (as_t(x).transpose(1, 2).detach().requires_grad_(i < 3) for i, x in enumerate((q, k, v, do)))
    group = c.heads // c.n_kv_heads

    def make_run(tk, tv, gqa):
        # The timer's events sit on CuPy's current stream; torch (and its autograd engine) enqueue on torch's
        # streams. Order both ways explicitly so that the events bracket the whole forward + backward.
        def run():
            timer_stream = torch.cuda.ExternalStream(cupy.cuda.get_current_stream().ptr)
            work_stream = torch.cuda.current_stream()
            work_stream.wait_stream(timer_stream)
            with sdpa_kernel(backend):
                out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=c.causal,
                                                                       enable_gqa=gqa)
                grads = torch.autograd.grad(out, (tq, tk, tv), tdo)
            timer_stream.wait_stream(work_stream)
            return grads
        return run

    run = make_run(tk, tv, group > 1)
    try:
        grads = run()
    except RuntimeError:
        if group == 1:
            raise
        # backend without GQA: K/V repeated to the q heads before timing, gradients summed over the group
        tk, tv = (x.detach().repeat_interleave(group, 1).requires_grad_() for x in (tk, tv))
        run = make_run(tk, tv, False)
        grads = run()
    torch.cuda.synchronize()
    t = timing.benchmark(run, budget_ms=budget_ms)
    # cross-check of the cross-library event ordering: torch's own events around three calls
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        run()
    end.record()
    end.synchronize()
    t = dataclasses.replace(t, clocks={**t.clocks, "torch_events_ms": start.elapsed_time(end) / 3})
    out = []
    for i, g in enumerate(grads):
        g = g.float()
        if i > 0 and g.shape[1] != c.n_kv_heads:
            g = g.unflatten(1, (c.n_kv_heads, group)).sum(2)
        out.append(cupy.from_dlpack(g.transpose(1, 2).contiguous()))
    return t, tuple(out)
