"""oallama: llama.cpp made operator-aware.

Importing oallama points llama-cpp-python at oallama's own llama.cpp build (see _libs), so
import it before anything imports ``llama_cpp``::

    from oallama import Llama
    llm = Llama("model.gguf", devices=["CPU", "CUDA0"], placement={"blk.0.ffn_up.weight": "CUDA0"})
    print(llm.tensor_devices()["blk.0.ffn_up.weight"])   # "CUDA0", read back from the model
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _libs
from ._version import __version__
from .errors import (
    BudgetError,
    LibraryMismatchError,
    ModelFileError,
    OallamaError,
    PlacementError,
    PlanError,
    ProfileError,
    RpcServerError,
    UnknownDeviceError,
)
from .runtime import planfile as _planfile

_libs.configure_llama_cpp()


def _planner() -> Any:
    # the composition root: the runtime asks for plans, oallama's planner makes them (imported
    # on first use, so `import oallama` stays light and the runtime never imports the planner)
    from .planner.plan import LoadPlanner

    return LoadPlanner()


_planfile.set_planner(_planner)


if TYPE_CHECKING:
    from .runtime.llama import Llama

__all__ = [
    "BudgetError",
    "LibraryMismatchError",
    "Llama",
    "ModelFileError",
    "OallamaError",
    "PlacementError",
    "PlanError",
    "ProfileError",
    "RpcServerError",
    "UnknownDeviceError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # Llama pulls in llama_cpp (and its libraries); load it on first use only
    if name == "Llama":
        from .runtime.llama import Llama

        return Llama
    raise AttributeError(f"module 'oallama' has no attribute {name!r}")
