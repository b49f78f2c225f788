"""``flash_attention``: validation (before any device work), planning, the cached launch.

Accepted tensors: CuPy arrays or torch CUDA tensors. q ``[batch, seq_q, heads, head_dim]``, k and v
``[batch, seq_kv, kv_heads, head_dim]``, all float16 or all bfloat16 (a CuPy ``uint16`` array holds bf16 bits,
see cukernels/dtypes.py); head_dim 64, 128 or 256; heads a multiple of kv_heads (GQA/MQA, K/V never repeated).

Strides: the head_dim axis must be contiguous (stride 1); the batch, seq and heads axes may have any
non-negative stride that is a multiple of 8 elements (16 bytes), e.g. a slice of a packed qkv tensor; the data
pointer must be 16-byte aligned. The output is a new contiguous array like q; LSE float32 ``[batch, heads,
seq_q]`` (natural log) when ``return_lse``. A query row with no visible key gives zeros and LSE -inf.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from cukernels import compile as _compile
from cukernels import device as _device
from cukernels import dtypes, launch, tiling

from .configs import (HEAD_DIMS, MASK_SEGMENTS, FwdProblem, FwdTmaConfig, check_servable, tile_order,
                      plan_forward)

KERNELS = Path(__file__).parent / "kernels"
KERNEL_SOURCE = KERNELS / "flash_fwd.cu"  # holds tile_id_range, the segment-id pre-pass of every kernel
_ALIGN_ELEMS = 8  # 16-byte cp.async copies


def _torch_dtype_name(dt) -> str | None:
    return {"torch.float16": "fp16", "torch.bfloat16": "bf16"}.get(str(dt))


def describe(x: Any, name: str):
    """(shape, dtype name or None, strides in elements, device id or None) from attributes alone."""
    if x is None or not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be a cupy.ndarray or a torch CUDA tensor, got {type(x).__name__}")
    shape = tuple(int(s) for s in x.shape)
    module = type(x).__module__
    if module.startswith("torch"):
        dtype = _torch_dtype_name(x.dtype)
        strides = tuple(int(s) for s in x.stride())
        dev = x.device.index if x.device.type == "cuda" else None
        dtype_text = str(x.dtype)
    else:
        dt = np.dtype(x.dtype)
        dtype = {dtypes.FP16: "fp16", dtypes.BF16: "bf16"}.get(dt)
        strides = tuple(int(s) // dt.itemsize for s in getattr(x, "strides", ()) or ())
        byte_strides = tuple(getattr(x, "strides", ()) or ())
        if any(s % dt.itemsize for s in byte_strides):
            strides = (None,) * len(shape)
        dev = x.device.id if module.startswith("cupy") else None
        dtype_text = str(dt)
    return shape, dtype, strides, dev, dtype_text


def check_strides(name: str, shape, strides) -> None:
    if len(strides) != len(shape) or any(s is None for s in strides):
        raise ValueError(f"{name} has strides that are not whole elements: {strides}")
    if strides[-1] != 1 and shape[-1] > 1:
        raise ValueError(f"{name} must be contiguous along head_dim (last stride 1), got strides {strides} "
                         f"(elements); use .contiguous() / cupy.ascontiguousarray")
    bad = [s for s in strides[:-1] if s < 0 or s % _ALIGN_ELEMS]
    if bad:
        raise ValueError(f"{name}: batch/seq/heads strides must be non-negative multiples of {_ALIGN_ELEMS} "
                         f"elements (16 bytes), got strides {strides} (elements)")


def _check_ids(name: str, ids, batch: int, seq: int, seq_name: str):
    shape, _, _, dev, _ = describe_ids(ids, name)
    if shape != (batch, seq):
        raise ValueError(f"{name} must have shape [batch, {seq_name}] = {[batch, seq]}, got {list(shape)}")
    return dev


def describe_ids(ids, name):
    """``describe`` of an int32 index array (segment ids, cu_seqlens: cupy or torch CUDA), shaped like its result:
    (shape, None, None, device id or None where not on a GPU, None); a clear error naming ``name`` otherwise."""
    if ids is None or not hasattr(ids, "shape") or not hasattr(ids, "dtype"):
        raise TypeError(f"{name} must be an int32 cupy.ndarray or torch CUDA tensor, got {type(ids).__name__}")
    module = type(ids).__module__
    if module.startswith("torch"):
        ok = str(ids.dtype) == "torch.int32"
        dev = ids.device.index if ids.device.type == "cuda" else None
    else:
        ok = np.dtype(ids.dtype) == np.int32
        dev = ids.device.id if module.startswith("cupy") else None
    if not ok:
        raise TypeError(f"{name} must be int32, got {ids.dtype}")
    return tuple(int(s) for s in ids.shape), None, None, dev, None


def describe_qkv(q, k, v, layout: str):
    """``describe`` of q, k and v, each ``layout``-shaped (its axis count), float16/bfloat16 with one dtype, k and v
    of one shape: ({name: (shape, strides)}, devices, dtype name). Shared by every attention entry point; the
    strides are checked by ``check_sizes``, after the sizes."""
    ndim = layout.count(",") + 1
    descs = {}
    for name, x in (("q", q), ("k", k), ("v", v)):
        shape, dt, strides, dev, dtype_text = describe(x, name)
        if len(shape) != ndim:
            raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {list(shape)}")
        if dt is None:
            raise TypeError(f"{name} must be float16 or bfloat16 (uint16 bf16 bits for CuPy), got {dtype_text}")
        descs[name] = (shape, dt, strides, dev)
    (_, qdt, _, qdev), (ks, kdt, _, kdev), (vs, vdt, _, vdev) = descs["q"], descs["k"], descs["v"]
    if not (qdt == kdt == vdt):
        raise TypeError(f"q, k and v must share one dtype, got q {qdt}, k {kdt}, v {vdt}")
    if ks != vs:
        raise ValueError(f"k and v must have the same shape, got k {list(ks)} and v {list(vs)}")
    return {name: (d[0], d[2]) for name, d in descs.items()}, {qdev, kdev, vdev}, qdt


def check_sizes(layouts, lengths, longest) -> None:
    """The size rules every attention entry point shares (the last two axes are heads, head_dim), then the
    strides: head_dim one of HEAD_DIMS and k's equal to q's, every named length in ``lengths`` and the head counts
    >= 1, the sequence lengths ``longest`` (q's, k's) < 2**28, q heads a multiple of k/v heads; ``layouts`` is
    ``describe_qkv``'s {name: (shape, strides)}."""
    q_shape, kv_shape = layouts["q"][0], layouts["k"][0]
    heads, head_dim, kv_heads = q_shape[-2], q_shape[-1], kv_shape[-2]
    if kv_shape[-1] != head_dim:
        raise ValueError(f"k/v head_dim {kv_shape[-1]} differs from q head_dim {head_dim}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim} (q shape {list(q_shape)})")
    for label, n in (*lengths, ("q heads", heads), ("k/v heads", kv_heads)):
        if n < 1:
            raise ValueError(f"{label} must be >= 1, got {n}")
    if max(longest) >= 2**28:
        raise ValueError(f"sequence lengths must be < 2**28, got q {longest[0]}, k/v {longest[1]}")
    if heads % kv_heads:
        raise ValueError(f"q heads ({heads}) must be a multiple of k/v heads ({kv_heads})")
    for name, (shape, strides) in layouts.items():
        check_strides(name, shape, strides)


def check_options(causal, window, softmax_scale):
    """The checks of ``causal``, ``window`` and ``softmax_scale`` shared by every attention entry point; returns
    the window as a (left, right) tuple or None."""
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    if window is not None:
        if (not isinstance(window, (tuple, list)) or len(window) != 2
                or not all(isinstance(w, (int, np.integer)) and not isinstance(w, bool) for w in window)):
            raise TypeError(f"window must be None or a pair of ints (left, right), got {window!r}")
        left, right = (int(w) for w in window)
        if left < -1 or right < -1:
            raise ValueError(f"window values must be >= 0, or -1 for unbounded, got {window!r}")
        if causal and right not in (0, -1):
            raise ValueError(f"with causal=True the window's right side is 0 (keys after the query are hidden); "
                             f"got window={window!r}: pass (left, 0) or causal=False")
        window = (left, right)

    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float, np.floating, np.integer)):
            raise TypeError(f"softmax_scale must be a float or None, got {softmax_scale!r}")
        if not (math.isfinite(float(softmax_scale)) and float(softmax_scale) > 0):
            raise ValueError(f"softmax_scale must be finite and > 0, got {softmax_scale!r}")
    return window


def validate(q, k, v, *, causal=False, window=None, segment_ids=None, softmax_scale=None,
             kv_is_paged=False) -> FwdProblem:
    """Check every argument from its attributes (no device work); return the problem or raise
    ``ValueError``/``TypeError`` naming the argument. ``kv_is_paged``: k and v are pages of a cache
    ([pages, page, kv_heads, head_dim]), whose first dimension is not the batch."""
    layouts, devs, qdt = describe_qkv(q, k, v, "[batch, seq, heads, head_dim]")
    (batch, seq_q, heads, head_dim), ks = layouts["q"][0], layouts["k"][0]
    if ks[0] != batch and not kv_is_paged:
        raise ValueError(f"k/v batch {ks[0]} differs from q batch {batch}")
    seq_kv, kv_heads = ks[1], ks[2]
    check_sizes(layouts, (("batch", batch), ("q seq", seq_q), ("k/v seq", seq_kv)), (seq_q, seq_kv))
    window = check_options(causal, window, softmax_scale)

    segments = segment_ids is not None
    if segments:
        if isinstance(segment_ids, (tuple, list)):
            if len(segment_ids) != 2:
                raise ValueError("segment_ids must be one [batch, seq] array or a (q_ids, kv_ids) pair, got a "
                                 f"sequence of {len(segment_ids)}")
            devs.add(_check_ids("segment_ids[0] (q ids)", segment_ids[0], batch, seq_q, "seq_q"))
            devs.add(_check_ids("segment_ids[1] (kv ids)", segment_ids[1], batch, seq_kv, "seq_kv"))
        else:
            if seq_q != seq_kv:
                raise ValueError(f"one segment_ids array needs seq_q == seq_kv (got {seq_q} and {seq_kv}); "
                                 "pass a (q_ids, kv_ids) pair")
            devs.add(_check_ids("segment_ids", segment_ids, batch, seq_q, "seq"))

    if None in devs:
        raise TypeError("q, k, v (and segment_ids) must be CuPy arrays or torch CUDA tensors on a GPU; "
                        "got host data (numpy array or CPU tensor)")
    if len(devs) != 1:
        raise ValueError(f"q, k, v (and segment_ids) must be on one device, got devices {sorted(devs)}")
    return FwdProblem(batch=batch, seq_q=seq_q, seq_kv=seq_kv, heads=heads, kv_heads=kv_heads,
                      head_dim=head_dim, dtype=qdt, causal=bool(causal), window=window, segments=segments,
                      tma_layout=tma_layout(layouts))


def tma_layout(layouts) -> bool:
    """Whether tensor maps can describe q, k and v (``describe_qkv``'s layouts): no stride 0 along an axis longer
    than 1 (an axis of length 1 takes any stride in the map)."""
    return all(st > 0 or n == 1 for shape, strides in layouts.values() for n, st in zip(shape[:-1], strides[:-1]))


def tensor_maps(q, k, v, problem: FwdProblem, cfg) -> list:
    """The tensor maps of ``flash_fwd_tma`` (kernels/flash_fwd_tma.cu): q, k, v as rank-4 (head_dim, seq, heads,
    batch) maps, boxes of 64 columns x the tile's rows with the 128-byte swizzle, bound to call pointers 0, 1, 2;
    a packed batch's as batch 1 over the packed rows."""
    return [tensor_map(problem, batch_strides(x, problem.varlen), rows, heads, box_rows, index=i)
            for i, (x, rows, heads, box_rows) in enumerate(((q, problem.seq_q, problem.heads, cfg.block_m),
                                                            (k, problem.seq_kv, problem.kv_heads, cfg.block_n),
                                                            (v, problem.seq_kv, problem.kv_heads, cfg.block_n)))]


def tensor_map(problem: FwdProblem, strides, rows: int, heads: int, box_rows: int, *, index: int):
    """One 16-bit [batch, seq, heads, head_dim] operand of the TMA attention kernels as a rank-4 (head_dim, seq,
    heads, batch) map: boxes of 64 columns x ``box_rows`` rows, 128-byte swizzle (one copy = one 64-column block
    of wgmma's blocked layout), bound to call pointer ``index``; ``strides``: its (batch, seq, head) element
    strides (``batch_strides``). A packed batch is batch 1 over the packed rows."""
    from cukernels import tma

    sb, ss, sh = strides
    dims = (problem.head_dim, rows, heads, 1 if problem.varlen else problem.batch)
    # an axis of length 1 is never stepped along: any valid stride describes it
    st = tuple(2 * int(x) if x > 0 else 2 * problem.head_dim for x in (ss, sh, sb))
    return tma.TensorMap(2, dims, st, (64, box_rows, 1, 1), swizzle=128, index=index)


# ---------------------------------------------------------------- the call: signature, cached launch


def options_key(causal, window, segment_ids, softmax_scale):
    """The hashable part of a call's signature that its options make, or None when they cannot be trusted to key
    a cached call (then the call validates in full and raises, or runs uncached). Types are part of the key:
    ``causal=1`` must not hit the entry of ``causal=True`` (validation refuses the first)."""
    if causal is not True and causal is not False:
        return None
    if window is not None:
        if type(window) not in (tuple, list) or len(window) != 2 or type(window[0]) is not int \
                or type(window[1]) is not int:
            return None
        window = (window[0], window[1])
    if segment_ids is None:
        seg = None
    elif type(segment_ids) in (tuple, list):
        if len(segment_ids) != 2:
            return None
        a, b = launch.view(segment_ids[0]), launch.view(segment_ids[1])
        if a is None or b is None:
            return None
        seg = (a[0], b[0])
    else:
        a = launch.view(segment_ids)
        if a is None:
            return None
        seg = a[0]
    if softmax_scale is not None and type(softmax_scale) is not float:
        return None
    return causal, window, seg, softmax_scale


def segment_pair(segment_ids):
    """``(q_ids, kv_ids)`` of either form of ``segment_ids`` (one array serves both)."""
    if isinstance(segment_ids, (tuple, list)):
        return segment_ids[0], segment_ids[1]
    return segment_ids, segment_ids


class TileRanges:
    """The segment-id pre-pass of a call: for each query tile and each KV tile, the range of ids it holds
    (``tile_id_range`` in flash_fwd.cu), built with the tile sizes of the kernel that reads them. ``ids`` are
    made contiguous int32 first when they are not."""

    def __init__(self, problem: FwdProblem, block_m: int, block_n: int, ws: launch.Workspace, ids_contiguous):
        B = problem.batch
        ranges = _compile.kernel(KERNEL_SOURCE, "tile_id_range")
        self.ids_contiguous = ids_contiguous
        self.offsets, self.launchers = [], []
        for seq, tile in ((problem.seq_q, block_m), (problem.seq_kv, block_n)):
            count = -(-seq // tile)
            self.offsets.append(ws.add(4 * 2 * B * count))
            self.launchers.append(launch.Launcher(
                ranges, (-(-B * count // 128),), (128,),
                (launch.Ptr(0), launch.Ptr(1), np.int32(seq), np.int32(tile), np.int32(count), np.int32(B))))

    def ids(self, segment_ids, keep: list) -> tuple[int, int]:
        """Pointers of contiguous (q_ids, kv_ids); copies made here are appended to ``keep``."""
        out = []
        for ids, contiguous in zip(segment_pair(segment_ids), self.ids_contiguous):
            if not contiguous:
                ids = ids.contiguous() if launch.is_torch(ids) else ids.copy(order="C")
                keep.append(ids)
            out.append(launch.view(ids)[1])
        return out[0], out[1]

    def launch(self, stream: int, ws_ptr: int, ids: tuple[int, int]) -> tuple[int, int]:
        """Enqueue the pre-pass; returns the pointers of the query-tile and KV-tile ranges."""
        out = tuple(ws_ptr + off for off in self.offsets)
        for launcher, src, dst in zip(self.launchers, ids, out):
            launcher.launch(stream, (src, dst))
        return out


def ids_contiguous(segment_ids) -> tuple[bool, bool]:
    def contiguous(x):
        if launch.is_torch(x):
            return x.is_contiguous()
        return bool(x.flags.c_contiguous)

    return tuple(contiguous(x) for x in segment_pair(segment_ids))


def element_strides(x) -> tuple[int, ...]:
    """Strides in elements of a CuPy array or torch tensor."""
    if launch.is_torch(x):
        return tuple(x.stride())
    return tuple(s // x.itemsize for s in x.strides)


def batch_strides(x, varlen: bool) -> tuple[int, int, int]:
    """The (batch, seq, heads) strides in elements the kernels take: a packed [total, heads, head_dim] tensor has
    no batch stride (0)."""
    st = element_strides(x)
    return (0, st[0], st[1]) if varlen else st[:3]


def device_of(x) -> int:
    return x.get_device() if launch.is_torch(x) else x.data.device_id


class ForwardCall:
    """A validated, planned, compiled forward for one signature: ``(ptrs, segment_ids) -> (o, lse)``."""

    def __init__(self, q, k, v, problem: FwdProblem, plan, softmax_scale, segment_ids):
        import cupy

        self.device = device_of(q)
        self.frame = launch.frame(launch.is_torch(q), self.device)
        with cupy.cuda.Device(self.device):
            spec = _device.current()
            if plan is None:
                plan = plan_forward(problem, spec)
            cfg = plan.config
            tiling.check_fits(cfg, spec)  # a plan handed in must fit this device like a planned one
            if cfg.head_dim != problem.head_dim:
                raise ValueError(f"plan is for head_dim {cfg.head_dim}, the inputs have {problem.head_dim}")
            check_servable(cfg, problem)
            dtype = dtypes.from_name(problem.dtype)
            kern = _compile.kernel(KERNELS / cfg.source, cfg.name_expression(dtype=dtype, mask=problem.mask))
            B, Sq, H, D, Skv = problem.batch, problem.seq_q, problem.heads, problem.head_dim, problem.seq_kv
            self.dtype = problem.dtype
            self.varlen = problem.varlen
            if problem.varlen:  # packed [total, heads, head_dim]; lse [heads, total_q] (attention/varlen.py)
                self.o_shape, self.lse_shape = (Sq, H, D), (H, Sq)
                grid = (problem.query_tiles(cfg.block_m), H, 1)
            else:
                self.o_shape, self.lse_shape = (B, Sq, H, D), (B, H, Sq)
                grid = (-(-Sq // cfg.block_m), H, B)
                if getattr(cfg, "persistent", False):  # CTAs that fit at once stride over the tiles (flash_fwd_tma.cu)
                    grid = (kern.resident_grid(grid[0] * H * B, cfg.threads, cfg.smem_bytes()), 1, 1)
            ws = launch.Workspace()
            self.ranges = (TileRanges(problem, cfg.block_m, cfg.block_n, ws, ids_contiguous(segment_ids))
                           if problem.mask & MASK_SEGMENTS else None)
            self.ws_bytes = ws.nbytes
            left, right = problem.window_bounds()
            scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)
            P = launch.Ptr
            # q, k, v, o, lse, q_ids, kv_ids, q_ranges, kv_ranges (ids: the cu_seqlens of a packed batch; the
            # last four unused without segments or packing); the TMA kernel takes q, k, v as tensor maps and no
            # strides (the maps hold them)
            tail = ()
            if isinstance(cfg, FwdTmaConfig):
                qkv, strides = tensor_maps(q, k, v, problem, cfg), []
                by_weight = tile_order(problem, cfg, spec, grid[0])  # the tiles' order (flash_fwd_tma.cu)
                if by_weight and not cfg.persistent:
                    grid = (H, B, grid[0])  # one tile per CTA by weight: query tiles outermost (flash_fwd_tma.cu)
                tail = (np.int32(by_weight),)
            else:
                qkv = (P(0), P(1), P(2))
                strides = [np.int64(s) for x in (q, k, v) for s in batch_strides(x, problem.varlen)]
            self.main = launch.Launcher(
                kern, grid, (cfg.threads,),
                (*qkv, P(3), P(4), P(5), P(6), P(7), P(8), *strides,
                 np.int32(Sq), np.int32(Skv), np.int32(H), np.int32(H // problem.kv_heads),
                 np.int32(left), np.int32(right), np.float32(scale * math.log2(math.e)), np.int32(B), *tail),
                smem=cfg.smem_bytes(), pdl=isinstance(cfg, FwdTmaConfig))  # flash_fwd_tma waits (pdl.cuh)
        self.new_o = self.frame.allocator(self.o_shape, self.dtype)
        self.new_lse = self.frame.allocator(self.lse_shape, "fp32")
        # a contiguous torch q (dense batches) has o's shape, dtype and layout (its signature, part of this call's
        # key, says so for every later call): o is then made by torch.empty_like(q), cheaper than torch.empty of
        # shape, dtype and device (the backward's gradients likewise, backward.BackwardCall.grads_like)
        self.o_like_q = self.frame.torch and not problem.varlen and q.is_contiguous()

    def __call__(self, pq: int, pk: int, pv: int, segment_ids, q=None):
        """``q``: the query tensor itself (o is then made like it where ``o_like_q``), or None."""
        if (pq | pk | pv) & 15:
            launch.check_aligned(("q", "k", "v"), (pq, pk, pv))
        if launch.current_device() != self.device:
            return launch.on_device(self.device, self, pq, pk, pv, segment_ids, q)
        f = self.frame
        stream = f.stream()
        o = f.empty_like(q) if q is not None and self.o_like_q else self.new_o()
        lse = self.new_lse()
        po, plse = f.ptr(o), f.ptr(lse)
        if self.varlen:  # segment_ids: the (cu_seqlens_q, cu_seqlens_k) pointers
            self.main.launch(stream, (pq, pk, pv, po, plse, segment_ids[0], segment_ids[1], plse, plse))
            return o, lse
        if self.ranges is None:
            self.main.launch(stream, (pq, pk, pv, po, plse, plse, plse, plse, plse))
            return o, lse
        keep = []
        ids = self.ranges.ids(segment_ids, keep)
        ws, pws = f.workspace(stream, self.ws_bytes)
        qr, kr = self.ranges.launch(stream, pws, ids)
        self.main.launch(stream, (pq, pk, pv, po, plse, ids[0], ids[1], qr, kr))
        return o, lse


_FORWARD = launch.Cache("attention.forward")


def flash_attention(q, k, v, *, causal=False, window=None, segment_ids=None, softmax_scale=None,
                    return_lse=False, plan=None):
    """Scaled dot-product attention, FlashAttention-2 style, on CuPy arrays or torch CUDA tensors.

    causal: query i sees keys j <= i + seq_kv - seq_q (bottom-right aligned). window=(left, right): query i sees
    keys in [i' - left, i' + right], i' = i + seq_kv - seq_q, -1 = unbounded (right is 0 under causal).
    segment_ids: int32 [batch, seq] (seq_q == seq_kv) or a (q_ids [batch, seq_q], kv_ids [batch, seq_kv])
    pair: attend only where ids are equal. softmax_scale: default 1/sqrt(head_dim). ``plan``: a
    ``cukernels.tiling.Plan`` to use instead of the planner's (benchmarks and tuning).
    Returns o (like q: CuPy in, CuPy out on CuPy's current stream; torch in, torch out on torch's current
    stream), and float32 lse [batch, heads, seq_q] when ``return_lse``.

    The first call with a signature (shapes, strides, dtypes, device, options) validates, plans and compiles;
    later ones launch the recorded kernels (cukernels/launch.py).
    """
    o, lse, _ = forward_keyed(q, k, v, causal, window, segment_ids, softmax_scale, plan)
    return (o, lse) if return_lse else o


def forward_keyed(q, k, v, causal, window, segment_ids, softmax_scale, plan=None):
    """``(o, lse, key)``: the forward, and the cached ``ForwardCall`` that ran it (None when uncached), which a
    backward of the same call keys on (``backward.backward_keyed``) instead of describing q, k, v again: the
    call stands for its whole signature and hashes by identity."""
    vq, vk, vv = launch.view(q), launch.view(k), launch.view(v)
    opts = options_key(causal, window, segment_ids, softmax_scale)
    if plan is None and opts is not None and vq is not None and vk is not None and vv is not None:
        key = (vq[0], vk[0], vv[0], opts)
        call = _FORWARD.get(key)
        if call is None:
            problem = validate(q, k, v, causal=causal, window=window, segment_ids=segment_ids,
                               softmax_scale=softmax_scale)
            call = _FORWARD.put(key, ForwardCall(q, k, v, problem, None, softmax_scale, segment_ids))
        o, lse = call(vq[1], vk[1], vv[1], segment_ids, q)
        return o, lse, call
    problem = validate(q, k, v, causal=causal, window=window, segment_ids=segment_ids, softmax_scale=softmax_scale)
    call = ForwardCall(q, k, v, problem, plan, softmax_scale, segment_ids)
    o, lse = call(*(launch.view(x)[1] for x in (q, k, v)), segment_ids)
    return o, lse, None
