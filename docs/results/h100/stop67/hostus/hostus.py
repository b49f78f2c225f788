"""Probe: why the bench's host-us column sometimes reads 10x the as-called time on one row.
Runs attention.bench with timing.host_us instrumented: every row's host_us taken 6 times by the tree's function, and
5 detailed held bursts (per-call wall, the burst's thread CPU time, gc events, the process's context switches)."""
import gc, json, os, resource, sys, time
sys.path.insert(0, ".")
import numpy as np
from cukernels import bench, timing

orig = timing.host_us
orig_take = bench._take_user_times
LOG = []
CUR = {"row": None}


def take(timed, fn, timer):
    CUR["row"] = (timed.case.name, timed.impl.name)
    return orig_take(timed, fn, timer)


def detail(fn, calls=20):
    import cupy
    dev = cupy.cuda.Device().id
    _, state = timing._hold_state(dev)
    out = []
    for _ in range(5):
        state[1] = 0
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        gc0 = sum(s["collections"] for s in gc.get_stats())
        release = timing._hold(dev)
        ts = [time.perf_counter()]
        c0 = time.thread_time()
        for _ in range(calls):
            fn()
            ts.append(time.perf_counter())
        c1 = time.thread_time()
        release()
        cupy.cuda.Device().synchronize()
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        d = np.diff(ts) * 1e6
        out.append(dict(per_call=float(d.mean()), max=float(d.max()), med=float(np.median(d)),
                        argmax=int(d.argmax()), cpu_per_call=(c1 - c0) * 1e6 / calls,
                        gc=sum(s["collections"] for s in gc.get_stats()) - gc0,
                        nvcsw=ru1.ru_nvcsw - ru0.ru_nvcsw, nivcsw=ru1.ru_nivcsw - ru0.ru_nivcsw,
                        tripped=int(state[1])))
    return out


def host_us(fn, *, per_call_ms, calls=timing.HOST_CALLS, repeats=5):
    rec = dict(row=CUR["row"], as_called_us=per_call_ms * 1e3, tree=[], detail=None)
    t = time.perf_counter()
    for _ in range(6):
        rec["tree"].append(orig(fn, per_call_ms=per_call_ms, calls=calls, repeats=repeats))
    rec["detail"] = detail(fn)
    rec["probe_s"] = time.perf_counter() - t
    LOG.append(rec)
    return rec["tree"][0]


timing.host_us = host_us
bench._take_user_times = take
out = os.environ.get("OUT", ".")
from attention import bench as abench
try:
    abench.main(sys.argv[1:])
finally:
    json.dump(LOG, open(f"{out}/hostus_log.json", "w"), indent=1)
    print("\nrow | as called us | tree host_us x6 | detail per-call (cpu) max gc ivcsw")
    for r in LOG:
        t = [round(x[0], 1) for x in r["tree"]]
        flag = " <<" if max(t) > 1.5 * r["as_called_us"] else ""
        det = " ".join(f"{d['per_call']:.0f}({d['cpu_per_call']:.0f})m{d['max']:.0f}g{d['gc']}i{d['nivcsw']}"
                       for d in r["detail"])
        print(f"{r['row'][0][7:]:28s} {r['row'][1]:14s} {r['as_called_us']:7.1f} | {t} | {det}{flag}")
