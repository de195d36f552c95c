"""Plan files as the runtime loads them, and the hook through which `Llama` asks for a plan.

The runtime knows no planner. A plan file is read through a small registry keyed by its
``schema``: each reader turns the document into a `LoadRequest` (which weight goes where, the
devices, ``n_gpu_layers``, per-weight streaming thresholds, extra llama_cpp.Llama arguments).
Strategies (``Llama(placement="optimal", gpu_budget="50%")``) are answered by a `Planner`
installed with `set_planner` — the top-level ``oallama`` package installs oallama's own planner
lazily, so importing the runtime never imports the planner::

    from oallama.runtime import planfile
    req = planfile.read("plan.json", model_info)      # LoadRequest, whichever planner wrote it
    planfile.register_reader("my.plan/1", my_reader)   # another plan format

Schemas read here: ``oallama.plan/1`` (`oallama plan`: one accelerator beside the CPU) and
``oallama.distplan/1`` (`oallama distribute`: blocks on several rpc-servers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .._files import read_json
from ..errors import OallamaError, PlanError
from ..options import option
from . import kvcache

if TYPE_CHECKING:
    from ..model.gguf_file import GGUFInfo

PLAN_SCHEMA = "oallama.plan/1"
DISTPLAN_SCHEMA = "oallama.distplan/1"
NEVER = 2**62  # a per-weight min batch meaning "never stream this weight's op" (patch 0001)


@dataclass
class LoadRequest:
    """What a placement argument resolves to, ready for the loader."""

    assignment: dict[str, str] | None = None  # weight -> device (None: no overrides)
    devices: list[str] | None = None
    n_gpu_layers: int | None = None
    offload_policy: dict[str, int] | None = None  # host weight -> min batch (patch 0001)
    plan: dict[str, Any] | None = None  # the plan document, when there is one
    raw_overrides: list[tuple[str, str]] | None = None  # patterns used as they are (llama.cpp's fit)
    llama_kwargs: dict[str, Any] | None = None  # further llama_cpp.Llama arguments the plan sets
    layouts: dict[str, str] | None = None  # host weight -> CPU layout (place.HOST_LAYOUT_NAMES)
    dual_max_batch: int | None = None  # CPU_REPACK_DUAL: below this batch, the repacked copy


Reader = Callable[[dict[str, Any], Path, "GGUFInfo | None"], "LoadRequest"]
_READERS: dict[str | None, Reader] = {}


def register_reader(schema: str | None, reader: Reader) -> None:
    """Read plan files whose ``schema`` is `schema` with `reader` (None: a bare placement file)."""
    _READERS[schema] = reader


def read_placement_file(path: str | Path) -> dict[str, Any]:
    """A placement or plan file (JSON with a "placement" mapping)."""
    p = Path(path)
    doc = read_json(p, "placement/plan file", PlanError)
    if not isinstance(doc, dict) or not isinstance(doc.get("placement"), dict):
        raise PlanError(f"{p}: expected a JSON object with a 'placement' mapping of weight name -> device")
    bad = next((w for w, d in doc["placement"].items() if not isinstance(d, str)), None)
    if bad is not None:
        raise PlanError(f"{p}: placement of '{bad}' is {doc['placement'][bad]!r}, not a device name")
    return doc


def check_model(doc: Mapping[str, Any], path: Path, model: GGUFInfo | None) -> None:
    """Refuse a plan made for another model (the plan's model identity vs the GGUF's)."""
    ident = doc["model"].get("identity") if isinstance(doc.get("model"), dict) else None
    if ident is not None and not isinstance(ident, str):
        raise PlanError(f"{path}: the plan's model identity is {ident!r}, not a string")
    if model is not None and ident and ident != model.identity():
        raise PlanError(f"{path}: plan was made for model '{doc['model'].get('name', '?')}' "
                        f"(identity {ident[:12]}), not {model.path.name} ({model.identity()[:12]})")


def read_document(path: str | Path, model: GGUFInfo | None = None, schema: str | None = None) -> dict[str, Any]:
    """A plan file's JSON, checked: a placement mapping, a known schema (or `schema` when
    given), and — given the model — that it was made for it."""
    p = Path(path)
    doc = read_placement_file(p)
    found = doc.get("schema")
    if schema is not None and found != schema:
        raise PlanError(f"{p}: schema {found!r}, expected {schema!r}")
    if not isinstance(found, str | None) or found not in _READERS:
        known = ", ".join(s for s in _READERS if s)
        raise PlanError(f"{p}: unsupported plan schema {found!r} (this oallama reads {known})")
    check_model(doc, p, model)
    return doc


def read(path: str | Path, model: GGUFInfo | None = None) -> LoadRequest:
    """The load request of a plan or placement file, through the reader of its schema."""
    doc = read_document(path, model)
    try:
        return _READERS[doc.get("schema")](doc, Path(path), model)
    except OallamaError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # a field of the wrong shape
        raise PlanError(f"{path}: malformed {doc.get('schema') or 'placement'} plan "
                        f"({type(e).__name__}: {e})") from None


def operator_plan_request(doc: dict[str, Any]) -> LoadRequest:
    """An ``oallama.plan/1`` document (also a plan made in this process) as a load request."""
    mode = doc.get("load", "overrides")
    policy = {w: (NEVER if b is None else int(b)) for w, b in (doc.get("offload_min_batch") or {}).items()}
    layouts = {str(w): str(b) for w, b in (doc.get("layouts") or {}).items()} or None
    dual = int(doc["dual_max_batch"]) if doc.get("dual_max_batch") else None
    # the attention the plan was costed with (a plan written before it recorded them: as loaded)
    s = doc.get("settings") or {}
    attention = (kvcache.llama_kwargs(bool(s["flash_attn"]), str(s.get("type_k", "f16")), str(s.get("type_v", "f16")))
                 if "flash_attn" in s else None)
    if int(s.get("n_seq_max", 1)) > 1:  # a plan for several sequences: their KV streams as planned
        attention = {**(attention or {}), "n_seq_max": int(s["n_seq_max"]), "kv_unified": bool(s.get("kv_unified"))}
    if mode == "fit":
        raw = [(str(a), str(b)) for a, b in doc.get("overrides") or []]
        return LoadRequest(None, doc.get("devices"), doc.get("n_gpu_layers"), policy or None, doc, raw,
                           llama_kwargs=attention, layouts=layouts, dual_max_batch=dual)
    return LoadRequest(None if mode == "n_gpu_layers" else dict(doc["placement"]), doc.get("devices"),
                       doc.get("n_gpu_layers"), policy or None, doc, llama_kwargs=attention, layouts=layouts,
                       dual_max_batch=dual)


def _read_placement(doc: dict[str, Any], path: Path, model: GGUFInfo | None) -> LoadRequest:
    return LoadRequest(dict(doc["placement"]), doc.get("devices"))


def _read_distributed(doc: dict[str, Any], path: Path, model: GGUFInfo | None) -> LoadRequest:
    if not isinstance(doc.get("model"), dict) or not isinstance(doc.get("devices"), list):
        raise PlanError(f"{path}: a distributed plan needs 'model' and 'devices'")
    load = dict(doc.get("load") or {})  # n_gpu_layers and tensor_split: the layer split
    return LoadRequest(dict(doc["placement"]), list(doc["devices"]), load.pop("n_gpu_layers", None),
                       plan=doc, llama_kwargs=load)


register_reader(None, _read_placement)
register_reader(PLAN_SCHEMA, lambda doc, path, model: operator_plan_request(doc))
register_reader(DISTPLAN_SCHEMA, _read_distributed)


# --- planning on request ------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfirmOptions:
    """How the `optimal` strategy's plan is confirmed by measurement (the planner's `confirm`): the
    shortlisted plans -- its best, llama.cpp's own placements for the budget, the next distinct ones
    -- loaded, run on the workload in alternated rounds, and the measured fastest kept (llama.cpp's
    unless another measured faster by more than the rounds' spread). Also the flags of `oallama plan`,
    `run` and `serve`; `Llama(confirm=...)` takes one, or False."""

    confirm: bool = option(True, off="--no-confirm", help="measure the shortlisted plans and keep the fastest "
                           "(--no-confirm: the predicted fastest)")
    confirm_time: float | None = option(None, minimum=0, help="seconds the confirmation may take, loads included",
                                        default_help="auto: 1.5x the time 3 rounds of the shortlist are estimated "
                                        "to take, 60-600 s")
    confirm_rounds: int = option(5, minimum=1, help="alternated rounds of the shortlisted plans, at most")
    confirm_steps: int = option(8, minimum=1, help="decode steps timed per round, after the workload's prompt")
    reconfirm: bool = option(False, help="measure again even where a cached confirmation matches")

    def __post_init__(self) -> None:
        if (self.confirm_time is not None and self.confirm_time < 0) or self.confirm_rounds < 1 or self.confirm_steps < 1:
            raise PlanError(f"confirmation: time {self.confirm_time} s, rounds {self.confirm_rounds} and steps "
                            f"{self.confirm_steps}: the time must be >= 0, rounds and steps >= 1")

    @staticmethod
    def of(value: Any) -> ConfirmOptions:
        """`Llama(confirm=...)`'s value: None (the defaults), a bool, a mapping of fields or ConfirmOptions."""
        if value is None or value is True:
            return ConfirmOptions()
        if value is False:
            return ConfirmOptions(confirm=False)
        if isinstance(value, ConfirmOptions):
            return value
        if isinstance(value, Mapping):
            return ConfirmOptions(**value)
        raise PlanError(f"confirm={value!r}: expected True, False, a mapping of ConfirmOptions' fields or "
                        "ConfirmOptions")


class Planner(Protocol):
    """Makes a plan document (``oallama.plan/1``) for a strategy and a budget. `confirm`: how the
    `optimal` plan is confirmed by measurement; `load`: the llama_cpp.Llama arguments the plan will
    be loaded with (the confirmation loads its candidates with them)."""

    @property
    def strategies(self) -> Sequence[str]: ...

    def __call__(self, model_path: Path, strategy: str, budget: str | int | None, *, device: str | None,
                 workload: Any, profile: Any, threads: int | None, op_offload: bool, n_ubatch: int,
                 progress: bool, host_budget: str | int | None = None, confirm: ConfirmOptions | None = None,
                 load: Mapping[str, Any] | None = None) -> dict[str, Any]: ...


_planner: Callable[[], Planner] | None = None


def set_planner(factory: Callable[[], Planner]) -> None:
    """Install the planner `Llama` asks for strategies (a factory, called on first use)."""
    global _planner
    _planner = factory


def planner() -> Planner:
    if _planner is None:
        raise PlanError("no planner is installed: placement strategies need oallama's planner "
                        "(import oallama, which installs it)")
    return _planner()
