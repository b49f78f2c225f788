"""Flash attention forward on tensor cores (CUDA C++ via NVRTC): ``flash_attention(q, k, v, ...)``.

See api.py for the accepted inputs, configs.py for tiles and the planner, reference.py for the naive formula,
suites.py for the named shapes, kernels/flash_fwd.cu for the kernel.
"""
from .api import flash_attention, validate
from .configs import FwdConfig, FwdProblem, plan_forward
from .reference import attention_reference

__all__ = ["flash_attention", "validate", "FwdConfig", "FwdProblem", "plan_forward", "attention_reference"]

# Backward (issue 4): backward.py, bwd_configs.py, backward_reference.py, kernels/flash_bwd.cu. attention.torch
# (the autograd op) is not imported here: ``import attention`` must not import torch.
from .backward import flash_attention_backward
from .backward_reference import attention_backward_reference
from .bwd_configs import BwdConfig, plan_backward

__all__ += ["flash_attention_backward", "attention_backward_reference", "BwdConfig", "plan_backward"]

# Inference: attention over a KV cache (kvcache.py, decode_configs.py, kernels/flash_decode.cu)
from .decode_configs import DecodeConfig, plan_decode
from .kvcache import flash_attention_with_kvcache

__all__ += ["flash_attention_with_kvcache", "DecodeConfig", "plan_decode"]
