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
