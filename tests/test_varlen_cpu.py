"""flash_attention_varlen's checks before any device work (host arrays reach the device check last, so every
earlier error shows here), the packed problem's tile counts, and its kernel instances."""
from __future__ import annotations

import numpy as np
import pytest

from attention import configs
from attention.bwd_configs import BwdConfig
from attention.varlen import validate_varlen
from cukernels import dtypes


def _a(shape, dtype=np.float16):
    return np.zeros(shape, dtype=dtype)


Q, KV = (10, 4, 64), (12, 2, 64)
CU = np.array([0, 4, 10], dtype=np.int32)
CUK = np.array([0, 5, 12], dtype=np.int32)


def _err(kind, match, q=None, k=None, v=None, cu_q=CU, cu_k=CUK, mq=6, mk=7, **kw):
    with pytest.raises(kind, match=match):
        validate_varlen(_a(Q) if q is None else q, _a(KV) if k is None else k, _a(KV) if v is None else v,
                        cu_q, cu_k, mq, mk, **kw)


def test_shapes_dtypes_and_offsets_are_checked():
    _err(ValueError, "q must be 3-D", q=_a((1, 10, 4, 64)))
    _err(TypeError, "float16 or bfloat16", q=_a(Q, np.float32))
    _err(TypeError, "share one dtype", k=_a(KV, dtypes.BF16), v=_a(KV, dtypes.BF16))
    _err(ValueError, "k and v must have the same shape", v=_a((11, 2, 64)))
    _err(ValueError, "head_dim must be one of", q=_a((10, 4, 32)), k=_a((12, 2, 32)), v=_a((12, 2, 32)))
    _err(ValueError, r"multiple of k/v heads", q=_a((10, 3, 64)))
    _err(ValueError, "contiguous along head_dim", q=_a((10, 64, 4)).transpose(0, 2, 1))
    _err(TypeError, "cu_seqlens_q must be int32", cu_q=CU.astype(np.int64))
    _err(ValueError, r"cu_seqlens_q must be 1-D \[batch \+ 1\]", cu_q=np.array([0], dtype=np.int32))
    _err(ValueError, "same length", cu_k=np.array([0, 5, 9, 12], dtype=np.int32))
    _err(TypeError, "cu_seqlens_k must be an int32", cu_k=[0, 5, 12])
    _err(TypeError, "max_seqlen_q must be an int", mq=6.0)
    _err(ValueError, "max_seqlen_k must be >= 0", mk=-1)
    _err(ValueError, "window's right side is 0", causal=True, window=(4, 4))
    _err(TypeError, "causal must be a bool", causal=1)
    _err(TypeError, "on a GPU; got host data")  # everything else is right: only the device is missing


def test_packed_problem_tiles_and_kernel_names():
    p = configs.FwdProblem(batch=64, seq_q=131072, seq_kv=131072, heads=16, kv_heads=16, head_dim=128,
                           causal=True, varlen=True)
    assert p.mask == configs.MASK_VARLEN | configs.MASK_WINDOW
    assert p.query_tiles(128) == 131072 // 128 + 64  # an upper bound: one partial tile per sequence at most
    dense = configs.FwdProblem(batch=2, seq_q=300, seq_kv=300, heads=1, kv_heads=1, head_dim=64)
    assert dense.query_tiles(128) == 2 * 3 and dense.kv_tiles(64) == 2 * 5
    cfg = BwdConfig(head_dim=256, block_m=64, block_n=64, warps=8, stages=1, dq_block_m=64, dq_block_n=32)
    assert cfg.name_expression(dtype=dtypes.BF16, mask=5, kernel="dq").startswith("flash_bwd_dq<__nv_bfloat16,256,64,16,")
    assert cfg.name_expression(dtype=dtypes.BF16, mask=1, kernel="dq").startswith("flash_bwd_dq<__nv_bfloat16,256,64,32,")


def test_bench_lengths_and_plan():
    from attention import varlen_bench

    lens = varlen_bench.mixed_lengths()
    assert len(lens) == 64 and sum(lens) == 131072 and min(lens) >= 1 and max(lens) == 8192
    assert varlen_bench.mixed_lengths() == lens  # fixed seed: every run times the same batch


def test_bench_plan_without_gpu(capsys):
    from attention import bench

    assert bench.main(["--suite", "varlen", "--plan", "--profile", "h100"]) == 0
    out = capsys.readouterr().out
    assert "varlen_mixed_T128k_h16-16_d128" in out and ("FwdTmaConfig" in out or "FwdWgmmaConfig" in out)
    assert bench.main(["--suite", "varlen", "--backward", "--plan", "--profile", "a100_80gb"]) == 0
    assert "BwdConfig" in capsys.readouterr().out
