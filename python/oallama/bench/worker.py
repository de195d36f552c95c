"""One `oallama bench` configuration in its own fresh process:

    python -m oallama.bench.worker raw/<id>.spec.json

Loads the model with `Llama(placement=plan)` and the run's shared settings, does the discarded
warm-up runs and the timed ones, samples peak accelerator memory, and writes the raw result
(`raw/<id>.json`, atomically) that `oallama.bench` aggregates, with the 1-minute load average
after the timed runs (the parent recorded it before starting this process). A fresh process per
configuration keeps one placement's allocations, caches and ggml state out of the next one's figures.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from .._files import write_json
from ..runtime import devices as devmod


class _DeviceMemory:
    """Peak accelerator memory of this process's load, by the best source the device offers."""

    def __init__(self, acc: str, kind: str, server_pid: int | None) -> None:
        self.acc, self.kind, self.pid = acc, kind, server_pid
        self.base = 0
        self.samples: list[int] = []
        if kind in ("gpu", "igpu"):
            self.source = "ggml free-memory drop on the device (after load and after the runs)"
            self.base = self._free()
        elif kind == "rpc" and server_pid is not None and self._rss(server_pid) is not None:
            # reset the server's peak RSS (VmHWM) so that it covers this load only
            try:
                Path(f"/proc/{server_pid}/clear_refs").write_text("5")
                self.source = "rpc-server peak RSS (VmHWM) above its RSS before the load"
            except OSError:
                self.source = "rpc-server RSS above its RSS before the load (sampled)"
            self.base = self._rss(server_pid) or 0
        else:
            self.source = "none"

    def _free(self) -> int:
        return next((d.memory_free for d in devmod.list_devices() if d.name == self.acc), 0)

    @staticmethod
    def _rss(pid: int, field_name: str = "VmRSS") -> int | None:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * 1024  # kB -> bytes
        except OSError:
            return None
        return None

    def sample(self) -> None:
        if self.kind in ("gpu", "igpu"):
            self.samples.append(self.base - self._free())
        elif self.source != "none" and self.pid is not None:
            now = self._rss(self.pid) or 0
            hwm = self._rss(self.pid, "VmHWM") if "VmHWM" in self.source else None
            self.samples.append(max(now, hwm or 0) - self.base)

    def peak(self) -> int | None:
        return max(self.samples) if self.samples else None


def run_worker(spec_path: str) -> int:
    """Run the configuration described by SPEC (written by `bench._launch`); write its raw result."""
    from ..planner.cost import hostspeed
    from ..runtime.generate import prompt_tokens, timed_generate
    from ..runtime.llama import Llama

    spec = json.loads(Path(spec_path).read_text())
    cfg, st, meta = spec["config"], spec["config"]["settings"], spec["meta"]
    acc = json.loads(Path(spec["plan_file"]).read_text())["accelerator"]
    devmod.resolve(acc)  # registers an rpc-server before measuring it
    # the reference ops before the load: on an rpc-server they allocate (a 36 MiB weight), and the
    # device's peak memory below is reset, then measured, from the load on
    speed_before = hostspeed.measure_devices(st["threads"], acc)
    mem = _DeviceMemory(acc, meta["device_kind"], spec.get("server_pid"))
    t0 = time.perf_counter()
    llm = Llama(cfg["model"], placement=spec["plan_file"], n_ctx=cfg["n_ctx"], n_batch=st["n_batch"],
                n_ubatch=st["n_ubatch"], n_threads=st["threads"], n_threads_batch=st["threads"],
                flash_attn=st["flash_attn"], use_mmap=st["mmap"], op_offload=cfg["op_offload"], seed=1234,
                verbose=False)
    load_s = time.perf_counter() - t0
    mem.sample()
    placed = llm.tensor_placements()
    acc_bytes = sum(t.nbytes for t in placed if t.device == acc)
    buffer_bytes = llm.bytes_per_buffer_type()  # a streamed weight's copy rate depends on its memory
    plan_doc = json.loads(Path(spec["plan_file"]).read_text())
    want = plan_doc.get("placement") or {}
    got = llm.tensor_devices()
    # the plan's weight -> device (for layers and fit: where llama.cpp's own load puts them, as
    # the planner modelled it) against what this load reports
    mismatches = sorted(w for w, d in want.items() if w in got and got[w] != d)
    prompt = prompt_tokens(llm, cfg["prompt"])
    samples: dict[str, list[float]] = {"ttft_ms": [], "tpot_ms": [], "e2e_ms": []}
    warm: dict[str, list[float]] = {"ttft_ms": [], "tpot_ms": [], "e2e_ms": []}
    tokens: list[int] = []
    for rep in range(st["warmup"] + st["reps"]):
        g = timed_generate(llm, prompt, cfg["gen"], temperature=0.0)
        if len(g.tokens) != cfg["gen"]:
            raise RuntimeError(f"generated {len(g.tokens)} tokens, expected {cfg['gen']}")
        dst = warm if rep < st["warmup"] else samples
        dst["ttft_ms"].append(g.ttft_s * 1e3)
        dst["tpot_ms"].append(g.tpot_s * 1e3 if cfg["gen"] > 1 else 0.0)
        dst["e2e_ms"].append(g.e2e_s * 1e3)
        tokens = g.tokens
        mem.sample()
    speed_after = hostspeed.measure_devices(st["threads"], acc)  # after the last memory sample
    load_end = os.getloadavg()[0]  # 1-minute load average after the timed runs (the spec has the start's)
    # each device's speed around the timed runs against the profile's (> 1: faster than when profiled)
    speed_now = hostspeed.mean([speed_before, speed_after])
    speed_vs = hostspeed.ratios(spec["plan"].get("profile_host_speed"), speed_now)
    llm.close()
    result = {**spec, "status": "ok", "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_s": load_s, "samples": samples,
              "warmup_samples": warm, "prompt_tokens": len(prompt), "gen_tokens": cfg["gen"],
              "load_avg_end": load_end, "host_speed": {"reference": hostspeed.REF_DESCRIPTION, "before": speed_before,
                                                       "after": speed_after, "vs_profile": speed_vs,
                                                       "ops_vs_profile": hostspeed.op_ratios(
                                                           spec["plan"].get("profile_host_speed"), speed_now)},
              "tokens_sha": hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16],
              "memory": {"host_peak_bytes": devmod.peak_rss_bytes(),
                         "device_peak_bytes": mem.peak(), "device_source": mem.source,
                         "device_planned_bytes": spec["plan"]["memory"]["total"]},
              "placement": {"acc_weight_bytes": acc_bytes, "mismatches": mismatches[:20],
                            "n_mismatches": len(mismatches), "buffer_type_bytes": buffer_bytes}}
    write_json(Path(spec["result"]), result)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m oallama.bench.worker SPEC_JSON")
    sys.exit(run_worker(sys.argv[1]))
