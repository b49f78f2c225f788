"""Tensor maps (cukernels/tma.py) before any driver call: the layout rules refuse a bad map when it is made, the
parameter buffer is 64-byte aligned and is what a launcher's slot points at; the TMA smoke kernel compiles for
sm_90a with no spills."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cukernels import compile as ccompile
from cukernels import launch, tma


def test_layout_rules_are_checked_when_the_map_is_made():
    ok = tma.TensorMap("bfloat16", (200, 300), (400,), (64, 32))
    assert ok.box_bytes == 64 * 32 * 2 and ok.address % 64 == 0
    for kw, match in ((dict(dims=(200, 300, 4, 2, 2, 2), strides=(400, 1, 1, 1, 1)), "1 to 5 dimensions"),
                      (dict(strides=()), "strides: 1 values"),
                      (dict(strides=(401,)), "multiples of 16 bytes"),
                      (dict(box=(64,)), "one value per dimension"),
                      (dict(box=(64, 512)), "1..256"),
                      (dict(box=(4, 32)), "multiple of 16 bytes"),
                      (dict(box=(128, 32)), "at most 128 bytes"),
                      (dict(swizzle=16), "swizzle must be one of"),
                      (dict(dtype="int4"), "dtype must be one of"),
                      (dict(dtype=3), "element size must be one of")):
        args = dict(dtype="bfloat16", dims=(200, 300), strides=(400,), box=(64, 32)) | kw
        with pytest.raises(ValueError, match=match):
            tma.TensorMap(args.pop("dtype"), args.pop("dims"), args.pop("strides"), args.pop("box"), **args)
    tma.TensorMap(2, (200, 300), (400,), (128, 32), swizzle=0)  # no swizzle: any inner width (a multiple of 16 B)


def test_unaligned_base_is_refused_before_encoding():
    m = tma.TensorMap(2, (64, 64), (128,), (64, 64), swizzle=128)
    with pytest.raises(ValueError, match="16-byte aligned"):
        m.bind(0x1008)


class _FakeKernel:
    name_expression = "fake"
    handle = 1

    def reserve_smem(self, smem):
        pass


def test_launcher_points_the_parameter_slot_at_the_map():
    m = tma.TensorMap(2, (64, 64), (128,), (64, 64), index=1)
    launcher = launch.Launcher(_FakeKernel(), (1,), (32,), (launch.Ptr(0), m, np.int32(7)))
    params = ctypes.cast(launcher._params_addr, ctypes.POINTER(ctypes.c_void_p))
    assert params[1] == m.address and m in launcher._maps


def test_smoke_kernel_compiles_for_hopper():
    res = ccompile.compile_offline(launch.__file__.replace("launch.py", "kernels/tma_copy.cu"),
                                   ["tma_copy_tiles<64,32>"], "sm_90a")
    r = res["tma_copy_tiles<64,32>"]
    assert r.spills == 0 and r.stack_bytes == 0


def test_recent_addresses_are_not_encoded_again(monkeypatch):
    """Buffers that alternate between calls (double buffering, a training step's fresh allocations landing on a
    few addresses) reuse the bytes encoded for them; an unseen address is encoded, and the oldest entry goes."""
    from unittest import mock

    encoded = []

    def encode(out, dtype, rank, address, *rest):  # the driver's entry point: writes the map at `out`
        encoded.append(address)
        ctypes.memmove(out, bytes([len(encoded)] * 128), 128)
        return 0

    monkeypatch.setattr(tma, "_driver", lambda: mock.MagicMock())  # enums for the argument values
    monkeypatch.setattr(tma, "_c_encoder", lambda: encode)
    m = tma.TensorMap(2, (64, 64), (128,), (64, 64), swizzle=128)
    for a in (0x1000, 0x2000, 0x1000, 0x2000, 0x1000):
        m.bind(a)
    assert encoded == [0x1000, 0x2000]
    assert ctypes.string_at(m.address, 128) == bytes([1] * 128)  # 0x1000's bytes back in the slot
    for i in range(tma.TensorMap.RECENT):
        m.bind(0x10000 + 0x100 * i)
    m.bind(0x1000)  # pushed out by RECENT newer addresses: encoded again
    assert len(encoded) == 2 + tma.TensorMap.RECENT + 1


def test_launcher_binds_its_maps_only_where_the_pointer_moved(monkeypatch):
    """A launch re-encodes a map only when the call pointer it is bound to changed since the launcher's last
    launch, and a bind that fails (a misaligned base) leaves the launcher re-checking every map next time."""
    from unittest import mock

    encoded = []

    def encode(out, dtype, rank, address, *rest):
        encoded.append(address)
        return 0

    monkeypatch.setattr(tma, "_driver", lambda: mock.MagicMock())
    monkeypatch.setattr(tma, "_c_encoder", lambda: encode)
    a = tma.TensorMap(2, (64, 64), (128,), (64, 64), swizzle=128, index=0)
    b = tma.TensorMap(2, (64, 64), (128,), (64, 64), swizzle=128, index=2)
    launcher = launch.Launcher(_FakeKernel(), (1,), (32,), (a, launch.Ptr(1), b, np.int32(7)))
    launches = []
    launcher._launch = lambda *args: launches.append(args)
    slot = ctypes.cast(launcher._params_addr, ctypes.POINTER(ctypes.c_void_p))[1]
    launcher.launch(0, (0x1000, 0x5550, 0x2000))
    assert ctypes.c_uint64.from_address(slot).value == 0x5550
    launcher.launch(0, (0x1000, 0x7770, 0x2000))  # only the plain pointer moved: no encoding
    assert encoded == [0x1000, 0x2000] and ctypes.c_uint64.from_address(slot).value == 0x7770
    with pytest.raises(ValueError, match="16-byte aligned"):
        launcher.launch(0, (0x3000, 0, 0x2008))  # a is bound to 0x3000, b refuses
    launcher.launch(0, (0x1000, 0, 0x2000))  # back to the first pointers: a must be bound to 0x1000 again
    assert encoded == [0x1000, 0x2000, 0x3000] and len(launches) == 3  # (its bytes for 0x1000 were kept)
    assert (a._bound, b._bound) == (0x1000, 0x2000)
