"""The call path as a user meets it: the launch cache, torch streams, CUDA graphs (torch and CuPy),
torch.compile of the custom ops, and the MoE layer at any expert count.

Every check draws fresh random inputs and compares against the fp32 reference or against an eager call that
was itself checked; outputs written under capture are poisoned before the replay that must fill them.
"""
from __future__ import annotations

import numpy as np
import pytest

from cukernels import checks, dtypes

pytestmark = pytest.mark.gpu

ATOL = {"fp16": 1e-3, "bf16": 8e-3}


def _torch():
    return pytest.importorskip("torch")


def _qkv_torch(batch, seq, heads, kv_heads, dim, dtype="bf16", seed=0, requires_grad=False):
    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch.bfloat16 if dtype == "bf16" else torch.float16
    shapes = ((batch, seq, heads, dim), (batch, seq, kv_heads, dim), (batch, seq, kv_heads, dim))
    return tuple(torch.randn(s, device="cuda", generator=g).to(dt).requires_grad_(requires_grad) for s in shapes)


def _to_cupy(t):
    import cupy

    t = t.detach()
    if str(t.dtype) == "torch.bfloat16":
        return cupy.from_dlpack(t.view(t.new_empty(0, dtype=__import__("torch").int16).dtype)).view(cupy.uint16)
    return cupy.from_dlpack(t)


def _check_o(o, q, k, v, dtype, **kw):
    from attention import attention_reference

    ref = attention_reference(*(_to_cupy(x) for x in (q, k, v)), **kw)
    naive = attention_reference(*(_to_cupy(x) for x in (q, k, v)), round_to=dtype, **kw)
    checks.compare(_to_cupy(o), ref, tol=checks.Tolerance(atol=ATOL[dtype], naive_factor=2.0), naive=naive,
                   name="o").raise_if_failed()


# ---------------------------------------------------------------- launch cache


def test_launch_cache_keys_on_strides_dtypes_and_flags():
    import cupy

    from attention import api, flash_attention

    q, k, v = (dtypes.random((1, 64, 2, 64), dtypes.BF16, seed=s) for s in (1, 2, 3))
    before = len(api._FORWARD)
    flash_attention(q, k, v)
    flash_attention(q, k, v)  # same signature: no new entry
    assert len(api._FORWARD) == before + 1
    flash_attention(q, k, v, causal=True)  # flag
    flash_attention(*(x.view(np.float16) for x in (q, k, v)))  # dtype
    packed = dtypes.random((1, 64, 3, 2, 64), dtypes.BF16, seed=4)
    o_strided = flash_attention(packed[:, :, 0], packed[:, :, 1], packed[:, :, 2])  # strides
    assert len(api._FORWARD) == before + 4
    # the strided call computes with its own strides, not those of a cached contiguous call
    ref = flash_attention(*(cupy.ascontiguousarray(packed[:, :, i]) for i in range(3)))
    assert bool((o_strided == ref).all())
    with pytest.raises(TypeError, match="causal must be a bool"):  # 1 == True must not hit the causal entry
        flash_attention(q, k, v, causal=1)
    with pytest.raises(ValueError, match="16-byte aligned"):  # pointers are checked on every call
        flat = dtypes.random((1 * 64 * 2 * 64 + 1,), dtypes.BF16, seed=5)
        flash_attention(flat[1:].reshape(1, 64, 2, 64), k, v)


def test_launch_cache_keys_on_device():
    import cupy

    from attention import flash_attention

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("one GPU: the device part of the signature needs two")
    outs = []
    for dev in (0, 1):
        with cupy.cuda.Device(dev):
            q, k, v = (dtypes.random((1, 64, 2, 64), dtypes.BF16, seed=s) for s in (1, 2, 3))
            outs.append((flash_attention(q, k, v), dev))
    for o, dev in outs:
        assert o.device.id == dev


# ---------------------------------------------------------------- torch: streams, graphs, compile


def test_torch_outputs_follow_the_current_stream():
    """Inputs produced on a non-default stream, consumed there, no sync in between: the kernels must run on it."""
    torch = _torch()
    from attention import flash_attention

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        q, k, v = _qkv_torch(2, 512, 4, 2, 128, seed=7)
        torch.cuda._sleep(2_000_000)  # keep the stream busy: work on another stream would race ahead
        q = q * 1.0  # produced on `side` after the sleep
        o = flash_attention(q, k, v, causal=True)
        o2 = o.float() * 1.0  # consumed on `side`
    side.synchronize()
    assert o.dtype == torch.bfloat16 and o.is_cuda
    _check_o(o, q, k, v, "bf16", causal=True)
    assert torch.equal(o2, o.float())


def test_torch_graph_capture_replays_on_new_inputs():
    torch = _torch()
    from attention import flash_attention

    q, k, v = _qkv_torch(2, 256, 4, 1, 64, seed=11)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flash_attention(q, k, v, causal=True)  # warm-up: plan and compile before capture
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = flash_attention(q, k, v, causal=True)
    for seed in (12, 13):
        new = _qkv_torch(2, 256, 4, 1, 64, seed=seed)
        for dst, src in zip((q, k, v), new):
            dst.copy_(src)
        o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _check_o(o, *new, "bf16", causal=True)


def test_cupy_graph_capture_replays_on_new_inputs():
    import cupy

    from attention import flash_attention

    q, k, v = (dtypes.random((2, 200, 4, 128), dtypes.BF16, seed=s) for s in (21, 22, 23))
    ids = cupy.asarray(np.repeat(np.arange(4, dtype=np.int32), 50)[None].repeat(2, 0))
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        flash_attention(q, k, v, segment_ids=ids)  # warm-up
        stream.synchronize()
        stream.begin_capture()
        o = flash_attention(q, k, v, segment_ids=ids)  # a call with a workspace (segment tile ranges)
        graph = stream.end_capture()
        for seed in (24, 25):
            for dst, s in zip((q, k, v), range(seed, seed + 3)):
                dst[...] = dtypes.random(dst.shape, dtypes.BF16, seed=100 * s)
            cupy.get_default_memory_pool().free_all_blocks()
            checks.poison_pool(8 << 20)  # memory the capture used must not have gone back to the pool
            checks.poison(o)
            graph.launch()
            stream.synchronize()
            from attention import attention_reference

            ref = attention_reference(q, k, v, segment_ids=ids)
            naive = attention_reference(q, k, v, segment_ids=ids, round_to="bf16")
            checks.compare(o, ref, tol=checks.Tolerance(atol=ATOL["bf16"], naive_factor=2.0), naive=naive,
                           name="o").raise_if_failed()


def _block(x, wq, wk, wv, wo, heads, kv_heads, fa):
    b, s, d = x.shape
    dim = d // heads
    q = (x @ wq).view(b, s, heads, dim)
    k = (x @ wk).view(b, s, kv_heads, dim)
    v = (x @ wv).view(b, s, kv_heads, dim)
    return fa(q, k, v, causal=True).reshape(b, s, d) @ wo


def test_torch_compile_fullgraph_forward_and_backward_equal_eager():
    torch = _torch()
    import attention.torch as at

    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 64
    d = heads * dim
    x = torch.randn(2, 128, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ws = [(torch.randn(d, n, device="cuda", dtype=torch.bfloat16) / d ** 0.5).requires_grad_()
          for n in (d, kv_heads * dim, kv_heads * dim, d)]

    def f(x, *w):
        return _block(x, *w, heads, kv_heads, at.flash_attention)

    eager = f(x, *ws)
    grads_eager = torch.autograd.grad(eager.float().square().sum(), (x, *ws))
    compiled = torch.compile(f, fullgraph=True)
    out = compiled(x, *ws)
    grads = torch.autograd.grad(out.float().square().sum(), (x, *ws))
    assert torch.equal(out, eager)
    for a, b in zip(grads, grads_eager):  # dQ is summed with atomics and inductor fuses the matmuls' backward
        err = ((a.float() - b.float()).norm() / b.float().norm()).item()
        assert err < 1e-2, err


def test_autograd_matches_the_float64_reference():
    """gradcheck in its reference form: our bf16 gradients against float64 autograd of the naive formula."""
    torch = _torch()
    import attention.torch as at

    q, k, v = _qkv_torch(1, 96, 4, 2, 64, dtype="fp16", seed=31, requires_grad=True)
    do = torch.randn_like(q)
    o = at.flash_attention(q, k, v, causal=True)
    grads = torch.autograd.grad(o, (q, k, v), do)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    kk, vv = (x.repeat_interleave(2, dim=2) for x in (k64, v64))
    s = torch.einsum("bqhd,bkhd->bhqk", q64, kk) / 8.0
    s = s.masked_fill(torch.ones(96, 96, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    ref = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), vv)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), do.double())
    for g, r in zip(grads, ref_grads):
        err = (g.double() - r).norm() / r.norm()
        assert err < 5e-3, err


@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
@pytest.mark.parametrize("q_layout", ["contiguous", "transposed view"])
@pytest.mark.parametrize("do_layout", ["contiguous", "strided"])
def test_autograd_backward_equals_the_validated_backward(q_layout, do_layout, kv_heads):
    """The autograd backward's shortcuts (a contiguous dO keyed by the forward alone; gradients made by
    empty_like of contiguous q, k, v) give the same gradients, bit for bit (deterministic dQ), in the same shapes
    and contiguous layout, as the fully validated ``flash_attention_backward``, on fresh inputs each time."""
    torch = _torch()
    import attention
    import attention.torch as at

    for seed in (41, 42):
        q, k, v = _qkv_torch(2, 80, 4, kv_heads, 64, seed=seed)
        if q_layout == "transposed view":  # [batch, heads, seq, dim] storage seen as [batch, seq, heads, dim]
            q = q.transpose(1, 2).contiguous().transpose(1, 2)
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        do = torch.randn(q.shape, device="cuda", dtype=q.dtype)
        if do_layout == "strided":
            do = torch.randn(2, 4, 80, 64, device="cuda", dtype=q.dtype).transpose(1, 2)
        o = at.flash_attention(q, k, v, causal=True, deterministic=True)
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
        o2, lse = attention.flash_attention(q.detach(), k.detach(), v.detach(), causal=True, return_lse=True)
        assert torch.equal(o, o2)
        ref = attention.flash_attention_backward(do.contiguous(), q.detach(), k.detach(), v.detach(), o2, lse,
                                                 causal=True, deterministic=True)
        for g, r, x in zip((dq, dk, dv), ref, (q, k, v)):
            assert g.shape == x.shape and g.is_contiguous() and g.dtype == x.dtype
            assert torch.equal(g, r)


@pytest.mark.parametrize("kv_heads", [1, 4], ids=["mqa", "mha"])
def test_autograd_gradients_accumulate_into_leaves(kv_heads):
    """``.backward()`` twice into the leaves' ``.grad`` (autograd keeps the gradients it is handed, then adds into
    them): twice the gradients of one ``autograd.grad``; and two chained ops (the first one's o is the second's q)
    give the gradients of the two taken one at a time, dK and dV summed over both."""
    torch = _torch()
    import attention.torch as at

    q, k, v = _qkv_torch(1, 64, 4, kv_heads, 64, seed=51, requires_grad=True)
    do = torch.randn(q.shape, device="cuda", dtype=q.dtype)
    once = torch.autograd.grad(at.flash_attention(q, k, v, causal=True, deterministic=True), (q, k, v), do)
    for _ in range(2):
        at.flash_attention(q, k, v, causal=True, deterministic=True).backward(do)
    for x, g in zip((q, k, v), once):
        assert x.grad.shape == x.shape and x.grad.dtype == x.dtype
        assert torch.equal(x.grad, g + g)
    x = q.detach().clone().requires_grad_()
    chained = torch.autograd.grad(at.flash_attention(at.flash_attention(x, k, v, causal=True, deterministic=True),
                                                     k, v, causal=True, deterministic=True), (x, k, v), do)
    o1 = at.flash_attention(x, k, v, causal=True, deterministic=True)
    mid = o1.detach().requires_grad_()
    d_mid, dk2, dv2 = torch.autograd.grad(at.flash_attention(mid, k, v, causal=True, deterministic=True),
                                          (mid, k, v), do)
    dx, dk1, dv1 = torch.autograd.grad(o1, (x, k, v), d_mid.clone())
    assert torch.equal(chained[0], dx)
    assert torch.equal(chained[1], dk1 + dk2) and torch.equal(chained[2], dv1 + dv2)


_FRESH_PROCESS = """
import torch
import attention.torch as at
q, k, v = (torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
do = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.float16)
grads = torch.autograd.grad(at.flash_attention(q, k, v, causal=True), (q, k, v), do)
q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
ref = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q32, k32, v32)), is_causal=True)
refs = torch.autograd.grad(ref.transpose(1, 2), (q32, k32, v32), do.float())
print(max(float((g.float() - r).norm() / r.norm()) for g, r in zip(grads, refs)))
"""


def test_backward_as_the_first_cuda_work_of_autograds_thread():
    """A fresh process whose first backward is ours: torch's autograd engine runs it on its own device thread,
    which has no current CUDA context yet (the driver-API launch must make one current, not fail with
    CUDA_ERROR_INVALID_CONTEXT)."""
    _torch()
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))))
    r = subprocess.run([sys.executable, "-c", _FRESH_PROCESS], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert float(r.stdout.split()[-1]) < 5e-3, r.stdout


def test_custom_ops_pass_opcheck():
    torch = _torch()
    import attention.torch as at

    q, k, v = _qkv_torch(1, 64, 2, 2, 64, seed=41, requires_grad=True)
    torch.library.opcheck(torch.ops.cukernels.flash_attention_forward.default,
                          (q, k, v, True, None, None, None, None, False),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    assert at.flash_attention_forward is not None


# ---------------------------------------------------------------- MoE


def _layer_weights(tokens, hidden, inter, experts, dtype, seed, torch_tensors=False):
    import cupy

    from moe import interleave_gate_up

    x = dtypes.random((tokens, hidden), dtype, seed=seed)
    router = cupy.random.default_rng(seed + 1).standard_normal((hidden, experts), dtype=cupy.float32)
    g = dtypes.random((experts, inter, hidden), dtype, seed=seed + 2, scale=1 / np.sqrt(hidden))
    u = dtypes.random((experts, inter, hidden), dtype, seed=seed + 3, scale=1 / np.sqrt(hidden))
    w_down = dtypes.random((experts, hidden, inter), dtype, seed=seed + 4, scale=1 / np.sqrt(inter))
    return x, router, interleave_gate_up(g, u), w_down


@pytest.mark.parametrize("experts,top_k", [(1, 1), (3, 2), (4, 2), (60, 4), (64, 6), (256, 8), (60, 1), (64, 8)])
def test_layer_any_expert_count(experts, top_k):
    from moe.layer import MoELayer, reference_forward

    dt = dtypes.BF16
    x, router, w_up, w_down = _layer_weights(96, 128, 64, experts, dt, seed=experts + top_k)
    layer = MoELayer(router, w_up, w_down, top_k)
    checks.poison_pool(16 << 20)
    out = layer(x)
    ref = reference_forward(x, router, w_up, w_down, top_k)
    naive = reference_forward(x, router, w_up, w_down, top_k, round_to=dt)
    checks.compare(out, ref, tol=checks.Tolerance(atol=2e-2, naive_factor=3.0), naive=naive,
                   name=f"layer E{experts} k{top_k}").raise_if_failed()


def test_layer_capture_replays_fresh_inputs_cupy_and_torch():
    torch = _torch()
    from moe.layer import MoELayer

    x, router, w_up, w_down = _layer_weights(16, 256, 128, 60, dtypes.BF16, seed=3)
    layer = MoELayer(router, w_up, w_down, 4)
    captured = layer.capture(16)
    for seed in (5, 6):
        x = dtypes.random((16, 256), dtypes.BF16, seed=seed)
        eager = layer(x)
        out = captured(x)
        import cupy

        cupy.cuda.Device().synchronize()
        assert bool((out == eager).all())
    tw = [torch.from_dlpack(a.view(np.int16)).view(torch.bfloat16) if a.dtype == np.uint16 else torch.from_dlpack(a)
          for a in (router, w_up, w_down)]
    tlayer = MoELayer(*tw, 4)
    tcaptured = tlayer.capture(16)
    for seed in (7, 8):
        xt = torch.randn(16, 256, device="cuda").to(torch.bfloat16)
        eager = tlayer(xt)
        out = tcaptured(xt)
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


def test_layer_compiles_fullgraph_as_one_op():
    torch = _torch()
    from moe.layer import MoELayer

    x, router, w_up, w_down = _layer_weights(32, 128, 64, 8, dtypes.BF16, seed=9)
    tw = [torch.from_dlpack(a.view(np.int16)).view(torch.bfloat16) if a.dtype == np.uint16 else torch.from_dlpack(a)
          for a in (router, w_up, w_down)]
    layer = MoELayer(*tw, 2)
    xt = torch.randn(32, 128, device="cuda").to(torch.bfloat16)

    def f(x):
        return layer(x * 2.0) + 1.0

    assert torch.equal(torch.compile(f, fullgraph=True)(xt), f(xt))
