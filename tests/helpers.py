"""Small helpers shared by test modules (pytest puts tests/ on sys.path)."""

from __future__ import annotations

import contextlib
import gc
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


def raises_cleanly(exc: type[Exception] | tuple[type[Exception], ...], match: str,
                   build: Callable[[], object]) -> str:
    """pytest.raises(exc, match=match) around build(); returns the message.

    A half-built object is collected inside, so that a failing __del__ (a refused model must
    leave nothing behind to free) fails this test and not a later one."""
    seen: list[Any] = []
    previous = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        with pytest.raises(exc, match=match) as info:
            build()
        message = str(info.value)
        del info
        gc.collect()
    finally:
        sys.unraisablehook = previous
    assert not seen, [f"{u.exc_type.__name__}: {u.exc_value} ({u.object!r})" for u in seen]
    return message


def closed_port(unregistered: bool = False) -> int:
    """A loopback port nothing listens on (bound, read, released). `unregistered`: also one no rpc
    device of this process names (ggml keeps every rpc device registered until exit, so a stopped
    server's port, handed out again by the kernel, would already be a known device)."""
    from oallama.runtime import devices

    known = {d.name for d in devices.list_devices()} if unregistered else set()
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if f"RPC[127.0.0.1:{port}]" not in known:
            return port
    raise AssertionError("no free loopback port outside this process's rpc devices")


def sched_model_mismatches(path: Any, acc: str, n_tokens: int, seed: str, trials: int = 6) -> list[str]:
    """Random placements of a 2-layer model's weights, KV layers and per-weight streaming thresholds
    on `acc`: the scheduler model's node -> device assignment against ggml's real scheduler. Returns
    one line per trial that disagreed (empty: the model is the scheduler, node for node)."""
    import random

    from oallama.planner.cost.schedmodel import HOST, NEVER, PassModel, Placement
    from oallama.planner.graph import GraphSession
    from oallama.runtime.place import compile_patterns, explicit

    kw = {"devices": [acc], "n_ctx": 256, "n_ubatch": 64}
    with GraphSession(path, **kw) as s:
        base = s.graph(n_tokens)
    with GraphSession(path, n_gpu_layers=3, **kw) as s:
        full = s.graph(n_tokens)
    pm = PassModel(base, None, acc, n_layer=2, full_graph=full)
    weights = sorted(pm.weights)
    rng = random.Random(seed)
    out = []
    for trial in range(trials):
        on = frozenset(w for w in weights if rng.random() < 0.5)
        policy = {w: rng.choice([1, 16, NEVER]) for w in weights if w not in on and rng.random() < 0.7}
        p = Placement(on, [0, 1, 2][trial % 3], policy)
        assign = {w: (acc if w in on else HOST) for w in weights}
        # as oallama's load compiles it (a tied embedding's input copy stays on the host)
        with GraphSession(path, overrides=compile_patterns(explicit(assign, p.n_gpu_layers, 2, output_device=acc)),
                          offload_policy=policy,
                          n_gpu_layers=p.n_gpu_layers, **kw) as s:
            real = s.graph(n_tokens)
        model_dev = pm.assign(p)
        wrong = [(real.nodes[i].name, real.nodes[i].op, real.nodes[i].backend) for i in pm.order
                 if (real.nodes[i].backend == acc) != model_dev[i]]
        if wrong:
            out.append(f"trial {trial} ({p.kv_layers} kv layers): {wrong[:5]}")
    return out


# --- loading many (possibly hostile) model files in a child process -------------------------------

_LOAD_WORKER = r"""
import json, sys
from oallama import Llama, OallamaError
jobs = json.load(open(sys.argv[1]))
kw = json.loads(sys.argv[2])
def say(*row):
    sys.stdout.write("@@" + json.dumps(row) + "\n")
    sys.stdout.flush()
for path, extra in jobs:
    say("start", path)
    try:
        Llama(path, **kw, **extra).close()
        say("ok", path, "", "", True)
    except Exception as e:
        say("error", path, type(e).__name__, str(e), isinstance(e, OallamaError))
"""


@dataclass(frozen=True)
class LoadOutcome:
    """What `oallama.Llama(path)` did in a child process: "ok", "error" (a Python exception:
    its class name, message, and whether it is an oallama error), "crash" (the process died:
    message = its exit status and the end of its stderr) or "timeout"."""

    kind: str
    error: str = ""
    message: str = ""
    oallama: bool = True


def load_batch(jobs: list[tuple[Path, dict[str, Any]]], timeout_s: float = 60.0,
               **llama_kw: Any) -> dict[str, LoadOutcome]:
    """Load every (path, extra Llama kwargs) in one child Python process (several when one dies:
    the input that killed it is reported as a crash and the rest go on in a new one), so that a
    native abort in llama.cpp cannot take the test process down. Keyed by str(path)."""
    import json
    import subprocess
    import tempfile

    kw = {"n_ctx": 64, "n_batch": 64, "n_threads": 1, "verbose": False, **llama_kw}
    todo = [(str(p), extra) for p, extra in jobs]
    out: dict[str, LoadOutcome] = {}
    while todo:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(todo, f)
        try:
            proc = subprocess.run([sys.executable, "-c", _LOAD_WORKER, f.name, json.dumps(kw)], capture_output=True,
                                  text=True, errors="replace", timeout=timeout_s)
            rc, stdout, stderr, timed_out = proc.returncode, proc.stdout, proc.stderr, False
        except subprocess.TimeoutExpired as e:
            rc, timed_out = -1, True
            stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        finally:
            Path(f.name).unlink()
        started = None
        for line in stdout.splitlines():
            if not line.startswith("@@"):
                continue
            row = json.loads(line[2:])
            if row[0] == "start":
                started = row[1]
            else:
                out[row[1]] = LoadOutcome(row[0], row[2], row[3], row[4])
                started = None
        if started is not None:  # the child died (or hung) on this input
            tail = "\n".join(stderr.strip().splitlines()[-5:])
            out[started] = LoadOutcome("timeout" if timed_out else "crash", "", f"exit status {rc}: {tail}", False)
        remaining = [(p, extra) for p, extra in todo if p not in out]
        if remaining and started is None:  # died before its first input: a broken environment
            raise RuntimeError(f"load worker exited with {rc} before loading anything:\n{stderr[-2000:]}")
        todo = remaining
    return out


@contextlib.contextmanager
def stock_server(args: list[str], log: Path, timeout_s: float = 120.0) -> Iterator[str]:
    """oallama's stock llama-server (built from the same patched tree) run with `args` on a free
    loopback port, its log in `log`; yields its base URL once /health answers."""
    import subprocess
    import time
    import urllib.request

    from oallama import _libs

    port = closed_port()
    cmd = [str(_libs.tool_path("llama-server")), *args, "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:  # a file, not a pipe: a full pipe would stall the server's logging
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"llama-server exited with {proc.returncode}: "
                                     f"{log.read_bytes()[-2000:].decode(errors='replace')}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"llama-server not ready in {timeout_s} s: {' '.join(cmd)}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def post_json(url: str, doc: dict[str, Any], timeout_s: float = 120.0) -> dict[str, Any]:
    import json
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.load(r)


def stock_placement(log: str, tensor_names: list[str], n_layer: int) -> dict[str, str]:
    """weight -> device (or buffer type) of a stock llama.cpp load, from its verbose log: its
    '-ot' matches ("tensor X (...) buffer type overridden to B"), else its layer's device ("layer N
    assigned to device D"; the output layer is N = n_layer, the input embedding stays on the CPU)."""
    import re

    layers = {int(m[1]): m[2] for m in re.finditer(r"layer +(\d+) assigned to device (\S+?),", log)}
    overridden = {m[1]: m[2] for m in re.finditer(r"tensor (\S+) \(.*?\) buffer type overridden to (\S+)", log)}
    out = {}
    for name in tensor_names:
        if name in overridden:
            out[name] = overridden[name]
        elif m := re.match(r"blk\.(\d+)\.", name):
            out[name] = layers[int(m[1])]
        else:
            out[name] = "CPU" if name.startswith("token_embd") else layers[n_layer]
    return out


def stock_context(log: str) -> dict[str, str]:
    """The context a stock llama.cpp load ran with, from its log: llama_context's n_ctx, n_ctx_seq,
    n_batch, n_ubatch, n_seq_max, kv_unified and flash_attn lines, and the KV cache's K and V types
    (the first cache's)."""
    import re

    out = {m[1]: m[2] for m in re.finditer(
        r"llama_context: (n_ctx|n_ctx_seq|n_batch|n_ubatch|n_seq_max|kv_unified|flash_attn) += (\S+)", log)}
    if m := re.search(r"K \((\w+)\): .*?, V \((\w+)\)", log):
        out["type_k"], out["type_v"] = m[1], m[2]
    return out


def stock_memory(log: str, device: str) -> dict[str, int]:
    """Bytes a stock llama.cpp load put on `device` (its name as the log prints it, e.g. "Vulkan0";
    "RPC0" matches "RPC0[host:port]"), from its log: weights ("model"), KV cache ("context") and
    compute buffers, as a plan's `memory` counts them. The log rounds each to 0.01 MiB."""
    import re

    kinds = {"model": "model", "KV": "context", "compute": "compute"}
    out = dict.fromkeys(kinds.values(), 0)
    for m in re.finditer(rf"\w+: +{re.escape(device)}(?:\[[^\]]*\])? (model|KV|compute) buffer size = +([\d.]+) MiB", log):
        out[kinds[m[1]]] += round(float(m[2]) * 2**20)
    return out


def assert_memory_as_planned(plan: Any, log: str, device: str) -> None:
    """The stock load's bytes on `device` within 2% of the plan's (or the log's 0.01 MiB rounding):
    of the plan's own load, or, where the stock command cannot stream as planned, of the stock load
    the plan measured (`Plan.stock_memory`)."""
    got = stock_memory(log, device)
    for kind, planned in got.items():
        want = plan.stock_memory[kind]
        assert abs(planned - want) <= max(0.02 * want, 0.005 * 2**20 + 1), (kind, "stock", planned, "planned", want)


def planned_context(plan: Any) -> dict[str, str]:
    """What `stock_context` should read for a plan's emitted command (planner.plan.Plan.stock_settings)."""
    s = plan.settings
    n_seq, unified = int(s.get("n_seq_max", 1)), bool(s.get("kv_unified"))
    return {"n_ctx": str(s["n_ctx"]), "n_ctx_seq": str(int(s["n_ctx"]) // (1 if unified else n_seq)),
            "n_batch": str(s["n_ubatch"]), "n_ubatch": str(s["n_ubatch"]), "n_seq_max": str(n_seq),
            "kv_unified": "true" if unified else "false",
            "flash_attn": "enabled" if s["flash_attn"] else "disabled", "type_k": s.get("type_k", "f16"),
            "type_v": s.get("type_v", "f16")}


def greedy_tokens(llm: Any, prompt: str, n: int) -> list[int]:
    """The first `n` greedily generated token ids after `prompt` (with BOS), as llama-server's
    /completion returns them with "return_tokens" (text would differ at a split UTF-8 character)."""
    out: list[int] = []
    for tok in llm.generate(llm.tokenize(prompt.encode(), add_bos=True), temp=0.0, repeat_penalty=1.0):
        if tok == llm.token_eos() or len(out) == n:
            break
        out.append(tok)
    return out
