"""Any expert count on a GPU: the grouped GEMM's fp32 output (router logits [tokens, experts]) for N that is not a
multiple of 8, on every config that fits, against the float64 reference; routing and the stable permutation for
1 to 512 experts (every experts-per-lane instance of moe_route, past the old 256 limit) against moe.reference.
Fresh random inputs, outputs poisoned beforehand."""
import numpy as np
import pytest

from cukernels import checks, device, dtypes, tiling
import moe
from moe import gemm_configs
from moe.grouped_gemm import grouped_gemm, reference
from test_grouped_gemm_gpu import DTYPES, _groups
from test_moe_gpu import DTYPES as ROUTE_DTYPES, _check_all, _logits

pytestmark = pytest.mark.gpu

# ---------------------------------------------------------------- grouped GEMM, fp32 output, any N


@pytest.mark.parametrize("dtype", DTYPES, ids=dtypes.dtype_name)
@pytest.mark.parametrize("n", [1, 3, 4, 60, 100, 500])
def test_fp32_output_takes_any_n_on_every_config(n, dtype):
    import cupy

    # 300 rows of which [5, 290) are grouped over 5 experts (expert 1 empty); K = 72 is not a multiple of 64
    rows, k, experts, lo, hi = 300, 72, 5, 5, 290
    a = dtypes.random((rows, k), dtype, seed=n)
    b = dtypes.random((experts, n, k), dtype, seed=n + 1, scale=1.0 / np.sqrt(k))
    off = cupy.asarray((_groups(hi - lo, experts, np.random.default_rng(n)) + lo).astype(np.int32))
    scale = cupy.random.default_rng(n + 2).random(rows, dtype=cupy.float32) + 0.5
    ref = reference(a, b, off, row_scale=scale)
    spec = device.current()
    fitting = [c for c in gemm_configs.ALL if tiling.fits(c, spec) is None]
    for cfg in (c for c in fitting if c.kind == "tma"):  # 16-bit outputs only: refused by name, nothing launched
        with pytest.raises(ValueError, match="input dtype"):
            grouped_gemm(a, b, off, out_dtype=np.float32, row_scale=scale, config=cfg)
    for cfg in [None] + [c for c in fitting if c.kind != "tma"]:
        # poison_pool fills the next allocations with NaN: out starts poisoned
        checks.poison_pool(16 << 20)
        out = grouped_gemm(a, b, off, out_dtype=np.float32, row_scale=scale, config=cfg)
        assert out.dtype == np.float32 and out.shape == (rows, n)
        name = f"N={n} {dtypes.dtype_name(dtype)} {cfg or 'planned'}"
        checks.compare(out[lo:hi], ref[lo:hi], tol=checks.Tolerance(atol=1e-4, rtol=1e-4),
                       name=name).raise_if_failed()
        # rows outside [offsets[0], offsets[-1]) are never written: a store past column N - 1 of row hi - 1
        # would land in row hi
        assert bool(cupy.isnan(out[:lo]).all()) and bool(cupy.isnan(out[hi:]).all()), name


# ---------------------------------------------------------------- routing and permutation, 1..512 experts

GRID = [(e, k) for e in (1, 3, 60, 300, 512) for k in (1, 2, 6, 8) if k <= e]


@pytest.mark.parametrize("i,experts,top_k", [(i, *g) for i, g in enumerate(GRID)],
                         ids=[f"E{e}-k{k}" for e, k in GRID])
def test_route_and_permute_any_expert_count(i, experts, top_k):
    # 3000 tokens: several routing blocks and a partial last one; dtype, scoring, block_m and renormalisation
    # cycle through the grid
    dtype = list(ROUTE_DTYPES.values())[i % 3]
    _check_all(_logits(3000, experts, dtype, seed=100 + i), top_k, scoring=moe.SCORINGS[(i // 3) % 2],
               renormalize=bool(i % 5), block_m=(None, 16, 128)[i % 3], seed=100 + i)


@pytest.mark.parametrize("experts,top_k", [(300, 6), (512, 8)])
def test_many_tokens_ties_and_skew_past_256_experts(experts, top_k):
    _check_all(_logits(65536, experts, dtypes.BF16, seed=200 + experts), top_k, block_m=64)
    # exact ties among the 16 experts of a lane and across lanes go to the lower index; skew: every token's
    # best expert is experts // 2 (150 or 256, a high bit of its lane's mask)
    _check_all(_logits(4000, experts, dtypes.FP32, seed=201, kind="ties"), top_k, scoring="sigmoid")
    r, _ = _check_all(_logits(4000, experts, dtypes.FP16, seed=202, kind="skew"), 1)
    assert r.counts.get()[experts // 2] == 4000


def test_512_experts_are_bitwise_reproducible():
    x = _logits(32768, 512, dtypes.BF16, seed=300)
    a, b = moe.route(x, 8), moe.route(x, 8)
    for name in ("aux_loss", "z_loss", "usage_cv", "mean_prob", "weights", "experts"):
        assert (getattr(a, name) == getattr(b, name)).all(), name
    da, db = moe.permute(a, block_m=64), moe.permute(b, block_m=64)
    assert (da.sorted_slots == db.sorted_slots).all() and (da.inverse == db.inverse).all()
