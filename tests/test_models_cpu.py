"""The end-to-end models with no GPU: seed 004's nine rows and the MoE variant as configs, projection sizes the
grouped GEMM accepts, the expected tables' rows and assumptions, the command line (--list, usage errors, no GPU),
argument checks of the norm/rotary ops, the NumPy reference's pieces, and the offline compile of norm_rope.cu."""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from cukernels import cli, device, dtypes
from cukernels import compile as ccompile
from models import bench, configs, norm_rope, reference
from moe.grouped_gemm import validate as validate_gemm

ROOT = Path(__file__).resolve().parent.parent

# seed 004, End-to-End Inference Benchmarks: (model, layers, hidden, heads) -> (batch, seq) rows
SEED_ROWS = {("small", 12, 768, 12): [(1, 128), (4, 512), (16, 2048)],
             ("medium", 24, 2048, 16): [(1, 128), (4, 512), (8, 1024)],
             ("large", 32, 4096, 32): [(1, 128), (4, 512), (8, 2048)]}


def test_the_nine_seed_rows_are_the_seed004_cases():
    got = sorted((c.model.name, c.model.layers, c.model.hidden, c.model.heads, c.batch, c.seq)
                 for c in configs.SEED004)
    want = sorted((*key, b, s) for key, rows in SEED_ROWS.items() for b, s in rows)
    assert got == want
    assert all(c.model.seed_row and c.model.ffn == "swiglu" for c in configs.SEED004)
    assert configs.QUICK == [configs.CASES["small_b1_s128"]]


@pytest.mark.parametrize("name", list(configs.MODELS))
def test_head_dim_and_ffn_sizes(name):
    m = configs.MODELS[name]
    assert m.head_dim * m.heads == m.hidden and m.head_dim in (64, 128, 256)
    assert m.heads % m.kv_heads == 0
    if m.seed_row:
        assert m.kv_heads == m.heads and m.intermediate == configs.llama_intermediate(m.hidden)
        assert m.intermediate % 256 == 0
    assert m.dtype == "bf16" and "vocabulary excluded" in m.assumptions()


def test_llama_rule_gives_the_known_widths():
    assert [configs.llama_intermediate(h) for h in (768, 2048, 4096)] == [2048, 5632, 11008]


class _Meta:
    """Shape and dtype of an array that is never made (the large model's weights are 180 MB each)."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.flags = type("Flags", (), {"c_contiguous": True})()


@pytest.mark.parametrize("name", list(configs.MODELS))
def test_every_projection_is_a_gemm_the_grouped_gemm_accepts(name):
    m = configs.MODELS[name]
    experts = m.experts if m.ffn == "moe" else 1
    rows = 128
    gemms = [(1, m.qkv_width, m.hidden, None), (1, m.hidden, m.heads * m.head_dim, None),
             (experts, 2 * m.intermediate, m.hidden, "swiglu"), (experts, m.hidden, m.intermediate, None)]
    for e, n, k, epilogue in gemms:
        validate_gemm(_Meta((rows, k), dtypes.BF16), _Meta((e, n, k), dtypes.BF16),
                      _Meta((e + 1,), np.int32), epilogue=epilogue)


def test_bad_configs_are_refused():
    base = dict(name="x", layers=1, hidden=256, heads=4, kv_heads=4, ffn="swiglu", intermediate=768)
    configs.ModelConfig(**base)
    for change, match in ((dict(heads=3), "multiple of heads"), (dict(kv_heads=3), "multiple of kv_heads"),
                          (dict(hidden=320, heads=4), "head_dim 80"), (dict(intermediate=700), "multiple of 16"),
                          (dict(ffn="moe"), "top_k"), (dict(ffn="gelu"), "ffn must be"),
                          (dict(dtype="fp16"), "bf16")):
        with pytest.raises(ValueError, match=match):
            configs.ModelConfig(**{**base, **change})


def test_flops_count_the_active_experts_and_half_the_causal_scores():
    m = configs.MODELS["small"]
    b, s, h, d = 2, 256, m.hidden, m.head_dim
    per_layer = 2 * b * s * (h * 3 * h + h * h) + 2 * b * s * 3 * h * m.intermediate + 2 * b * m.heads * s * s * d
    assert m.flops(b, s) == pytest.approx(m.layers * per_layer)
    # medium-moe: top-2 of 2816 wide experts = dense medium's 5632 FFN FLOPs; it adds the router, GQA saves k/v
    moe, dense = configs.MODELS["medium-moe"], configs.MODELS["medium"]
    assert moe.top_k * moe.intermediate == dense.intermediate
    t = 128
    router = 2 * t * moe.hidden * moe.experts
    kv_saved = 2 * t * moe.hidden * 2 * (moe.heads - moe.kv_heads) * moe.head_dim
    assert moe.flops(1, t) - dense.flops(1, t) == pytest.approx(moe.layers * (router - kv_saved))


# ---------------------------------------------------------------- expected tables


def _tables():
    return {p.stem: tomllib.loads(p.read_text()) for p in sorted((ROOT / "expected_results").glob("*.toml"))}


@pytest.mark.parametrize("name", [n for n, doc in _tables().items() if doc.get("end_to_end")])
def test_expected_rows_match_a_case_and_state_its_assumptions(name):
    rows = _tables()[name]["end_to_end"]
    assert len(rows) == 9
    for row in rows:
        case = configs.CASES[f"{row['model']}_b{row['batch']}_s{row['seq']}"]
        assert bench.find_expected(rows, case) is row
        assert row["assumptions"].startswith(case.model.assumptions()), row
        assert "seed 004" in row["provenance"]


def test_the_h200_run_scores_against_the_h100_rows():
    rows, note = bench.expected_rows(device.profile("h200"), "auto")
    assert len(rows) == 9 and "h100_sxm" in note
    rows, _ = bench.expected_rows(device.profile("h100"), "auto")
    assert bench.find_expected(rows, configs.CASES["large_b8_s2048"])["expected_ms"] == 185.0
    assert bench.gate_pct(device.profile("h100"), "auto") == 40


def test_json_only_with_out(tmp_path, capsys):
    assert bench.parser().parse_args(["--quick"]).out is None  # nothing written to docs/results by default
    case = configs.QUICK[0]
    row = bench.ModelResult(case=case.name, model=case.model.name, impl="ours", batch=case.batch, seq=case.seq,
                            tokens=case.tokens, status="ok", median_ms=1.0)
    out = tmp_path / "r" / "models.json"
    bench.write_json(out, [row], [case], "note", 40.0, ["--quick", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["results"][0]["median_ms"] == 1.0 and doc["command"].endswith(f"--out {out}")
    assert {"tune_cache", "tuned"} <= set(doc["environment"])


# ---------------------------------------------------------------- command line


def test_list_names_every_model_and_its_assumptions(capsys):
    assert bench.main(["--list"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    for name in configs.BENCH_MODELS:
        assert name in out and configs.MODELS[name].assumptions() in out
    for case in configs.SEED004:
        assert case.name in out


@pytest.mark.parametrize("argv, names", [(["--model", "huge"], "small, medium, large, medium-moe"),
                                          (["--quick", "--model", "small"], "--quick"),
                                          (["--expected", "nope"], "h100_sxm")])
def test_usage_errors_exit_2_and_say_what_is_accepted(argv, names, capsys):
    assert bench.main(argv) == cli.EXIT_USAGE
    assert names in capsys.readouterr().err


def test_selected_cases():
    args = bench.parser().parse_args([])
    assert bench.selected_cases(args) == configs.SEED004
    args = bench.parser().parse_args(["--model", "medium-moe"])
    assert [c.name for c in bench.selected_cases(args)] == ["medium-moe_b1_s128", "medium-moe_b4_s512",
                                                            "medium-moe_b8_s1024"]
    args = bench.parser().parse_args(["--case", "large_b1_s128", "--case", "small_b4_s512"])
    assert [c.name for c in bench.selected_cases(args)] == ["small_b4_s512", "large_b1_s128"]
    args = bench.parser().parse_args(["--model", "small", "--case", "large_b1_s128"])
    with pytest.raises(cli.UsageError, match="--case large_b1_s128: unknown; known: small_b16_s2048"):
        bench.selected_cases(args)


@pytest.mark.skipif(device.gpu_available(), reason="checks the no-GPU message")
def test_no_gpu_exits_0_with_the_shared_message():
    out = subprocess.run([sys.executable, "-m", "models.bench", "--quick"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == cli.EXIT_NO_GPU == 0, out.stderr
    assert "No CUDA GPU is visible to CuPy" in out.stderr and "Traceback" not in out.stderr


# ---------------------------------------------------------------- ops: argument checks before any launch


def test_norm_and_rotary_refuse_host_arrays_and_bad_shapes():
    x = np.zeros((4, 64), dtype=dtypes.BF16)
    with pytest.raises(TypeError, match="x must be a cupy.ndarray or a torch CUDA tensor, got ndarray on the host"):
        norm_rope.rms_norm(x, np.zeros(64, dtype=dtypes.BF16))
    cos, sin = norm_rope.rotary_tables(8, 64)
    with pytest.raises(TypeError, match="qkv must be"):
        norm_rope.rotary_(np.zeros((8, 3, 64), dtype=dtypes.BF16), cos, sin, seq=8, rot_heads=2)


def test_rotary_refuses_no_tokens(monkeypatch):
    monkeypatch.setattr(norm_rope, "_device_of", lambda name, t: 0)  # host arrays stand in for device ones
    cos, sin = norm_rope.rotary_tables(8, 64)
    with pytest.raises(ValueError, match=r"qkv must hold at least one token \(qkv.shape\[0\]\)"):
        norm_rope.validate_rotary(np.zeros((0, 3, 64), dtype=dtypes.BF16), cos, sin, 8, 2)
    assert norm_rope.validate_rotary(np.zeros((8, 3, 64), dtype=dtypes.BF16), cos, sin, 8, 2)[0] == 8


# ---------------------------------------------------------------- the NumPy reference


def test_rotary_tables_and_reference_rotation_are_a_complex_product():
    seq, d = 16, 64
    cos, sin = norm_rope.rotary_tables(seq, d)
    assert cos.shape == sin.shape == (seq, d // 2) and cos.dtype == np.float32
    t = np.random.default_rng(0).standard_normal((1, seq, 2, d)).astype(np.float32)
    got = reference.rotary(t, cos, sin)
    z = (t[..., : d // 2] + 1j * t[..., d // 2:]) * (cos + 1j * sin)[None, :, None, :]
    np.testing.assert_allclose(got, np.concatenate([z.real, z.imag], axis=-1), rtol=1e-5, atol=1e-5)


def test_reference_attention_is_causal():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 6, 4, 64)).astype(np.float32) for _ in range(3))
    o = reference.causal_attention(q, k[:, :, :2], v[:, :, :2])
    np.testing.assert_allclose(o[:, 0], np.repeat(v[:, 0, :2], 2, axis=1), rtol=1e-5)  # row 0 sees key 0 only
    k2 = k.copy()
    k2[:, 5] += 10  # the last key: no earlier row may change
    np.testing.assert_allclose(reference.causal_attention(q, k2[:, :, :2], v[:, :, :2])[:, :5], o[:, :5], rtol=1e-6)


def test_norm_plan_block_per_row_up_to_its_limit():
    assert norm_rope.norm_plan(8) == (1, 32)
    assert norm_rope.norm_plan(768) == (1, 96)
    assert norm_rope.norm_plan(4096) == (1, 512)
    assert norm_rope.norm_plan(5000) == (2, 320)
    assert norm_rope.norm_plan(12296) == (4, 416)
    assert norm_rope.norm_plan(16384) == (4, 512)
    assert norm_rope.norm_plan(16392) == (0, 32 * norm_rope.NORM_WARPS)  # the warp-per-row kernel


# ---------------------------------------------------------------- offline compile


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_norm_rope_compiles_offline_without_spills(arch):
    res = ccompile.compile_offline(norm_rope.SOURCE, norm_rope.name_expressions(), arch)
    assert set(res) == set(norm_rope.name_expressions())
    for expr, r in res.items():
        smem = 128 if expr.startswith("rms_norm_row") else 0  # its 32 warps' partial sums
        assert r.spills == 0 and r.stack_bytes == 0 and r.static_smem_bytes == smem, f"{expr} on {arch}: {r}"
        assert r.registers <= 128, f"{expr} on {arch}: {r.registers} registers"  # 512 threads: 128 at most


def test_moe_dense_suite_is_the_models_projections():
    """moe.bench's dense suite (moe never imports models) holds the medium and large models' GEMM shapes."""
    from moe import suites

    shapes = {(s.n, s.k) for s in suites.suite("dense")}
    for name in ("medium", "large"):
        m = configs.model(name)
        h = m.hidden
        assert {(m.qkv_width, h), (h, m.heads * m.head_dim), (2 * m.intermediate, h), (h, m.intermediate)} <= shapes
