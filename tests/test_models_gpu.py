"""The end-to-end models on a GPU: the RMSNorm and rotary kernels against NumPy (CuPy and torch inputs, outputs
poisoned first), the tiny dense and MoE models' forwards against the float32 NumPy reference (within twice the
error of the same forward rounded to bf16 at every op), the CUDA-graph replay against the eager forward, and the
bench's quick row."""
from __future__ import annotations

import numpy as np
import pytest

from cukernels import dtypes
from models import configs, norm_rope, reference

pytestmark = pytest.mark.gpu


def _torch():
    torch = pytest.importorskip("torch", reason="the models run on torch tensors (pip install -e '.[torch]')")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


def _poison_pool(nbytes: int) -> None:
    import cupy

    block = cupy.empty(int(nbytes), dtype=cupy.uint8)
    block.fill(0xFF)  # bf16/fp16 NaN bits
    cupy.cuda.get_current_stream().synchronize()
    del block


def _host(x):
    return dtypes.to_float32(x.get()).astype(np.float64)


# ---------------------------------------------------------------- kernels against NumPy


@pytest.mark.parametrize("dtype", [dtypes.BF16, dtypes.FP16])
# block-per-row kernel: one piece per thread (768, 4096), several (5000: 2, 12296: 4, the last block partly idle);
# 20480 is past what it holds: the warp-per-row kernel
@pytest.mark.parametrize("rows, hidden", [(1, 8), (37, 768), (130, 4096), (3, 5000), (5, 12296), (2, 20480)])
@pytest.mark.parametrize("add", [False, True])
def test_rms_norm_matches_numpy(dtype, rows, hidden, add):
    x = dtypes.random((rows, hidden), dtype, seed=1)
    w = dtypes.from_float32(1 + 0.1 * np.random.default_rng(2).standard_normal(hidden).astype(np.float32), dtype)
    import cupy

    w = cupy.asarray(w)
    resid = dtypes.random((rows, hidden), dtype, seed=3, scale=2.0) if add else None
    before = None if resid is None else _host(resid)
    _poison_pool(8 * rows * hidden)
    out = norm_rope.rms_norm(x, w, eps=1e-5, residual=resid)
    v = _host(x)
    if add:
        v = dtypes.to_float32(dtypes.from_float32((before + v).astype(np.float32), dtype)).astype(np.float64)
        np.testing.assert_array_equal(_host(resid), v)  # the residual stream holds the rounded sum
    ref = v / np.sqrt(np.mean(v * v, axis=1, keepdims=True) + 1e-5) * _host(w)
    got = _host(out)
    ulp = 2.0 ** (-8 if dtype == dtypes.BF16 else -11)
    np.testing.assert_allclose(got, ref, rtol=2 * ulp, atol=2 * ulp)


@pytest.mark.parametrize("dtype", [dtypes.BF16, dtypes.FP16])
@pytest.mark.parametrize("tokens, seq, heads, kv, d", [(64, 64, 4, 4, 64), (2 * 96, 96, 8, 2, 128),
                                                       (3 * 40, 40, 2, 1, 256)])
def test_rotary_matches_numpy_and_leaves_v(dtype, tokens, seq, heads, kv, d):
    nh = heads + 2 * kv
    qkv = dtypes.random((tokens, nh, d), dtype, seed=4)
    before = _host(qkv)
    cos, sin = norm_rope.rotary_tables(seq + 5, d, like=qkv)  # a longer table than the sequence is fine
    norm_rope.rotary_(qkv, cos, sin, seq=seq, rot_heads=heads + kv)
    c, s = norm_rope.rotary_tables(seq, d)
    pos = np.arange(tokens) % seq
    t = before[:, None, :heads + kv]  # [tokens, 1, heads, d] as [batch, seq, heads, d] with per-token positions
    half = d // 2
    a, b = t[..., :half], t[..., half:]
    cc, ss = c[pos][:, None, None, :], s[pos][:, None, None, :]
    ref = np.concatenate([a * cc - b * ss, b * cc + a * ss], axis=-1)[:, 0]
    got = _host(qkv)
    ulp = 2.0 ** (-8 if dtype == dtypes.BF16 else -11)
    np.testing.assert_allclose(got[:, :heads + kv], ref, rtol=ulp, atol=2 * ulp)
    np.testing.assert_array_equal(got[:, heads + kv:], before[:, heads + kv:])


def test_ops_take_torch_tensors_on_torch_stream():
    torch = _torch()
    x = torch.randn(33, 256, device="cuda").to(torch.bfloat16)
    w = torch.randn(256, device="cuda").to(torch.bfloat16)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out = norm_rope.rms_norm(x, w)
    side.synchronize()
    xf = x.float()
    ref = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-5) * w.float()
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=2 ** -7, atol=2 ** -7)


# ---------------------------------------------------------------- tiny models against the NumPy reference


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("name", ["tiny", "tiny-moe"])
def test_tiny_model_forward_matches_the_float32_reference(name):
    torch = _torch()
    from models.layers import OursModel, TorchModel, init_weights

    cfg = configs.MODELS[name]
    case = next(c for c in configs.CASES.values() if c.model is cfg)
    weights = init_weights(cfg, seed=3)
    x = torch.randn(case.batch, case.seq, cfg.hidden, device="cuda", generator=torch.Generator("cuda").manual_seed(4))
    x = x.to(torch.bfloat16)
    w_np, x_np = reference.weights_to_numpy(weights), x.float().cpu().numpy()
    ref, gap = reference.forward(cfg, w_np, x_np)
    naive_bf16, _ = reference.forward(cfg, w_np, x_np, round_bf16=True)
    with torch.inference_mode():
        ours = OursModel(cfg, weights)(x).float().cpu().numpy()
        torch_naive = TorchModel(cfg, weights)(x).float().cpu().numpy()
    keep = np.ones(case.tokens, dtype=bool)
    if gap is not None:  # tokens at a near-tie of the router may go to another expert in bf16: not compared
        keep = gap > 0.05
        assert keep.mean() > 0.7, f"only {keep.mean():.0%} of the tokens route unambiguously"
    flat = lambda a: a.reshape(case.tokens, cfg.hidden)[keep]  # noqa: E731
    bound = 2 * _rel(flat(naive_bf16), flat(ref)) + 1e-3
    assert _rel(flat(ours), flat(ref)) <= bound, (_rel(flat(ours), flat(ref)), bound)
    assert _rel(flat(torch_naive), flat(ref)) <= bound  # the baseline the bench checks against is right too
    assert np.isfinite(ours).all()


@pytest.mark.parametrize("name", ["tiny", "tiny-moe"])
def test_captured_forward_replays_the_eager_one(name):
    torch = _torch()
    from models.layers import OursModel, init_weights

    cfg = configs.MODELS[name]
    model = OursModel(cfg, init_weights(cfg, seed=5))
    x = torch.randn(2, 64, cfg.hidden, device="cuda").to(torch.bfloat16)
    with torch.inference_mode():
        eager = model(x).clone()
        graph = model.capture(x)
        torch.testing.assert_close(graph.replay(), eager, rtol=0, atol=0)
        y = torch.randn_like(x)
        graph.input.copy_(y)
        torch.testing.assert_close(graph.replay(), model(y), rtol=0, atol=0)


@pytest.mark.parametrize("graph", [False, True])
def test_pdl_chain_equals_plain_launches(graph):
    """40 norms, each reading the output of the one before and updating the residual it reads next, launched as
    programmatic dependent launches (the default on sm_90+) and the plain way: bit-identical, eagerly and as a
    CUDA graph. A kernel that read its input before the previous grid completed would differ; the outputs come
    from torch's allocator, which hands a freed buffer to the next norm (the write-after-read case)."""
    torch = _torch()
    from cukernels import launch

    gen = torch.Generator("cuda").manual_seed(7)
    x0 = torch.randn(128, 4096, device="cuda", generator=gen).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(4096, device="cuda", generator=gen)).to(torch.bfloat16)

    def chain():
        resid, h = x0.clone(), x0
        for _ in range(40):
            h = norm_rope.rms_norm(h, w, residual=resid)
        return torch.cat([h, resid])

    results = []
    saved = launch.PDL[0]
    try:
        for pdl in (True, False):
            launch.PDL[0] = pdl
            if graph:
                chain()  # compiled, planned
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    out = chain()
                g.replay()
                results.append(out.clone())
            else:
                results.append(chain())
    finally:
        launch.PDL[0] = saved
    torch.cuda.synchronize()
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


def test_section_timer_splits_one_forward():
    torch = _torch()
    from models.layers import SECTIONS, OursModel, SectionTimer, init_weights

    cfg = configs.MODELS["tiny-moe"]
    model = OursModel(cfg, init_weights(cfg))
    probe = SectionTimer()
    with torch.inference_mode():
        model(torch.randn(1, 64, cfg.hidden, device="cuda").to(torch.bfloat16), probe)
    totals = probe.totals_ms()
    assert set(totals) == set(SECTIONS) and all(v > 0 for v in totals.values())


def test_bench_quick_row(tmp_path):
    _torch()
    from models import bench

    out = tmp_path / "models.json"
    rc = bench.main(["--quick", "--no-compile", "--budget-ms", "200", "--out", str(out)])
    import json

    doc = json.loads(out.read_text())
    rows = {r["impl"]: r for r in doc["results"]}
    assert rc == 0, rows
    assert rows["ours"]["status"] == "ok" and rows["ours"]["split_ms"]
    assert rows["ours-graph"]["status"] == "ok" and rows["torch-naive"]["status"] == "ok"
    assert rows["ours"]["expected_ms"] is None or rows["ours"]["vs_expected"]
