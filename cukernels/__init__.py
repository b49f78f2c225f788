"""cukernels: GPU kernels as CUDA C++ compiled at run time through CuPy/NVRTC, and the harness that measures them.

The engine: ``device`` (limits), ``compile`` (the one build path), ``tiling`` (configs and plans),
``timing`` (the one timer), ``checks`` (numerics), ``bench`` / ``report`` / ``environment`` (the bench loop
and its outputs). See docs/engine-api.md.
"""
__version__ = "0.1.0"
