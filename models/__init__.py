"""End-to-end decoder-only transformer benchmarks built from this project's ops (``attention``, ``moe``, and the
RMSNorm/rotary kernels here): seed 004's small/medium/large models and an MoE variant (``configs``), the model
three ways over one set of weights (``layers``: ours, eager torch naive, best torch), a NumPy reference
(``reference``) and ``python -m models.bench``. Importing ``models`` needs no torch; building a model does."""
from .configs import CASES, MODELS, ModelCase, ModelConfig

__all__ = ["CASES", "MODELS", "ModelCase", "ModelConfig"]
