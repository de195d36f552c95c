import statistics
import sys

sys.path.insert(0, "bench/scripts")
from pathlib import Path

import netns_hosts
from oallama import collective as C

topo = C.Topology.uniform(2, 1)
sizes = "32768,262144,1048576"
for pb in [0, 262144, 65536]:
    res = []
    for rep in range(2):
        hosts = netns_hosts.Hosts(2, netns_hosts.LinkOptions(rate="1gbit", delay_ms=0.2))
        hosts.up()
        try:
            r = C.selftest(
                topo,
                Path(f"/tmp/ard/pipe-{pb}-{rep}"),
                sizes=sizes,
                iters=9,
                count_n=3072,
                check_sizes="1000",
                timeout_s=600,
                pipeline_bytes=pb,
                netns=hosts.namespaces,
                ifnames=hosts.ifnames,
                master_addr=hosts.addrs[0],
            )[0]
        finally:
            hosts.down()
        res.append(r)
    for n in sizes.split(","):
        t = {
            a: statistics.median(x["algorithms"][a]["seconds_per_call"][n] for x in res) * 1e3
            for a in C.ALGORITHMS
        }
        print(
            f"pipeline_bytes={pb} n={int(n) * 4 // 1024}KiB tree {t['tree']:.2f} ring {t['ring']:.2f} star {t['star']:.2f} tree/ring {t['tree'] / t['ring']:.2f}",
            flush=True,
        )
