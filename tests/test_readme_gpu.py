"""The README's "Use it from your code" snippets, executed in order in one namespace as a reader would paste
them: a snippet that drifts from the API fails here. Each result is then checked against the fp32 reference."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cukernels import checks

pytestmark = pytest.mark.gpu

README = Path(__file__).resolve().parent.parent / "README.md"


def snippets() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Use it from your code"):]
    section = section[: section.index("\n## ", 3)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_readme_has_the_usage_snippets():
    found = snippets()
    assert len(found) >= 4
    for name in ("flash_attention(", "attention.torch", "flash_attention_with_kvcache(", "flash_attention_varlen(",
                 "MoELayer(", "capture(", "route("):
        assert any(name in s for s in found), name


def test_readme_snippets_run_and_compute_the_right_thing(capsys):
    torch = pytest.importorskip("torch")
    import cupy

    from attention.kvcache import kvcache_reference
    from moe.layer import reference_forward

    ns: dict = {}
    for code in snippets():
        exec(compile(code, str(README), "exec"), ns)  # noqa: S102 - the README's own code
    torch.cuda.synchronize()

    def c(t):
        t = t.detach()
        return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16) if t.dtype == torch.bfloat16 else cupy.from_dlpack(t)

    # the KV-cache snippet's output against the per-sequence reference (its cache now holds the appended token)
    lens = ns["cache_seqlens"] + 1
    ref, _ = kvcache_reference(c(ns["q"]), c(ns["k_cache"]), c(ns["v_cache"]), lens, causal=True)
    checks.compare(c(ns["o"]), ref, tol=checks.Tolerance(atol=8e-3, rtol=2e-2), name="kvcache o").raise_if_failed()
    # the torch snippet's gradients exist and are finite
    assert all(bool(torch.isfinite(x.grad).all()) for x in (ns["k"], ns["v"]))
    # the packed snippet: each sequence against the dense reference, gradients finite
    from attention import attention_reference

    cu = ns["cu"].tolist()
    for b in range(len(cu) - 1):
        if cu[b + 1] > cu[b]:
            rows = slice(cu[b], cu[b + 1])
            ref = attention_reference(*(c(ns[n][rows])[None] for n in ("q_packed", "k_packed", "v_packed")),
                                      causal=True)[0]
            checks.compare(c(ns["o_packed"][rows]), ref, tol=checks.Tolerance(atol=8e-3, rtol=2e-2),
                           name=f"varlen o[{b}]").raise_if_failed()
    assert all(bool(torch.isfinite(ns[n].grad).all()) for n in ("q_packed", "k_packed", "v_packed"))
    # the MoE layer: eager and captured outputs equal, and against the float64 reference
    x = ns["x"]
    eager = ns["layer"](x)
    assert torch.equal(ns["y"], eager)
    ref = reference_forward(c(x), c(ns["router_weight"]), c(ns["layer"]._op_weights[1]), c(ns["w_down"]), 4)
    checks.compare(c(eager), ref, tol=checks.Tolerance(atol=3e-2, rtol=3e-2), name="moe y").raise_if_failed()
    assert "aux_loss" in capsys.readouterr().out
