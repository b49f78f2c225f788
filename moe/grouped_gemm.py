"""``grouped_gemm``: one GEMM per expert over the expert-ordered rows, on tensor cores, scheduled on the GPU.

Contract:

- ``a`` ``[rows, K]``: rows in expert order; group ``e`` is rows ``offsets[e]:offsets[e+1]``.
- ``b`` ``[experts, N, K]``, K contiguous: expert e's weight in torch ``Linear`` layout ``[out, in]``. Both
  operands are K-major, mma.sync's row.col form (no transposes in shared memory, plain ldmatrix for both).
- ``offsets`` int32 ``[experts + 1]`` on the GPU, non-decreasing, ``0 <= offsets[0]`` and ``offsets[-1] <= rows``
  (the caller's promise: it is read on the GPU only, never copied to the host). Any group may be empty. Rows
  outside ``[offsets[0], offsets[-1])`` are not written. ``None``: one group of all rows (``b`` must hold one
  expert): a dense ``a @ b[0].T``, which the tma tile runs without reading any offsets (its tiles follow from
  the row count, so the first loads wait on nothing; the other tiles read an array the call keeps).
- dtypes: float16, or bfloat16 as ``uint16`` bits (the project convention); torch CUDA tensors are accepted
  zero-copy. Accumulation in fp32; the output has the input dtype.
- ``K`` and ``N`` multiples of 8 (16-byte rows for cp.async); ``epilogue="swiglu"`` needs ``N`` a multiple of 16.
- ``epilogue``: ``None``; ``"swiglu"``: ``b[e]``'s rows are gate and up interleaved (row ``2j`` gate j, row
  ``2j+1`` up j; ``interleave_gate_up`` builds it), output ``[rows, N/2]`` = ``silu(gate) * up``; ``"gelu"``:
  ``gelu(x)`` (erf form).
- ``row_scale``: float32 ``[rows]``, multiplies each output row after the epilogue (the routing weight of the
  down projection).
- ``out_dtype``: ``None`` (a's dtype) or ``numpy.float32`` (plain GEMM only: fp32 results, e.g. router logits).
- ``rotary``: ``(cos, sin, cols)``, with ``offsets=None`` and no ``epilogue`` (sm_90a tma tiles): rotary embedding
  (neox halves) on output columns ``[0, cols)``, heads of ``2 * cos.shape[1]`` columns (64, 128 or 256), row r at
  position ``r % cos.shape[0]`` (a batch of sequences of that many tokens); ``cos``/``sin`` float32 ``[seq, head_dim
  / 2]`` (``models.norm_rope.rotary_tables``). The fused QKV projection of a model, rotated in registers before
  its output is written: no second pass over q and k.

On sm_90a a tma tile may split each output tile's K range over several work items (weight-bound problems with
few tiles, ``gemm_configs.tma_ranked``): on 128 x 128 tiles whose clusters fit at once, the CTAs of a cluster
split the tile and add their sums through distributed shared memory in rank order (``cluster_k``); otherwise
their fp32 sums go to scratch the call keeps, and a second kernel adds them in a fixed order. Both are
deterministic and apply the epilogue and row scale after the sum. Large problems (one group, or groups of at least
``gemm_configs.PAIR_MIN_GROUP_ROWS`` rows on average) run 128 x 256 tiles in clusters of two CTAs along M that
share each B stage through TMA multicast (``gemm_configs.as_pair``; a group's last 1-128 rows as tail items).

Nothing is synchronised with the host: the kernel finds each CTA's (expert, m-tile, n-tile) from ``offsets``
itself (grouped_gemm.cu's header), so the call can be captured in a CUDA graph.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from cukernels import dtypes, tiling
from cukernels import launch as _launch

from . import configs, gemm_configs, launch

SOURCE = Path(__file__).parent / "kernels" / "grouped_gemm.cu"
SPLIT_KEEP_BYTES = 64 << 20  # a split-K call keeps partial-sum scratch up to this size for its next run
_DTYPES = (dtypes.FP16, dtypes.BF16)


def _validate_rotary(rotary, offsets, epilogue, n: int) -> str:
    """The rotary epilogue's name (``rope<head dim>``) after checking ``rotary = (cos, sin, cols)``."""
    if not (isinstance(rotary, tuple) and len(rotary) == 3):
        got = f"a tuple of {len(rotary)}" if isinstance(rotary, tuple) else type(rotary).__name__
        raise ValueError(f"rotary must be a tuple (cos, sin, cols), got {got}")
    cos, sin, cols = rotary
    if epilogue is not None:
        raise ValueError(f"rotary is an epilogue of its own: epilogue must be None, got {epilogue!r}")
    if offsets is not None:
        raise ValueError("rotary needs offsets=None (one group of all rows: row r is a token at position r % seq)")
    for name, t in (("rotary cos", cos), ("rotary sin", sin)):
        if len(getattr(t, "shape", ())) != 2 or dtypes.storage(t) != np.float32 or not dtypes.is_c_contiguous(t):
            raise ValueError(f"{name} must be a C-contiguous float32 [seq, head_dim / 2] table, got "
                             f"{dtypes.text(t) if hasattr(t, 'dtype') else type(t).__name__} of shape "
                             f"{tuple(getattr(t, 'shape', ()))}")
    if tuple(cos.shape) != tuple(sin.shape) or int(cos.shape[0]) < 1:
        raise ValueError(f"rotary cos and sin must have one shape [seq >= 1, head_dim / 2], got {tuple(cos.shape)} "
                         f"and {tuple(sin.shape)}")
    hd = 2 * int(cos.shape[1])
    if hd not in gemm_configs.ROPE:
        raise ValueError(f"rotary head dim 2 * cos.shape[1] = {hd}: must be one of {list(gemm_configs.ROPE)}")
    if not isinstance(cols, (int, np.integer)) or cols < hd or cols % hd or cols > n:
        raise ValueError(f"rotary cols = {cols!r}: must be a positive multiple of the head dim {hd}, at most N = {n}")
    return gemm_configs.ROPE[hd]


def validate(a, b, offsets, *, epilogue=None, row_scale=None, out_dtype=None, rotary=None) -> gemm_configs.GemmProblem:
    """Check shapes, dtypes and layout from the arrays' attributes alone (no GPU needed); return the problem."""
    if epilogue not in gemm_configs.NAMED_EPILOGUES:  # the rotary epilogues come with ``rotary=``
        raise ValueError(f"epilogue must be one of {list(gemm_configs.NAMED_EPILOGUES)}, got {epilogue!r}")
    if out_dtype is not None and np.dtype(out_dtype) not in (np.dtype(np.float32), dtypes.storage(a)):
        raise TypeError(f"out_dtype must be None, float32 or a's dtype {dtypes.text(a)}, got {np.dtype(out_dtype)}")
    fp32_out = out_dtype is not None and np.dtype(out_dtype) == np.float32
    if fp32_out and epilogue is not None:
        raise ValueError(f"out_dtype=float32 is for the plain GEMM; epilogue {epilogue!r} writes a's dtype")
    if len(getattr(a, "shape", ())) != 2:
        raise ValueError(f"a must be 2-D [rows, K], got shape {tuple(getattr(a, 'shape', ()))}")
    if len(getattr(b, "shape", ())) != 3:
        raise ValueError(f"b must be 3-D [experts, N, K] (one [N, K] weight per expert, K contiguous), "
                         f"got shape {tuple(getattr(b, 'shape', ()))}")
    if dtypes.storage(a) not in _DTYPES:
        raise TypeError(f"a must be float16 or bfloat16, got {dtypes.text(a)}")
    if dtypes.storage(b) != dtypes.storage(a):
        raise TypeError(f"b must have a's dtype {dtypes.text(a)}, got {dtypes.text(b)}")
    rows, k = (int(v) for v in a.shape)
    experts, n, kb = (int(v) for v in b.shape)
    if kb != k:
        raise ValueError(f"b's K (shape[2]) is {kb}, a's K (shape[1]) is {k}: they must match")
    if experts < 1:
        raise ValueError("b has no experts (shape[0] == 0)")
    if k < 8 or k % 8:
        raise ValueError(f"K = {k} (a.shape[1]): must be a positive multiple of 8")
    # fp32 outputs are stored by column pairs, each column guarded against N: any N >= 1. 16-bit outputs leave
    # in 16-byte stores of 8 columns (SwiGLU: 8 output columns from 16 columns of b).
    if fp32_out and n < 1:
        raise ValueError(f"N = {n} (b.shape[1]): must be at least 1")
    mult = 16 if epilogue == "swiglu" else 8
    if not fp32_out and (n < mult or n % mult):
        hint = {"swiglu": "; SwiGLU halves N into gate/up pairs",
                None: "; out_dtype=float32 accepts any N >= 1"}.get(epilogue, "")
        raise ValueError(f"N = {n} (b.shape[1]): must be a positive multiple of {mult} for "
                         f"{dtypes.dtype_name(dtypes.storage(a))} outputs, written in 16-byte stores{hint}")
    if rows >= 2**31:
        raise ValueError(f"a has {rows} rows: at most 2**31 - 1 are supported")
    if offsets is None:
        if experts != 1:
            raise ValueError(f"offsets=None (one group of all rows) needs b with one expert, got b.shape[0] = "
                             f"{experts}")
    elif tuple(getattr(offsets, "shape", ())) != (experts + 1,):
        raise ValueError(f"offsets must be 1-D [experts + 1] = [{experts + 1}], got shape "
                         f"{tuple(getattr(offsets, 'shape', ()))}")
    if offsets is not None and dtypes.storage(offsets) != np.int32:
        raise TypeError(f"offsets must be int32, got {dtypes.text(offsets)}")
    if row_scale is not None:
        if tuple(getattr(row_scale, "shape", ())) != (rows,):
            raise ValueError(f"row_scale must be 1-D [rows] = [{rows}], got shape "
                             f"{tuple(getattr(row_scale, 'shape', ()))}")
        if dtypes.storage(row_scale) != np.float32:
            raise TypeError(f"row_scale must be float32, got {dtypes.text(row_scale)}")
    for name, x in (("a", a), ("b", b), ("offsets", offsets), ("row_scale", row_scale)):
        if x is not None and not dtypes.is_c_contiguous(x):
            raise ValueError(f"{name} must be C-contiguous, got a strided view of shape {tuple(x.shape)}")
    if rotary is not None:
        if fp32_out:
            raise ValueError("rotary writes a's dtype: out_dtype must be None")
        epilogue = _validate_rotary(rotary, offsets, epilogue, n)
    return gemm_configs.GemmProblem(rows=rows, n=n, k=k, experts=experts, dtype=dtypes.dtype_name(dtypes.storage(a)),
                                    epilogue=epilogue, out_dtype="fp32" if fp32_out else None)


class GemmCall:
    """A validated, planned, compiled grouped GEMM for one signature: pointers in, output allocated and written
    (``dtype``, or float32 when ``problem.out_dtype`` says so).

    ``gather``: the offer of a fused token gather (the layer's, ``gather`` = top_k), taken when the plan is a skinny
    tile, or (``TMA_GATHER``) the 128 x 256 tma tile alone or in pairs with a plain or SwiGLU epilogue
    (``self.gather`` says whether): row r of the groups then reads a[index[r] // gather], with ``index`` the sixth
    pointer of ``enqueue`` (the sorted slots), and ``a`` is the tokens, not the gathered rows.

    ``early``: the caller passes ``enqueue(..., pcounts=)``, the groups' row counts, written two launches back or
    more (the layer's routing counts); a skinny plan over fewer rows than experts then lists the experts from them
    and prefetches its first weights into L2 before its programmatic wait (``self.early`` bytes per CTA)."""

    def __init__(self, problem: gemm_configs.GemmProblem, config, dtype: np.dtype, frame, gather: int = 0,
                 dense: bool = False, rope: tuple[int, int] = (1, 0), early: bool = False, scatter: int = 0):
        import cupy

        self.frame, self.dense_offsets, self.problem = frame, None, problem
        self.early = 0  # bytes of weights a skinny CTA prefetches before its programmatic wait (early=True)
        out_dtype = np.dtype(np.float32) if problem.out_dtype == "fp32" else np.dtype(dtype)
        with cupy.cuda.Device(frame.device_id):
            if config is None:
                config = launch.plan(gemm_configs.plan, problem).config
            else:
                tiling.check_fits(config, launch.spec())
            k_tiles = -(-problem.k // config.block_k)
            for what in ("split_k", "cluster_k"):
                if config.kind == "tma" and getattr(config, what) > k_tiles:
                    raise ValueError(f"{config}: {what} {getattr(config, what)} exceeds K's {k_tiles} k tiles of "
                                     f"{config.block_k} (K = {problem.k}); every split needs one")
            takes = config.kind == "skinny" or tma_gathers(config, problem.epilogue)
            self.config, self.gather = config, int(gather) if takes else 0
            self.scatter = int(scatter) if tma_scatters(config, problem, scatter) else 0
            n_out = problem.n // 2 if problem.epilogue == "swiglu" else problem.n
            # a scatter call adds its rows into the tokens' rows: its output is [rows / scatter, n_out]
            self.out_shape = (problem.rows // self.scatter if self.scatter else problem.rows, n_out)
            self.out_dtype = dtypes.dtype_name(out_dtype)
            self.empty = problem.rows == 0
            if self.empty:
                return
            if dense and config.kind != "tma":  # the tma tile takes a null pointer; the others read [0, rows]
                self.dense_offsets = cupy.asarray(np.array([0, problem.rows], dtype=np.int32))
            P = _launch.Ptr  # 0 a, 1 b, 2 out, 3 offsets, 4 row_scale (0: none), 5 gather index, 6 split sums,
            # 7, 8 rotary cos / sin, 9 the groups' row counts (early skinny plans)
            a_arg, b_arg = P(0), P(1)
            tma_gather = config.kind == "tma" and self.gather > 0
            kern = launch.kernel(SOURCE, config.name_expression(dtype=dtype, epilogue=problem.epilogue,
                                                                out_dtype=out_dtype, gather=tma_gather,
                                                                scatter=self.scatter > 0))
            clusters, out_args = None, (P(2),)
            if config.kind == "tma":  # tensor maps over a [rows, K], b [experts * N, K] and out [rows, n_out]
                from cukernels import tma

                row_bytes = (problem.k * 2,)
                if not tma_gather:  # (a gathering tile reads a's rows itself)
                    a_arg = tma.TensorMap(2, (problem.k, problem.rows), row_bytes, (config.block_k, config.block_m),
                                          swizzle=128, index=0)
                b_arg = tma.TensorMap(2, (problem.k, problem.experts * problem.n), row_bytes,  # a cluster's CTAs
                                      (config.block_k, config.block_n // config.cluster_m), swizzle=128, index=1)
                # out: 64 x 64 boxes of the epilogue's staging blocks (and the pointer, for partial slabs). A split-K
                # plan (fp32 sums, or sums added across a cluster and stored by the threads) never stores through
                # the map: a's map fills the slot (already bound, so no third encode per call where out moves)
                no_store = config.split_k > 1 or config.cluster_k > 1 or self.scatter > 0
                out_map = a_arg if no_store else tma.TensorMap(2, (n_out, problem.rows), (n_out * 2,), (64, 64),
                                                               swizzle=128, index=2)
                out_args = (out_map, P(2))
                if config.cluster_size > 1:  # the clusters that fit at once, not SMs / cluster size
                    kern.reserve_smem(config.smem_bytes())
                    clusters = tma.max_active_clusters(kern.handle, config.cluster_size, config.threads,
                                                       config.smem_bytes())
            args = (a_arg, b_arg, *out_args, P(3), P(4), np.int32(problem.experts), np.int32(problem.n),
                    np.int32(problem.k))
            if config.kind == "skinny":  # 5: the gather's row index (0: none) and its divisor
                args += (P(5), np.int32(max(1, self.gather)))
            if tma_gather:  # b's map, out's; the groups; a (the token rows), 5: the index, its divisor
                args = (b_arg, *out_args, P(3), P(4), np.int32(problem.experts), np.int32(problem.n),
                        np.int32(problem.k), np.int32(problem.rows), P(0), P(5), np.int32(self.gather))
            if self.scatter:  # a's and b's maps; out is [rows / scatter, N]; 5: the index (the sorted slots), divisor
                args = (a_arg, b_arg, P(2), P(3), P(4), np.int32(problem.experts), np.int32(problem.n),
                        np.int32(problem.k), np.int32(problem.rows), P(5), np.int32(self.scatter))
            splits = config.split_k if config.kind == "tma" else 1
            if config.kind == "tma" and not tma_gather and not self.scatter:
                # 6: the split sums [splits, rows, N] fp32 (unused unsplit)
                args += (P(6), np.int32(splits), np.int32(problem.rows))
                if config.cluster_size == 1:  # 7, 8: the rotary tables (0: none), their rows, the rotated columns
                    args += (P(7), P(8), np.int32(rope[0]), np.int32(rope[1]))
            grid = config.grid(problem, launch.spec().sm_count, clusters)
            if config.kind == "skinny":  # persistent: what the GPU holds at once, striding over the items
                grid = kern.resident_grid(grid, config.threads, config.smem_bytes())
                self.early = self._early_bytes(problem, config, grid) if early else 0
                args += (P(9), np.int32(self.early))
            self.launcher = _launch.Launcher(
                kern, (grid,), (config.threads,), args,
                smem=config.smem_bytes(), pdl=config.kind != "tma" or config.one_wave(problem, grid))
            self.split_sums, self.reduce = None, None
            if splits > 1:  # the split sums' adder: epilogue, row scale and the 16-bit store
                nbytes = 4 * splits * problem.rows * problem.n
                self.split_sums = _launch.KeptWorkspace(nbytes, keep_bytes=SPLIT_KEEP_BYTES)
                red = launch.kernel(SOURCE, f"moe_splitk_reduce<{dtypes.ctype(dtype)}, "
                                            f"{gemm_configs.EPILOGUES[problem.epilogue]}>")
                across = -(-(n_out // 8) // 256)  # CTAs along a row's 8-output chunks; rows strided over y
                self.reduce = _launch.Launcher(
                    red, (across, max(1, min(problem.rows, 8 * launch.spec().sm_count // across))), (256,),
                    (P(6), P(2), P(3), P(4), np.int32(problem.experts), np.int32(problem.n), np.int32(splits),
                     np.int32(problem.rows)), pdl=True)

    @staticmethod
    def _early_bytes(problem: gemm_configs.GemmProblem, config, grid: int) -> int:
        """Bytes of its first items' weights a skinny CTA asks L2 for before its programmatic wait (``early``: the
        call's ``pcounts``, the groups' row counts, were written two launches back or more); 0 (no early start)
        unless ``gemm_configs.few_experts_touched``. At most ``EARLY_L2_SHARE`` of the L2 over the grid, at most
        four items per CTA. H100 (docs/perf/grouped_gemm.md v4.3): E64 top-8 T1 -2 to -3 %, seed 004 T1 -3 %, T4
        rows -1 to -2 %; the whole L2 was worse than half (T1 +2 % over no prefetch), and a full item per CTA with
        every expert touched (T64: 135 MB asked of a 50 MB L2) +1.3 %."""
        if not gemm_configs.few_experts_touched(problem):
            return 0
        per_cta = -(-config.grid(problem) // grid)  # a skinny tile's grid() is its item count (before the cap)
        item_bytes = config.block_n * problem.k * 2
        budget = min(min(4, per_cta) * item_bytes, int(EARLY_L2_SHARE * launch.spec().l2_bytes) // grid)
        return budget // 16 * 16 if budget >= 4096 else 0

    def enqueue(self, stream: int, pa: int, pb: int, pout: int, poffsets: int, pscale: int, pindex: int = 0,
                pcos: int = 0, psin: int = 0, pcounts: int = 0) -> None:
        """``pcounts``: the groups' row counts, written two launches back or more (a GemmCall made with
        ``early=True`` reads them before its programmatic wait; the others ignore it)."""
        if self.empty:
            return
        if self.dense_offsets is not None:
            poffsets = self.dense_offsets.data.ptr
        if self.reduce is None:
            self.launcher.launch(stream, (pa, pb, pout, poffsets, pscale, pindex, 0, pcos, psin, pcounts))
            return
        # split K: the partial sums live in scratch that the reduce reads in stream order; kept for the next call
        # on this stream (split K is planned for few rows: a few MiB), fresh under graph capture (the graph's)
        owner, pws = self.split_sums.take(self.frame, stream)
        ptrs = (pa, pb, pout, poffsets, pscale, pindex, pws, 0, 0)
        self.launcher.launch(stream, ptrs)
        self.reduce.launch(stream, ptrs)  # owner (a local) holds the scratch until both are enqueued

    def __call__(self, pa: int, pb: int, poffsets: int, pscale: int, pcos: int = 0, psin: int = 0):
        if self.scatter:
            raise RuntimeError("a GemmCall made with scatter= adds into a zeroed output: call enqueue() with it")
        f = self.frame
        out, pout = f.empty(self.out_shape, self.out_dtype)
        self.enqueue(f.stream(), pa, pb, pout, poffsets, pscale, 0, pcos, psin)
        return out


def _skinny_tile(c: gemm_configs.GemmConfig) -> str:
    """A skinny tile's (MI, WN, KS) template arguments in the fused kernels."""
    return f"{c.block_n // (16 * c.warps_n)}, {c.warps_n}, {c.split_k}"


def _ffn_args(up: gemm_configs.GemmConfig, down: gemm_configs.GemmConfig) -> str:
    """The fused FFN's template arguments (BM, the two tiles, U) for two skinny tiles with the same rows per pass."""
    if up.kind != "skinny" or down.kind != "skinny" or up.block_m != down.block_m:
        raise ValueError(f"the fused FFN takes two skinny tiles with the same block_m, got {up} and {down}")
    return f"{up.block_m}, {_skinny_tile(up)}, {_skinny_tile(down)}, {up.stages}"


def ffn_name_expression(up: gemm_configs.GemmConfig, down: gemm_configs.GemmConfig, dtype) -> str:
    """The ``moe_ffn_skinny`` instance of two skinny tiles with the same rows per pass (``SkinnyFFN``)."""
    return f"moe_ffn_skinny<{dtypes.ctype(dtype)}, {_ffn_args(up, down)}>"


def decode_name_expression(router: gemm_configs.GemmConfig, up: gemm_configs.GemmConfig,
                           down: gemm_configs.GemmConfig, dtype, experts: int) -> str:
    """The ``moe_decode_skinny`` instance of a layer's three skinny tiles (``SkinnyDecode``); ``experts`` sets
    moe_route's experts per lane."""
    if router.kind != "skinny":
        raise ValueError(f"the one-launch decode layer takes a skinny router tile, got {router}")
    return (f"moe_decode_skinny<{dtypes.ctype(dtype)}, {configs.experts_per_lane(experts)}, {router.block_m}, "
            f"{_skinny_tile(router)}, {_ffn_args(up, down)}>")


class SkinnyFFN:
    """A decode-sized layer's two expert GEMMs as one launch (``moe_ffn_skinny``): the up-projection's skinny
    items (SwiGLU, token rows gathered through the sorted slots), then the down-projection's (row weights), in one
    persistent grid where each down item waits on its expert's up items through a counter instead of a grid
    boundary. Made from the two planned ``GemmCall``s when both are skinny tiles with the same rows per pass
    (``SkinnyFFN.fits``); ``enqueue`` takes the layer's pointers and a zeroed counter buffer of ``SYNC_BYTES``
    (left zeroed by the launch)."""

    # two counters per group slot (SKINNY_MAX_GROUPS), then the down items' ticket and its CTA count, then
    # (SkinnyDecode) the router items stored and the CTAs past their wait, then one per down column block (the
    # combine's; SKINNY_COLS, SKINNY_MAX_COLS in the kernel)
    SYNC_BYTES = 4 * (2 * 512 + 16 + 1024)
    MAX_COMBINE_BLOCKS = 1024

    @staticmethod
    def combines(down: "GemmCall", top_k: int) -> bool:
        """Whether the fused kernel can run the layer's combine too (``enqueue``'s ``out``): the down-projection's
        column blocks fit the counters and top_k the kernel's bound."""
        return (-(-down.problem.n // down.config.block_n) <= SkinnyFFN.MAX_COMBINE_BLOCKS
                and top_k <= 8)  # the kernel's SKINNY_MAX_TOP_K

    @staticmethod
    def fits(up: "GemmCall", down: "GemmCall") -> bool:
        """``planned`` for two made calls: the up-projection gathering (skinny plans do) with SwiGLU into its own
        dtype, the down-projection plain."""
        return (not up.empty and not down.empty and up.gather > 0 and up.problem.epilogue == "swiglu"
                and down.problem.epilogue is None and up.out_dtype == up.problem.dtype
                and SkinnyFFN.planned(up.config, down.config, up.problem))

    @staticmethod
    def planned(up: gemm_configs.GemmConfig, down: gemm_configs.GemmConfig, problem: gemm_configs.GemmProblem) -> bool:
        """Whether a layer whose expert GEMMs got the tiles ``up`` and ``down`` (``problem``: the up-projection's)
        runs them as one launch: both skinny with the same rows per pass, and ``gemm_configs.few_experts_touched``,
        where the second launch's start is what the fusion saves (H100: E64 top-8 T1 -5 %, T4 -3 %, seed 004 T1 /
        T4 level; with every expert touched, T16 / T64, it was 4-5 % slower than the two launches)."""
        return (up.kind == down.kind == "skinny" and up.block_m == down.block_m
                and gemm_configs.few_experts_touched(problem))

    def __init__(self, up: "GemmCall", down: "GemmCall", dtype: np.dtype, top_k: int, early: bool):
        import cupy

        cu, cd, pu, pd = up.config, down.config, up.problem, down.problem
        frame = up.frame
        with cupy.cuda.Device(frame.device_id):
            name = ffn_name_expression(cu, cd, dtype)
            kern = launch.kernel(SOURCE, name)
            smem = max(cu.smem_bytes(), cd.smem_bytes())  # the larger phase's partial sums, then the group list
            grid = kern.resident_grid(cu.grid(pu) + cd.grid(pd), 256, smem)  # the items: up, then down
            self.early = GemmCall._early_bytes(pu, cu, grid) if early else 0
            P = _launch.Ptr  # 0 x, 1 w_up, 2 h, 3 w_down, 4 y, 5 offsets, 6 row weights, 7 sorted slots, 8 counts,
            # 9 the counters, 10 out (0: no combine), 11 inverse
            self.launcher = _launch.Launcher(
                kern, (grid,), (256,),
                (P(0), P(1), P(2), P(3), P(4), P(5), P(6), np.int32(pu.experts), np.int32(pu.n), np.int32(pu.k),
                 np.int32(pd.k), P(7), np.int32(top_k), P(8), np.int32(self.early), P(9), P(10), P(11),
                 np.int32(pu.rows // top_k)), smem=smem, pdl=True)

    def enqueue(self, stream: int, px: int, w_up: int, h: int, w_down: int, y: int, offsets: int, row_weight: int,
                sorted_slots: int, counts: int, sync: int, out: int = 0, inverse: int = 0) -> None:
        """``out``: the layer's output, combined from y through ``inverse`` in this launch (``combines``); 0: y
        only."""
        self.launcher.launch(stream, (px, w_up, h, w_down, y, offsets, row_weight, sorted_slots, counts, sync, out,
                                      inverse))


class SkinnyDecode:
    """A decode-sized layer's router GEMM, routing, permutation and both expert GEMMs as one launch
    (``moe_decode_skinny``): the router's skinny items, a grid-wide wait on a counter, the routing of every token
    in every CTA (moe_route's choice and softmax weights, bit for bit) with the sorted rows built in shared
    memory, then ``SkinnyFFN``'s items. Made where the layer runs the FFN fused (``SkinnyFFN.fits``) and the
    router GEMM is a skinny tile too; ``enqueue`` takes a zeroed counter buffer of ``SkinnyFFN.SYNC_BYTES`` (left
    zeroed) and writes the logits, h, y and ``inverse`` (slot -> row, for the combine)."""

    @staticmethod
    def fits(router: "GemmCall", ffn: SkinnyFFN | None) -> bool:
        """``planned`` for made calls (``ffn``: the layer's fused FFN, None where it runs two launches): the router
        GEMM one group of fp32 logits."""
        return (ffn is not None and not router.empty and SkinnyDecode.planned(router.config, True)
                and router.problem.experts == 1 and router.problem.out_dtype == "fp32"
                and router.problem.epilogue is None)

    @staticmethod
    def planned(router: gemm_configs.GemmConfig, ffn_fused: bool) -> bool:
        """Whether a layer whose router GEMM got the tile ``router`` runs as this one launch (and the combine):
        where its FFN is one launch (``SkinnyFFN.planned``) and the router's tile is skinny (H100: E64 top-8 T1
        -8 %, T4 -5 %, seed 004 T1 -5 % against the five launches it replaces)."""
        return ffn_fused and router.kind == "skinny"

    @staticmethod
    def smem_bytes(router: gemm_configs.GemmConfig, up: gemm_configs.GemmConfig,
                   down: gemm_configs.GemmConfig) -> int:
        """The largest phase's partial sums, the group list and its count, the row offsets, and per slot / per row
        its expert, weight, slot and row weight (moe_decode_skinny)."""
        # a skinny tile's own cost is its partial sums and the group list; then the offsets and five per-slot arrays
        return max(c.smem_bytes() for c in (router, up, down)) + 4 * (configs.MAX_EXPERTS + 1 + 6 * configs.MAX_EXPERTS)

    def __init__(self, router: "GemmCall", up: "GemmCall", down: "GemmCall", dtype: np.dtype, top_k: int,
                 early: bool):
        import cupy

        cr, pr = router.config, router.problem
        cu, cd, pu, pd = up.config, down.config, up.problem, down.problem
        frame = router.frame
        experts = pu.experts
        name = decode_name_expression(cr, cu, cd, dtype, experts)
        smem = self.smem_bytes(cr, cu, cd)
        with cupy.cuda.Device(frame.device_id):
            kern = launch.kernel(SOURCE, name)
            grid = kern.resident_grid(cu.grid(pu) + cd.grid(pd), 256, smem)  # the FFN's items (router's: fewer)
            self.early = GemmCall._early_bytes(pu, cu, grid) if early else 0
            P = _launch.Ptr  # 0 x, 1 router weight, 2 logits, 3 w_up, 4 h, 5 w_down, 6 y, 7 inverse, 8 the counters,
            # 9 out (0: no combine)
            self.launcher = _launch.Launcher(
                kern, (grid,), (256,),
                (P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), np.int32(pr.rows), np.int32(experts),
                 np.int32(top_k), np.int32(pu.n), np.int32(pu.k), np.int32(pd.k), np.int32(self.early), P(8), P(9)),
                smem=smem, pdl=True)

    def enqueue(self, stream: int, px: int, router_b: int, logits: int, w_up: int, h: int, w_down: int, y: int,
                inverse: int, sync: int, out: int = 0) -> None:
        """``out``: the layer's output, combined in this launch (``SkinnyFFN.combines``); 0: y and inverse only."""
        self.launcher.launch(stream, (px, router_b, logits, w_up, h, w_down, y, inverse, sync, out))


EARLY_L2_SHARE = 0.5  # of the L2 that skinny plans started early (GemmCall early=) may prefetch over the grid

_GEMM = _launch.Cache("moe.grouped_gemm")


def _validated(a, b, offsets, epilogue, row_scale, out_dtype, config, rotary=None) -> GemmCall:
    """The slow path of a call: every check (torch tensors are read through CuPy views for it), then the call."""
    cos, sin = rotary[:2] if isinstance(rotary, tuple) and len(rotary) == 3 else (None, None)
    named = (("a", a), ("b", b), ("offsets", offsets), ("row_scale", row_scale), ("rotary cos", cos),
             ("rotary sin", sin))
    for name, x in named:
        if x is not None and _launch.view(x) is None:
            raise TypeError(f"{name} must be a cupy.ndarray or a torch CUDA tensor, got {type(x).__name__}"
                            + (" on the host" if hasattr(x, "shape") else ""))
    problem = validate(a, b, offsets, epilogue=epilogue, row_scale=row_scale, out_dtype=out_dtype, rotary=rotary)
    devs = {_launch.view(x)[0][4] for _, x in named if x is not None}
    if len(devs) != 1:
        raise ValueError(f"a, b, offsets (and row_scale, rotary) must be on one device, got devices {sorted(devs)}")
    frame = _launch.frame(_launch.is_torch(a), devs.pop())
    rope = (int(cos.shape[0]), int(rotary[2])) if rotary is not None else (1, 0)
    return GemmCall(problem, config, dtypes.storage(a), frame, dense=offsets is None, rope=rope)


# The layer's token gather fused into the up-projection's loads on the 128 x 256 tma tiles (alone or in pairs;
# docs/perf/grouped_gemm.md "v7.3"). False: the layer gathers the rows by a launch of its own (A/B, tests).
TMA_GATHER = True
# The layer's combine fused into the down-projection where it runs in pairs (groups of >= 1,024 rows on average),
# for top-k <= 2: each row added into its token's row of the zeroed output by 16-byte bf16x2 / f16x2 reductions,
# deterministic and bitwise equal to the combine launch (moe_grouped_gemm_tma_pair_scatter). The layer's time is
# level with the combine launch's and its workspace has no y (docs/perf/grouped_gemm.md "v7.4"). False: the
# down-projection writes y and the combine launch sums it.
TMA_SCATTER = True


def tma_gathers(config: gemm_configs.GemmConfig, epilogue: str | None) -> bool:
    """Whether a tma plan fetches A's rows through an index itself (``TMA_GATHER``; the layer's token gather): the
    rule GemmCall applies and the bench's ``--plan`` names."""
    return TMA_GATHER and config.kind == "tma" and config.gathers and epilogue in (None, "swiglu")


def tma_scatters(config: gemm_configs.GemmConfig, problem: gemm_configs.GemmProblem, top_k: int) -> bool:
    """Whether a plan adds its rows into the tokens' rows itself (``TMA_SCATTER``; the layer's combine, for at
    most two rows per token): the rule GemmCall applies and the bench's ``--plan`` names."""
    return (TMA_SCATTER and 1 <= top_k <= 2 and config.scatters and problem.epilogue is None
            and problem.out_dtype is None)


_NO_OFFSETS = (None, 0)  # offsets=None: its view (no key, a null pointer)


def rotary_unavailable(spec=None) -> str | None:
    """Why ``grouped_gemm(rotary=...)`` cannot run on ``spec`` (default: the current device); None when it can."""
    from cukernels import device, tma

    spec = spec or device.current()
    if spec.arch != "sm_90a":
        return f"the rotary epilogue runs on the sm_90a tma tiles; {spec.name} is {spec.arch}"
    return tma.available()


def grouped_gemm(a, b, offsets, *, epilogue: str | None = None, row_scale=None, out_dtype=None, config=None,
                 rotary=None):
    """Per-expert ``epilogue(a[group e] @ b[e].T) * row_scale`` (see the module doc; ``offsets=None``: one group
    of all rows; ``rotary=(cos, sin, cols)``: rotary embedding on the leading columns). ``config``: a
    ``gemm_configs.GemmConfig`` to use instead of the planner's choice (benchmarks), checked against the device.
    The output is a new array like ``a`` (CuPy, or torch on torch's current stream)."""
    va, vb = _launch.view(a), _launch.view(b)
    vo = _NO_OFFSETS if offsets is None else _launch.view(offsets)
    vs = None if row_scale is None else _launch.view(row_scale)
    vc = vn = _NO_OFFSETS
    if rotary is not None:  # a malformed rotary takes the slow path, which says what is wrong
        ok = isinstance(rotary, tuple) and len(rotary) == 3
        vc, vn = (_launch.view(rotary[0]), _launch.view(rotary[1])) if ok else (None, None)
    if config is None and None not in (va, vb, vo, vc, vn) and (row_scale is None or vs is not None):
        key = (va[0], vb[0], vo[0], None if vs is None else vs[0], epilogue,
               None if out_dtype is None else np.dtype(out_dtype), vc[0], vn[0],
               None if rotary is None else rotary[2])
        call = _GEMM.get(key)
        if call is None:
            call = _GEMM.put(key, _validated(a, b, offsets, epilogue, row_scale, out_dtype, None, rotary))
    else:
        call = _validated(a, b, offsets, epilogue, row_scale, out_dtype, config, rotary)
        va, vb = _launch.view(a), _launch.view(b)
        vo = _NO_OFFSETS if offsets is None else _launch.view(offsets)
        vs = None if row_scale is None else _launch.view(row_scale)
        if rotary is not None:
            vc, vn = _launch.view(rotary[0]), _launch.view(rotary[1])
    ps = 0 if vs is None else vs[1]
    if (va[1] | vb[1] | vo[1] | ps | vc[1] | vn[1]) & 15:
        _launch.check_aligned(("a", "b", "offsets", "row_scale", "rotary cos", "rotary sin"),
                              (va[1], vb[1], vo[1], ps, vc[1], vn[1]))
    return _launch.on_device(call.frame.device_id, call, va[1], vb[1], vo[1], ps, vc[1], vn[1])


def interleave_gate_up(w_gate, w_up):
    """``[experts, I, K]`` gate and up weights -> ``[experts, 2I, K]`` with row 2j = gate j, row 2j+1 = up j
    (the layout ``epilogue="swiglu"`` reads). CuPy, NumPy or torch, same library out."""
    if tuple(w_gate.shape) != tuple(w_up.shape) or len(w_gate.shape) != 3:
        raise ValueError(f"w_gate and w_up must both be [experts, I, K], got {tuple(w_gate.shape)} and "
                         f"{tuple(w_up.shape)}")
    e, i, k = w_gate.shape
    if _launch.is_torch(w_gate):
        import torch

        return torch.stack([w_gate, w_up], dim=2).reshape(e, 2 * i, k)
    return dtypes._xp(w_gate).stack([w_gate, w_up], axis=2).reshape(e, 2 * i, k)


def reference(a, b, offsets, *, epilogue=None, row_scale=None, rotary=None) -> np.ndarray:
    """float64 NumPy reference: a per-expert loop over the fp32 values of the stored inputs (``rotary`` as in
    ``grouped_gemm``: applied to the product, before the row scale)."""
    def host(x):
        x = x.get() if hasattr(x, "get") else np.asarray(x)
        return dtypes.to_float32(x).astype(np.float64) if x.dtype in _DTYPES else x

    a64, b64 = host(a), host(b)
    off = np.array([0, a64.shape[0]]) if offsets is None else np.asarray(host(offsets)).astype(np.int64)
    n = b64.shape[1]
    out = np.zeros((a64.shape[0], n // 2 if epilogue == "swiglu" else n))
    for e in range(b64.shape[0]):
        lo, hi = off[e], off[e + 1]
        if hi <= lo:
            continue
        y = a64[lo:hi] @ b64[e].T
        if epilogue == "swiglu":
            g, u = y[:, 0::2], y[:, 1::2]
            y = g / (1.0 + np.exp(-g)) * u
        elif epilogue == "gelu":
            from math import erf, sqrt

            y = 0.5 * y * (1.0 + np.vectorize(erf, otypes=[np.float64])(y / sqrt(2.0)))
        out[lo:hi] = y
    if rotary is not None:
        cos, sin = (np.asarray(host(t), dtype=np.float64) for t in rotary[:2])
        seq, half = cos.shape
        pos = np.arange(out.shape[0]) % seq
        for h0 in range(0, int(rotary[2]), 2 * half):
            x, y = out[:, h0:h0 + half].copy(), out[:, h0 + half:h0 + 2 * half].copy()
            out[:, h0:h0 + half] = x * cos[pos] - y * sin[pos]
            out[:, h0 + half:h0 + 2 * half] = y * cos[pos] + x * sin[pos]
    if row_scale is not None:
        out *= np.asarray(host(row_scale), dtype=np.float64)[:, None]
    return out
