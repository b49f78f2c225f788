"""``flash_attention_backward``: validation (before any device work), planning, the cached launch.

Inputs follow the forward (api.py): do, q, o ``[batch, seq_q, heads, head_dim]``, k, v ``[batch, seq_kv, kv_heads,
head_dim]``, one dtype (fp16 or bf16 = CuPy uint16 bits), lse float32 ``[batch, heads, seq_q]`` (natural log, as
``flash_attention(..., return_lse=True)`` returns it). Returns dq like q and dk, dv like k (kv_heads heads: a GQA
group's gradients are summed), new contiguous arrays.

Launches (kernels/flash_bwd.cu): preprocess (D = rowsum(dO * O), lse in log2 units, zeroed fp32 dQ accumulator)
-> dK/dV kernel (one CTA per KV tile and kv head, looping over the group's q heads, so dK/dV need no workspace and
no reduction; adds dQ with fp32 atomics) -> dQ conversion. ``deterministic=True`` replaces the atomics by a
separate dQ kernel (one CTA per query tile, fixed KV order): bit-identical results run to run, about 1.4x the
tensor-core work.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from cukernels import compile as _compile
from cukernels import device as _device
from cukernels import dtypes, launch, tiling

from . import api
from .bwd_configs import BwdConfig, BwdTmaConfig, plan_backward
from .configs import MASK_SEGMENTS, FwdProblem, check_servable

KERNEL_SOURCE = Path(__file__).parent / "kernels" / "flash_bwd.cu"
_SEQ_PAD = 128  # lse2 / D rows are padded to a multiple of every block_m
_VARLEN_PAD = 132  # a packed batch: rows per sequence on top of its length (VARLEN_PAD in kernels/bwd_common.cuh)


def validate_backward(do, q, k, v, o, lse, *, causal=False, window=None, segment_ids=None, softmax_scale=None,
                      deterministic=False, problem: FwdProblem | None = None) -> FwdProblem:
    """The forward's checks for q, k, v and the masks, plus do, o (like q) and lse (float32 [batch, heads,
    seq_q]); raises ``ValueError``/``TypeError`` naming the argument. No device work. ``problem``: q, k, v and
    the options already checked (a packed batch, attention/varlen.py: lse [heads, total_q])."""
    if problem is None:
        problem = api.validate(q, k, v, causal=causal, window=window, segment_ids=segment_ids,
                               softmax_scale=softmax_scale)
    if problem.varlen:
        qshape = (problem.seq_q, problem.heads, problem.head_dim)
        lse_shape, lse_text = (problem.heads, problem.seq_q), "[heads, total_q]"
    else:
        qshape = (problem.batch, problem.seq_q, problem.heads, problem.head_dim)
        lse_shape, lse_text = (problem.batch, problem.heads, problem.seq_q), "[batch, heads, seq_q]"
    qdev = api.describe(q, "q")[3]
    for name, x in (("do", do), ("o", o)):
        shape, dt, strides, dev, dtype_text = api.describe(x, name)
        if shape != qshape:
            raise ValueError(f"{name} must have q's shape {list(qshape)}, got {list(shape)}")
        if dt != problem.dtype:
            raise TypeError(f"{name} must have q's dtype ({problem.dtype}), got {dtype_text}")
        api.check_strides(name, shape, strides)
        if dev != qdev:
            raise ValueError(f"{name} is on device {dev}, q on {qdev}")
        if name == "do" and problem.tma_layout and not api.tma_layout({"do": (shape, strides)}):
            problem = dataclasses.replace(problem, tma_layout=False)  # dO goes through a tensor map too
    if lse is None or not hasattr(lse, "shape") or not hasattr(lse, "dtype"):
        raise TypeError(f"lse must be a float32 cupy.ndarray or torch CUDA tensor, got {type(lse).__name__}")
    lshape = tuple(int(s) for s in lse.shape)
    if lshape != lse_shape:
        raise ValueError(f"lse must have shape {lse_text} = {list(lse_shape)}, got {list(lshape)}")
    if type(lse).__module__.startswith("torch"):
        ok, ldev = str(lse.dtype) == "torch.float32", (lse.device.index if lse.device.type == "cuda" else None)
    else:
        ok = np.dtype(lse.dtype) == np.float32
        ldev = lse.device.id if type(lse).__module__.startswith("cupy") else None
    if not ok:
        raise TypeError(f"lse must be float32 (natural-log LSE from the forward), got {lse.dtype}")
    if ldev != qdev:
        raise ValueError(f"lse is on device {ldev}, q on {qdev}")
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic must be a bool, got {deterministic!r}")
    return problem


class BackwardCall:
    """A validated, planned, compiled backward for one signature: ``(ptrs, lse, segment_ids) -> (dq, dk, dv)``."""

    def __init__(self, do, q, k, v, o, lse, problem: FwdProblem, plan, softmax_scale, segment_ids, deterministic):
        import cupy

        self.device = api.device_of(q)
        self.frame = launch.frame(launch.is_torch(q), self.device)
        with cupy.cuda.Device(self.device):
            spec = _device.current()
            if plan is None:
                plan = plan_backward(problem, spec, deterministic=bool(deterministic))
            cfg: BwdConfig = plan.config
            if not isinstance(cfg, BwdConfig) or cfg.head_dim != problem.head_dim:
                raise ValueError(f"plan must hold a BwdConfig for head_dim {problem.head_dim}, got {cfg}")
            tiling.check_fits(cfg, spec)
            check_servable(cfg, problem)
            dtype = dtypes.from_name(problem.dtype)
            ct, mask = dtypes.ctype(dtype), problem.mask
            B, Sq, H, D = problem.batch, problem.seq_q, problem.heads, problem.head_dim
            Skv, KVH = problem.seq_kv, problem.kv_heads
            varlen = self.varlen = problem.varlen
            self.dtype = problem.dtype
            if varlen:  # packed: Sq, Skv are the totals; lse2 / D padded after each sequence (bwd_common.cuh)
                seq_pad = -(-Sq // 4) * 4 + B * _VARLEN_PAD
                lse_rows, q_rows = H * seq_pad, Sq
                self.shapes = ((Sq, H, D), (Skv, KVH, D), (Skv, KVH, D))
            else:
                seq_pad = -(-Sq // _SEQ_PAD) * _SEQ_PAD
                lse_rows, q_rows = B * H * seq_pad, B * Sq
                self.shapes = ((B, Sq, H, D), (B, Skv, KVH, D), (B, Skv, KVH, D))
            self.lse_contiguous = _contiguous(lse)

            ws = launch.Workspace()  # lse2, dsum, the fp32 dQ accumulator, segment tile ranges
            self.ws_lse2, self.ws_dsum = ws.add(4 * lse_rows), ws.add(4 * lse_rows)
            self.ws_accum = None if deterministic else ws.add(4 * q_rows * H * D)
            # dQ converted in the dK/dV grid (flash_bwd_tma's convert_dq): one arrival counter per (batch, kv head)
            self.dq_in_grid = (isinstance(cfg, BwdTmaConfig) and not cfg.pair and not deterministic and not varlen
                               and Sq * (H // KVH) * D * 4 <= DQ_CONVERT_IN_GRID_BYTES)
            n_counters = B * KVH if self.dq_in_grid else 0
            self.ws_counters = ws.add(4 * n_counters) if n_counters else None
            # and the preprocess too (flash_bwd_tma's backward_prologue): the backward in one launch, where the
            # dK/dV grid's CTAs are all resident at once (the occupancy the device reports), for its grid-wide
            # barrier's two counters
            dkdv = _compile.kernel(KERNEL_SOURCE.parent / cfg.source,
                                   cfg.name_expression(dtype=dtype, mask=mask, dq=not deterministic))
            ctas = -(-Skv // cfg.block_n) * KVH * B
            self.one_launch = (self.dq_in_grid and ONE_LAUNCH
                               and dkdv.resident_grid(ctas, 32 * cfg.warps, cfg.dkdv_smem_bytes()) == ctas
                               and B * H * Sq <= ctas * cfg.warps * (256 // D) * PROLOGUE_ROWS_IN_FLIGHT)
            self.ws_grid = ws.add(8) if self.one_launch else None
            ids_cont = api.ids_contiguous(segment_ids) if mask & MASK_SEGMENTS else None
            self.ranges = [api.TileRanges(problem, bm, bn, ws, ids_cont) for bm, bn in
                           ((cfg.block_m, cfg.block_n), (cfg.dq_block_m, cfg.dq_block_n))[:1 + deterministic]
                           ] if mask & MASK_SEGMENTS else []
            self.ws_bytes = ws.nbytes

            P = launch.Ptr  # 0 do, 1 q, 2 k, 3 v, 4 o, 5 lse, 6 dq, 7 dk, 8 dv, 9 lse2, 10 dsum, 11 dq accumulator,
            # 12 q ids, 13 kv ids (packed: cu_seqlens_q / _k), 14/15 q/kv tile ranges of the dK/dV kernel, 16/17
            # those of the dQ kernel, 18 the dQ conversion's arrival counters (dq_in_grid), 19 the grid barrier's
            # (one_launch)
            st = {name: [np.int64(s) for s in api.batch_strides(x, varlen)]
                  for name, x in (("do", do), ("q", q), ("k", k), ("v", v), ("o", o))}
            pre = _compile.kernel(KERNEL_SOURCE, f"flash_bwd_preprocess<{ct},{D},{'true' if varlen else 'false'}>")
            left, right = problem.window_bounds()
            scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)
            tail = (*st["q"], *st["k"], *st["v"], *st["do"], np.int32(Sq), np.int32(Skv), np.int32(seq_pad),
                    np.int32(H), np.int32(H // KVH), np.int32(left), np.int32(right),
                    np.float32(scale * math.log2(math.e)), np.float32(scale), np.int32(B))

            def plan_steps(in_grid: bool, one: bool) -> list:
                """The launches: [preprocess], dK/dV (+ dQ), [dQ kernel or conversion]; ``in_grid``: dQ converted
                by the dK/dV grid, ``one``: the preprocess there too."""
                steps = [] if one else [launch.Launcher(
                    pre, ((lse_rows + 7) // 8,), (256,),
                    (P(4), P(0), P(5), P(9), P(10), P(11), *st["o"], *st["do"], np.int32(B), np.int32(Sq),
                     np.int32(seq_pad), np.int32(H), P(12), P(18) if in_grid else 0,
                     np.int32(n_counters if in_grid else 0)))]
                if isinstance(cfg, BwdTmaConfig):  # q, k, v, dO and the dQ accumulator as tensor maps, no strides
                    maps = _tensor_maps(problem, cfg, [st[n] for n in ("q", "k", "v", "do")], deterministic)
                    args = (*maps, P(9), P(10), P(7), P(8), P(12), P(13), P(14), P(15), *tail[12:],
                            np.int32(head_chunk(problem, cfg, spec.sm_count)))
                    if not cfg.pair:  # the dQ accumulator, dq and the counters where dQ is converted in the grid;
                        # o, dO, lse, their strides and the barrier's counters where the preprocess runs there too
                        args += (P(11), P(6), P(18)) if in_grid else (0, 0, 0)
                        args += (P(4), P(0), P(5), *st["o"], *st["do"], P(19)) if one else (0, 0, 0, *[_I0] * 6, 0)
                else:
                    args = (P(1), P(2), P(3), P(0), P(9), P(10), P(11), P(7), P(8), P(12), P(13), P(14), P(15),
                            *tail)
                steps.append(launch.Launcher(
                    dkdv, (problem.kv_tiles(cfg.block_n), KVH, 1) if varlen else (-(-Skv // cfg.block_n), KVH, B),
                    (32 * cfg.warps,), args, smem=cfg.dkdv_smem_bytes()))
                if deterministic:
                    dqk = _compile.kernel(KERNEL_SOURCE, cfg.name_expression(dtype=dtype, mask=mask, kernel="dq"))
                    steps.append(launch.Launcher(
                        dqk, (problem.query_tiles(cfg.dq_block_m), H, 1) if varlen
                        else (-(-Sq // cfg.dq_block_m), H, B), (32 * cfg.dq_warps,),
                        (P(1), P(2), P(3), P(0), P(9), P(10), P(6), P(12), P(13), P(16), P(17), *tail),
                        smem=cfg.dq_smem_bytes()))
                elif not in_grid:
                    quads = q_rows * H * D // 4  # head dims are multiples of 64
                    conv = _compile.kernel(KERNEL_SOURCE, f"flash_bwd_dq_convert<{ct}>")
                    steps.append(launch.Launcher(conv, (min(-(-quads // 256), 32 * spec.sm_count),), (256,),
                                                 (P(11), P(6), np.int64(quads), np.float32(scale))))
                return steps

            # eager calls: the fewest launches (a small problem's backward is host time); calls captured into a
            # graph, whose replays cost no host time: the plan of least device time (the preprocess and the dQ
            # conversion as launches of their own, wide grids: H100, docs/perf/engine.md stop 56)
            self.steps = plan_steps(self.dq_in_grid, self.one_launch)
            self.graph_steps = plan_steps(False, False) if self.dq_in_grid else self.steps
        self.new_grads = tuple(self.frame.allocator(shape, self.dtype) for shape in self.shapes)
        # torch q, k, v contiguous (their signature, part of this call's key, says so for every later call): the
        # gradients may be made like them, torch.empty_like of the tensor instead of torch.empty of shape, dtype
        # and device (H100 host, on autograd's device thread: 13.0 against 17.8 us for the three; stop 56)
        self.grads_like = self.frame.torch and all(_contiguous(x) for x in (q, k, v))
        self.workspace = launch.KeptWorkspace(self.ws_bytes)  # lse2, D, the dQ accumulator: scratch only

    def __call__(self, ptrs: tuple[int, ...], lse, segment_ids, like=None):
        """``ptrs``: do, q, k, v, o data pointers; ``like``: (q, k, v) themselves, whose gradients are then made
        by ``empty_like`` where ``grads_like``."""
        if launch.current_device() != self.device:
            return launch.on_device(self.device, self, ptrs, lse, segment_ids, like)
        pdo, pq, pk, pv, po = ptrs
        if (pdo | pq | pk | pv | po) & 15:
            launch.check_aligned(("do", "q", "k", "v", "o"), ptrs)
        f = self.frame
        stream = f.stream()
        keep = []
        if not self.lse_contiguous:
            lse = lse.contiguous() if launch.is_torch(lse) else lse.copy(order="C")
            keep.append(lse)
        if like is not None and self.grads_like:
            empty_like = f.empty_like
            dq, dk, dv = empty_like(like[0]), empty_like(like[1]), empty_like(like[2])
        else:
            new_dq, new_dk, new_dv = self.new_grads
            dq, dk, dv = new_dq(), new_dk(), new_dv()
        ptr = f.ptr
        plse, pdq, pdk, pdv = launch.pointer(lse), ptr(dq), ptr(dk), ptr(dv)  # lse: torch or CuPy
        ws, pws, new, captured = self.workspace.take_new(f, stream)
        steps = self.steps
        if captured:
            steps = self.graph_steps
        elif new and self.one_launch:  # the grid barrier's counters start at zero (each launch leaves them so)
            _memset(pws + self.ws_grid, 0, 8, stream)
        lse2, dsum = pws + self.ws_lse2, pws + self.ws_dsum
        accum = 0 if self.ws_accum is None else pws + self.ws_accum
        seg = [lse2] * 6  # unused by kernels without segments; any pointer will do
        if self.varlen:  # segment_ids: the (cu_seqlens_q, cu_seqlens_k) pointers
            seg[:2] = segment_ids
        elif self.ranges:
            ids = self.ranges[0].ids(segment_ids, keep)
            seg[:2] = ids
            for i, r in enumerate(self.ranges):
                seg[2 + 2 * i: 4 + 2 * i] = r.launch(stream, pws, ids)
        args = (pdo, pq, pk, pv, po, plse, pdq, pdk, pdv, lse2, dsum, accum, *seg,
                0 if self.ws_counters is None else pws + self.ws_counters,
                0 if self.ws_grid is None else pws + self.ws_grid)
        for step in steps:
            step.launch(stream, args)
        return dq, dk, dv


def head_chunk(problem: FwdProblem, cfg: BwdConfig, sm_count: int) -> int:
    """The kv heads whose CTAs ``flash_bwd_tma`` runs together (kv_block_coords in kernels/bwd_common.cuh): about
    one wave of CTAs (sm_count // KV tiles per head, at least 1), heaviest KV tiles first within it. Measured on
    an H100 (docs/perf/attention.md, backward v3): all heads at once made seed004_b 0.61x cuDNN (the dQ rows and
    the Q/dO tiles of 32 heads at once do not stay in L2) and llama8b_long 0.86x; one wave's worth 0.94x and
    0.98x; chunks of 1-2 heads slowed the small causal grids (llama8b 0.79x) where heaviest-first matters."""
    tiles = problem.kv_tiles(cfg.block_n) if problem.varlen else -(-problem.seq_kv // cfg.block_n)
    return max(1, min(problem.kv_heads, sm_count // max(tiles, 1)))


def _tensor_maps(problem: FwdProblem, cfg: BwdTmaConfig, strides, deterministic: bool) -> list:
    """The maps of ``flash_bwd_tma`` (kernels/flash_bwd_tma.cu): q, k, v, dO as rank-4 (head_dim, seq, heads, batch)
    maps with boxes of 64 columns x the tile's rows (128-byte swizzle), bound to call pointers 1, 2, 3, 0; the fp32
    dQ accumulator (pointer 11, [batch, seq_q, heads, head_dim]) with boxes of 32 columns x 64 rows. A packed
    batch's maps are batch 1 over the packed rows. Deterministic mode has no accumulator: k's map fills the slot
    (that kernel instance never reads it). ``strides``: (batch, seq, head) element strides of q, k, v, dO."""
    from cukernels import tma

    B, D, H = 1 if problem.varlen else problem.batch, problem.head_dim, problem.heads
    maps = [api.tensor_map(problem, st, rows, heads, box, index=index) for index, st, rows, heads, box in zip(
        (1, 2, 3, 0), strides, (problem.seq_q, problem.seq_kv, problem.seq_kv, problem.seq_q),
        (H, problem.kv_heads, problem.kv_heads, H), (cfg.block_m, cfg.block_n, cfg.block_n, cfg.block_m))]
    if deterministic:
        return [*maps, maps[1]]
    acc = (4 * H * D, 4 * D, 4 * problem.seq_q * H * D)
    return [*maps, tma.TensorMap("float32", (D, problem.seq_q, H, B), acc, (32, 64, 1, 1), swizzle=128, index=11)]


def _contiguous(x) -> bool:
    return x.is_contiguous() if launch.is_torch(x) else bool(x.flags.c_contiguous)


# dQ converted by the dK/dV kernel's last CTA of each (batch, kv head) where that group's fp32 rows are at most
# this many bytes (flash_bwd_tma only): one launch fewer, which is most of a small backward's cost (host time on
# autograd's device thread, ~8 us a launch: docs/perf/engine.md, stop 56), for a conversion by one CTA per group
# (256 threads, 8 float4 loads each in flight: 64 KiB in two trips through L2)
DQ_CONVERT_IN_GRID_BYTES = 64 << 10
# where dQ is converted in the grid and the grid fits the SMs at once, the preprocess runs in it too (a prologue
# and a grid-wide barrier): the backward is one launch (False: two, the preprocess launched; A/B and tests)
ONE_LAUNCH = True
# ... where the grid's warps take every query row in one pass (backward_prologue: 256 / head_dim rows a warp at a
# time, this many times over before it waits on a load; the padding rows past seq_q load nothing): a longer
# prologue costs more device time than the launch it saves (H100: B2 S60 8/2 heads d64, 4 CTAs for 960 rows, as
# called 39.8 against 32.5 us in three launches)
PROLOGUE_ROWS_IN_FLIGHT = 4  # U in backward_prologue


def _memset(ptr: int, value: int, nbytes: int, stream: int) -> None:
    from cupy.cuda import runtime

    runtime.memsetAsync(ptr, value, nbytes, stream)


_I0 = np.int64(0)  # a null int64 argument (the unused strides of the one-launch prologue)
_BACKWARD = launch.Cache("attention.backward")


def _new_call(do, q, k, v, o, lse, causal, window, segment_ids, softmax_scale, deterministic) -> BackwardCall:
    """A cache miss: every check, then the planned call."""
    problem = validate_backward(do, q, k, v, o, lse, causal=causal, window=window, segment_ids=segment_ids,
                                softmax_scale=softmax_scale, deterministic=deterministic)
    return BackwardCall(do, q, k, v, o, lse, problem, None, softmax_scale, segment_ids, deterministic)


def flash_attention_backward(do, q, k, v, o, lse, *, causal=False, window=None, segment_ids=None,
                             softmax_scale=None, deterministic=False, plan=None):
    """Gradients (dq, dk, dv) of ``o = flash_attention(q, k, v, ...)`` given dO; masks and scale as in the
    forward. Rows with no visible key (lse = -inf) contribute nothing. ``plan``: a ``cukernels.tiling.Plan``
    of a ``BwdConfig`` to use instead of ``plan_backward``'s. Cached by signature like the forward."""
    views = [launch.view(x) for x in (do, q, k, v, o, lse)]
    opts = api.options_key(causal, window, segment_ids, softmax_scale)
    if plan is None and opts is not None and None not in views and (deterministic is True or deterministic is False):
        key = (*(x[0] for x in views), opts, deterministic)
        call = _BACKWARD.get(key) or _BACKWARD.put(key, _new_call(do, q, k, v, o, lse, causal, window, segment_ids,
                                                                  softmax_scale, deterministic))
    else:
        problem = validate_backward(do, q, k, v, o, lse, causal=causal, window=window, segment_ids=segment_ids,
                                    softmax_scale=softmax_scale, deterministic=deterministic)
        call = BackwardCall(do, q, k, v, o, lse, problem, plan, softmax_scale, segment_ids, deterministic)
        views = [launch.view(x) for x in (do, q, k, v, o)]
    return call(tuple(x[1] for x in views[:5]), lse, segment_ids)


_BACKWARD_AFTER = launch.Cache("attention.backward (keyed by its forward)")


_DO_LIKE_O = "dO contiguous, of o's shape, dtype and device"  # a backward key's part for such a dO's signature


def backward_keyed(forward_key, do, q, k, v, o, lse, *, causal, window, segment_ids, softmax_scale, deterministic,
                   do_like_o=False):
    """The backward of the cached forward ``forward_key`` (the ``ForwardCall`` of ``api.forward_keyed``), whose
    o and lse it is given: its signature is the forward's, dO's and the flag, so q, k, v, o and lse need only
    their pointers. ``do_like_o``: the caller knows dO is a contiguous torch tensor of o's shape, dtype and device
    (what torch's autograd hands a backward, which is given a gradient of its output's metadata): o is the
    forward's own contiguous output, so dO's signature is then fixed by the forward's and is not described per
    call (3-4 us of host time on autograd's device thread, H100, stop 56). Falls back to
    ``flash_attention_backward`` (which validates in full) when the forward was not cached."""
    if deterministic is not True and deterministic is not False:
        forward_key = None
    if do_like_o and forward_key is not None:
        key, pdo = (forward_key, _DO_LIKE_O, deterministic), do.data_ptr()
    else:
        vdo = launch.view(do)
        if forward_key is None or vdo is None:
            return flash_attention_backward(do, q, k, v, o, lse, causal=causal, window=window,
                                            segment_ids=segment_ids, softmax_scale=softmax_scale,
                                            deterministic=deterministic)
        key, pdo = (forward_key, vdo[0], deterministic), vdo[1]
    call = _BACKWARD_AFTER.get(key) or _BACKWARD_AFTER.put(key, _new_call(do, q, k, v, o, lse, causal, window,
                                                                          segment_ids, softmax_scale, deterministic))
    ptr = call.frame.ptr  # q, k, v, o are of the forward's framework (its key says so)
    return call((pdo, ptr(q), ptr(k), ptr(v), ptr(o)), lse, segment_ids, (q, k, v))
