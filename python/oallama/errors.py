"""Exceptions raised by oallama. Each names the file, tensor, device or option at fault.

They subclass the builtin a caller would catch anyway (ValueError for bad input,
RuntimeError for a failing environment), so `except ValueError` keeps working.
"""

from __future__ import annotations


class OallamaError(Exception):
    """Base of every oallama error."""


class LibraryMismatchError(OallamaError, ImportError):
    """llama_cpp is (or would be) using other llama.cpp libraries than oallama's."""


class ModelFileError(OallamaError, ValueError):
    """A model file is missing, truncated, not GGUF, or of an unsupported architecture."""


class UnknownDeviceError(OallamaError, ValueError):
    """A device name that ggml does not know in this process."""


class PlacementError(OallamaError, ValueError):
    """A placement that cannot be applied to this model (unknown tensors, devices, ...)."""


class BudgetError(OallamaError, ValueError):
    """A memory budget that cannot be parsed or cannot be met."""


class PlanError(OallamaError, ValueError):
    """A plan file that is malformed or made for another model or other devices."""


class RpcServerError(OallamaError, RuntimeError):
    """An rpc-server that cannot be started or reached, or that died."""


class ClosedError(OallamaError, RuntimeError):
    """A native handle (model, context, session) used after its owner freed it, e.g. a closed Llama."""


class BuildConfigError(OallamaError, RuntimeError):
    """A feature the native build does not have (e.g. CUDA requested, built without it)."""


class ProfileError(OallamaError, RuntimeError):
    """An op could not be measured on a device."""


class CollectiveError(OallamaError, RuntimeError):
    """A collective operation, a rank process or a test-host network failed or timed out."""


class WeaverError(OallamaError, RuntimeError):
    """Weaver attention offload: a ring that cannot be created or reached, a closed receiver, or a
    broken protocol invariant (oallama.weaver)."""


class WeaverTimeoutError(WeaverError, TimeoutError):
    """A Weaver post (ring full) or wait (task not completed) that ran past its timeout."""


class WeaverTaskError(OallamaError, ValueError):
    """A Weaver task the receiver refused or failed (bad sequence or position, corrupt payload)."""


class InfeasiblePlanError(PlanError):
    """No assignment satisfies the constraints; the message names the binding one."""
