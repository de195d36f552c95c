"""python signatures.py MODEL.gguf: each weight signature's one-op timing (s) on the CPU and a loopback
rpc-server (1 thread each), as a first plan's profile takes them for a shape-only file (no
routing: the expert matmuls at the most experts only)."""
import sys
import time

from oallama.planner.cost import measure as M
from oallama.planner.cost.profile import DEFAULT_TOKENS, default_settings
from oallama.planner.graph import inventory
from oallama.runtime import rpc

orig = M._time_signature
def timed(d, sig, cols, *a, **k):
    t = time.perf_counter()
    orig(d, sig, cols, *a, **k)
    print(f"{time.perf_counter() - t:6.2f}s {d.name[:6]} {sig} {cols}", file=sys.stderr, flush=True)
M._time_signature = timed
t = time.perf_counter()
inv = inventory(sys.argv[1], sorted({*DEFAULT_TOKENS}), n_ctx=4096)
print(f"inventory {time.perf_counter() - t:.2f}", file=sys.stderr)
with rpc.start_server(threads=1) as s:
    st = default_settings(1, server_threads=1)
    t = time.perf_counter()
    M.measure(inv, ["CPU", s.device_name], st, progress=False, few=False)
    print(f"measure {time.perf_counter() - t:.2f}", file=sys.stderr)
