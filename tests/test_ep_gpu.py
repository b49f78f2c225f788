"""The expert-parallel layer on GPUs: world size 1 in this process (no exchange: ``MoELayer``'s launches) against
the single-GPU ``MoELayer``; two ranks through the bench's own launcher when two GPUs are visible, with equal
tokens (the bench) and with unequal tokens, an empty rank and empty chunks."""
from __future__ import annotations

import numpy as np
import pytest

from cukernels import checks, dtypes
from moe import MoELayer, ep, ep_bench, suites

pytestmark = pytest.mark.gpu

_SHAPE = suites.shape("quick_T1000_E60_top4")  # odd sizes: 1000 tokens, 60 experts, top-4, hidden 384
_INTER = 256


def _nccl():
    from cupy.cuda import nccl

    missing = ep_bench.nccl_missing()
    if missing:
        pytest.skip(missing)
    return nccl


@pytest.fixture(scope="module")
def comm1():
    nccl = _nccl()
    return nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)


@pytest.fixture(scope="module", params=["bf16", "fp16"])
def weights(request):
    dt = dtypes.from_name(request.param)
    router, w_gu, w_down = ep_bench.layer_weights(_SHAPE.experts, _SHAPE.hidden, _INTER, dt, seed=5)
    x = dtypes.random((_SHAPE.tokens, _SHAPE.hidden), dt, seed=11)
    return request.param, router, w_gu, w_down, x


@pytest.mark.parametrize("chunks", [1, 3, 7])
def test_world_one_equals_moe_layer(comm1, weights, chunks):
    name, router, w_gu, w_down, x = weights
    k = _SHAPE.top_k
    ref = MoELayer(router, w_gu, w_down, k)(x)
    layer = ep.ExpertParallelMoE.from_full(comm1, 0, 1, router, w_gu, w_down, k, chunks=chunks)
    out = layer(x)
    check = ep_bench.compare_rows(out, ref, checks.TOLERANCES[name], "EP vs MoELayer")
    assert check["passed"], check
    # world size 1 makes MoELayer's launches (no NCCL, no host wait), so the output is MoELayer's bit for bit
    assert bool((out.view(np.uint16) == ref.view(np.uint16)).all()), "EP(1) differs from MoELayer"
    rec = layer.last_exchange
    assert rec.plan is None and rec.rows == _SHAPE.tokens * k and set(rec.bytes().values()) == {0}
    again = layer(x)
    assert bool((again.view(np.uint16) == out.view(np.uint16)).all()), "two forwards differ"
    alone = layer(x, exchange_only=True, record=True)  # rows out and back unchanged: x again
    assert ep_bench.compare_rows(alone, x, checks.TOLERANCES[name], "exchange alone")["passed"]
    assert layer.last_exchange.times_ms() == {"dispatch_ms": 0.0, "return_ms": 0.0}  # nothing exchanged


def test_arguments_are_checked(comm1, weights):
    name, router, w_gu, w_down, x = weights
    with pytest.raises(ValueError, match="60 experts do not split evenly over 7 ranks"):
        ep.ExpertParallelMoE.from_full(comm1, 0, 7, router, w_gu, w_down, 2)
    with pytest.raises(ValueError, match="rank 0's 60 of the 60 experts"):
        ep.ExpertParallelMoE(comm1, 0, 1, router, w_gu[:30], w_down[:30], 2)
    layer = ep.ExpertParallelMoE.from_full(comm1, 0, 1, router, w_gu, w_down, 2, chunks=4)
    assert layer(x[:0]).shape == (0, _SHAPE.hidden)  # no tokens, fewer tokens than chunks: both allowed
    few = layer(x[:3])
    assert ep_bench.compare_rows(few, MoELayer(router, w_gu, w_down, 2)(x[:3]), checks.TOLERANCES[name],
                                 "3 tokens")["passed"]
    with pytest.raises(ValueError, match=r"x must be \[tokens, 384\]"):
        layer(x[:, :256].copy())


def test_quick_bench_one_gpu(tmp_path):
    _nccl()
    out = tmp_path / "ep.json"
    assert ep_bench.main(["--suite", "ep", "--gpus", "1", "--quick", "--iters", "2", "--warmup", "1",
                          "--json", str(out)]) == 0
    import json

    rows = json.loads(out.read_text())["rows"]
    assert rows and all(r["correct"] and r["world"] == 1 for r in rows)


def test_two_ranks_equal_moe_layer():
    import cupy

    _nccl()
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs 2 GPUs (world size 2)")
    assert ep_bench.main(["--suite", "ep", "--gpus", "2", "--quick", "--iters", "2", "--warmup", "1"]) == 0


@pytest.mark.parametrize("rank_tokens, chunks", [([300, 2], 3), ([0, 257], 2)])
def test_two_ranks_uneven_tokens_and_empty_chunks(rank_tokens, chunks):
    """Unequal tokens per rank, a rank with fewer tokens than chunks (empty chunks) or none: no rank waits
    forever, every output matches MoELayer's."""
    import argparse

    import cupy

    _nccl()
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs 2 GPUs (world size 2)")
    args = argparse.Namespace(rank_tokens=rank_tokens, chunks=chunks, experts=8, hidden=256, intermediate=256,
                              top_k=2, dtype="bf16", seed=3, timeout=300.0)
    (row,) = ep_bench.launch_local(2, args, main=ep_bench.uneven_rank_main)
    assert row["rank"] == 0 and row["tokens"] == rank_tokens[0]
