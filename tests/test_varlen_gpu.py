"""flash_attention_varlen and its backward against the fp32 reference run per sequence on a GPU: ragged lengths
including 0, 1 and exactly a tile (64 / 128), cu_seqlens_q != cu_seqlens_k (bottom-right causal per sequence, a
sequence with queries but no keys), GQA, windows, each head dim and dtype, the deterministic backward (bitwise
repeatable), the torch autograd op, and the host check of the offsets (nothing launched on bad values).

Outputs come from a poisoned memory pool: an unwritten element is NaN and fails.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from cukernels import checks, dtypes

pytestmark = pytest.mark.gpu

ATOL = {"fp16": 2e-3, "bf16": 1.6e-2}
LSE_TOL = checks.Tolerance(atol=2e-3, rtol=2e-4)


def _cu(lengths):
    import cupy

    return cupy.asarray(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))


def _inputs(lq, lk, heads, kv_heads, dim, dtype, seed):
    dt = dtypes.from_name(dtype)
    tq, tk = int(sum(lq)), int(sum(lk))
    q = dtypes.random((tq, heads, dim), dt, seed=seed)
    k = dtypes.random((tk, kv_heads, dim), dt, seed=seed + 1)
    v = dtypes.random((tk, kv_heads, dim), dt, seed=seed + 2)
    do = dtypes.random((tq, heads, dim), dt, seed=seed + 3)
    return q, k, v, do


def _per_sequence(lq, lk, fn, q, k, v, *rest):
    """Run ``fn`` (a dense reference on [1, len, heads, dim] slices) per sequence; yields (b, q rows, k rows,
    result or None when the sequence has queries but no keys)."""
    cq, ck = np.concatenate([[0], np.cumsum(lq)]), np.concatenate([[0], np.cumsum(lk)])
    for b in range(len(lq)):
        rq, rk = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        if lq[b] == 0:
            continue
        if lk[b] == 0:
            yield b, rq, rk, None
            continue
        yield b, rq, rk, fn(q[rq][None], k[rk][None], v[rk][None], *(x[rq][None] for x in rest))


def _forward_reference(lq, lk, q, k, v, *, round_to=None, **kw):
    import cupy

    from attention import attention_reference

    tq, heads, dim = q.shape
    o = cupy.zeros((tq, heads, dim), dtype=cupy.float32)
    lse = cupy.full((heads, tq), -np.inf, dtype=cupy.float32)
    for _, rq, _, res in _per_sequence(lq, lk, lambda a, b, c: attention_reference(
            a, b, c, return_lse=round_to is None, round_to=round_to, **kw), q, k, v):
        if res is None:
            continue
        if round_to is None:
            o[rq], lse[:, rq] = res[0][0], res[1][0]
        else:
            o[rq] = res[0]
    return o, lse


def _check_forward(lq, lk, q, k, v, dtype, plan=None, **kw):
    import cupy

    from attention import flash_attention_varlen

    checks.poison_pool(q.size * 2 + q.shape[0] * q.shape[1] * 4 + (1 << 20))
    o, lse = flash_attention_varlen(q, k, v, _cu(lq), _cu(lk), max(lq), max(lk), return_lse=True, plan=plan,
                                     **kw)
    cupy.cuda.get_current_stream().synchronize()
    assert o.shape == q.shape and o.dtype == q.dtype
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == np.float32
    ref_o, ref_lse = _forward_reference(lq, lk, q, k, v, **kw)
    naive, _ = _forward_reference(lq, lk, q, k, v, round_to=dtype, **kw)
    checks.compare(o, ref_o, tol=checks.Tolerance(atol=ATOL[dtype], naive_factor=2.0), naive=naive,
                   name="o").raise_if_failed()
    finite = cupy.isfinite(ref_lse)
    assert bool((cupy.isfinite(lse) == finite).all()), "rows with no key must have lse -inf, the others finite"
    checks.compare(cupy.where(finite, lse, 0), cupy.where(finite, ref_lse, 0), tol=LSE_TOL,
                   name="lse").raise_if_failed()
    return o, lse


def _check_backward(lq, lk, q, k, v, do, o, lse, dtype, deterministic=False, **kw):
    import cupy

    from attention import flash_attention_varlen_backward
    from attention.backward_reference import attention_backward_reference

    checks.poison_pool(4 * (q.size + 2 * k.size) + (1 << 20))
    dq, dk, dv = flash_attention_varlen_backward(do, q, k, v, o, lse, _cu(lq), _cu(lk), max(lq), max(lk),
                                                 deterministic=deterministic, **kw)
    cupy.cuda.get_current_stream().synchronize()
    refs = [cupy.zeros(x.shape, dtype=cupy.float32) for x in (q, k, v)]
    naives = [cupy.zeros(x.shape, dtype=cupy.float32) for x in (q, k, v)]
    for out, rnd in ((refs, None), (naives, dtype)):
        for _, rq, rk, res in _per_sequence(
                lq, lk, lambda a, b, c, d, oo: attention_backward_reference(d, a, b, c, o=oo, round_to=rnd, **kw),
                q, k, v, do, o):
            if res is not None:
                out[0][rq], out[1][rk], out[2][rk] = (r[0] for r in res)
    tol = checks.Tolerance(atol=ATOL[dtype], naive_factor=3.0)
    for g, r, n, name in zip((dq, dk, dv), refs, naives, ("dq", "dk", "dv")):
        assert g.shape == r.shape
        checks.compare(g, r, tol=tol, naive=n, name=name).raise_if_failed()
    return dq, dk, dv


# (lengths q, lengths k (None: the same), heads, kv_heads, dim, dtype, options)
RAGGED = [0, 1, 64, 128, 129, 17, 700, 0, 255, 1000]
CASES = [
    *[(RAGGED, None, 4, 2, d, dt, {"causal": c}) for d in (64, 128, 256) for dt in ("fp16", "bf16")
      for c in (False, True)],
    ([300, 5, 1, 900], [200, 0, 64, 1000], 4, 4, 128, "bf16", {"causal": True}),  # len_q != len_k, one without keys
    ([1000, 33, 129], [17, 700, 129], 4, 1, 64, "fp16", {}),
    (RAGGED, None, 8, 2, 128, "bf16", {"window": (64, 16)}),
    (RAGGED, None, 4, 4, 256, "bf16", {"causal": True, "window": (100, 0)}),
    ([513, 2048, 3], None, 2, 2, 128, "fp16", {"causal": True, "softmax_scale": 0.3}),
]
IDS = [f"{i}_d{c[4]}_{c[5]}_h{c[2]}x{c[3]}_{'_'.join(f'{k}{v}' for k, v in c[6].items())}"
       for i, c in enumerate(CASES)]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_and_backward_against_reference(case):
    lq, lk, heads, kv_heads, dim, dtype, opts = case
    lk = lq if lk is None else lk
    seed = zlib.crc32(IDS[CASES.index(case)].encode()) % 1000
    q, k, v, do = _inputs(lq, lk, heads, kv_heads, dim, dtype, seed)
    o, lse = _check_forward(lq, lk, q, k, v, dtype, **opts)
    _check_backward(lq, lk, q, k, v, do, o, lse, dtype, **opts)


@pytest.mark.parametrize("dim", [128, 256])
def test_deterministic_backward_is_bitwise_repeatable(dim):
    import cupy

    from attention import flash_attention_varlen, flash_attention_varlen_backward

    lq = [100, 0, 513, 64, 1]
    q, k, v, do = _inputs(lq, lq, 4, 2, dim, "bf16", 7)
    kw = {"causal": True, "window": (200, 0)}
    o, lse = flash_attention_varlen(q, k, v, _cu(lq), _cu(lq), 513, 513, return_lse=True, **kw)
    _check_backward(lq, lq, q, k, v, do, o, lse, "bf16", deterministic=True, **kw)
    runs = [flash_attention_varlen_backward(do, q, k, v, o, lse, _cu(lq), _cu(lq), 513, 513, deterministic=True,
                                            **kw) for _ in range(2)]
    for a, b in zip(*runs):
        assert bool(cupy.array_equal(a, b))


def test_bad_offsets_are_refused_before_any_launch():
    import cupy

    from attention import flash_attention_varlen

    lq = [3, 5]
    q, k, v, _ = _inputs(lq, lq, 2, 2, 64, "fp16", 1)
    good = _cu(lq)
    for cu, match in ((cupy.asarray([1, 3, 8], dtype=cupy.int32), r"cu_seqlens_q\[0\] must be 0"),
                      (cupy.asarray([0, 6, 5], dtype=cupy.int32), "must not decrease"),
                      (cupy.asarray([0, 3, 7], dtype=cupy.int32), "packed length 8")):
        with pytest.raises(ValueError, match=match):
            flash_attention_varlen(q, k, v, cu, good, 8, 8)
    with pytest.raises(ValueError, match="more than max_seqlen_k = 4"):
        flash_attention_varlen(q, k, v, good, good, 5, 4)
    with pytest.raises(TypeError, match="cu_seqlens_k must be int32"):
        flash_attention_varlen(q, k, v, good, good.astype(cupy.int64), 5, 5)


def test_torch_autograd_matches_the_cupy_path():
    torch = pytest.importorskip("torch")
    import cupy

    import attention.torch as fa
    from attention import flash_attention_varlen, flash_attention_varlen_backward

    lq = [0, 77, 300, 1, 128]
    tq = sum(lq)
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(tq, h, 128, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for h in (8, 2, 2))
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32, device="cuda")
    o = fa.flash_attention_varlen(q, k, v, cu, cu, 300, 300, causal=True, deterministic=True)
    do = torch.randn_like(o)
    o.backward(do)

    def bits(t):
        return cupy.from_dlpack(t.detach().view(torch.int16)).view(cupy.uint16)

    qc, kc, vc, doc = (bits(x) for x in (q, k, v, do))
    cuc = cupy.from_dlpack(cu)
    oc, lsec = flash_attention_varlen(qc, kc, vc, cuc, cuc, 300, 300, causal=True, return_lse=True)
    grads = flash_attention_varlen_backward(doc, qc, kc, vc, oc, lsec, cuc, cuc, 300, 300, causal=True,
                                            deterministic=True)
    assert bool(cupy.array_equal(bits(o), oc))
    for t, c in zip((q.grad, k.grad, v.grad), grads):
        assert bool(cupy.array_equal(bits(t), c))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_tma_forward(case):
    """The warp-specialised TMA forward (sm_90a with cuda-bindings) forced with each of its tiles: query tiles
    and key tiles that reach into the next packed sequence (masked, never stored)."""
    from attention import configs
    from cukernels import device, tma, tune

    spec = device.current()
    if spec.arch != "sm_90a" or tma.available() is not None:
        pytest.skip(f"the TMA kernel needs sm_90a and cuda-bindings ({spec.arch}; {tma.available()})")
    lq, lk, heads, kv_heads, dim, dtype, opts = case
    lk = lq if lk is None else lk
    q, k, v, _ = _inputs(lq, lk, heads, kv_heads, dim, dtype, seed=zlib.crc32(IDS[CASES.index(case)].encode()) % 991)
    mask = configs.mask_of(causal=opts.get("causal", False), window=opts.get("window"), varlen=True)
    for c in configs.tma_tiles(spec, dim):
        if mask in configs.kernel_masks(c):  # the persistent tiles have no packed-batch kernel
            _check_forward(lq, lk, q, k, v, dtype, plan=tune.explicit(c, spec), **opts)
