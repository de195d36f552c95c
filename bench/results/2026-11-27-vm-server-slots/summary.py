"""summary.txt from results.json: per workload, each kind's median wall (e2e of all N requests) and
mean TTFT, their ratios to lockstep round by round (median, min-max), and the lockstep plan's
prediction against each."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

d = json.loads((Path(__file__).parent / "results.json").read_text())
out = [f"commit {d['commit']}, {d['machine']} ({d['cpus']} CPUs), {Path(d['model']).name}, ubatch {d['ubatch']}, "
       f"{d['threads']} threads"]
for w in d["workloads"]:
    pred = w["plan"]["predicted"]
    out += ["", f"prompt {w['prompt']}, gen {w['gen']}, {w['parallel']} sequences (n_ctx {w['n_ctx']}); "
            f"lockstep plan predicted TTFT {pred['ttft_ms']:.0f} ms, TPOT {pred['tpot_ms']:.1f} ms, "
            f"e2e {pred['e2e_ms']:.0f} ms",
            f"  lockstep passes: {w['lockstep_ubatches']}; the server's (modelled): {w['server_batches']} batches, "
            f"{sum(w['server_ubatches'].values())} ubatches; the first request alone: "
            f"{w['server_batches_first_alone']} batches, {sum(w['server_ubatches_first_alone'].values())} ubatches",
            f"  {'kind':<19} {'e2e ms':>8} {'min-max':>13} {'/lockstep':>10} {'min-max':>12} {'mean TTFT':>10} "
            f"{'/lockstep':>10} {'pred/e2e':>9} {'load':>9}"]
    lock = w["rounds"]["lockstep"]
    for kind, rows in w["rounds"].items():
        walls = [r["wall_s"] * 1e3 for r in rows]
        ttft = [statistics.mean(r["first_s"]) * 1e3 for r in rows]
        rw = [r["wall_s"] / b["wall_s"] for r, b in zip(rows, lock, strict=True)]
        rt = [statistics.mean(r["first_s"]) / statistics.mean(b["first_s"]) for r, b in zip(rows, lock, strict=True)]
        loads = [r["load1"] for r in rows]
        out.append(f"  {kind:<19} {statistics.median(walls):8.0f} {min(walls):6.0f}-{max(walls):6.0f} "
                   f"{statistics.median(rw):10.3f} {min(rw):5.3f}-{max(rw):5.3f} {statistics.median(ttft):10.0f} "
                   f"{statistics.median(rt):10.3f} {pred['e2e_ms'] / statistics.median(walls):9.3f} "
                   f"{min(loads):.2f}-{max(loads):.2f}")
text = "\n".join(out) + "\n"
(Path(__file__).parent / "summary.txt").write_text(text)
print(text, end="")
