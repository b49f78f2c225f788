"""Tile tuning: time every feasible config of a kernel for a problem, keep the fastest, remember it per GPU.

Three things kept apart (STYLE.md 3): the planner's heuristic choice (``plan_*``), the search space
(``candidates(problem, spec)`` beside each planner, the heuristic's choice always among them) and this module's
tuned cache. ``--tune`` on a bench times each candidate of each case (checked first: a config whose output fails
its check is never kept), stores the fastest; ``--sweep`` times them all again and prints the seed 002/000-style
table (tile sizes against time, the automatic choice marked beside the explicit ones).

The cache is JSON under ``$XDG_CACHE_HOME/cukernels/tune/`` (``~/.cache`` when unset; ``CUKERNELS_TUNE_DIR``
overrides), one file per (GPU name, driver version), one entry per (op, problem signature), each entry stamped
with the kernel's code revision: a hash of the text of its kernel sources and its config module. An entry of
another revision is ignored (stale) and re-tuned; an unreadable or corrupt file gives a warning and a re-tune,
never a crash; writes go to a temp file that replaces the cache atomically (``os.replace``).

The planners consult the cache through ``lookup`` for a live device only (never for a profile, so CPU plans stay
deterministic), at a call's cache miss only: one dict lookup after the file's first read in the process.
``CUKERNELS_TUNED=0`` turns that off.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from . import bench as _bench
from . import device as _device
from . import tiling

FORMAT = 1
SOURCE = "tuned cache"  # Plan.source of a plan that came from here


class TuneCacheWarning(UserWarning):
    """The tuned-config cache could not be used (unreadable, corrupt, unwritable, a bad entry): re-tuned instead."""


# ---------------------------------------------------------------- keys


def cache_dir() -> Path:
    if os.environ.get("CUKERNELS_TUNE_DIR"):
        return Path(os.environ["CUKERNELS_TUNE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cukernels" / "tune"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", str(text)).strip("_") or "unknown"


def signature(problem: Any) -> str:
    """A problem (a frozen dataclass) as stable text: its type and every field, sorted."""
    fields = dataclasses.asdict(problem) if dataclasses.is_dataclass(problem) else {"value": problem}
    return f"{type(problem).__name__}{json.dumps(fields, sort_keys=True, default=str, separators=(',', ':'))}"


@functools.cache
def _revision(paths: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(Path(p).name.encode())
        h.update(b"\0")
        h.update(Path(p).read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def revision(files: Sequence[str | Path]) -> str:
    """The code revision of a kernel: a hash of the text of its kernel sources and its config module (read once
    per process). Any edit to one of them makes the tuned entries of that kernel stale."""
    return _revision(tuple(str(f) for f in files))


@functools.cache
def driver_version() -> str:
    info = _device.nvml_info(0)
    if info.get("driver"):
        return str(info["driver"])
    try:
        import cupy

        v = cupy.cuda.runtime.driverGetVersion()
        return f"cuda{v // 1000}.{v % 1000 // 10}"
    except Exception:
        return "unknown"


# ---------------------------------------------------------------- configs as data


def encode(config: Any) -> dict:
    """A frozen config dataclass as data: its type name and its init fields."""
    return {"type": type(config).__name__,
            "fields": {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}}


def decode(raw: dict, types: Sequence[type]) -> Any:
    """``encode``'s inverse, for one of ``types`` only (never an arbitrary import)."""
    known = {t.__name__: t for t in types}
    if not isinstance(raw, dict) or raw.get("type") not in known or not isinstance(raw.get("fields"), dict):
        raise ValueError(f"not a config of {sorted(known)}: {raw!r}")
    return known[raw["type"]](**raw["fields"])


# ---------------------------------------------------------------- the cache


class TuneCache:
    """The tuned configs of one GPU (name) under one driver, in one JSON file."""

    def __init__(self, gpu: str, driver: str, directory: str | Path | None = None):
        self.gpu, self.driver = str(gpu), str(driver)
        self.path = Path(directory or cache_dir()) / f"{_slug(self.gpu)}--driver-{_slug(self.driver)}.json"
        self._entries: dict | None = None

    @classmethod
    def for_device(cls, spec: _device.DeviceSpec, directory=None) -> "TuneCache":
        return cls(spec.name, driver_version(), directory)

    @staticmethod
    def key(op: str, problem: Any) -> str:
        return f"{op}|{signature(problem)}"

    def _read(self) -> dict:
        """The file's entries; {} when there is none; a warning (and {}) when it cannot be used."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            warnings.warn(f"tuned-config cache {self.path} is unreadable ({exc}); ignoring it: the configs will be "
                          "re-tuned", TuneCacheWarning, stacklevel=3)
            return {}
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict) or not isinstance(doc.get("entries"), dict):
                raise ValueError("no 'entries' object")
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT}")
            if doc.get("gpu") != self.gpu or doc.get("driver") != self.driver:
                raise ValueError(f"written for {doc.get('gpu')!r} driver {doc.get('driver')!r}")
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            warnings.warn(f"tuned-config cache {self.path} is corrupt ({exc}); ignoring it: the configs will be "
                          "re-tuned and the file rewritten", TuneCacheWarning, stacklevel=3)
            return {}
        return doc["entries"]

    @property
    def entries(self) -> dict:
        if self._entries is None:
            self._entries = self._read()
        return self._entries

    def status(self, op: str, problem: Any, rev: str) -> str:
        """``hit``, ``miss``, or ``stale`` (an entry of another kernel revision, ignored)."""
        entry = self.entries.get(self.key(op, problem))
        if not isinstance(entry, dict):
            return "miss"
        return "hit" if entry.get("revision") == rev else "stale"

    def get(self, op: str, problem: Any, rev: str) -> dict | None:
        """The entry for (op, problem) at kernel revision ``rev``; None when missing or stale."""
        return self.entries.get(self.key(op, problem)) if self.status(op, problem, rev) == "hit" else None

    def put(self, op: str, problem: Any, rev: str, record: dict) -> bool:
        """Store an entry: the file is read again (entries others wrote since are kept), the entry set, and the
        whole written to a temp file in the same directory that then replaces the cache (``os.replace``, atomic).
        False, with a warning, when it cannot be written."""
        key = self.key(op, problem)
        entry = {**record, "op": op, "signature": signature(problem), "revision": rev}
        fresh = self._read() if self.path.exists() else {}
        fresh[key] = entry
        self._entries = fresh
        doc = {"format": FORMAT, "gpu": self.gpu, "driver": self.driver, "entries": fresh}
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True, default=str)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            tmp = None
            return True
        except OSError as exc:
            warnings.warn(f"tuned-config cache {self.path} could not be written ({exc}); the tuned config holds for "
                          "this process only", TuneCacheWarning, stacklevel=2)
            return False
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


_LIVE: dict = {}  # (gpu, driver, directory) -> TuneCache: one read per process


def live_cache(spec: _device.DeviceSpec) -> TuneCache:
    key = (spec.name, driver_version(), str(cache_dir()))
    if key not in _LIVE:
        _LIVE[key] = TuneCache(spec.name, key[1], key[2])
    return _LIVE[key]


_BYPASS = [0]  # > 0 while ``heuristic`` runs a planner: lookups return None


def heuristic(planner: Callable[..., tiling.Plan], *args) -> tiling.Plan:
    """``planner(*args)`` as if the cache were empty: the heuristic's own choice (or the profile's override)."""
    _BYPASS[0] += 1
    try:
        return planner(*args)
    finally:
        _BYPASS[0] -= 1


def lookup(op: str, problem: Any, spec: _device.DeviceSpec, *, files: Sequence[str | Path],
           types: Sequence[type]) -> tiling.Plan | None:
    """The tuned plan for ``problem`` on the live device ``spec``, or None: for a profile (never tuned here), with
    ``CUKERNELS_TUNED=0``, with no entry or a stale one. A planner calls it first; a call's cache miss is the only
    place planners run, so this is never on the hot path. A bad entry warns and is ignored."""
    if spec.source != "live" or _BYPASS[0] or os.environ.get("CUKERNELS_TUNED", "1") == "0":
        return None
    try:
        entry = live_cache(spec).get(op, problem, revision(files))
        if entry is None:
            return None
        config = decode(entry["config"], types)
    except (KeyError, TypeError, ValueError, OSError) as exc:
        warnings.warn(f"tuned-config cache entry for {op} is unusable ({exc}); using the heuristic",
                      TuneCacheWarning, stacklevel=2)
        return None
    if (why := tiling.fits(config, spec)) is not None:
        warnings.warn(f"tuned config {config} for {op} does not fit {spec.name} ({why}); using the heuristic",
                      TuneCacheWarning, stacklevel=2)
        return None
    speedup = entry.get("speedup")
    gain = f"{speedup:.2f}x the heuristic's {entry.get('heuristic')}" if speedup else "measured fastest"
    return tiling.Plan(config=config, smem_bytes=config.smem_bytes(), limit=spec.smem_per_block_optin,
                       reason=f"tuned on this GPU {entry.get('date', '')}: {gain}", source=SOURCE)


def pick(candidates: Sequence[Any], heuristic: Any, limit: int | None) -> list:
    """The configs to time: all of them, or with ``limit`` the heuristic's choice and the first ``limit - 1``
    others in the planner's preference order (a documented, deterministic subset). The heuristic's comes first."""
    rest = [c for c in candidates if c != heuristic]
    if limit is not None:
        rest = rest[:max(0, limit - 1)]
    return [heuristic, *rest]


# ---------------------------------------------------------------- timing the candidates


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tunable:
    """One kernel choice of a bench case that can be tuned."""

    op: str  # cache namespace, e.g. "attention.fwd"
    label: str  # what the table calls it: "forward", "up GEMM (swiglu)"
    problem: Any  # frozen dataclass: the problem signature
    candidates: Sequence[Any]  # every feasible config, the heuristic's choice among them
    heuristic: tiling.Plan  # the planner's choice without the tuned cache
    files: Sequence[Path]  # kernel sources and config module: the code revision
    run: Callable[[Any, Any], Callable[[], Any]]  # (config, inputs) -> a call that launches with that config
    inputs: Callable[[int], Any] | None = None  # own inputs from a seed (a sub-problem); None: the case's own
    dtype: str = "bf16"  # own inputs: candidates are checked against the heuristic's output in this precision


@dataclasses.dataclass(frozen=True, kw_only=True)
class NotTunable:
    label: str
    reason: str


@dataclasses.dataclass(kw_only=True)
class Trial:
    config: str
    tiles: dict
    smem_bytes: int
    heuristic: bool
    status: str  # ok | failed-check | error
    reason: str = ""
    median_ms: float | None = None
    rel_noise: float | None = None
    samples: int = 0
    best: bool = False


@dataclasses.dataclass(kw_only=True)
class TuneResult:
    case: str
    kernel: str
    op: str = ""
    status: str  # tuned | re-tuned (stale) | cached | same key | swept | failed | not tunable
    reason: str = ""
    signature: str = ""
    heuristic: str = ""
    heuristic_source: str = ""
    heuristic_ms: float | None = None
    tuned: str = ""
    tuned_config: dict | None = None
    tuned_ms: float | None = None
    speedup: float | None = None  # heuristic ms / tuned ms
    candidates: int = 0
    trials: list = dataclasses.field(default_factory=list)
    revision: str = ""
    tuned_date: str = ""


_TILE_FIELDS = (("M tile", "block_m"), ("N tile", "block_n"), ("K tile", "block_k"), ("warps", "warps"),
                ("warpgroups", "warpgroups"), ("stages", "stages"))


def tiles(config: Any) -> dict:
    out = {"kind": type(config).__name__}
    if getattr(config, "kind", None) in ("mma", "wgmma"):
        out["kind"] += f" {config.kind}"
    for label, attr in _TILE_FIELDS:
        value = getattr(config, attr, None)
        if isinstance(value, int) and value:
            out[label] = value
    return out


def _time_one(fn, *, budget_ms: float):
    from . import timing

    return timing.benchmark(fn, budget_ms=budget_ms, min_samples=10, warmup_ms=10.0)


def _free() -> None:
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()


def _finite(out):
    """The heuristic's own output on a sub-problem: every element written and finite (it is the others'
    reference; GPU tests check it against fp32)."""
    import cupy

    from . import checks, dtypes

    a = out if isinstance(out, cupy.ndarray) else dtypes.as_cupy(out, name="out")[0]
    bad = int((~cupy.isfinite(dtypes.to_float32(a))).sum())
    return checks.CheckResult(name="heuristic output", max_abs=0.0, max_rel=0.0, mean_abs=0.0, rel_l2=0.0,
                              nonfinite=bad, passed=bad == 0,
                              reason="all finite" if bad == 0 else f"{bad} non-finite or unwritten elements")


def _first_failure(results) -> str:
    bad = [str(c) for c in results if not c.passed]
    return "; ".join(bad)[:300]


def tune_case(op, case, tunables: Sequence[Tunable | NotTunable], cache: TuneCache, *, sweep: bool = False,
              retune: bool = False, seed: int = 0, budget_ms: float = 200.0, max_configs: int | None = None,
              stored: dict | None = None, progress=sys.stderr) -> list[TuneResult]:
    """Tune (or read from ``cache``) every tunable of ``case``. ``op`` is the bench's ``cukernels.bench.Op``: its
    inputs, reference and check gate each candidate on the case's own inputs; a sub-problem with its own inputs
    checks each candidate against the heuristic's output. ``sweep`` times every candidate whatever the cache
    holds; ``retune`` ignores the cache's entry. ``stored`` (one dict for a whole run: cache key -> the case and
    kernel that stored it) makes a second case with the same key report "same key", naming the first, instead of
    "cached" with the first's numbers (with ``sweep`` it is timed again and its result replaces the entry)."""
    from . import checks

    out: list[TuneResult] = []
    shared: dict = {}  # the case's inputs and reference, made once

    def case_inputs():
        if "inputs" not in shared:
            inputs = op.make_inputs(case, seed)
            shared.update(inputs=inputs, reference=op.reference(case, inputs))
        return shared["inputs"], shared["reference"]

    for t in tunables:
        if isinstance(t, NotTunable):
            out.append(TuneResult(case=case.name, kernel=t.label, status="not tunable", reason=t.reason))
            continue
        rev = revision(t.files)
        base = dict(case=case.name, kernel=t.label, op=t.op, signature=signature(t.problem), revision=rev,
                    heuristic=str(t.heuristic.config), heuristic_source=t.heuristic.source)
        state = cache.status(t.op, t.problem, rev)
        key = cache.key(t.op, t.problem)
        earlier = None if stored is None else stored.get(key)  # the case that stored this key in this run
        if earlier is not None and not sweep:
            out.append(TuneResult(**base, status="same key",
                                  reason=f"same tuned key as {earlier}, tuned earlier in this run: not timed again; "
                                         "that entry applies to this case too"))
            continue
        if state == "hit" and not (sweep or retune):
            e = cache.get(t.op, t.problem, rev)
            out.append(TuneResult(**{**base, "heuristic": e.get("heuristic", base["heuristic"])}, status="cached",
                                  heuristic_ms=e.get("heuristic_ms"), tuned=e.get("tuned", ""),
                                  tuned_config=e.get("config"), tuned_ms=e.get("ms"), speedup=e.get("speedup"),
                                  candidates=e.get("candidates", 0), tuned_date=e.get("date", "")))
            continue
        configs = pick(t.candidates, t.heuristic.config, max_configs)
        trials, reference_out = [], None
        for i, cfg in enumerate(configs):
            if progress is not None:
                print(f"\r\033[Ktune {case.name} / {t.label}: {i + 1}/{len(configs)} {cfg}", end="", file=progress,
                      flush=True)
            trial = Trial(config=str(cfg), tiles=tiles(cfg), smem_bytes=cfg.smem_bytes(),
                          heuristic=cfg == t.heuristic.config, status="ok")
            trials.append(trial)
            fn = None
            try:
                if t.inputs is None:
                    inputs, reference = case_inputs()
                    fn = t.run(cfg, inputs)
                    checks.poison_pool(op.poison_bytes(case))
                    try:
                        first = fn()
                    finally:
                        checks.stop_poisoning()
                    verdict = op.check(case, first, reference)
                else:
                    if "own" not in shared or shared.get("own_for") is not t:
                        shared.update(own=t.inputs(seed), own_for=t)
                    fn = t.run(cfg, shared["own"])
                    checks.poison_pool(1 << 30)
                    try:
                        first = fn()
                    finally:
                        checks.stop_poisoning()
                    if reference_out is None and trial.heuristic:
                        verdict = [_finite(first)]
                        if verdict[0].passed:
                            reference_out = first
                    elif reference_out is None:
                        raise RuntimeError("the heuristic's config failed: nothing to check against")
                    else:
                        verdict = [checks.compare(first, reference_out, tol=checks.Tolerance(atol=1e-3, rtol=1 / 64),
                                                  name="vs the heuristic's output")]
                    if reference_out is not first:
                        del first
                if not all(c.passed for c in verdict):
                    trial.status, trial.reason = "failed-check", _first_failure(verdict)
                    continue
                timed = _time_one(fn, budget_ms=budget_ms)
                again = op.check(case, fn(), shared["reference"]) if t.inputs is None else []
                if again and not all(c.passed for c in again):
                    trial.status, trial.reason = "failed-check", "after timing: " + _first_failure(again)
                    continue
                trial.median_ms, trial.rel_noise, trial.samples = timed.median_ms, timed.rel_noise, timed.samples
            except Exception as exc:  # a config that does not compile or launch is reported, never kept
                trial.status, trial.reason = "error", f"{type(exc).__name__}: {exc}"[:300]
            finally:
                fn = None
                if t.inputs is not None:
                    _free()
        shared.pop("own", None)
        shared.pop("own_for", None)
        reference_out = None
        ok = [tr for tr in trials if tr.status == "ok"]
        heur = next((tr for tr in trials if tr.heuristic), None)
        res = TuneResult(**base, status="failed", candidates=len(configs), trials=trials,
                         heuristic_ms=heur.median_ms if heur else None)
        if not ok:
            res.reason = "no candidate passed its check: " + "; ".join(f"{tr.config}: {tr.reason}" for tr in trials)[:300]
            out.append(res)
            continue
        best_i = min(range(len(trials)), key=lambda i: (trials[i].median_ms is None, trials[i].median_ms or 0.0))
        best = trials[best_i]
        best.best = True
        res.tuned, res.tuned_config, res.tuned_ms = best.config, encode(configs[best_i]), best.median_ms
        res.speedup = (heur.median_ms / best.median_ms) if heur and heur.median_ms else None
        res.tuned_date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        res.status = "swept" if sweep else ("re-tuned (stale)" if state == "stale" else "tuned")
        if heur is not None and heur.status != "ok":
            res.reason = f"the heuristic's config failed: {heur.reason}"
        if failed := [tr for tr in trials if tr.status == "failed-check"]:  # a wrong config fails the run
            res.reason = "; ".join(x for x in (res.reason, f"{len(failed)} config(s) failed the check: " + "; ".join(
                f"{tr.config}: {tr.reason}" for tr in failed)) if x)[:300]
        if earlier is not None:
            res.reason = "; ".join(x for x in (res.reason, f"same tuned key as {earlier}: this result replaced its "
                                                             "entry") if x)[:300]
        cache.put(t.op, t.problem, rev, {"config": res.tuned_config, "tuned": res.tuned, "ms": res.tuned_ms,
                                         "heuristic": res.heuristic, "heuristic_ms": res.heuristic_ms,
                                         "speedup": res.speedup, "candidates": len(configs), "date": res.tuned_date})
        if stored is not None:
            stored[key] = f"{case.name} / {t.label}"  # under --sweep the latest holds the entry
        out.append(res)
    if progress is not None:
        print("\r\033[K", end="", file=progress, flush=True)
    return out


# ---------------------------------------------------------------- views


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v:.4f}"


def failed_checks(result: TuneResult) -> int:
    """How many of ``result``'s configs failed their correctness check (any fails the run: STYLE.md 7)."""
    return sum(t.status == "failed-check" for t in result.trials)


def tune_rows(results: Sequence[TuneResult]) -> list[dict]:
    rows = []
    for r in results:
        bad = failed_checks(r)
        rows.append({"case": r.case, "kernel": r.kernel, "status": r.status + (f" ({bad} failed check)" if bad else ""),
                     "heuristic (auto)": r.heuristic, "auto ms": _ms(r.heuristic_ms), "tuned": r.tuned or r.reason[:90],
                     "tuned ms": _ms(r.tuned_ms),
                     "tuned / auto": "" if r.speedup is None else f"{r.speedup:.3f}x",
                     "tried": str(r.candidates or "")})
    return rows


def sweep_rows(results: Sequence[TuneResult]) -> list[dict]:
    """Seed 002/000's layout: one row per config, tile sizes then time; "auto" marks the heuristic's choice (the
    others are explicit), ✓ the fastest."""
    rows = []
    for r in results:
        if not r.trials:
            rows.append({"case": r.case, "kernel": r.kernel, "config": f"({r.status}) {r.reason}"[:100]})
            continue
        heur = next((t for t in r.trials if t.heuristic and t.median_ms), None)
        for t in r.trials:
            row = {"case": r.case, "kernel": r.kernel, **{k: str(v) for k, v in t.tiles.items()},
                   "smem B": f"{t.smem_bytes:,}",
                   "ms": (f"{t.median_ms:.4f} ±{100 * (t.rel_noise or 0):.1f}%" if t.status == "ok"
                          else f"{t.status}: {t.reason[:60]}"),
                   "vs auto": (f"{heur.median_ms / t.median_ms:.3f}x" if heur and t.median_ms else ""),
                   "choice": "auto" if t.heuristic else "explicit", "best": "✓" if t.best else ""}
            rows.append(row)
    return rows


def _table(rows: list[dict]) -> str:
    from tabulate import tabulate

    if not rows:
        return "(nothing to tune)"
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return tabulate([{k: r.get(k, "") for k in keys} for r in rows], headers="keys", tablefmt="github",
                    disable_numparse=True)


def tune_table(results: Sequence[TuneResult]) -> str:
    return _table(tune_rows(results))


def sweep_table(results: Sequence[TuneResult]) -> str:
    return _table(sweep_rows(results))


def to_json(results: Sequence[TuneResult], environment: dict, path: str | Path, **meta) -> None:
    doc = {"environment": environment, **meta, "results": [dataclasses.asdict(r) for r in results]}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1, default=str))


def plots(results: Sequence[TuneResult], out_dir: str | Path) -> list[Path]:
    """One PNG per (case, kernel): time per config, the heuristic's bar in another colour ([] without
    matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: --plot needs matplotlib (pip install 'cukernels[plot]'); no plots written")
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for r in results:
        timed = [t for t in r.trials if t.median_ms]
        if not timed:
            continue
        fig, ax = plt.subplots(figsize=(7, 0.45 * len(timed) + 1.5))
        labels = [t.config + (" (auto)" if t.heuristic else "") + (" ✓" if t.best else "") for t in timed]
        ax.barh(labels, [t.median_ms for t in timed], color=["tab:orange" if t.heuristic else "tab:blue"
                                                             for t in timed])
        ax.invert_yaxis()
        ax.set_xlabel("median ms (lower is better)")
        ax.set_title(f"{r.case} / {r.kernel}", fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
        fig.tight_layout()
        written.append(out_dir / f"sweep_{_slug(r.case)}_{_slug(r.kernel)}.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


# ---------------------------------------------------------------- the bench flags


def add_arguments(parser) -> None:
    g = parser.add_argument_group("tuning (cukernels/tune.py)")
    g.add_argument("--tune", action="store_true",
                   help="time every feasible config per case, keep the fastest in the per-GPU cache "
                        f"({cache_dir()}); a case already tuned for this GPU, driver and kernel revision is read "
                        "from it ('cached')")
    g.add_argument("--sweep", action="store_true",
                   help="time every feasible config per case and print tile sizes vs time (auto = the heuristic's "
                        "choice); updates the cache; --plot DIR draws it")
    g.add_argument("--retune", action="store_true", help="with --tune: ignore the cache's entries")
    g.add_argument("--max-configs", type=int, metavar="N",
                   help="time at most N configs per kernel: the heuristic's and the next N-1 in the planner's "
                        "preference order (default: all)")
    g.add_argument("--tune-budget-ms", type=float, default=200.0, help="timing budget per config (default %(default)s)")


def run_cli(ob, argv: Sequence[str] | None, tunables: Callable) -> int:
    """``--tune`` / ``--sweep`` of a bench (``ob``: its ``cli.OpBench``; ``tunables(case, spec, args)``: the case's
    ``Tunable``/``NotTunable`` list)."""
    from . import cli, environment

    args = cli.parser_for(ob).parse_args(argv)
    try:
        _, cases = cli._check_options(ob, args)
        if args.max_configs is not None and args.max_configs < 1:
            raise cli.UsageError(f"--max-configs {args.max_configs}: needs at least 1")
        if args.plan:
            raise cli.UsageError("--tune/--sweep time configs on a GPU; --plan shows the heuristic's choice")
    except cli.UsageError as exc:
        return cli.usage_error(ob.prog, exc)
    if not _device.gpu_available():
        return cli.no_gpu(ob.prog, f"Tuning needs one; `{ob.prog} --plan --profile h100` shows the heuristic's "
                                   "choice for any GPU profile.")
    spec = _device.current()
    cache = TuneCache.for_device(spec)
    op = ob.op(args)
    results: list[TuneResult] = []
    stored: dict = {}  # cache keys tuned in this run: a repeat is reported as "same key", not "cached"
    for case in cases:
        results += tune_case(op, case, tunables(case, spec, args), cache, sweep=args.sweep, retune=args.retune,
                             seed=_bench.case_seed(case, args.seed), budget_ms=args.tune_budget_ms,
                             max_configs=args.max_configs, stored=stored)
    forget_plans()
    mode = "sweep" if args.sweep else "tune"
    print(f"{ob.prog} --{mode}: suite {args.suite}, {args.dtype}, {spec.name}, driver {cache.driver}; "
          f"cache {cache.path}")
    if any(r.trials for r in results):  # what was timed, config by config (all of it with --sweep)
        print(sweep_table(results))
        print()
    print(tune_table(results))
    if not args.sweep and any(r.status == "cached" for r in results):
        print("cached: read from the cache, not timed again (--retune times them again)")
    if any(r.status == "same key" for r in results):
        print("same key: the problem signature of an earlier case in this run (its tuned entry applies)")
    if any(failed_checks(r) for r in results):
        print("failed check: a config gave a wrong result (see the per-config table); the run fails")
    if args.json:
        to_json(results, environment.collect(), args.json, mode=mode, suite=args.suite, dtype=args.dtype,
                cache_file=str(cache.path),
                command=" ".join([ob.prog, *(argv if argv is not None else sys.argv[1:])]))
        print(f"json: {args.json}")
    if args.plot:
        for path in plots(results, args.plot):
            print(f"plot: {path}")
    return cli.EXIT_FAILED if any(r.status == "failed" or failed_checks(r) for r in results) else cli.EXIT_OK


_MEMOISED_PLANS = (("moe.launch", "_plan"),)  # (module, function): lru_caches that hold planner results


def forget_plans() -> None:
    """After tuning, planners in this process read the new entries: drop the live caches' contents and the
    memoised planner results of modules already imported (``moe.launch._plan``). Compiled calls that other
    modules keep per signature hold their plan until the process ends."""
    _LIVE.clear()
    for module, name in _MEMOISED_PLANS:
        fn = getattr(sys.modules.get(module), name, None)
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()


def requested(ob, argv: Sequence[str] | None) -> bool:
    """Did the command line ask for --tune or --sweep? (Parsed as the bench parses it, abbreviations included.)"""
    from . import cli

    args = cli.parser_for(ob).parse_args(argv)
    return bool(getattr(args, "tune", False) or getattr(args, "sweep", False))


def explicit(config: Any, spec: _device.DeviceSpec) -> tiling.Plan:
    """A plan that names ``config`` (the API's ``plan=`` argument), checked against ``spec`` by the call."""
    return tiling.Plan(config=config, smem_bytes=config.smem_bytes(), limit=spec.smem_per_block_optin,
                       reason="explicit (tuning)", source="explicit")
