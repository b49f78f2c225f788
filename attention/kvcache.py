"""``flash_attention_with_kvcache``: attention of new queries over a KV cache (decode, speculative decoding,
chunked prefill), with optional appending of the new tokens' k/v, contiguous or paged caches, split-KV.

Accepted tensors (CuPy arrays or torch CUDA tensors, one dtype: float16 or bfloat16; head_dim 64, 128 or 256):

- ``q`` ``[batch, seq_q, heads, head_dim]``, seq_q >= 1; head_dim contiguous, other strides multiples of 8.
- contiguous cache: ``k_cache``, ``v_cache`` ``[batch, max_seq, kv_heads, head_dim]``;
  paged cache: ``[num_pages, page, kv_heads, head_dim]`` with ``block_table`` int32 ``[batch, max_pages]``
  (sequence b's key j is in page ``block_table[b, j // page]``, slot ``j % page``); page a multiple of 16 in
  16..256. Rows of the cache must be contiguous along head_dim with strides that are multiples of 8 elements.
- ``cache_seqlens`` int32 ``[batch]``: keys already in each sequence (0 allowed, ragged).
- ``k``, ``v`` (optional) ``[batch, seqlen_new, kv_heads, head_dim]``: written into the cache at positions
  ``cache_seqlens[b] + i`` first (the cache is updated in place; ``cache_seqlens`` is not), then attended to:
  each sequence holds ``cache_seqlens[b] + seqlen_new`` keys.
- ``causal``: query i sits at key position ``L_b - seq_q + i`` (bottom-right) and sees keys up to it;
  ``window=(left, right)`` as in ``flash_attention``.
- ``num_splits``: None (the planner's choice from the SM count, the grid and the cache size) or 1..128.

``check_values`` (default True) reads ``cache_seqlens`` (and ``block_table``) on the host once per call to refuse
lengths past the cache's capacity and page ids outside the pool with a clear error, before anything is
launched (small device-to-host copies, which a CUDA graph cannot capture): pass False inside captured or
latency-critical loops. The kernels clamp lengths and page ids either way, so bad values never read or write
outside the cache.

Returns ``o`` like q (new, contiguous), and float32 ``lse`` ``[batch, heads, seq_q]`` with ``return_lse``.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from cukernels import compile as _compile
from cukernels import device as _device
from cukernels import dtypes, launch

from . import api
from .decode_configs import DecodeProblem, plan_call

SOURCE = Path(__file__).parent / "kernels" / "flash_decode.cu"


def _int32_vector(x, name: str, shape: tuple) -> None:
    if x is None or not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be an int32 cupy.ndarray or torch CUDA tensor, got {type(x).__name__}")
    if dtypes.storage(x) != np.int32:
        raise TypeError(f"{name} must be int32, got {dtypes.text(x)}")
    if tuple(int(s) for s in x.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(x.shape)}")
    if not dtypes.is_c_contiguous(x):
        raise ValueError(f"{name} must be contiguous")
    if launch.view(x) is None:
        raise TypeError(f"{name} must be on the GPU (a cupy.ndarray or torch CUDA tensor), got host data")


def validate(q, k_cache, v_cache, cache_seqlens, block_table, k, v, causal, window, softmax_scale, num_splits):
    """Every check that needs no device value; returns (DecodeProblem, page, seqlen_new)."""
    # q and the cache through the forward's checks: same dtype, head_dim, heads a multiple of kv_heads, strides
    problem = api.validate(q, k_cache, v_cache, causal=causal, window=window, softmax_scale=softmax_scale,
                           kv_is_paged=block_table is not None)
    batch, seq_q, heads, head_dim = problem.batch, problem.seq_q, problem.heads, problem.head_dim
    kv_heads = problem.kv_heads
    paged = block_table is not None
    cache_rows = int(k_cache.shape[0])
    if paged:
        if not hasattr(block_table, "shape") or len(block_table.shape) != 2 or int(block_table.shape[0]) != batch:
            raise ValueError(f"block_table must be int32 [batch, max_pages] with batch {batch}, got shape "
                             f"{list(getattr(block_table, 'shape', []))}")
        _int32_vector(block_table, "block_table", (batch, int(block_table.shape[1])))
        page = int(k_cache.shape[1])
        if page % 16 or not 16 <= page <= 256:
            raise ValueError(f"paged cache: the page size (k_cache.shape[1]) must be a multiple of 16 in 16..256, "
                             f"got {page}")
        max_keys = int(block_table.shape[1]) * page
    else:
        if cache_rows != batch:
            raise ValueError(f"k_cache has batch {cache_rows}, q has {batch} (a paged cache needs block_table)")
        page, max_keys = 0, int(k_cache.shape[1])
    _int32_vector(cache_seqlens, "cache_seqlens", (batch,))
    seqlen_new = 0
    if (k is None) != (v is None):
        raise ValueError("k and v (new tokens) go together: pass both or neither")
    if k is not None:
        for name, x in (("k", k), ("v", v)):
            shape, dt, strides, dev, text = api.describe(x, name)
            if len(shape) != 4 or shape[0] != batch or shape[2] != kv_heads or shape[3] != head_dim:
                raise ValueError(f"{name} (new tokens) must be [batch, seqlen_new, kv_heads, head_dim] = "
                                 f"[{batch}, n, {kv_heads}, {head_dim}], got {list(shape)}")
            if dt != problem.dtype:
                raise TypeError(f"{name} must have q's dtype ({problem.dtype}), got {text}")
            api.check_strides(name, shape, strides)
        if tuple(k.shape) != tuple(v.shape):
            raise ValueError(f"k and v must have the same shape, got {list(k.shape)} and {list(v.shape)}")
        seqlen_new = int(k.shape[1])
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, (int, np.integer))
                                   or not 1 <= num_splits <= 128):
        raise ValueError(f"num_splits must be None or an int in 1..128, got {num_splits!r}")
    devs = {api.device_of(x) for x in (q, k_cache, v_cache, cache_seqlens, block_table, k, v) if x is not None}
    if len(devs) != 1:
        raise ValueError(f"q, the cache, cache_seqlens, block_table and k/v must be on one device, got {sorted(devs)}")
    return (DecodeProblem(batch=batch, seq_q=seq_q, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                          max_keys=max_keys, dtype=problem.dtype, paged=paged), page, seqlen_new)


def _host(x) -> np.ndarray:
    return x.cpu().numpy() if launch.is_torch(x) else x.get()


def _check_values(cache_seqlens, block_table, seqlen_new: int, capacity: int, num_pages: int, page: int) -> None:
    """What only the device's values can say: lengths within the cache, the pages they use within the pool."""
    lens = _host(cache_seqlens)
    bad = np.nonzero((lens < 0) | (lens + seqlen_new > capacity))[0]
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"cache_seqlens[{b}] = {int(lens[b])} (+ {seqlen_new} new tokens) does not fit the cache's "
                         f"{capacity} keys per sequence (and must be >= 0)")
    if block_table is not None:
        table = _host(block_table)
        for b, n in enumerate(lens):
            used = table[b, : -(-(int(n) + seqlen_new) // page)]
            out = np.nonzero((used < 0) | (used >= num_pages))[0]
            if out.size:
                raise ValueError(f"block_table[{b}, {int(out[0])}] = {int(used[out[0]])}: page ids must be in "
                                 f"0..{num_pages - 1} (k_cache.shape[0])")


class DecodeCall:
    """A planned, compiled call for one signature: append (optional), then the split attention (whose last split
    per tile merges the splits)."""

    def __init__(self, q, k_cache, v_cache, k, v, problem: DecodeProblem, page: int, seqlen_new: int, causal,
                 window, softmax_scale, num_splits):
        import cupy

        self.device = api.device_of(q)
        self.frame = launch.frame(launch.is_torch(q), self.device)
        with cupy.cuda.Device(self.device):
            spec = _device.current()
            st = {n: [np.int64(s) for s in api.element_strides(x)[:3]] for n, x in
                  (("q", q), ("k", k_cache), ("v", v_cache))}
            dp = plan_call(problem, spec, heads_adjacent=st["k"][2] == 64 and st["v"][2] == 64,
                           num_splits=num_splits)
            kp, cfg, splits, split_keys, self.pair = dp.problem, dp.config, dp.splits, dp.split_keys, dp.pair
            self.splits, self.config, self.cluster = splits, cfg, dp.cluster
            # splits merged through global memory (partials and a counter per tile); a cluster merges on chip
            self.parts = splits > 1 and dp.cluster == 1
            B, Sq, H, D, KVH = problem.batch, problem.seq_q, problem.heads, problem.head_dim, problem.kv_heads
            KD, KKVH = kp.head_dim, kp.kv_heads  # the kernel's head dim and KV heads (a pair is one 128-wide head)
            self.dtype, self.capacity, self.seqlen_new, self.page = problem.dtype, problem.max_keys, seqlen_new, page
            self.o_shape, self.lse_shape = (B, Sq, H, D), (B, H, Sq)
            dt = dtypes.from_name(problem.dtype)
            fwd = api.FwdProblem(batch=B, seq_q=Sq, seq_kv=problem.max_keys, heads=H, kv_heads=KVH, head_dim=D,
                                 dtype=problem.dtype, causal=bool(causal), window=window, segments=False)
            left, right = fwd.window_bounds()
            unbounded = Sq + problem.max_keys
            left, right = min(left, unbounded), min(right, unbounded)
            scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)
            kst = {n: [*st[n][:2], st[n][2] * (2 if self.pair else 1)] for n in ("k", "v")}
            max_pages = problem.max_keys // page if problem.paged else 0
            num_pages = int(k_cache.shape[0]) if problem.paged else 1
            self.num_pages = num_pages
            P = launch.Ptr  # 0 q, 1 k cache, 2 v cache, 3 o, 4 lse, 5 o_part, 6 lse_part, 7 cache_seqlens,
            # 8 block table, 9 k new, 10 v new, 11 split counters
            self.attend = launch.Launcher(
                _compile.kernel(SOURCE, cfg.name_expression(dtype=dt, paged=problem.paged, pair=self.pair,
                                                            cluster=dp.cluster)),
                (splits, KKVH * kp.row_tiles, B), (cfg.threads,),
                (P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(11), P(7), P(8), *st["q"], *kst["k"], *kst["v"],
                 np.int32(Sq), np.int32(H), np.int32(KKVH), np.int32(H // KKVH), np.int32(max_pages),
                 np.int32(page), np.int32(num_pages), np.int32(problem.max_keys), np.int32(seqlen_new), np.int32(left), np.int32(right),
                 np.int32(split_keys), np.float32(scale * math.log2(math.e))),
                smem=cfg.dynamic_smem_bytes(), pdl=True)
            ws = launch.Workspace()  # with splits: their O and LSE, and one counter per (batch, kv head, row tile)
            self.ws_o = ws.add(4 * splits * B * Sq * H * KD) if self.parts else None
            self.ws_lse = ws.add(4 * splits * B * Sq * H) if self.parts else None
            self.counters_bytes = 4 * B * KKVH * kp.row_tiles
            self.ws_counters = ws.add(self.counters_bytes) if self.parts else None
            self.ws_bytes = ws.nbytes
            from cupy.cuda import runtime

            self._memset = runtime.memsetAsync
            self._capturing = runtime.streamIsCapturing
            # the split counters of eager calls, one zeroed buffer per stream: the last split of a tile sets its
            # counter back to zero, so no memset precedes later launches on that stream
            self._counters: dict = {}
            self.append = None
            if seqlen_new:
                sn = {n: [np.int64(s) for s in api.element_strides(x)[:3]] for n, x in (("k", k), ("v", v))}
                self.append = launch.Launcher(
                    _compile.kernel(SOURCE, f"kv_append<{dtypes.ctype(dt)},{'true' if problem.paged else 'false'}>"),
                    (seqlen_new, KVH, B), (D // 8,),
                    (P(9), P(10), P(1), P(2), P(7), P(8), *sn["k"], *sn["v"], *st["k"], *st["v"],
                     np.int32(max_pages), np.int32(page), np.int32(num_pages), np.int32(problem.max_keys)))

    def __call__(self, ptrs: list, check_values, cache_seqlens, block_table, want_lse: bool = True):
        if launch.current_device() != self.device:
            return launch.on_device(self.device, self, ptrs, check_values, cache_seqlens, block_table, want_lse)
        if check_values:
            _check_values(cache_seqlens, block_table, self.seqlen_new, self.capacity, self.num_pages, self.page)
        f = self.frame
        stream = f.stream()
        o, ptrs[3] = f.empty(self.o_shape, self.dtype)
        lse = None  # not asked for: the kernel writes none (a null pointer), and no buffer is made
        if want_lse:
            lse, ptrs[4] = f.empty(self.lse_shape, "fp32")
        ws = None
        if self.parts:
            ws, base = f.workspace(stream, self.ws_bytes)
            ptrs[5], ptrs[6] = base + self.ws_o, base + self.ws_lse
            if self._capturing(stream):  # a graph has its own counters, zeroed by a node of the graph
                ptrs[11] = base + self.ws_counters
                self._memset(ptrs[11], 0, self.counters_bytes, stream)
            else:
                counters = self._counters.get(stream)
                if counters is None:
                    buf, ptr = f.workspace(stream, self.counters_bytes)
                    self._memset(ptr, 0, self.counters_bytes, stream)
                    counters = self._counters[stream] = (buf, ptr)
                ptrs[11] = counters[1]
        if self.append is not None:
            self.append.launch(stream, ptrs)
        self.attend.launch(stream, ptrs)
        return o, lse


_CACHE = launch.Cache("attention.kvcache")


def flash_attention_with_kvcache(q, k_cache, v_cache, *, cache_seqlens, block_table=None, k=None, v=None,
                                 causal=False, window=None, softmax_scale=None, num_splits=None, return_lse=False,
                                 check_values=True):
    """Attention of ``q`` over the cache (see the module doc). Cached by signature like ``flash_attention``."""
    view = launch.view
    vq, vkc, vvc, vlen = view(q), view(k_cache), view(v_cache), view(cache_seqlens)
    vtab = None if block_table is None else view(block_table)
    vk = None if k is None else view(k)
    vv = None if v is None else view(v)
    opts = api.options_key(causal, window, None, softmax_scale)
    call = key = None
    if (opts is not None and vq is not None and vkc is not None and vvc is not None and vlen is not None
            and (vtab is not None or block_table is None) and (vk is not None or k is None)
            and (vv is not None or v is None) and (num_splits is None or type(num_splits) is int)):
        key = (vq[0], vkc[0], vvc[0], vlen[0], vtab and vtab[0], vk and vk[0], vv and vv[0], opts, num_splits)
        call = _CACHE.get(key)
    if call is None:
        problem, page, seqlen_new = validate(q, k_cache, v_cache, cache_seqlens, block_table, k, v, causal, window,
                                             softmax_scale, num_splits)
        call = DecodeCall(q, k_cache, v_cache, k, v, problem, page, seqlen_new, causal, window, softmax_scale,
                          num_splits)
        if key is not None:
            _CACHE.put(key, call)
        vq, vkc, vvc, vlen = view(q), view(k_cache), view(v_cache), view(cache_seqlens)
        vtab = None if block_table is None else view(block_table)
        vk = None if k is None else view(k)
        vv = None if v is None else view(v)
    pk, pv = (0 if vk is None else vk[1]), (0 if vv is None else vv[1])
    ptrs = [vq[1], vkc[1], vvc[1], 0, 0, 0, 0, vlen[1], 0 if vtab is None else vtab[1], pk, pv, 0]
    if (vq[1] | vkc[1] | vvc[1] | pk | pv) & 15:
        launch.check_aligned(("q", "k_cache", "v_cache", "k", "v"), (vq[1], vkc[1], vvc[1], pk, pv))
    o, lse = call(ptrs, check_values, cache_seqlens, block_table, bool(return_lse))
    return (o, lse) if return_lse else o


def kvcache_reference(q, k_cache, v_cache, cache_seqlens, *, block_table=None, k=None, v=None, causal=False,
                      window=None, softmax_scale=None):
    """float32 reference (CuPy, per sequence): gathers each sequence's keys (pages followed through the block
    table), appends k/v, and runs ``attention_reference`` on them. Returns (o, lse); does not touch the cache."""
    import cupy

    from .reference import attention_reference

    lens = cupy.asnumpy(cupy.asarray(cache_seqlens))
    table = None if block_table is None else cupy.asnumpy(cupy.asarray(block_table))
    outs, lses = [], []
    for b in range(q.shape[0]):
        n = int(lens[b])
        if table is None:
            kb, vb = k_cache[b, :n], v_cache[b, :n]
        else:
            page = k_cache.shape[1]
            idx = [(int(table[b, j // page]), j % page) for j in range(n)]
            kb = k_cache[[p for p, _ in idx], [s for _, s in idx]] if n else k_cache[:0, 0]
            vb = v_cache[[p for p, _ in idx], [s for _, s in idx]] if n else v_cache[:0, 0]
        if k is not None:
            kb, vb = cupy.concatenate([kb, k[b]]), cupy.concatenate([vb, v[b]])
        if kb.shape[0] == 0:
            outs.append(cupy.zeros((1,) + q.shape[1:], dtype=cupy.float32))
            lses.append(cupy.full((1, q.shape[2], q.shape[1]), -cupy.inf, dtype=cupy.float32))
            continue
        o, lse = attention_reference(q[b:b + 1], kb[None], vb[None], causal=causal, window=window,
                                     softmax_scale=softmax_scale, return_lse=True)
        outs.append(o)
        lses.append(lse)
    return cupy.concatenate(outs), cupy.concatenate(lses)
