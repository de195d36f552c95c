"""The request gate in front of llama_cpp.server's routes: clear errors, a bounded queue, drain.

llama_cpp.server serves one request at a time per model (its locks) but queues without bound, and
its error handler answers a malformed body with a 500 (or, for bad JSON, with a traceback). The
gate, an ASGI middleware just outside the routes, fixes both without touching them:

* a request body that is not JSON gets 400, one that its route's own request model
  (llama_cpp.server.types) refuses gets 422 naming the fields, an unknown model 404, embeddings or
  logprobs the loaded model cannot give 400 — OpenAI-style ``{"error": {"message", "type", "param",
  "code"}}``;
* the model's routes are admitted one at a time, first come first served (`Admission`); up to
  ``limit`` more wait, any further one gets 429 at once;
* on shutdown the request in flight finishes, waiting ones get 503 at once, and so do new ones.

Requests without a valid API key (when one is set) pass straight through: the routes answer 401
before they touch the model.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 32 * 2**20  # a request body larger than this gets 413
COPILOT_PATH = "/v1/engines/copilot-codex/completions"  # llama_cpp.server maps it to the default model


class Admission:
    """One request at a time, the others waiting in arrival order, at most `limit` of them.

    Lives on the server's event loop: every method is called from it (use
    ``loop.call_soon_threadsafe(admission.close)`` from a signal handler)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        self.closing = False
        self.counts: Counter[str] = Counter()  # admitted, busy, closing, invalid
        self._waiting: deque[asyncio.Future[bool]] = deque()
        self._idle_callbacks: list[Callable[[], None]] = []

    @property
    def waiting(self) -> int:
        return sum(1 for f in self._waiting if not f.done())

    def snapshot(self) -> dict[str, Any]:
        return {"active": self.active, "waiting": self.waiting, "queue_limit": self.limit,
                "shutting_down": self.closing, "counts": dict(self.counts)}

    async def acquire(self) -> str | None:
        """None once the caller holds the slot (it must `release` it), else why not: "busy" (the
        queue is full) or "closing" (the server is shutting down)."""
        if self.closing:
            self.counts["closing"] += 1
            return "closing"
        if self.active == 0 and not self._waiting:
            self.active = 1
            self.counts["admitted"] += 1
            return None
        if self.waiting >= self.limit:
            self.counts["busy"] += 1
            return "busy"
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        try:
            admitted = await fut
        except asyncio.CancelledError:
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled() and fut.result():
                self.release()  # handed the slot just as we were cancelled: pass it on
            raise
        finally:
            if fut in self._waiting:
                self._waiting.remove(fut)
        if not admitted:
            self.counts["closing"] += 1
            return "closing"
        self.counts["admitted"] += 1
        return None

    def release(self) -> None:
        """The slot's holder is done: hand it to the longest waiting request, if any."""
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():
                fut.set_result(True)  # active stays 1: the slot changes hands
                return
        self.active = 0
        if self.closing:
            self._fire_idle()

    def close(self) -> None:
        """Stop admitting: refuse every waiting request now, and any later one."""
        self.closing = True
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():
                fut.set_result(False)
        if self.active == 0:
            self._fire_idle()

    def on_idle_after_close(self, callback: Callable[[], None]) -> None:
        """Call `callback` once closed and nothing is in flight (at once if that is already so)."""
        self._idle_callbacks.append(callback)
        if self.closing and self.active == 0:
            self._fire_idle()

    def _fire_idle(self) -> None:
        callbacks, self._idle_callbacks = self._idle_callbacks, []
        for cb in callbacks:
            cb()


def error_body(message: str, *, type: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape (what the `openai` client reads into its exceptions)."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


async def send_json(send: Send, status: int, body: dict[str, Any],
                    headers: Iterable[tuple[str, str]] = ()) -> None:
    data = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the route the body already read, then the client's own messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _describe(err: ValidationError) -> tuple[str, str | None]:
    """'messages: Field required; temperature: Input should be ...' and the first field's name."""
    parts, first = [], None
    for e in err.errors():
        loc = ".".join(str(x) for x in e.get("loc", ()))
        first = first or (str(e["loc"][0]) if e.get("loc") else None)
        parts.append(f"{loc or 'body'}: {e.get('msg', 'invalid')}")
    return "; ".join(parts), first


class RequestGate:
    """ASGI middleware: validates the model routes' requests and admits them one at a time.

    routes: path -> the pydantic model of its JSON body (POST), or None for a GET route that
    takes the model lock (/v1/models). no_embeddings / no_logprobs: why the server cannot answer
    those (None: it can), told to the client as a 400 instead of the route's 500."""

    def __init__(self, app: ASGIApp, *, admission: Admission, routes: dict[str, type[BaseModel] | None],
                 model_names: Iterable[str], api_key: str | None, no_embeddings: str | None = None,
                 no_logprobs: str | None = None, max_body: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.admission = admission
        self.routes = routes
        self.model_names = sorted(model_names)
        self.no_embeddings = no_embeddings  # why /v1/embeddings is refused (None: served)
        self.no_logprobs = no_logprobs  # why requests for logprobs are refused (None: served)
        self.api_key = api_key
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, root = scope.get("path", ""), scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]  # the route's path behind a proxy (ServerSettings.root_path)
        if scope["type"] != "http" or path not in self.routes or not self._authorized(scope):
            await self.app(scope, receive, send)
            return
        schema = self.routes[path]
        if (scope["method"] != "POST") if schema is not None else (scope["method"] not in ("GET", "HEAD")):
            await self.app(scope, receive, send)  # the router answers 405
            return
        if schema is not None:
            body = await self._read_body(scope, receive, send)
            if body is None:
                return
            problem = self._check(path, schema, body)
            if problem is not None:
                self.admission.counts["invalid"] += 1
                status, payload = problem
                await send_json(send, status, payload)
                return
            receive = _replay(body, receive)
            # the body is JSON: say so to the route (FastAPI reads no JSON without the header)
            headers = [(k, v) for k, v in scope.get("headers", ()) if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        refusal = await self.admission.acquire()
        if refusal == "busy":
            await send_json(send, 429, error_body(
                f"server busy: one request is being served and {self.admission.limit} are waiting (the queue "
                "limit, oallama serve --queue); retry later", type="server_busy", code="queue_full"),
                headers=[("retry-after", "1")])
            return
        if refusal == "closing":
            await send_json(send, 503, error_body(
                "server shutting down: not taking new requests", type="server_unavailable", code="shutting_down"),
                headers=[("connection", "close")])
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.release()

    def _authorized(self, scope: Scope) -> bool:
        if self.api_key is None:
            return True
        header = dict(scope.get("headers", ())).get(b"authorization", b"").decode("latin-1")
        scheme, _, credentials = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip().encode(), self.api_key.encode())

    async def _read_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        too_big = error_body(f"request body over {self.max_body // 2**20} MiB", code="request_too_large")
        length = dict(scope.get("headers", ())).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            await send_json(send, 413, too_big)
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None  # the client is gone: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await send_json(send, 413, too_big)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _check(self, path: str, schema: type[BaseModel], body: bytes) -> tuple[int, dict[str, Any]] | None:
        """(status, error body) for a request the route must not see, else None."""
        try:
            doc = json.loads(body)
        except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8/16/32
            return 400, error_body(f"request body is not valid JSON: {e}", code="invalid_json")
        if not isinstance(doc, dict):
            return 400, error_body(f"request body must be a JSON object, not {type(doc).__name__}",
                                   code="invalid_json")
        try:
            req = schema.model_validate(doc)
        except ValidationError as e:
            message, param = _describe(e)
            return 422, error_body(f"invalid request: {message}", code="invalid_request", param=param)
        n = getattr(req, "n", None)
        if n is not None and n != 1:
            return 422, error_body(f"n={n}: this server returns one choice per request (n=1); send {n} requests",
                                   code="invalid_request", param="n")
        if getattr(req, "messages", None) == []:
            return 422, error_body("messages: at least one message is needed", code="invalid_request",
                                   param="messages")
        prompt = getattr(req, "prompt", None)
        if isinstance(prompt, list) and len(prompt) > 1:
            return 422, error_body(f"prompt: {len(prompt)} prompts in one request; this server takes one "
                                   "(send one request each)", code="invalid_request", param="prompt")
        model = getattr(req, "model", None)
        if path != COPILOT_PATH and model is not None and model not in self.model_names:
            served = ", ".join(f"'{m}'" for m in self.model_names)
            return 404, error_body(f"model '{model}' not found: this server serves {served} (GET /v1/models)",
                                   code="model_not_found", param="model")
        if path == "/v1/embeddings" and self.no_embeddings is not None:
            return 400, error_body(self.no_embeddings, code="embeddings_unavailable")
        logprobs = getattr(req, "logprobs", None)
        if self.no_logprobs is not None and (logprobs not in (None, False, 0) or getattr(req, "top_logprobs", None)):
            return 400, error_body(self.no_logprobs, code="logprobs_unavailable", param="logprobs")
        return None

