"""Flash attention on tensor cores (CUDA C++ via NVRTC): training forward and backward, and inference over a KV
cache.

- ``flash_attention`` (api.py; tiles and planner in configs.py; kernels/flash_fwd.cu, and on Hopper
  flash_fwd_tma.cu (warp-specialised, TMA; needs cuda-bindings) or flash_fwd_sm90.cu), ``flash_attention_backward``
  (backward.py, bwd_configs.py; kernels/flash_bwd.cu, and on Hopper flash_bwd_tma.cu or flash_bwd_sm90.cu);
- ``flash_attention_varlen`` and its backward (varlen.py): packed variable-length batches by cu_seqlens, on the
  same kernels;
- ``flash_attention_with_kvcache`` (kvcache.py, decode_configs.py; kernels/flash_decode.cu);
- the naive formulas in reference.py and backward_reference.py, the named shapes in suites.py.

``attention.torch`` (the differentiable torch op and the ``torch.ops.cukernels`` custom ops) is not imported here:
``import attention`` must not import torch.
"""
from .api import flash_attention, validate
from .configs import FwdConfig, FwdProblem, plan_forward
from .reference import attention_reference

__all__ = ["flash_attention", "validate", "FwdConfig", "FwdProblem", "plan_forward", "attention_reference"]

from .backward import flash_attention_backward
from .backward_reference import attention_backward_reference
from .bwd_configs import BwdConfig, plan_backward

__all__ += ["flash_attention_backward", "attention_backward_reference", "BwdConfig", "plan_backward"]

from .decode_configs import DecodeConfig, plan_decode
from .kvcache import flash_attention_with_kvcache

__all__ += ["flash_attention_with_kvcache", "DecodeConfig", "plan_decode"]

from .varlen import flash_attention_varlen, flash_attention_varlen_backward

__all__ += ["flash_attention_varlen", "flash_attention_varlen_backward"]
