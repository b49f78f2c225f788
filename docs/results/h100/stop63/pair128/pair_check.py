"""Stop 63: where the paired head-dim-128 call's output differs from the planned one (B64 L1k rows in
pair_probe.py): both against the bench's reference (batches 0 and B-1), and the batches / heads that differ."""
import sys
import cupy
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import pair_probe as pp  # noqa: E402  (runs nothing with an empty case list)
from attention import decode_bench as db  # noqa: E402

for name in ["decode_b64_L1k_h32-8_d128_q1", "decode_b64_L1k_h32-32_d128_q4", "decode_b8_L1k_h32-32_d128_q1",
             "decode_b64_L8k_h32-8_d128_q1"]:
    case = pp.cases[name]
    inputs = db.make_inputs(case, 0)
    ref = db.reference(case, inputs)
    _, plan_out, pd = pp.variant(case, inputs, False)
    _, pair_out, qd = pp.variant(case, inputs, True)
    a, b = cupy.asarray(plan_out).astype(cupy.float32), cupy.asarray(pair_out).astype(cupy.float32)
    d = cupy.abs(a - b)
    bad = cupy.argwhere(d > 1e-2)
    print(name, pd, qd, "plan check", [str(c) for c in db.check(case, plan_out, ref)],
          "pair check", [str(c) for c in db.check(case, pair_out, ref)], flush=True)
    print("   differing elements", int(bad.shape[0]), "batches", cupy.unique(bad[:, 0]).get()[:10] if bad.size else [],
          "heads", cupy.unique(bad[:, 2]).get()[:40] if bad.size else [], "nan plan/pair",
          int(cupy.isnan(a).sum()), int(cupy.isnan(b).sum()), flush=True)
    again = pp.variant(case, inputs, False)[1]
    print("   planned twice equal:", bool((cupy.asarray(again) == cupy.asarray(plan_out)).all()), flush=True)
