"""measure_compute of a 256x256 matmul when the link's round trip was measured slower than it runs now."""

import time

from oallama.cluster.probe import ProbeOptions, RpcClient, measure_compute, measure_link
from oallama.runtime import rpc

opts = ProbeOptions(
    matmul_k=256,
    matmul_m=256,
    tokens=(1, 16),
    samples=3,
    rtt_samples=10,
    warmup=1,
    payload_bytes=2**16,
    compute_target_s=0.2,
)
with rpc.start_server(threads=1) as srv, RpcClient(srv.endpoint, timeout=opts.timeout_s) as c:
    link = measure_link(c, opts, 0)
    print(f"measured rtt {link['rtt_s'] * 1e6:.0f} us, jitter {link['rtt_jitter_s'] * 1e6:.0f} us")
    for rtt in (link["rtt_s"], 2 * link["rtt_s"], 4 * link["rtt_s"]):
        t0 = time.perf_counter()
        out = measure_compute(c, opts, {**link, "rtt_s": rtt}, 0, lambda m: print(m, flush=True))
        print(f"rtt taken as {rtt * 1e6:.0f} us: {time.perf_counter() - t0:.1f} s", flush=True)
