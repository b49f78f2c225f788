import importlib.util
from pathlib import Path

import pytest

from cukernels import device


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU visible to CuPy (skipped otherwise)")


def pytest_collection_modifyitems(config, items):
    if device.gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible to CuPy: GPU validation skipped (CPU checks still run)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _tool(name: str):
    """tools/<name>.py as a module (the tools are scripts, not package modules)."""
    path = Path(__file__).resolve().parents[1] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_tool", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def sass_tool():
    """tools/sass.py: nvdisasm(), disassemble(), opcode(), loops(), register_moves()."""
    return _tool("sass")


@pytest.fixture(scope="session")
def fwd_timeline_tool():
    """tools/fwd_timeline.py: summarize() of the forward's per-CTA stamps."""
    return _tool("fwd_timeline")


@pytest.fixture(scope="session")
def decode_timeline_tool():
    """tools/decode_timeline.py: summarize() of the decode layer kernel's per-CTA stamps."""
    return _tool("decode_timeline")


@pytest.fixture(scope="session")
def decode_ab_tool():
    """tools/decode_ab.py: parse_case(), parse_variant(), parse_caches(), parse_tables(), page_order()."""
    return _tool("decode_ab")


@pytest.fixture(scope="session")
def layer_ab_tool():
    """tools/layer_ab.py: parse_variant(), parse_case()."""
    return _tool("layer_ab")


@pytest.fixture(scope="session")
def gemm_ab_tool():
    """tools/gemm_ab.py: parse_variant(), parse_case(), forced_config()."""
    return _tool("gemm_ab")
