"""``route``: top-k expert selection with the load-balance statistics, one fused pass over the router logits.

Semantics (the NumPy reference in ``moe.reference`` is the specification):

- ``logits`` ``[tokens, experts]``, float32, float16 or bfloat16 (a ``uint16`` CuPy array of bf16 bits, or a
  torch bf16 CUDA tensor). ``experts <= 256``, ``1 <= top_k <= min(8, experts)``.
- Experts are ranked by their logit (fp32 value of the stored element); **equal logits go to the lower expert
  index**; NaN ranks below -inf. Both scorings are monotonic in the logit, so this is the ranking by score,
  without the ties that rounding of the scores would add.
- ``scoring="softmax"``: weight = softmax probability; with ``renormalize`` divided by the sum over the chosen k.
  ``scoring="sigmoid"`` (DeepSeek-V3): weight = sigmoid(logit); with ``renormalize`` divided by the chosen sum.
- ``aux_loss`` (Switch/GShard) = experts * sum_i fraction_i * mean_prob_i, fraction_i = counts_i / (tokens top_k),
  mean_prob_i = mean over tokens of the softmax probability of expert i (for sigmoid scoring: the sigmoid scores
  normalised to sum 1 over all experts, DeepSeek-V3's balance-loss probabilities).
- ``z_loss`` = mean over tokens of logsumexp(logits)^2 (both scorings).
- Usage: ``share`` = counts / (tokens top_k); ``usage_cv`` = std(counts) / mean(counts) (population std).

Everything stays on the GPU; the reductions have a fixed order, so the losses are bitwise reproducible.
``Routing.stats()`` synchronises and returns Python floats.
"""
from __future__ import annotations

import numpy as np

from cukernels import dtypes
from cukernels import launch as _launch

from . import configs, launch

SCORINGS = ("softmax", "sigmoid")


class Routing:
    """What ``route`` returns. Every array lives in one allocation made by the call; an attribute becomes an
    array (CuPy or torch, like the logits) when it is first read, so the MoE layer and ``permute`` never pay for
    views they do not use.

    weights float32 [tokens, top_k]; experts int32 [tokens, top_k] in rank order; counts int32 [experts] (slots
    routed to each expert); aux_loss, z_loss, usage_cv float32 0-d; share float32 [experts] (counts / (tokens
    top_k)); mean_prob float32 [experts] (the aux-loss factor); block_base int32 [blocks, experts] (per block of
    the routing kernel, the slots routed by earlier blocks: the starting ranks of ``permute``'s stable scatter).
    """

    __slots__ = ("tokens", "top_k", "num_experts", "scoring", "renormalize", "block_tokens", "device", "_frame",
                 "_buf", "_base", "_layout", "_views")

    def __init__(self, call: "RouteCall", frame, buf, base: int):
        self.tokens, self.top_k, self.num_experts = call.tokens, call.top_k, call.experts
        self.scoring, self.renormalize, self.block_tokens = call.scoring, call.renormalize, call.block_tokens
        self.device = frame.device_id
        self._frame, self._buf, self._base, self._layout, self._views = frame, buf, base, call.layout, {}

    def ptr(self, field: str) -> int:
        """Device address of a field (for the next kernels of the pipeline)."""
        return self._base + self._layout[field][0]

    def _view(self, field: str):
        v = self._views.get(field)
        if v is None:
            off, shape, dtype = self._layout[field]
            v = self._views[field] = self._frame.view(self._buf, off, shape, dtype)
        return v

    weights = property(lambda self: self._view("weights"))
    experts = property(lambda self: self._view("experts"))
    counts = property(lambda self: self._view("counts"))
    share = property(lambda self: self._view("share"))
    mean_prob = property(lambda self: self._view("mean_prob"))
    aux_loss = property(lambda self: self._view("aux_loss"))
    z_loss = property(lambda self: self._view("z_loss"))
    usage_cv = property(lambda self: self._view("usage_cv"))
    block_base = property(lambda self: self._view("block_base"))

    def stats(self) -> dict[str, float]:
        """Load-balance figures as Python floats (synchronises)."""
        share = np.asarray(_host(self.share))
        return {
            "aux_loss": float(_host(self.aux_loss)),
            "z_loss": float(_host(self.z_loss)),
            "usage_cv": float(_host(self.usage_cv)),
            "max_share": float(share.max()),
            "min_share": float(share.min()),
            "idle_experts": int((share == 0).sum()),
        }


def _host(x):
    return x.cpu().numpy() if _launch.is_torch(x) else x.get()


def validate(logits, top_k, scoring, renormalize) -> configs.RouteProblem:
    """Check route's arguments from their attributes; returns the problem. Raises before anything is launched."""
    if not hasattr(logits, "shape") or not hasattr(logits, "dtype"):
        raise TypeError(f"logits must be a cupy.ndarray or a torch CUDA tensor, got {type(logits).__name__}")
    if len(logits.shape) != 2:
        raise ValueError(f"logits must be 2-D [tokens, experts], got shape {tuple(logits.shape)}")
    dt = dtypes.storage(logits)
    if dt not in (dtypes.FP32, dtypes.FP16, dtypes.BF16):
        raise TypeError(f"logits must be float32, float16 or bfloat16, got {dtypes.text(logits)}")
    if not dtypes.is_c_contiguous(logits):
        raise ValueError(f"logits must be C-contiguous, got a strided view of shape {tuple(logits.shape)}")
    tokens, experts = (int(n) for n in logits.shape)
    if tokens < 1:
        raise ValueError("logits has no tokens (shape[0] == 0)")
    if not 1 <= experts <= configs.MAX_EXPERTS:
        raise ValueError(f"logits has {experts} experts (shape[1]); 1..{configs.MAX_EXPERTS} are supported")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)):
        raise TypeError(f"top_k must be an int, got {type(top_k).__name__}")
    if not 1 <= top_k <= min(configs.MAX_TOP_K, experts):
        raise ValueError(f"top_k={top_k}: must be 1..{min(configs.MAX_TOP_K, experts)} "
                         f"(at most {configs.MAX_TOP_K} and at most the {experts} experts)")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    if not isinstance(renormalize, (bool, np.bool_)):
        raise TypeError(f"renormalize must be a bool, got {type(renormalize).__name__}")
    if tokens * top_k >= 2**31:
        raise ValueError(f"tokens * top_k = {tokens * top_k} slots: must stay below 2**31")
    if _launch.view(logits) is None:
        raise TypeError(f"logits must be a cupy.ndarray or a torch CUDA tensor, got host data ({type(logits).__name__})")
    return configs.RouteProblem(tokens=tokens, experts=experts, top_k=int(top_k), dtype=dtypes.dtype_name(dt))


class RouteCall:
    """The routing kernel and its finishing kernel for one signature; ``layout`` places every output and the
    per-block partials in one allocation: field -> (byte offset, shape, dtype name)."""

    def __init__(self, problem: configs.RouteProblem, scoring: str, renormalize: bool, frame):
        tokens, experts, top_k = problem.tokens, problem.experts, problem.top_k
        self.tokens, self.experts, self.top_k = tokens, experts, top_k
        self.scoring, self.renormalize, self.frame = scoring, bool(renormalize), frame
        cfg = launch.plan(configs.plan_route, problem).config
        finish = None if cfg.finish else launch.plan(configs.plan_finish).config  # one block finishes itself
        self.block_tokens = cfg.block_tokens
        nblk = -(-tokens // cfg.block_tokens)
        ws = _launch.Workspace()
        self.layout = {}
        for field, shape, dtype in (
                ("weights", (tokens, top_k), "fp32"), ("experts", (tokens, top_k), "int32"),
                ("counts", (experts,), "int32"), ("block_base", (nblk, experts), "int32"),
                ("mean_prob", (experts,), "fp32"), ("share", (experts,), "fp32"),
                ("scalars", (3,), "fp32"), ("blk_counts", (nblk, experts), "int32"),
                ("blk_prob", (nblk, experts), "fp32"), ("blk_z", (nblk,), "fp32"), ("ticket", (1,), "int32")):
            self.layout[field] = (ws.add(4 * int(np.prod(shape, dtype=np.int64))), shape, dtype)
        self.nbytes = ws.nbytes
        self.offsets = {field: off for field, (off, _, _) in self.layout.items()}
        scalars = self.layout["scalars"][0]  # the finishing kernel writes aux_loss, z_loss, usage CV in a row
        for i, field in enumerate(("aux_loss", "z_loss", "usage_cv")):
            self.layout[field] = (scalars + 4 * i, (), "fp32")
        P = _launch.Ptr  # 0: logits, 1: the allocation
        dt = dtypes.from_name(problem.dtype)
        if cfg.finish and nblk != 1:
            raise ValueError(f"{cfg}: a finishing route config needs one block, {tokens} tokens make {nblk}")
        self.route = _launch.Launcher(
            launch.kernel(launch.ROUTE_SOURCE, cfg.name_expression(dtype=dt)), (nblk,), (cfg.threads,),
            (P(0), np.int32(tokens), np.int32(experts), np.int32(top_k), np.int32(cfg.block_tokens),
             np.int32(SCORINGS.index(scoring)), np.int32(bool(renormalize)), *self._at("weights", "experts",
             "blk_counts", "blk_prob", "blk_z", "ticket", "block_base", "counts", "mean_prob", "share", "scalars")),
            pdl=True)
        self.finish = None if cfg.finish else _launch.Launcher(
            launch.kernel(launch.ROUTE_SOURCE, finish.name_expression()), (-(-experts // 32),), (32, 32),
            (*self._at("blk_counts", "blk_prob", "blk_z"), np.int32(nblk), np.int32(tokens), np.int32(experts),
             np.int32(top_k), *self._at("block_base", "counts", "mean_prob", "share", "scalars", "ticket")),
            pdl=True)

    def _at(self, *fields):
        """Launcher arguments for fields of the allocation (pointer 1 of a call, plus the field's offset)."""
        return tuple(_launch.Ptr(1, self.offsets[f]) for f in fields)

    def enqueue(self, stream: int, logits_ptr: int, base: int) -> None:
        """Launch both kernels writing the allocation at ``base``."""
        ptrs = (logits_ptr, base)
        self.route.launch(stream, ptrs)
        if self.finish is not None:
            self.finish.launch(stream, ptrs)

    def __call__(self, logits_ptr: int) -> Routing:
        f = self.frame
        stream = f.stream()
        buf, base = f.workspace(stream, self.nbytes)
        self.enqueue(stream, logits_ptr, base)
        return Routing(self, f, buf, base)


_ROUTE = _launch.Cache("moe.route")


def route(logits, top_k: int, *, scoring: str = "softmax", renormalize: bool = True) -> Routing:
    """Top-k routing of ``logits`` [tokens, experts] with the load-balance statistics (see the module doc)."""
    vx = _launch.view(logits)
    key = None if vx is None else (vx[0], top_k, type(top_k), scoring, renormalize, type(renormalize))
    call = None if key is None else _ROUTE.get(key)
    if call is None:
        problem = validate(logits, top_k, scoring, renormalize)
        call = _ROUTE.put(key, RouteCall(problem, scoring, renormalize,
                                         _launch.frame(_launch.is_torch(logits), vx[0][4])))
    return _launch.on_device(call.frame.device_id, call, vx[1])
