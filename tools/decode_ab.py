"""A/B of attention-over-a-KV-cache variants (planner knobs, kernel flags, forced rings) on the decode suite's shapes,
contiguous and paged caches side by side.

    python tools/decode_ab.py --case b1_L1k_h32-8_d128_q1 --case 8:8192:16/16:64:4 --cache contig,p16,p256 \\
        --variant base --variant pipe:attention.decode_configs.WARP_PIPE=True [--rounds 5] [--json PATH]
    python tools/decode_ab.py --case b1_L32k_h16-16_d64_q1 --cache p16 --table inorder,shuffled,window:262144 \\
        --variant base --variant w8:ring=8/3

A case is a decode suite name (``decode_b1_L1k_h32-8_d128_q1``, the prefix optional; its inputs are the suite's,
``attention.decode_bench.make_inputs``) or ``BATCH:LENGTH:HEADS/KV_HEADS:HEAD_DIM:SEQ_Q`` for any other shape (bf16,
full-length caches). A variant is ``NAME[:item,...]`` (tools/ab_variants.py): ``module.attr=value``,
``-DMACRO=V`` (flash_decode built with it: a kernel variant or probe behind an ``#if``), ``ring=WARPS/STAGES`` (that
ring planned first) or ``splits=N`` (the call's ``num_splits``). The first variant is the reference. A cache is
``contig`` or ``pN`` (pages of N keys: the suite's cache seen as pages, no copy, as the bench does); ``--table``
orders the pages of each sequence in the block table: ``shuffled`` (the bench's), ``inorder``, ``window:BYTES``
(shuffled within windows of that many bytes of pages) or ``sorted`` (shuffled, then each split's pages in address
order, the reference plan's splits: with no mask the output is the same). Each (cache, table, variant) call is built
once in a cleared cache (its plan recorded), its output compared with the reference variant's contiguous call (max
|diff|) and with the reference variant's call on the same cache (bitwise), then all are timed in ``--rounds`` rounds
with the order rotated each round: the engine's held timer (L2 flushed by a read); ``--do-bench`` adds triton's
do_bench and ``--called`` the time as called (``cukernels.timing.as_called``). The table gives each median and its
ratio to the reference variant's contiguous call. Needs a GPU. Every attribute is put back at the end.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ab_variants  # noqa: E402

_SHAPE = re.compile(r"^(\d+):(\d+):(\d+)/(\d+):(\d+):(\d+)$")
_SUITE = re.compile(r"^(decode_)?b(\d+)_L(\d+)k_h(\d+)-(\d+)_d(\d+)_q(\d+)$")


def _own_item(item: str, key: str, value: str):
    if key == "ring":
        parts = value.split("/")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise SystemExit(f"--variant: a forced ring is ring=WARPS/STAGES, got {item!r}")
        return ("ring", "", tuple(int(p) for p in parts))
    if key == "splits":
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"--variant: splits=N needs a positive integer, got {item!r}")
        return ("splits", "", int(value))
    return None


def parse_variant(text: str):
    """``NAME[:item,...]`` (tools/ab_variants.py) with this tool's ``ring=W/S`` and ``splits=N``."""
    return ab_variants.parse_variant(text, _own_item)


def parse_case(text: str) -> dict:
    """A suite name (``b1_L1k_h32-8_d128_q1``, ``decode_`` optional) or ``B:L:H/KVH:D:Q`` -> the case's params
    (batch, length, heads, kv_heads, head_dim, seq_q) and its name."""
    m = _SUITE.match(text)
    if m:
        b, lk, h, kvh, d, q = (int(x) for x in m.groups()[1:])
        return dict(name=f"decode_b{b}_L{lk}k_h{h}-{kvh}_d{d}_q{q}", suite=True, batch=b, length=lk * 1024,
                    heads=h, kv_heads=kvh, head_dim=d, seq_q=q)
    m = _SHAPE.match(text)
    if m:
        b, n, h, kvh, d, q = (int(x) for x in m.groups())
        return dict(name=f"B{b} L{n} {h}/{kvh} d{d} q{q}", suite=False, batch=b, length=n, heads=h, kv_heads=kvh,
                    head_dim=d, seq_q=q)
    raise SystemExit(f"--case {text!r}: a decode suite case (b1_L1k_h32-8_d128_q1) or BATCH:LENGTH:HEADS/KV_HEADS:"
                     f"HEAD_DIM:SEQ_Q")


def parse_caches(text: str) -> list[int | None]:
    """``contig,p16,p256`` -> [None, 16, 256] (a page size a multiple of 16 in 16..256)."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        if item == "contig":
            out.append(None)
        elif item.startswith("p") and item[1:].isdigit() and 16 <= int(item[1:]) <= 256 and int(item[1:]) % 16 == 0:
            out.append(int(item[1:]))
        else:
            raise SystemExit(f"--cache {text!r}: contig or pN with N a multiple of 16 in 16..256, got {item!r}")
    return out


def parse_tables(text: str) -> list[str]:
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        if item in ("shuffled", "inorder", "sorted") or (item.startswith("window:") and item[7:].isdigit()):
            out.append(item)
        else:
            raise SystemExit(f"--table {text!r}: shuffled, inorder, sorted or window:BYTES, got {item!r}")
    return out


def page_order(table: str, batch: int, per_seq: int, page_bytes: int, split_pages: int, seed: int) -> np.ndarray:
    """Each sequence's page ids in the block table (sequence b owns pages b * per_seq ...): ``shuffled`` is the
    bench's order (attention.decode_bench._paged's generator), ``inorder``, ``window:BYTES`` shuffles within windows
    of BYTES // page_bytes pages, ``sorted`` sorts each split's stretch of the shuffled order."""
    rng = np.random.default_rng(seed)
    if table == "inorder":
        order = np.tile(np.arange(per_seq), (batch, 1))
    elif table.startswith("window:"):
        w = max(1, int(table[7:]) // page_bytes)
        order = np.stack([np.concatenate([rng.permutation(np.arange(s, min(s + w, per_seq)))
                                          for s in range(0, per_seq, w)]) for _ in range(batch)])
    else:
        order = np.stack([rng.permutation(per_seq) for _ in range(batch)])
        if table == "sorted":
            order = np.concatenate([np.sort(order[:, s:s + split_pages], axis=1)
                                    for s in range(0, per_seq, split_pages)], axis=1)
    return (order + np.arange(batch)[:, None] * per_seq).astype(np.int32)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", required=True,
                    help="b1_L1k_h32-8_d128_q1 or BATCH:LENGTH:HEADS/KV_HEADS:HEAD_DIM:SEQ_Q (repeatable)")
    ap.add_argument("--variant", action="append", required=True, help="NAME[:item,...] (repeatable)")
    ap.add_argument("--cache", default="contig,p16,p256", help="contig and/or pN, comma-separated")
    ap.add_argument("--table", default="shuffled", help="page orders of the paged caches (shuffled, inorder, "
                                                        "sorted, window:BYTES), comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget-ms", type=float, default=100.0, help="held timer budget per measurement")
    ap.add_argument("--do-bench", action="store_true", help="also time with triton's do_bench")
    ap.add_argument("--called", action="store_true", help="also time back-to-back calls (as called)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    variants = dict(parse_variant(v) for v in args.variant)
    cases = [parse_case(c) for c in args.case]
    caches, tables = parse_caches(args.cache), parse_tables(args.table)
    if not caches:
        raise SystemExit("--cache: name at least one cache")

    import cupy

    from attention import decode_bench, decode_configs, kvcache
    from cukernels import bench, compile as ccompile, device, dtypes, timing

    suite_cases = {case.name: case for case in decode_bench.cases("decode", argparse.Namespace(dtype="bf16"))}
    unknown = [c["name"] for c in cases if c["suite"] and c["name"] not in suite_cases]
    if unknown:
        raise SystemExit(f"--case: not in the decode suite: {', '.join(unknown)} (BATCH:LENGTH:HEADS/KV_HEADS:"
                         f"HEAD_DIM:SEQ_Q runs any shape)")
    attrs = ab_variants.Attributes(variants, kinds=("define", "ring", "splits"))
    builds = contextlib.ExitStack()
    space = decode_configs.search_space

    def configure(name):  # the tree's values, then this variant's; a cleared call cache
        builds.close()
        attrs.apply(variants[name])
        decode_configs.search_space = space
        for m, _, v in variants[name]:
            if m == "ring":
                decode_configs.search_space = lambda d, *a, _r=v, **kw: (
                    [decode_configs.DecodeConfig(head_dim=d, warps=_r[0], stages=_r[1])] + space(d, *a, **kw))
        if ab_variants.defines(variants[name]):
            builds.enter_context(ccompile.kernels_built_with(ab_variants.defines(variants[name]), "flash_decode"))
        kvcache._CACHE.clear()
        return next((v for m, _, v in variants[name] if m == "splits"), None)

    print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), flush=True)
    rows, names = [], list(variants)
    try:
        for c in cases:
            if c["suite"]:  # the suite's own case (its registry) and inputs
                case = suite_cases[c["name"]]
                inputs = decode_bench.make_inputs(case, bench.case_seed(case))
                if inputs is None:
                    print(f"{c['name']}: does not fit this device, skipped", flush=True)
                    continue
            else:
                dt = dtypes.from_name("bf16")
                b, n, kvh, d = c["batch"], c["length"], c["kv_heads"], c["head_dim"]
                inputs = {"q": dtypes.random((b, c["seq_q"], c["heads"], d), dt, seed=0),
                          "k": dtypes.random((b, n, kvh, d), dt, seed=1),
                          "v": dtypes.random((b, n, kvh, d), dt, seed=2),
                          "lens": cupy.full((b,), n, dtype=cupy.int32)}
            q, k, v, lens = inputs["q"], inputs["k"], inputs["v"], inputs["lens"]
            B, L, KVH, D = k.shape
            ref_problem = decode_configs.DecodeProblem(batch=B, seq_q=c["seq_q"], heads=c["heads"], kv_heads=KVH,
                                                       head_dim=D, max_keys=L, dtype="bf16", paged=True)
            configure(names[0])
            split_keys = decode_configs.plan_call(ref_problem, device.current(), heads_adjacent=False).split_keys
            layouts = []  # (label, k, v, table)
            for page in caches:
                if page is None:
                    layouts.append(("contig", k, v, None))
                    continue
                per = L // page
                for t in tables:
                    order = page_order(t, B, per, page * KVH * D * 2, max(1, split_keys // page), seed=page)
                    layouts.append((f"p{page}" + ("" if len(tables) == 1 else f"/{t}"),
                                    k.reshape(B * per, page, KVH, D), v.reshape(B * per, page, KVH, D),
                                    cupy.asarray(order)))
            calls, plans, outs = {}, {}, {}
            for label, kk, vv, tab in layouts:
                for name in names:
                    splits = configure(name)
                    o = kvcache.flash_attention_with_kvcache(q, kk, vv, cache_seqlens=lens, block_table=tab,
                                                             num_splits=splits, check_values=False)
                    call = next(iter(kvcache._CACHE._entries.values()))
                    key = f"{label}/{name}"
                    plans[key] = f"{call.config} x{call.splits}" + (f" cluster {call.cluster}" if call.cluster > 1
                                                                    else "")
                    outs[key] = o
                    base = [q.data.ptr, kk.data.ptr, vv.data.ptr, 0, 0, 0, 0, lens.data.ptr,
                            0 if tab is None else tab.data.ptr, 0, 0, 0]
                    calls[key] = (lambda c_=call, b_=base, t_=tab: c_(list(b_), False, lens, t_))
            ref_key = f"{layouts[0][0]}/{names[0]}"
            ref = dtypes.to_float32(outs[ref_key])
            keys = list(calls)
            row = {"case": c["name"], "plans": plans,
                   "max_abs_diff_vs_" + ref_key: {kk_: float(cupy.abs(dtypes.to_float32(o) - ref).max())
                                                  for kk_, o in outs.items()},
                   "bitwise_vs_reference_variant": {kk_: bool((o == outs[f"{kk_.rsplit('/', 1)[0]}/{names[0]}"]).all())
                                                    for kk_, o in outs.items()},
                   "held_us": {kk_: [] for kk_ in keys}}
            if args.do_bench:
                import triton

                row["do_bench_us"] = {kk_: [] for kk_ in keys}
            for r in range(args.rounds):
                for kk_ in ab_variants.rotated(keys, r):
                    fn = calls[kk_]
                    row["held_us"][kk_].append(round(timing.benchmark(fn, budget_ms=args.budget_ms).median_ms * 1e3, 3))
                    if args.do_bench:
                        row["do_bench_us"][kk_].append(round(triton.testing.do_bench(fn, warmup=25, rep=100) * 1e3, 3))
            if args.called:
                row["called_us"] = {kk_: round(timing.as_called(calls[kk_]) * 1e3, 3) for kk_ in keys}
            row["median_held_us"] = {kk_: float(np.median(row["held_us"][kk_])) for kk_ in keys}
            rows.append(row)
            ref_t = row["median_held_us"][ref_key]
            print(f"{c['name']}: " + "; ".join(f"{kk_} [{plans[kk_]}] {row['median_held_us'][kk_]:.2f} us "
                                               f"({row['median_held_us'][kk_] / ref_t:.3f})" for kk_ in keys),
                  flush=True)
    finally:  # the tree's values and planner back, and no call made under a variant left in the cache
        builds.close()
        attrs.restore()
        decode_configs.search_space = space
        kvcache._CACHE.clear()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if rows:
        keys = list(rows[0]["median_held_us"])
        print("\nheld us (ratio to " + keys[0] + ")\n\n| case | " + " | ".join(keys) + " |")
        print("|---" * (len(keys) + 1) + "|")
        for row in rows:
            m = row["median_held_us"]
            first = m[keys[0]]
            print(f"| {row['case']} | " + " | ".join(f"{m[k_]:.2f} ({m[k_] / first:.3f})" if k_ in m else "-"
                                                   for k_ in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
