"""``CapturedMoE``: one ``MoELayer`` forward of a fixed token count captured into a CUDA graph.

The graph owns its input and output (``input``, ``output``) and every workspace of the captured call (torch's
graph memory pool, or CuPy arrays the launch path keeps alive while capturing), so a replay costs one copy of x
and one graph launch on the host. Replays are ordered on the current stream (torch's or CuPy's).
"""
from __future__ import annotations

import numpy as np

from cukernels import dtypes
from cukernels import launch as _launch


class CapturedMoE:
    def __init__(self, layer, tokens: int, use_torch: bool):
        if tokens < 1:
            raise ValueError(f"tokens must be >= 1, got {tokens}")
        self.layer, self.tokens, self.torch = layer, tokens, use_torch
        shape = (tokens, layer.hidden)
        dev = layer.w_gate_up.device.id
        if use_torch:
            import torch

            dt = torch.bfloat16 if layer.dtype == dtypes.BF16 else torch.float16
            self.input = torch.randn(shape, device=f"cuda:{dev}").to(dt)
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):  # warm-up: compile, plan, and the constants of the plan
                for _ in range(2):
                    layer.forward(self.input)
            torch.cuda.current_stream(dev).wait_stream(side)
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                self.output = layer.forward(self.input)
        else:
            import cupy

            with cupy.cuda.Device(dev):
                self.input = dtypes.random(shape, layer.dtype, seed=0)
                stream = cupy.cuda.Stream(non_blocking=True)
                with stream:
                    for _ in range(2):
                        layer.forward(self.input)
                    stream.synchronize()
                    mark = _launch.captured_mark()
                    stream.begin_capture(cupy.cuda.runtime.streamCaptureModeRelaxed)
                    try:
                        self.output = layer.forward(self.input)
                    finally:
                        self._graph = stream.end_capture()
                        self._workspaces = _launch.captured_workspaces_since(mark)
                self._graph.upload()
        self._nbytes = int(np.prod(shape)) * 2
        self._stream = _launch.frame(use_torch, dev).stream
        from cupy.cuda import runtime

        self._memcpy = runtime.memcpyAsync

    def replay(self):
        """Run the graph on ``input`` as it is now; returns ``output``."""
        if self.torch:
            self._graph.replay()
        else:
            self._graph.launch()
        return self.output

    def __call__(self, x):
        """Copy ``x`` ([tokens, hidden], the layer's dtype) into the graph's input, replay, return ``output``."""
        if tuple(x.shape) != tuple(self.input.shape):
            raise ValueError(f"x must be {list(self.input.shape)} (the captured token count), got {list(x.shape)}")
        if x.dtype != self.input.dtype:
            raise TypeError(f"x must have dtype {self.input.dtype}, got {x.dtype}")
        if not dtypes.is_c_contiguous(x):
            raise ValueError("x must be C-contiguous")
        src, dst = _launch.view(x)[1], _launch.view(self.input)[1]
        self._memcpy(dst, src, self._nbytes, 3, self._stream())  # device to device, on the replay's stream
        return self.replay()

    def release(self) -> None:
        """Drop the graph and the workspaces of its captured call."""
        self._graph = None
        self._workspaces = []
