"""``python -m cukernels.compare A.json B.json``: do two result files (``--json`` of a bench) agree?

Rows are matched by (case, implementation); for each pair measured OK in both, the relative difference of the
medians is set against the noise both runs stated (``rel_noise``), with a floor for run-to-run drift of clocks
and power (default 2 %). A row agrees when ``|b - a| / a <= max(noise_a + noise_b, floor)``.

The stated noise of a row timed in one round is half its p20-p80 spread over the median. A row timed with host
time ("host-incl": an implementation of its case synchronises the host), or one whose samples did not settle in
one round, also moves between moments of a run and between processes; the bench times it in rounds spread over
the run and states the larger of its samples' spread and half the range of its round medians
(cukernels/bench.py), so a rerun is judged against what the run itself saw of that drift. The ``timed`` column
says how each row of A was timed. A row's time as called and host µs per call (``as_called_ms``, ``host_us``) are
informative and not compared.
"""
from __future__ import annotations

import argparse
import json
import sys

from tabulate import tabulate


def compare(a: dict, b: dict, *, floor: float = 0.02) -> list[dict]:
    rows_b = {(r["case"], r["impl"]): r for r in b["results"] if r["status"] == "ok"}
    out = []
    for ra in a["results"]:
        rb = rows_b.get((ra["case"], ra["impl"]))
        if ra["status"] != "ok" or rb is None:
            continue
        diff = (rb["median_ms"] - ra["median_ms"]) / ra["median_ms"]
        band = max((ra["rel_noise"] or 0) + (rb["rel_noise"] or 0), floor)
        out.append({"case": ra["case"], "impl": ra["impl"], "timed": _timed(ra), "A ms": f"{ra['median_ms']:.4f}",
                    "B ms": f"{rb['median_ms']:.4f}", "diff": f"{100 * diff:+.1f}%", "band": f"±{100 * band:.1f}%",
                    "agree": "yes" if abs(diff) <= band else "NO"})
    return out


def _timed(row: dict) -> str:
    kind = "host-incl" if row.get("clocks", {}).get("held") is False else "device"
    rounds = len(row.get("round_medians_ms") or [])
    return f"{kind}, {rounds} rounds" if rounds > 1 else kind


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m cukernels.compare", description=__doc__.splitlines()[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--floor", type=float, default=0.02, help="run-to-run floor of the band (default 0.02)")
    args = p.parse_args(argv)
    with open(args.a) as fa, open(args.b) as fb:
        rows = compare(json.load(fa), json.load(fb), floor=args.floor)
    if not rows:
        print("no (case, implementation) pair measured OK in both files")
        return 2
    print(tabulate(rows, headers="keys", tablefmt="github", disable_numparse=True))
    bad = sum(r["agree"] != "yes" for r in rows)
    print(f"{len(rows) - bad} of {len(rows)} rows agree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
