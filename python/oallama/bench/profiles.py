"""The profiles a bench run costs its plans with: saved beside the results (profiles/<id>.json,
compact JSON that `planner.cost.profile.Profile.load` reads; the records' `profile_key` names the file),
and, with `--reprofile`, measured anew for the run instead of taken from the profile cache."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def measure(model: str, acc: str, n_ctx: int, threads: int, op_offload: bool, progress: bool,
            flash_attn: bool = False) -> Any:
    """--reprofile: the profile build_context would take from the cache, measured anew (and not
    cached)."""
    from ..planner.cost.measure import profile_model
    from ..planner.cost.profile import DEFAULT_TOKENS
    from ..planner.cost.schedmodel import HOST

    if progress:
        log(f"--reprofile: measuring the profile of {Path(model).name} afresh (n_ctx {n_ctx}, op offload "
            f"{'on' if op_offload else 'off'})")
    return profile_model(model, [HOST, acc], threads=threads, n_tokens=DEFAULT_TOKENS, n_ctx=n_ctx,
                         op_offload=op_offload, progress=progress, cache=False, flash_attn=flash_attn)


def save(out_dir: Path, profile: Any) -> str:
    """Save a profile the plans were costed with as out_dir/profiles/<id>.json; return its id:
    key[:16]; key[:16]-<created> when another measurement under the same key is already saved there
    (--reprofile, a cleared cache); key[:16]-<digest of its JSON> when the same measurement saved there
    has grown since (a decode tail timed for a later workload: `calibrate.with_decode_tail`), so that
    each row names the profile it was costed with."""
    pid = profile.key[:16]
    doc = profile.to_json()
    path = out_dir / "profiles" / f"{pid}.json"
    if path.exists():
        try:
            there = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            there = None
        if isinstance(there, dict) and there.get("created") == doc.get("created"):
            same = there == json.loads(json.dumps(doc))
            pid = pid if same else f"{pid}-{hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:8]}"
        else:
            pid = f"{pid}-{int(doc.get('created') or time.time())}"
        path = path.with_name(f"{pid}.json")
    if not path.exists():
        # compact (the planner's own save indents): a third smaller, to be committed with the results
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
        tmp.replace(path)
    return pid
