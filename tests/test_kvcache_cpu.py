"""Attention over a KV cache without a GPU: the planner fits every profile, every planned kernel compiles offline
for every profile's arch with zero spills, and the split heuristic fills the GPU in whole waves."""
from __future__ import annotations

import numpy as np
import pytest

from attention.decode_configs import (MIN_STAGES_PER_SPLIT, DecodeConfig, DecodeProblem, plan_decode, plan_splits,
                                      search_space)
from attention.kvcache import SOURCE
from cukernels import compile, device, tiling

PROFILES = device.all_profiles()
HEAD_DIMS = (64, 128, 256)


def _problem(batch=8, seq_q=1, heads=32, kv_heads=8, head_dim=128, max_keys=32768, paged=False):
    return DecodeProblem(batch=batch, seq_q=seq_q, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                         max_keys=max_keys, dtype="bf16", paged=paged)


@pytest.mark.parametrize("spec", PROFILES, ids=lambda s: s.key)
def test_plans_fit_every_profile(spec):
    for d in HEAD_DIMS:
        if spec.compute_capability < (8, 0):
            with pytest.raises(tiling.PlanError, match="sm_80"):
                plan_decode(_problem(head_dim=d), spec)
            continue
        plan = plan_decode(_problem(head_dim=d), spec)
        assert plan.smem_bytes <= spec.smem_per_block_optin
        assert 1 <= plan_splits(_problem(head_dim=d), plan.config, spec) <= 128


def _archs():
    return sorted({s.arch for s in PROFILES if s.compute_capability >= (8, 0)})


@pytest.mark.slow
@pytest.mark.parametrize("arch", _archs())
def test_planned_kernels_compile_without_spills(arch):
    specs = [s for s in PROFILES if s.arch == arch]
    configs = {plan_decode(_problem(head_dim=d, paged=p), s).config for s in specs for d in HEAD_DIMS
               for p in (False, True)}
    exprs = [c.name_expression(dtype=np.uint16, paged=p) for c in configs for p in (False, True)]
    exprs += [c.name_expression(dtype=np.float16, paged=False) for c in configs]
    exprs += ["kv_append<__nv_bfloat16,true>", "kv_append<__half,false>"]
    for expr, res in compile.compile_offline(SOURCE, exprs, arch).items():
        assert res.spills == 0 and res.stack_bytes == 0, f"{expr} on {arch}: {res}"


def test_search_space_is_valid_and_ordered():
    for d in HEAD_DIMS:
        space = search_space(d)
        assert space[0] == DecodeConfig(head_dim=d, warps=8 if d == 64 else 4, stages=4 if d == 64 else 3)
        assert all(c.smem_bytes() == 2 * d * (16 + 2 * c.stages * 16 * c.warps) for c in space)
    with pytest.raises(ValueError, match="head_dim"):
        DecodeConfig(head_dim=96)


def test_splits_fill_the_gpu_and_keep_whole_stages():
    spec = device.profile("h100_sxm")
    cfg = plan_decode(_problem(), spec).config
    # one sequence, 8 KV heads: the splits make about one CTA per SM
    s = plan_splits(_problem(batch=1, max_keys=131072), cfg, spec)
    assert 0.9 <= 8 * s / spec.sm_count <= 1.0
    # a grid that already fills the GPU is not split
    assert plan_splits(_problem(batch=64, max_keys=8192), cfg, spec) == 1
    # short caches keep at least MIN_STAGES_PER_SPLIT stages per split
    s = plan_splits(_problem(batch=1, max_keys=1024), cfg, spec)
    assert s * MIN_STAGES_PER_SPLIT * cfg.keys_per_stage <= 1024
