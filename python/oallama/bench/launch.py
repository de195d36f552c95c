"""One benchmark configuration run in a fresh process (`oallama.bench.worker`), and its files.

A configuration can be measured in several rounds (`oallama bench --rounds N`: the whole grid
once per round, so that one configuration's processes run minutes apart). Its files in round r,
under the results directory's raw/ (round 1 has no suffix: a run without --rounds is round 1):

    <stem>.spec.json    what the worker was asked to run (config, settings, plan summary, round)
    <stem>.plan.json    the plan file it loaded
    <stem>.json         its result; present = finished (written atomically)
    <stem>.failed.json  why it failed, when it did
    <stem>.log          its stderr

with stem = <id> in round 1 and <id>.r<r> after it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .._files import write_json
from . import accuracy

RAW_SCHEMA = "oallama.bench.raw/1"

__all__ = ["RAW_SCHEMA", "is_finished", "launch", "raw_stem"]


def raw_stem(cid: str, rnd: int = 1) -> str:
    """The name a configuration's files have in round `rnd` (see the module docstring)."""
    if rnd < 1:
        raise ValueError(f"round {rnd}: rounds count from 1")
    return cid if rnd == 1 else f"{cid}.r{rnd}"


def is_finished(raw_dir: Path, cid: str, rnd: int = 1) -> bool:
    p = raw_dir / f"{raw_stem(cid, rnd)}.json"
    if not p.exists():
        return False
    try:
        return json.loads(p.read_text()).get("status") == "ok"
    except (OSError, json.JSONDecodeError):
        return False


def launch(raw_dir: Path, cid: str, rnd: int, *, config: dict[str, Any], plan: Any, plan_doc: dict[str, Any],
           meta: dict[str, Any], server_pid: int | None, profile_key: str, timeout_s: float,
           deadline: float | None) -> str | None:
    """Run configuration `cid` (its `config` doc, its `plan`) in a fresh process, as round `rnd`;
    None on success, else an error ("deadline": the time limit stopped it). timeout_s: seconds the
    worker may take; deadline: time.monotonic() at which the run stops."""
    stem = raw_stem(cid, rnd)
    plan_path = raw_dir / f"{stem}.plan.json"
    plan.save(plan_path)
    if not config["op_offload"]:
        # without op offload nothing streams; "never stream" entries (null) would only make
        # Llama() refuse the plan (it refuses any per-weight policy when op_offload=False)
        doc = json.loads(plan_path.read_text())
        doc["offload_min_batch"] = {w: b for w, b in (doc.get("offload_min_batch") or {}).items() if b is not None}
        write_json(plan_path, doc)
    spec = {"schema": RAW_SCHEMA, "id": cid, "round": rnd, "config": config, "meta": meta,
            "plan_file": str(plan_path), "plan": plan_doc, "server_pid": server_pid,
            "result": str(raw_dir / f"{stem}.json"), "profile_key": profile_key,
            "placement_key": accuracy.placement_key(json.loads(plan_path.read_text())),
            "load_avg_start": os.getloadavg()[0]}
    spec_path = raw_dir / f"{stem}.spec.json"
    write_json(spec_path, spec)
    failed = raw_dir / f"{stem}.failed.json"
    with contextlib.suppress(OSError):
        failed.unlink()
    timeout = timeout_s
    if deadline is not None:
        timeout = min(timeout, max(deadline - time.monotonic(), 1.0))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log_path = raw_dir / f"{stem}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "oallama.bench.worker", str(spec_path)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            if deadline is not None and time.monotonic() >= deadline - 1.0 and timeout < timeout_s:
                return "deadline"
            err = f"timed out after {timeout:.0f} s"
            write_json(failed, {"schema": RAW_SCHEMA, "id": cid, "round": rnd, "status": "failed",
                                "config": config, "error": err})
            return err
        except BaseException:
            proc.kill()  # Ctrl-C: no result is written, the configuration reruns next time
            proc.wait()
            raise
    if rc == 0 and is_finished(raw_dir, cid, rnd):
        return None
    tail = log_path.read_bytes()[-1500:].decode(errors="replace").strip()
    err = f"worker exited with code {rc}: {tail.splitlines()[-1] if tail else 'no output'}"
    write_json(failed, {"schema": RAW_SCHEMA, "id": cid, "round": rnd, "status": "failed", "config": config,
                        "error": err, "log_tail": tail})
    return err
