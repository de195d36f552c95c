"""Committed calibrations (bench/results/*/profiles): each load's decode splits per device after 32 and
after 510 tokens of KV cache (ms), and which ran the shorter pass slower (a slow phase the fastest of
the calibration's rounds did not escape; method 15 bounds them, planner/rounds.py context_bounded)."""
import collections, glob, json
seen, n_prof, n_inv, n_pairs, n_pair_inv = set(), 0, 0, 0, 0
for f in sorted(glob.glob("bench/results/*/profiles/*.json")):
    d = json.load(open(f)); cal = d.get("calibration") or {}
    if d["key"] in seen or not cal.get("splits"):
        continue
    seen.add(d["key"])
    t = collections.defaultdict(float)
    for s in cal["splits"]:
        if s["n_tokens"] == 1:
            t[(s["load"], s["device"][:3], s["n_past"])] += s["split_us"] / 1e3
    pairs = sorted({(l, dv) for l, dv, _ in t})
    row, inv = [], False
    for l, dv in pairs:
        ps = sorted(p for l2, d2, p in t if (l2, d2) == (l, dv))
        if len(ps) < 2:
            continue
        a, b = t[(l, dv, ps[0])], t[(l, dv, ps[-1])]
        n_pairs += 1; n_pair_inv += a > b; inv |= a > b
        row.append(f"{l}/{dv} {a:.2f} {'>' if a > b else '<='} {b:.2f}")
    if row:
        n_prof += 1; n_inv += inv
        print(f"{f.split('results/')[1]}: " + "; ".join(row))
print(f"\n{n_inv} of {n_prof} calibrations with two KV lengths have a device's decode pass slower after 32 tokens "
      f"than after 510 ({n_pair_inv} of {n_pairs} load/device pairs)")
