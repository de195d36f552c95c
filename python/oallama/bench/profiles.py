"""The profiles a bench run costs its plans with: saved beside the results (profiles/<id>.json,
compact JSON that `planner.cost.profile.Profile.load` reads; the records' `profile_key` names the file),
and, with `--reprofile`, measured anew for the run instead of taken from the profile cache."""

from __future__ import annotations

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
    key[:16], or key[:16]-<created> when another measurement under the same key (--reprofile, a
    cleared cache) is already saved there."""
    pid = profile.key[:16]
    created = getattr(profile, "created", None)
    path = out_dir / "profiles" / f"{pid}.json"
    if path.exists():
        try:
            same = json.loads(path.read_text()).get("created") == created
        except (OSError, json.JSONDecodeError, AttributeError):
            same = False
        if same:
            return pid
        pid = f"{pid}-{int(created or time.time())}"
        path = path.with_name(f"{pid}.json")
    if not path.exists():
        # compact (the planner's own save indents): a third smaller, to be committed with the results
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(profile.to_json(), separators=(",", ":")) + "\n")
        tmp.replace(path)
    return pid
