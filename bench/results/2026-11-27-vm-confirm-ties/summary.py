"""summary.txt from the runs: per file, how often the candidate was kept, the gains beyond the
rounds' spread, the spread of the medians, and the TPOT and TTFT ratios' extremes."""
import json
import statistics
from pathlib import Path

here = Path(__file__).parent
for name in ("before-r7", "fresh-r7", "fresh-r5"):
    rows = [json.loads(line) for line in (here / f"{name}.jsonl").read_text().splitlines()]
    med = [r["median"] for r in rows]
    beyond = sorted(1 - r["median"] for r in rows if 1 - r["median"] > r["spread"])
    print(f"{name}: {len(rows)} confirmations, load {min(r['load'] for r in rows):.2f}-{max(r['load'] for r in rows):.2f}")
    print(f"  kept the candidate (TIE 2%): {sum(r['chosen'] != 'layers' for r in rows)}")
    print(f"  gain beyond the spread: {len(beyond)} ({', '.join(f'{g:.1%}' for g in beyond) or '-'})")
    print(f"  |median - 1|: median {statistics.median(abs(m - 1) for m in med):.1%}, max {max(abs(m - 1) for m in med):.1%}")
    print(f"  TPOT ratio median per confirmation: {min(r['tpot_med'] for r in rows):.3f}-{max(r['tpot_med'] for r in rows):.3f}; "
          f"TTFT: {min(r['ttft_med'] for r in rows):.3f}-{max(r['ttft_med'] for r in rows):.3f}")
