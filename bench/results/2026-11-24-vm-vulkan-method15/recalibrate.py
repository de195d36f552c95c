"""The MoE cell of this run re-predicted with a calibration measured again by this checkout (method 16:
split-mode runs spreading more than 20% repeated) on top of the run's own one-op profile; errors
against this run's measurements beside the recorded predictions'. Also the calibration's timed passes
per load and device (ms, keyed load, device, tokens, KV length) and its streamed decode pass, before and now.

    GGML_VK_VISIBLE_DEVICES=0 python recalibrate.py
"""
import collections, json, statistics, sys
from pathlib import Path
from oallama.planner import plan as planmod
from oallama.planner.calibrate import calibrate
from oallama.planner.profile import Profile
from oallama.planner.schedmodel import NEVER, Placement

D = Path("bench/results/2026-11-24-vm-vulkan-method15")
M = "build/bench-models/qwen3moe-small-q4_k_m-L8.gguf"
pf = D / "profiles/395079fe9db3bb09.json"
prof = Profile.from_json(json.loads(pf.read_text()), pf)

def acc_decode(cal):
    t = collections.defaultdict(float)
    for s in cal.splits:
        t[(s["load"], s["device"][:3], s["n_tokens"], s["n_past"])] += s["split_us"] / 1e3
    st = {d: round(m["wall_us"] / 1e3, 1) for d, m in cal.stream.items()}
    return {k: round(v, 1) for k, v in sorted(t.items())}, f"streamed decode pass {st}"

print("before:", acc_decode(prof.calibration))
prof.calibration = calibrate(M, ["CPU", "Vulkan0"], prof, threads=1, op_offload=True, mmap=True, progress=False)
print("now:   ", acc_decode(prof.calibration), f"({prof.calibration.elapsed_s:.0f} s)")
rows, ctxs = [], {}
for spec_f in sorted(D.glob("raw/*.spec.json")):
    res_f = spec_f.with_name(spec_f.name.replace(".spec.json", ".json"))
    spec = json.loads(spec_f.read_text())
    c = spec["config"]
    if "qwen3moe" not in c["model"] or not res_f.exists():
        continue
    res = json.loads(res_f.read_text())
    key = (c["prompt"], c["gen"])
    if key not in ctxs:
        wl = planmod.Workload(c["prompt"], c["gen"], "e2e", c["settings"]["n_ubatch"])
        ctxs[key] = planmod.build_context(M, "Vulkan0", wl, profile=prof, threads=1, progress=False)
    plan = json.loads(Path(spec["plan_file"]).read_text())
    on = frozenset(w for w, d in plan["placement"].items() if d == plan["accelerator"])
    mb = {w: (NEVER if b is None else int(b)) for w, b in (plan.get("offload_min_batch") or {}).items()}
    pred = ctxs[key].predict(Placement(on, plan["kv_layers"], mb, plan.get("layouts") or {}, plan.get("dual_max_batch") or 0))
    meas = {k: statistics.median(v) for k, v in res["samples"].items()}
    rows.append((c["strategy"], c["budget"], meas, spec["plan"]["predicted"], pred))
print(f"\n{len(rows)} configurations (3 rounds each); median / p90 |predicted - measured| / measured")
for k in ("ttft_ms", "tpot_ms", "e2e_ms"):
    old = sorted(abs(r[3][k] - r[2][k]) / r[2][k] for r in rows)
    new = sorted(abs(r[4][k] - r[2][k]) / r[2][k] for r in rows)
    p90 = lambda v: v[int(round(0.9 * (len(v) - 1)))]
    print(f"{k}: recorded {100 * statistics.median(old):.1f}% / {100 * p90(old):.1f}%, now {100 * statistics.median(new):.1f}% / {100 * p90(new):.1f}%")
for s, b, meas, old, new in rows[:: 3]:
    print(f"  {s} @{b}: TPOT measured {meas['tpot_ms']:.1f}, recorded {old['tpot_ms']:.1f}, now {new['tpot_ms']:.1f}; "
          f"TTFT {meas['ttft_ms']:.0f} / {old['ttft_ms']:.0f} / {new['ttft_ms']:.0f}")
