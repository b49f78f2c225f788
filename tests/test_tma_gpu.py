"""The tensor-map path on a Hopper GPU: tiles copied by TMA load and TMA store (cukernels/kernels/tma_copy.cu)
with maps encoded by cukernels/tma.py and bound through a cached launcher, edge boxes partly out of bounds, a
strided source, the 128-byte swizzle round trip, and a re-bind when the source array changes."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cukernels import launch, tma

pytestmark = pytest.mark.gpu

SOURCE = Path(launch.__file__).parent / "kernels" / "tma_copy.cu"


@pytest.fixture(scope="module", autouse=True)
def _hopper():
    import cupy

    from cukernels import device

    if device.current().arch != "sm_90a":
        pytest.skip("TMA needs sm_90 (Hopper)")
    why = tma.available()
    if why:
        pytest.skip(why)
    yield
    cupy.cuda.get_current_stream().synchronize()


def _copy(rows, cols, row_stride, swizzle):
    import cupy

    from cukernels import compile as ccompile

    kern = ccompile.kernel(SOURCE, "tma_copy_tiles<64,32>")
    smap = tma.TensorMap(2, (cols, rows), (row_stride * 2,), (64, 32), swizzle=swizzle, index=0)
    dmap = tma.TensorMap(2, (cols, rows), (cols * 2,), (64, 32), swizzle=swizzle, index=1)
    launcher = launch.Launcher(kern, (-(-cols // 64), -(-rows // 32)), (128,),
                               (smap, dmap, launch.Ptr(2), np.int32(rows), np.int32(cols)))

    def run(src):
        dst = cupy.full((rows, cols), 0xFFFF, dtype=cupy.uint16)
        plain = cupy.full((rows, cols), 0xFFFF, dtype=cupy.uint16) if swizzle == 0 else None
        launcher.launch(cupy.cuda.get_current_stream().ptr,
                        (src.data.ptr, dst.data.ptr, 0 if plain is None else plain.data.ptr))
        cupy.cuda.get_current_stream().synchronize()
        return dst, plain
    return run, smap


@pytest.mark.parametrize("swizzle", [0, 128])
def test_tiles_round_trip(swizzle):
    import cupy

    rows, cols = 300, 200  # edge boxes: 200 = 3 x 64 + 8, 300 = 9 x 32 + 12
    src = cupy.asarray(np.random.default_rng(1).integers(0, 2**16, (rows, cols), dtype=np.uint16))
    run, smap = _copy(rows, cols, cols, swizzle)
    dst, plain = run(src)
    assert bool(cupy.array_equal(dst, src))
    if plain is not None:
        assert bool(cupy.array_equal(plain, src))
    again = cupy.asarray(np.random.default_rng(2).integers(0, 2**16, (rows, cols), dtype=np.uint16))
    dst, _ = run(again)  # another base address: the map is re-encoded at launch
    assert bool(cupy.array_equal(dst, again)) and smap._bound == again.data.ptr


def test_strided_source():
    import cupy

    rows, cols, stride = 100, 136, 256
    full = cupy.asarray(np.random.default_rng(3).integers(0, 2**16, (rows, stride), dtype=np.uint16))
    run, _ = _copy(rows, cols, stride, 0)
    dst, plain = run(full)
    assert bool(cupy.array_equal(dst, full[:, :cols])) and bool(cupy.array_equal(plain, full[:, :cols]))


@pytest.mark.parametrize("dtype,dims,strides,box,swizzle", [
    ("bfloat16", (64, 1024, 8, 4), (1024, 128, 1024 * 1024), (64, 128, 1, 1), 128),
    ("float32", (128, 300, 4, 2), (2048, 512, 300 * 2048), (32, 64, 1, 1), 128),
    (2, (200, 300), (400,), (64, 32), 0),
])
def test_ctypes_encoder_writes_the_bytes_cuda_bindings_writes(dtype, dims, strides, box, swizzle):
    """The fast encoder (ctypes, straight into the parameter buffer) and cuda-bindings' wrapper give the same
    128-byte map for the same layout and address."""
    import ctypes

    import cupy

    buf = cupy.empty(1 << 22, dtype=cupy.uint8)
    for address in (buf.data.ptr, buf.data.ptr + 4096):
        fast = tma.TensorMap(dtype, dims, strides, box, swizzle=swizzle)
        fast.bind(address)
        d = tma._driver()
        a = fast._encode_args()
        err, m = d.cuTensorMapEncodeTiled(a[0], a[1], address, *a[2:])
        assert err == d.CUresult.CUDA_SUCCESS
        assert ctypes.string_at(fast.address, 128) == ctypes.string_at(m.getPtr(), 128)
