"""`oallama serve`: an OpenAI-compatible HTTP server over a placed model (issue 16).

llama-cpp-python's own server (``llama_cpp.server``) with the model loaded through oallama's
`Llama` (a plan file, or a plan made at start-up for a budget), a request gate in front of its
routes (clear errors, one request at a time with a bounded queue, a drain on SIGTERM), and two
routes of its own: ``/health`` and ``/placement``. ::

    oallama serve model.gguf --rpc-local --gpu-budget 50% --port 8000
    oallama serve model.gguf --placement plan.json --api-key "$KEY" --host 0.0.0.0

Modules: `options` (the command's options and checks; imports no server package), `gate` (the
ASGI request gate), `app` (loading and the app), `cli` (uvicorn, signals, the command). A sibling
feature: it imports the runtime and, to plan, the planner; only the cli imports it. Needs the
``serve`` extra (``pip install 'oallama[serve]'``).
"""

from __future__ import annotations

from .options import ServeError, ServeOptionError, ServeOptions, check_exposure

__all__ = ["ServeError", "ServeOptionError", "ServeOptions", "check_exposure"]
