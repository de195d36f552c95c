#!/usr/bin/env python3
"""One header's first read (a parse) against its reads again (the blake2b check), in one process.

    python reread.py MODEL.gguf > reread.txt
"""
import statistics
import sys
import time

import oallama  # noqa: F401
from oallama.model import gguf_file

path = sys.argv[1]
t0 = time.perf_counter()
info = gguf_file.read(path)
first = time.perf_counter() - t0
again = []
for _ in range(11):
    t0 = time.perf_counter()
    gguf_file.read(path)
    again.append(time.perf_counter() - t0)
print(f"{path.rsplit('/', 1)[-1]}: header {info.data_offset} bytes; first read {first * 1e3:.1f} ms, "
      f"read again median {statistics.median(again) * 1e3:.1f} ms ({min(again) * 1e3:.1f}-{max(again) * 1e3:.1f}, 11 reads)")
