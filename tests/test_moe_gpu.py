"""MoE kernels on a GPU against the NumPy references: routing (both scorings, every logits dtype, exact ties,
skew, idle experts, NaN/-inf), the stable permutation (with and without block_m padding), gather and combine,
on outputs poisoned beforehand; bitwise reproducibility; argument errors raised before any launch."""

import numpy as np
import pytest

from cukernels import checks, dtypes
import moe
from moe import bench, reference

pytestmark = pytest.mark.gpu

DTYPES = {"fp32": dtypes.FP32, "fp16": dtypes.FP16, "bf16": dtypes.BF16}


def _poison_pool(nbytes: int) -> None:
    """Fill what the pool hands out next with 0x7F bytes: 3.4e38 in every float dtype, 0x7F7F7F7F in int32 --
    values no output of these kernels holds, so an unwritten element fails an exact or tolerance comparison."""
    import cupy

    block = cupy.empty(int(nbytes), dtype=cupy.uint8)
    block.fill(0x7F)
    cupy.cuda.get_current_stream().synchronize()
    del block


def _logits(tokens, experts, dtype, seed, kind="normal"):
    import cupy

    rng = cupy.random.default_rng(seed)
    if kind == "normal":
        x = rng.standard_normal((tokens, experts), dtype=cupy.float32) * 2
    elif kind == "ties":  # few distinct values: many exact ties
        x = rng.integers(0, 3, size=(tokens, experts)).astype(cupy.float32)
    elif kind == "skew":  # every token's best expert is expert experts // 2
        x = rng.standard_normal((tokens, experts), dtype=cupy.float32)
        x[:, experts // 2] += 100.0
    else:
        raise ValueError(kind)
    return dtypes.from_float32(x, dtype)


def _check_all(logits, top_k, *, scoring="softmax", renormalize=True, block_m=None, hidden=64, seed=0):
    import cupy

    tokens, experts = logits.shape
    _poison_pool(64 * tokens * max(experts, hidden) + (1 << 20))
    r = moe.route(logits, top_k, scoring=scoring, renormalize=renormalize)
    d = moe.permute(r, block_m=block_m)
    ref = reference.route(logits, top_k, scoring=scoring, renormalize=renormalize)

    np.testing.assert_array_equal(r.experts.get(), ref.experts)
    np.testing.assert_allclose(r.weights.get(), ref.weights, rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(r.counts.get(), ref.counts)
    np.testing.assert_allclose(r.share.get(), ref.share, rtol=1e-6)
    np.testing.assert_allclose(r.mean_prob.get(), ref.mean_prob, rtol=1e-4, atol=1e-7)
    stats = r.stats()
    assert stats["aux_loss"] == pytest.approx(ref.aux_loss, rel=1e-4)
    assert stats["z_loss"] == pytest.approx(ref.z_loss, rel=1e-4, abs=1e-6)
    assert stats["usage_cv"] == pytest.approx(ref.usage_cv, rel=1e-4, abs=1e-6)

    dref = reference.permute(ref.experts, experts, block_m=block_m)
    np.testing.assert_array_equal(d.sorted_slots.get(), dref.sorted_slots)
    np.testing.assert_array_equal(d.inverse.get(), dref.inverse)
    np.testing.assert_array_equal(d.offsets.get(), dref.offsets)
    if block_m:
        np.testing.assert_array_equal(d.padded_offsets.get(), dref.padded_offsets)

    dt = logits.dtype
    x = dtypes.random((tokens, hidden), dt, seed=seed + 1)
    g = moe.gather(x, d)
    np.testing.assert_array_equal(g.get(), reference.gather(x.get(), dref.sorted_slots, top_k))
    y = dtypes.random((d.rows, hidden), dt, seed=seed + 2)
    out = moe.combine(y, d, r)
    assert out.dtype == dt and out.shape == (tokens, hidden)
    want = reference.combine(y.get(), dref.inverse, r.weights.get())
    name = dtypes.dtype_name(dt)
    checks.compare(out, want, tol=checks.TOLERANCES[name], name=f"combine {name}").raise_if_failed()
    return r, d


# tokens x experts x top_k, with the dtype, scoring, block_m and hidden size cycling through the grid
GRID = [(t, e, k) for t in (1, 7, 4096) for e in (8, 32, 60, 128, 256) for k in (1, 2, 4, 8) if k <= e]
GRID += [(65536, 32, 2), (65536, 256, 8), (65536, 60, 4), (32, 60, 8), (33, 60, 8)]  # 32: the finishing block's edge


@pytest.mark.parametrize("i,tokens,experts,top_k", [(i, *g) for i, g in enumerate(GRID)],
                         ids=[f"T{t}-E{e}-k{k}" for t, e, k in GRID])
def test_route_permute_gather_combine(i, tokens, experts, top_k):
    dtype = list(DTYPES.values())[i % 3]
    scoring = moe.SCORINGS[(i // 3) % 2]
    block_m = (None, 16, 128)[i % 3 if tokens < 65536 else 0]
    hidden = (64, 33, 256, 4096 if tokens < 4096 else 512)[i % 4] if tokens < 65536 else 128
    _check_all(_logits(tokens, experts, dtype, seed=i), top_k, scoring=scoring, renormalize=bool(i % 5),
               block_m=block_m, hidden=hidden, seed=i)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("scoring", moe.SCORINGS)
def test_exact_ties_go_to_the_lower_expert(dtype, scoring):
    import cupy

    _check_all(_logits(3000, 60, DTYPES[dtype], seed=3, kind="ties"), 4, scoring=scoring, block_m=32)
    r, _ = _check_all(dtypes.from_float32(cupy.zeros((300, 32), np.float32), DTYPES[dtype]), 8)
    assert (r.experts.get() == np.arange(8)).all()


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_skew_sends_every_token_to_one_expert_and_leaves_the_rest_idle(dtype):
    experts = 64
    r, d = _check_all(_logits(5000, experts, DTYPES[dtype], seed=4, kind="skew"), 1, block_m=64)
    counts = r.counts.get()
    assert counts[experts // 2] == 5000 and counts.sum() == 5000
    stats = r.stats()
    assert stats["idle_experts"] == experts - 1 and stats["usage_cv"] == pytest.approx(np.sqrt(experts - 1), rel=1e-5)
    offs = d.offsets.get()
    assert offs[experts // 2 + 1] - offs[experts // 2] == 5000
    _check_all(_logits(5000, experts, DTYPES[dtype], seed=5, kind="skew"), 2, scoring="sigmoid")


def test_nan_and_inf_logits_rank_like_the_reference():
    import cupy

    x = cupy.random.default_rng(6).standard_normal((500, 40), dtype=cupy.float32)
    x[::3, 5] = cupy.nan
    x[::4, 7] = -cupy.inf
    x[1::5, :] = -cupy.inf
    x[1::5, 3] = 0.0
    r = moe.route(x, 4)
    ref = reference.route(x, 4)
    np.testing.assert_array_equal(r.experts.get(), ref.experts)
    np.testing.assert_array_equal(r.counts.get(), ref.counts)


def test_losses_and_layout_are_bitwise_reproducible():
    x = _logits(65536, 256, dtypes.BF16, seed=7)
    a, b = moe.route(x, 8), moe.route(x, 8)
    for name in ("aux_loss", "z_loss", "usage_cv", "mean_prob", "weights"):
        assert (getattr(a, name) == getattr(b, name)).all(), name
    da, db = moe.permute(a, block_m=64), moe.permute(b, block_m=64)
    assert (da.sorted_slots == db.sorted_slots).all() and (da.inverse == db.inverse).all()


def test_misaligned_rows_take_the_narrow_path():
    r = moe.route(_logits(100, 8, dtypes.FP16, seed=8), 2)
    d = moe.permute(r)
    base = dtypes.random((100 * 64 + 1,), dtypes.FP16, seed=9)
    x = base[1:].reshape(100, 64)  # 2-byte aligned rows: no 16-byte accesses possible
    np.testing.assert_array_equal(moe.gather(x, d).get(), reference.gather(x.get(), d.sorted_slots.get(), 2))
    ybase = dtypes.random((d.rows * 64 + 1,), dtypes.FP16, seed=10)
    y = ybase[1:].reshape(d.rows, 64)
    want = reference.combine(y.get(), d.inverse.get(), r.weights.get())
    checks.compare(moe.combine(y, d, r), want, tol=checks.TOLERANCES["fp16"]).raise_if_failed()


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    logits = torch.randn(512, 32, device="cuda", dtype=torch.bfloat16)
    r = moe.route(logits, 2)
    ref = reference.route(dtypes.as_cupy(logits, name="logits")[0], 2)
    assert isinstance(r.experts, torch.Tensor) and r.experts.device == logits.device  # torch in, torch out
    np.testing.assert_array_equal(r.experts.cpu().numpy(), ref.experts)
    d = moe.permute(r)
    assert isinstance(d.sorted_slots, torch.Tensor)
    x = torch.randn(512, 128, device="cuda", dtype=torch.bfloat16)
    g = moe.gather(x, d)
    assert isinstance(g, torch.Tensor) and g.dtype == torch.bfloat16
    out = moe.combine(g, d, r)  # gather then combine with weights summing to 1 returns x (to bf16 rounding)
    assert torch.allclose(out.float(), x.float(), atol=2e-2, rtol=2e-2)


def test_bad_arguments_raise_before_launch():
    import cupy

    x = _logits(16, 8, dtypes.FP32, seed=11)
    cases = [
        (lambda: moe.route(x[0], 2), ValueError, "logits must be 2-D"),
        (lambda: moe.route(x.astype(cupy.float64), 2), TypeError, "logits must be float32"),
        (lambda: moe.route(x.T, 2), ValueError, "C-contiguous"),
        (lambda: moe.route(x[:0], 2), ValueError, "no tokens"),
        (lambda: moe.route(cupy.zeros((4, 513), cupy.float32), 2), ValueError, "513 experts"),
        (lambda: moe.route(x, 9), ValueError, "top_k=9"),
        (lambda: moe.route(cupy.zeros((4, 4), cupy.float32), 5), ValueError, "top_k=5"),
        (lambda: moe.route(x, 0), ValueError, "top_k=0"),
        (lambda: moe.route(x, 2.0), TypeError, "top_k must be an int"),
        (lambda: moe.route(x, 2, scoring="relu"), ValueError, "scoring"),
        (lambda: moe.route(x.get(), 2), TypeError, "logits must be a cupy.ndarray"),
        (lambda: moe.permute("r"), TypeError, "routing must be a moe.Routing"),
    ]
    r = moe.route(x, 2)
    d = moe.permute(r)
    cases += [
        (lambda: moe.permute(r, block_m=0), ValueError, "block_m"),
        (lambda: moe.gather(cupy.zeros((15, 8), cupy.float32), d), ValueError, "x has 15 rows"),
        (lambda: moe.gather(cupy.zeros((16, 8), cupy.int32), d), TypeError, "x must be float32"),
        (lambda: moe.gather(cupy.zeros((16, 8), cupy.float32), r), TypeError, "dispatch must be a moe.Dispatch"),
        (lambda: moe.combine(cupy.zeros((d.rows + 1, 8), cupy.float32), d, r), ValueError, "expert_out has"),
        (lambda: moe.combine(cupy.zeros((d.rows, 8), cupy.float32), d, moe.route(x[:8], 2)), ValueError,
         "does not match dispatch"),
    ]
    for call, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            call()


def test_bench_quick_suite_passes_its_checks(capsys):
    assert bench.main(["--suite", "quick", "--budget-ms", "20"]) == 0
    out = capsys.readouterr().out
    assert "expert utilisation" in out and "failed-check" not in out
