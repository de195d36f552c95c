"""`oallama serve`: the real server process (llama_cpp.server over oallama's placed Llama) on a free
port, spoken to with the official `openai` client (raw HTTP only where a client would not send
it: bad JSON), its second device a real loopback rpc-server.

Deterministic by construction: a request is held in flight for as long as a test needs by stopping
(SIGSTOP) the rpc-server that holds some of the model's weights (the model cannot take a step until
it is continued), and every wait is a bounded poll of the server's /health. Every process is
stopped in a finally (SIGTERM, then SIGKILL after a bound, children included).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

from oallama import Llama
from oallama.runtime import rpc
from oallama.serve import ServeOptionError, ServeOptions, check_exposure
from oallama.serve.options import API_KEY_ENV

ALIAS = "tiny"
KEY = "test-key"
WAIT_S = 180.0  # bound on any one wait for the server (start-up on a busy 2-core machine included)
FFN = re.compile(r"^(blk\.\d+\.ffn_(up|gate|down)\.weight|output\.weight)$")


# --- the server process -------------------------------------------------------------------------


def _poll(what: str, check: Callable[[], bool], proc: ServerProcess | None = None, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc is not None and proc.proc.poll() is not None:
            pytest.fail(f"server exited ({proc.proc.returncode}) while waiting for {what}; log:\n{proc.log()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:.0f} s" + (f"; log:\n{proc.log()}" if proc else ""))
        time.sleep(0.02)


class ServerProcess:
    """`python -m oallama serve MODEL --port 0 ARGS...`, its log in a file."""

    def __init__(self, model: Path, args: list[str], log_path: Path, api_key: str | None = None) -> None:
        self.api_key = api_key
        self.log_path = log_path
        # the options say it all: no API key or llama_cpp.server config file from this environment
        env = {k: v for k, v in os.environ.items() if k not in (API_KEY_ENV, "CONFIG_FILE")}
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "oallama", "serve", str(model), "--port", "0", *args],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=env)
        self.url = ""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> ServerProcess:
        found: list[str] = []

        def listening() -> bool:
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+) \(", self.log())  # the whole line is there
            if m:
                found.append(m[1])
            return bool(m)

        _poll("'listening on' line", listening, self)
        self.url = found[0]
        _poll("healthy /health", lambda: self.health()[0] == 200, self)
        return self

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            with e:
                return e.code, json.loads(e.read() or b"null")

    def health(self) -> tuple[int, Any]:
        try:
            return self.request("GET", "/health")
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, None

    def wait_queue(self, active: int, waiting: int) -> None:
        def there() -> bool:
            status, body = self.health()
            return status == 200 and body["active"] == active and body["waiting"] == waiting

        _poll(f"{active} request(s) in flight and {waiting} waiting", there, self)

    def client(self, api_key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key or self.api_key or "none",
                             max_retries=0, timeout=WAIT_S)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL (with its children: an rpc-server it started) after a bound."""
        if self.proc.poll() is None:
            try:
                children = psutil.Process(self.proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                children = []
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
                for child in children:
                    if child.is_running():
                        child.kill()


def _hand_placement(model: Path, device: str, path: Path) -> Path:
    from oallama.model import gguf_file

    names = [t.name for t in gguf_file.check_model(model).tensors]
    path.write_text(json.dumps({"placement": {n: device for n in names if FFN.match(n)}}))
    return path


class Held:
    """The rpc-server stopped (SIGSTOP) for the block: whatever the model does next waits."""

    def __init__(self, server: rpc.RpcServer) -> None:
        self.server = server

    def __enter__(self) -> Held:
        os.kill(self.server.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc: object) -> None:
        os.kill(self.server.pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def rpc_a() -> Iterator[rpc.RpcServer]:
    with rpc.start_server(threads=1) as server:  # our own: an rpc-server serves one client at a time
        try:
            yield server
        finally:
            os.kill(server.pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def served(tiny_q8: Path, rpc_a: rpc.RpcServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """tiny q8_0, its feed-forward weights and output head on the rpc-server (a hand placement
    file), with an API key, embeddings (mean pooling) and a queue of 5."""
    tmp = tmp_path_factory.mktemp("serve")
    plan = _hand_placement(tiny_q8, rpc_a.device_name, tmp / "placement.json")
    server = ServerProcess(tiny_q8, ["--devices", f"CPU,{rpc_a.device_name}", "--placement", str(plan),
                                     "--alias", ALIAS, "--api-key", KEY, "--embedding", "--pooling", "mean",
                                     "--queue", "5", "--ctx", "512", "--threads", "1"],
                           tmp / "server.log", api_key=KEY)
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def reference(tiny_q8: Path) -> Iterator[Llama]:
    """The same model in this process, on the CPU: what llama-cpp-python itself makes of a prompt."""
    llm = Llama(str(tiny_q8), n_ctx=512, n_threads=1, verbose=False)
    try:
        yield llm
    finally:
        llm.close()


def _chat(client: openai.OpenAI, content: str, n: int = 6, **kw: Any) -> Any:
    return client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": content}],
                                          max_tokens=n, temperature=0, extra_body={"min_tokens": n}, **kw)


# --- options (no server) ------------------------------------------------------------------------


@pytest.mark.parametrize(("host", "api_key", "warns"), [
    ("127.0.0.1", None, False), ("::1", None, False), ("localhost", None, False),
    ("0.0.0.0", None, True), ("192.168.1.5", None, True), ("0.0.0.0", "k", False),
])
def test_exposure_warns_off_loopback_without_a_key(host: str, api_key: str | None, warns: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    opts = ServeOptions(Path("m.gguf"), host=host, api_key=api_key)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        text = check_exposure(opts)
    assert [str(w.message) for w in seen] == ([text] if warns else [])
    assert all(w.category is RuntimeWarning for w in seen)
    if warns:
        assert text is not None and host in text and "--api-key" in text


@pytest.mark.parametrize(("options", "match"), [
    ({"port": 70000}, r"--port 70000: not a TCP port"),
    ({"placement": "p.json", "gpu_budget": "50%"}, r"--placement and --gpu-budget: give one"),
    ({"queue": -1}, r"--queue -1: must be at least 0"),
    ({"api_key": " "}, r"--api-key: empty"),
    ({"settings": "{bad"}, r"--settings: not valid JSON"),
    ({"settings": '{"host": "0.0.0.0", "n_ctx": 9}'}, r"--settings: host, n_ctx are set by host: --host; n_ctx: --ctx"),
    ({"settings": "[1]"}, r"--settings: expected an object of llama_cpp.server settings, got list"),
    ({"settings": "missing.yaml"}, r"--settings 'missing.yaml': neither a JSON object nor an existing file"),
    ({"settings": '{"n_batchh": 1}'}, r"--settings: unknown llama_cpp.server setting\(s\) n_batchh"),
    ({"settings": '{"n_batch": "many"}'}, r"--settings: n_batch: Input should be a valid integer"),
], ids=["port", "placement-and-budget", "queue", "api-key", "settings-json", "settings-owned", "settings-list",
        "settings-file", "settings-unknown", "settings-type"])
def test_bad_options_are_refused_naming_the_option(options: dict[str, Any], match: str) -> None:
    from oallama.serve.app import build_settings

    with pytest.raises(ServeOptionError, match=match):
        build_settings(ServeOptions(Path("m.gguf"), **options))


@pytest.mark.parametrize("case", ["port-in-use", "missing-model"])
def test_start_up_failure_is_a_clear_error(case: str, tiny_q8: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        model, expect = {"port-in-use": (tiny_q8, rf"--host 127\.0\.0\.1 --port {port}: cannot listen there"),
                         "missing-model": (tmp_path / "nope.gguf", r"nope\.gguf")}[case]
        args = ["--port", str(port)] if case == "port-in-use" else ["--port", "0"]
        proc = subprocess.run([sys.executable, "-m", "oallama", "serve", str(model), *args],
                              capture_output=True, text=True, timeout=WAIT_S, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert re.search(r"oallama serve: error: .*" + expect, proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr


# --- one placed server ------------------------------------------------------------------------


def test_start_up_log_says_where_the_model_went(served: ServerProcess, rpc_a: rpc.RpcServer) -> None:
    log = served.log()
    assert re.search(r"placed 26 weights \([\d.]+ MiB\) on CPU$", log, re.M), log
    assert re.search(rf"placed 13 weights \([\d.]+ MiB\) on {re.escape(rpc_a.device_name)}$", log, re.M), log
    assert f"model '{ALIAS}' listening on {served.url}" in log


def test_placement_is_read_back_from_the_loaded_model(served: ServerProcess, rpc_a: rpc.RpcServer) -> None:
    status, body = served.request("GET", "/placement", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200, body
    tensors = body["tensors"]
    assert len(tensors) == 39
    assert {n for n, d in tensors.items() if d == rpc_a.device_name} == {n for n in tensors if FFN.match(n)}
    assert {d for n, d in tensors.items() if not FFN.match(n)} == {"CPU"}
    assert {d: v["tensors"] for d, v in body["devices"].items()} == {"CPU": 26, rpc_a.device_name: 13}
    assert body["model"] == ALIAS and (body["plan"] or {}).get("predicted") is None  # placed by hand: no plan


@pytest.mark.parametrize(("path", "key", "status"), [
    ("/placement", None, 401), ("/placement", "wrong", 401), ("/v1/models", "wrong", 401),
    ("/health", None, 200), ("/v1/models", KEY, 200),
])
def test_api_key_guards_the_api_not_health(served: ServerProcess, path: str, key: str | None, status: int) -> None:
    got, body = served.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
    assert got == status, body


def test_models_lists_the_alias(served: ServerProcess) -> None:
    assert [m.id for m in served.client().models.list()] == [ALIAS]
    # and how it formats chats: the tiny model's GGUF has a chat template, so nothing to warn of
    status, body = served.request("GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200 and body["data"][0]["chat_template"] is True and "warning" not in body["data"][0]


@pytest.mark.parametrize(("chat_format", "warned"), [(None, True), ("chatml", False)])
def test_a_model_without_a_chat_template_is_reported(gemma3_270m: Path, chat_format: str | None,
                                                     warned: bool) -> None:
    from oallama.serve.app import build_settings, chat_report

    _, settings, _ = build_settings(ServeOptions(model=gemma3_270m, chat_format=chat_format))
    llm = Llama(str(gemma3_270m), chat_format=chat_format, n_ctx=256, verbose=False)
    try:
        chat = chat_report(llm, settings)
    finally:
        llm.close()
    assert chat["template"] is False  # the registry's Gemma 3 270M is a base model
    assert (chat["warning"] is not None) == warned
    if warned:
        assert chat["format"] == "llama-2" and "--chat-format" in chat["warning"] and str(gemma3_270m) in chat["warning"]


def test_chat_uses_the_ggufs_chat_template(served: ServerProcess, reference: Llama) -> None:
    messages: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    out = served.client().chat.completions.create(model=ALIAS, messages=messages, max_tokens=6, temperature=0,
                                                  extra_body={"min_tokens": 6})
    want = reference.create_chat_completion(messages=messages, max_tokens=1)
    assert out.usage is not None and out.usage.prompt_tokens == want["usage"]["prompt_tokens"]
    assert out.usage.completion_tokens == 6 and out.choices[0].finish_reason == "length"
    assert out.model == ALIAS and out.choices[0].message.role == "assistant"
    assert isinstance(out.choices[0].message.content, str) and out.choices[0].message.content


def test_chat_streams_to_its_end(served: ServerProcess) -> None:
    chunks = list(_chat(served.client(), "Tell me a story", n=8, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert 1 <= len(texts) <= 8 and "".join(texts)
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]


@pytest.mark.parametrize("stream", [False, True])
def test_completion(served: ServerProcess, reference: Llama, stream: bool) -> None:
    prompt = "The quick brown fox"
    client = served.client()
    kw: dict[str, Any] = {"model": ALIAS, "prompt": prompt, "max_tokens": 6, "temperature": 0,
                          "extra_body": {"min_tokens": 6}}
    if not stream:
        out = client.completions.create(**kw)
        assert out.usage is not None and out.usage.completion_tokens == 6
        assert out.usage.prompt_tokens == len(reference.tokenize(prompt.encode(), add_bos=True))
        assert out.choices[0].finish_reason == "length" and out.choices[0].text
    else:
        chunks = list(client.completions.create(stream=True, **kw))
        assert 1 <= sum(1 for c in chunks if c.choices[0].text) <= 6
        assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize("inputs", [["hello world"], ["hello world", "the quick brown fox"]])
def test_embeddings(served: ServerProcess, reference: Llama, inputs: list[str]) -> None:
    out = served.client().embeddings.create(model=ALIAS, input=inputs)
    vectors = [d.embedding for d in out.data]
    assert len(vectors) == len(inputs)
    assert all(len(v) == reference.n_embd() and all(isinstance(x, float) for x in v) for v in vectors)
    if len(vectors) == 2:
        assert vectors[0] != vectors[1]


MALFORMED = [
    ("bad-json", "/v1/chat/completions", b'{"model": "tiny", "messages": [', 400, "invalid_json", "not valid JSON"),
    ("not-utf8", "/v1/completions", b"\xff\xfe\xfa", 400, "invalid_json", "not valid JSON"),
    ("not-an-object", "/v1/completions", b"[1, 2]", 400, "invalid_json", "must be a JSON object"),
    ("messages-not-a-list", "/v1/chat/completions", b'{"model": "tiny", "messages": "hi"}', 422,
     "invalid_request", "messages"),
    ("no-messages", "/v1/chat/completions", b'{"model": "tiny", "messages": []}', 422, "invalid_request",
     "at least one message"),
    ("max-tokens-not-a-number", "/v1/completions", b'{"model": "tiny", "prompt": "x", "max_tokens": "many"}', 422,
     "invalid_request", "max_tokens"),
    ("n-2", "/v1/completions", b'{"model": "tiny", "prompt": "x", "n": 2}', 422, "invalid_request", "n=2"),
    ("two-prompts", "/v1/completions", b'{"model": "tiny", "prompt": ["a", "b"]}', 422, "invalid_request",
     "2 prompts"),
    ("logprobs", "/v1/completions", b'{"model": "tiny", "prompt": "x", "logprobs": 2}', 400, "logprobs_unavailable",
     "logits_all"),
    ("unknown-model", "/v1/embeddings", b'{"model": "gpt-4", "input": "x"}', 404, "model_not_found", "'gpt-4'"),
    ("over-the-context", "/v1/completions", json.dumps({"model": "tiny", "prompt": "word " * 600}).encode(), 400,
     "context_length_exceeded", "maximum context length is 512"),
]


@pytest.mark.parametrize(("case", "path", "body", "status", "code", "says"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_request_is_a_clear_error_and_the_server_goes_on(served: ServerProcess, case: str, path: str,
                                                                   body: bytes, status: int, code: str,
                                                                   says: str) -> None:
    got, answer = served.request("POST", path, body, headers={"Authorization": f"Bearer {KEY}",
                                                               "Content-Type": "application/json"})
    assert got == status, answer
    assert answer["error"]["code"] == code and says in answer["error"]["message"], answer
    assert served.health()[0] == 200
    assert served.client().models.list().data[0].id == ALIAS


def test_json_without_content_type_is_served(served: ServerProcess) -> None:
    body = json.dumps({"model": ALIAS, "prompt": "Hello", "max_tokens": 2}).encode()
    status, answer = served.request("POST", "/v1/completions", body, headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200 and answer["usage"]["completion_tokens"] <= 2, answer


@pytest.mark.parametrize("route", ["chat", "completions", "embeddings"])
def test_unknown_model_is_404_naming_the_served_one(served: ServerProcess, route: str) -> None:
    client = served.client()
    call: Callable[[], object] = {
        "chat": lambda: client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}]),
        "completions": lambda: client.completions.create(model="gpt-4", prompt="x"),
        "embeddings": lambda: client.embeddings.create(model="gpt-4", input="x"),
    }[route]
    with pytest.raises(openai.NotFoundError, match=r"model 'gpt-4' not found: this server serves 'tiny'"):
        call()


def _ask(client: openai.OpenAI, i: int) -> tuple[int, int, str]:
    """Request i (a prompt of its own length): (prompt tokens, completion tokens, finish reason)."""
    prompt = "word " * (3 + i)
    if i % 2:
        chunks = list(client.completions.create(model=ALIAS, prompt=prompt, max_tokens=4, temperature=0,
                                                stream=True, extra_body={"min_tokens": 4}))
        finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
        return -1, sum(1 for c in chunks if c.choices[0].text), finish[-1] if finish else ""
    out = client.completions.create(model=ALIAS, prompt=prompt, max_tokens=4, temperature=0,
                                    extra_body={"min_tokens": 4})
    assert out.usage is not None
    return out.usage.prompt_tokens, out.usage.completion_tokens, out.choices[0].finish_reason


def _collect(futures: list[Future[Any]]) -> list[Any]:
    return [f.result(timeout=WAIT_S) for f in futures]


def test_concurrent_requests_from_threads_are_all_answered(served: ServerProcess, reference: Llama) -> None:
    before = served.health()[1]["counts"].get("admitted", 0)
    client = served.client()
    with ThreadPoolExecutor(6) as pool:
        results = _collect([pool.submit(_ask, client, i) for i in range(6)])
    for i, (prompt_tokens, completion_tokens, finish) in enumerate(results):
        if i % 2 == 0:  # its own prompt, not another thread's
            assert prompt_tokens == len(reference.tokenize(("word " * (3 + i)).encode(), add_bos=True))
            assert completion_tokens == 4
        else:
            assert 1 <= completion_tokens <= 4
        assert finish == "length"
    _, health = served.health()
    assert health["active"] == 0 and health["waiting"] == 0
    assert health["counts"]["admitted"] - before == 6


def test_requests_over_the_queue_limit_get_429_and_the_rest_are_served(served: ServerProcess,
                                                                       rpc_a: rpc.RpcServer) -> None:
    client = served.client()
    with ThreadPoolExecutor(6) as pool:
        futures: list[Future[Any]] = []
        try:
            with Held(rpc_a):
                futures.append(pool.submit(_ask, client, 0))
                served.wait_queue(active=1, waiting=0)
                futures += [pool.submit(_ask, client, i) for i in range(1, 6)]
                served.wait_queue(active=1, waiting=5)
                with pytest.raises(openai.RateLimitError, match="server busy") as refused:
                    _chat(client, "one too many")
                assert refused.value.status_code == 429 and refused.value.response.headers["retry-after"] == "1"
        finally:
            results = _collect(futures)
    assert len(results) == 6 and all(r[2] == "length" for r in results)
    served.wait_queue(active=0, waiting=0)


# --- a planned placement --------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["optimal", "layers"])
def planned(request: pytest.FixtureRequest, synth_model: Callable[..., Path],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """tiny f16 (2 layers) planned at start-up for half its weights on a loopback rpc-server:
    `optimal` (which may keep everything on the CPU: a loopback rpc-server is no faster), and
    `layers` (llama.cpp's -ngl on that budget: whole layers on the rpc-server)."""
    tmp = tmp_path_factory.mktemp(f"serve-{request.param}")
    server = ServerProcess(synth_model("tiny", "f16", n_layer=2),
                           ["--rpc-local", "--gpu-budget", "50%", "--strategy", request.param, "--plan-prompt", "32",
                            "--plan-gen", "8", "--ubatch", "64", "--ctx", "256", "--threads", "1"],
                           tmp / "server.log")
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def test_planned_placement_reports_the_plans_prediction(planned: ServerProcess) -> None:
    status, body = planned.request("GET", "/placement")
    assert status == 200, body
    plan = body["plan"]
    strategy = plan["strategy"]
    assert strategy in ("optimal", "layers") and plan["budget"]["request"] == "50%"
    assert plan["workload"]["prompt"] == 32 and plan["workload"]["gen"] == 8
    assert plan["predicted"]["ttft_ms"] > 0 and plan["predicted"]["tpot_ms"] > 0
    acc = plan["accelerator"]
    assert acc.startswith("RPC[127.0.0.1:")
    # the plan's weights are where the loaded model says they are
    on_acc = {w for w, d in body["tensors"].items() if d == acc}
    assert on_acc == {w for w, d in plan["placement"].items() if d == acc}
    if strategy == "layers":
        assert on_acc and body["devices"][acc]["tensors"] == len(on_acc)
    log = planned.log()
    assert f"started rpc-server {acc.removeprefix('RPC[').removesuffix(']')} as device {acc}" in log
    assert re.search(rf"plan '{strategy}' for a 50% budget on {re.escape(acc)}: predicted TTFT [\d.]+ ms, "
                     r"TPOT [\d.]+ ms", log), log
    for dev, d in body["devices"].items():
        assert f"placed {d['tensors']} weights" in log and dev in log


def test_planned_server_chats(planned: ServerProcess) -> None:
    out = planned.client().chat.completions.create(model="tiny-f16-n_layer2", messages=[{"role": "user", "content": "Hi"}],
                                                   max_tokens=4, extra_body={"min_tokens": 4})
    assert out.usage is not None and out.usage.completion_tokens == 4


def test_embeddings_when_off_are_a_clear_400(planned: ServerProcess) -> None:
    with pytest.raises(openai.BadRequestError, match=r"embeddings are off on this server: .*--embedding"):
        planned.client().embeddings.create(model="tiny-f16-n_layer2", input="x")


# --- shutdown -------------------------------------------------------------------------------------


def _stream(client: openai.OpenAI) -> tuple[int, str | None]:
    """A streamed chat read to its end: (content chunks, finish reason)."""
    chunks = list(_chat(client, "Tell me a story", n=8, stream=True))
    texts = [c for c in chunks if c.choices and c.choices[0].delta.content]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return len(texts), finish[-1] if finish else None


def test_sigterm_finishes_the_stream_in_flight_and_refuses_the_queue(tiny_q8: Path, tmp_path: Path) -> None:
    with rpc.start_server(threads=1) as rpc_server:
        plan = _hand_placement(tiny_q8, rpc_server.device_name, tmp_path / "placement.json")
        server = ServerProcess(tiny_q8, ["--devices", f"CPU,{rpc_server.device_name}", "--placement", str(plan),
                                         "--alias", ALIAS, "--ctx", "512", "--threads", "1", "--shutdown-timeout", "60"],
                               tmp_path / "server.log")
        try:
            server.wait_ready()
            client = server.client()
            with ThreadPoolExecutor(2) as pool:
                os.kill(rpc_server.pid, signal.SIGSTOP)  # the stream in flight waits for the rpc-server
                try:
                    in_flight = pool.submit(_stream, client)
                    server.wait_queue(active=1, waiting=0)
                    queued = pool.submit(_chat, client, "Hello")
                    server.wait_queue(active=1, waiting=1)
                    server.proc.send_signal(signal.SIGTERM)
                    with pytest.raises(openai.InternalServerError, match="server shutting down") as refused:
                        queued.result(timeout=WAIT_S)
                    assert refused.value.status_code == 503
                    # a new request now: refused too (503, or no connection once the socket is closed)
                    try:
                        _chat(client, "Hello again")
                        pytest.fail("a request after SIGTERM was served")
                    except openai.APIStatusError as e:
                        assert e.status_code == 503
                    except openai.APIConnectionError:
                        pass
                finally:
                    os.kill(rpc_server.pid, signal.SIGCONT)
                n_chunks, finish = in_flight.result(timeout=WAIT_S)
            assert finish == "length" and 1 <= n_chunks <= 8  # streamed to its end, not cut
            assert server.proc.wait(timeout=WAIT_S) == 0
            log = server.log()
            assert "SIGTERM: finishing 1 request(s) in flight, refusing 1 waiting and any new one" in log
            assert log.rstrip().endswith("oallama serve: stopped"), log
            assert "Traceback" not in log and "ERROR" not in log, log
        finally:
            os.kill(rpc_server.pid, signal.SIGCONT)
            server.stop()



def test_a_dead_rpc_server_fails_requests_not_the_server(tiny_q8: Path, tmp_path: Path) -> None:
    # patch 0007: the request that needs the killed rpc-server gets a 500 naming it, /health turns
    # 503 saying which server failed, and the HTTP server itself keeps running
    with rpc.start_server(threads=1) as server:
        plan = _hand_placement(tiny_q8, server.device_name, tmp_path / "placement.json")
        proc = ServerProcess(tiny_q8, ["--devices", f"CPU,{server.device_name}", "--placement", str(plan),
                                       "--ctx", "256", "--threads", "1", "--rpc-timeout", "5"], tmp_path / "server.log")
        try:
            proc.wait_ready()
            body = json.dumps({"prompt": "Hello", "max_tokens": 4}).encode()
            headers = {"Content-Type": "application/json"}
            assert proc.request("POST", "/v1/completions", body, headers)[0] == 200
            os.kill(server.pid, signal.SIGKILL)
            _poll("the rpc-server gone", lambda: not server.alive(), proc)
            again = json.dumps({"prompt": "Something else entirely", "max_tokens": 4}).encode()
            status, answer = proc.request("POST", "/v1/completions", again, headers)
            assert status == 500 and server.endpoint in answer["error"]["message"]
            status, health = proc.health()
            assert status == 503 and health["status"] == "rpc_server_failed"
            assert health["failed_rpc_servers"] == [server.endpoint]
            assert proc.proc.poll() is None
        finally:
            proc.stop()
