"""What a decode pass sends a loopback rpc-server, per bench configuration: the server traced with
strace while 20 of the plan's 1-token passes run (after 32 tokens): commands per pass, the graph a
GRAPH_COMPUTE carries, and the server's time from a graph's arrival to its result leaving (us; strace
slows the syscalls, not the compute between them).

    python rpc_wire.py RESULTS_DIR CONFIG_ID [CONFIG_ID ...]
"""

from __future__ import annotations

import collections
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from oallama.planner.cost.realpass import timed_eval
from oallama.runtime.generate import prompt_tokens
from oallama.runtime.llama import Llama
from oallama.runtime.rpc import start_server

NAMES = {"\\6": "SET_TENSOR", "\\10": "GET_TENSOR", "\\n": "GRAPH_COMPUTE", "\\20": "GRAPH_RECOMPUTE"}
N = 10  # timed_eval calls; each runs two 1-token passes (the graph the timed one follows, and it)


def _us(line: str) -> float:
    h, m, s = line.split()[1].split(":")
    return (int(h) * 3600 + int(m) * 60 + float(s)) * 1e6


def main() -> int:
    d = Path(sys.argv[1])
    for cid in sys.argv[2:]:
        spec = json.loads((d / "raw" / f"{cid}.spec.json").read_text())
        text = Path(spec["plan_file"]).read_text()
        plan = json.loads(text)
        srv = start_server(threads=1)
        p = Path(f"/tmp/rpc-wire-{cid}.plan.json")
        p.write_text(text.replace(plan["accelerator"], srv.device_name))
        llm = Llama(
            spec["config"]["model"],
            placement=str(p),
            n_ctx=256,
            n_batch=64,
            n_ubatch=64,
            n_threads=1,
            n_threads_batch=1,
            verbose=False,
            seed=1234,
        )
        toks = prompt_tokens(llm, 64)
        timed_eval(llm, None, toks[:32], toks[32:33], [])
        out = Path(f"/tmp/rpc-wire-{cid}.strace")
        st = subprocess.Popen(
            ["strace", "-f", "-tt", "-p", str(srv.pid), "-e", "trace=network,read,write", "-o", str(out)],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)
        for _ in range(N):
            timed_eval(llm, None, toks[:32], toks[32:33], [])
        time.sleep(0.3)
        st.terminate()
        st.wait()
        lines = [ln.strip() for ln in out.read_text().splitlines()]
        cmds: collections.Counter[str] = collections.Counter()
        payload: dict[str, list[int]] = collections.defaultdict(list)
        served: dict[str, list[float]] = collections.defaultdict(list)
        for i, ln in enumerate(lines):
            m = re.search(r'recvfrom\(\d+, "(.*?)", 1, 0', ln)
            if not m or i + 2 >= len(lines):
                continue
            name = NAMES.get(m.group(1), m.group(1))
            cmds[name] += 1
            n = re.search(r"= (\d+)$", lines[i + 2])
            payload[name].append(int(n.group(1)) if n else 0)
            if name in ("GRAPH_COMPUTE", "GRAPH_RECOMPUTE"):  # to the next reply: the GET_TENSOR behind it
                j = next((k for k in range(i + 3, len(lines)) if "sendto" in lines[k]), None)
                if j is not None:
                    served[name].append(_us(lines[j]) - _us(lines[i + 2]))
        label = (
            f"{Path(spec['config']['model']).stem} {spec['config']['strategy']} @{spec['config']['budget']}"
        )
        print(f"{label} ({cid}), per 1-token pass:")
        for name, k in cmds.most_common():
            line = (
                f"  {name}: {k / N / 2:.1f}, payload median {statistics.median(payload[name]):.0f} B "
                f"({min(payload[name])}-{max(payload[name])})"
            )
            if served.get(name):
                line += (
                    f"; graph in -> result out on the server, median {statistics.median(served[name]):.0f} us"
                )
            print(line)
        llm.close()
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
