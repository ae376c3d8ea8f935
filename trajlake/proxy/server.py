"""The proxy's HTTP side: an OpenAI-compatible endpoint on loopback that forwards every request to the upstream
server and hands each answered chat or completion call to the ``ProxyRecorder``.

- ``POST /v1/chat/completions`` and ``POST /v1/completions``, streaming or not: forwarded with vLLM's
  ``return_token_ids`` and ``logprobs`` added when the agent did not ask for them (and taken out of the reply again,
  so the agent gets what it asked for). An upstream that refuses them (HTTP 400/422, as ``transformers serve``
  answers "Unexpected fields in the request") is asked once more without them and remembered: its calls are
  recorded as text only, with a note.
- every other ``/v1/...`` request (``GET /v1/models``, ...) is forwarded as it is and not recorded;
- ``POST /trajlake/outcome`` (also under ``/v1/``): the harness ends an episode, ``{"session": ..., "success":
  ..., "reward_components": {...}, "termination_reason": ..., "task_id": ..., ...}`` (``session.Outcome``; the
  session may be the ``X-Trajlake-Session`` header instead; ``"flush": true`` commits before answering);
- ``GET /trajlake/status``: the open sessions (unnamed ones as ``auto:EPISODE_ID``) and the episodes written.

Request headers other than the session's go to the upstream (the agent's ``Authorization`` among them, unless the
proxy was given a key of its own) and are never recorded.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import socket
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from trajlake.errors import TrajlakeError, ValidationError, one_line
from trajlake.policies.openai_policy import OPTIONAL_EXTENSIONS, server_detail
from trajlake.proxy.session import (
    CHAT,
    COMPLETIONS,
    SESSION_HEADER,
    Call,
    Outcome,
    ProxyRecorder,
    content_text,
    tool_calls_of,
)
from trajlake.record.episode import utcnow

if TYPE_CHECKING:
    from pathlib import Path

# hop-by-hop headers, the ones http.client sets itself, and the proxy's own
_NOT_FORWARDED = {"host", "connection", "keep-alive", "content-length", "transfer-encoding", "accept-encoding",
                  "proxy-authorization", "te", "trailer", "upgrade", SESSION_HEADER.lower()}
_OUTCOME_PATHS = ("/trajlake/outcome", "/v1/trajlake/outcome")
_STATUS_PATHS = ("/trajlake/status", "/v1/trajlake/status")


class Upstream:
    """The upstream server: its base URL (what an OpenAI client's ``base_url`` would be, e.g.
    ``http://127.0.0.1:8000/v1``), one kept-alive connection per proxy thread."""

    def __init__(self, url: str, *, timeout_s: float = 600.0):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TrajlakeError(f"--upstream {url!r}: give the server's base URL, e.g. http://127.0.0.1:8000/v1")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.base_path = parts.path.rstrip("/")
        self.timeout_s = timeout_s
        # what is recorded and printed: no user name, password or query (a key may hide there)
        self.url = f"{parts.scheme}://{self.host}:{self.port}{self.base_path}"
        self._local = threading.local()

    def path_for(self, path: str) -> str:
        """The upstream path of a request path: the proxy's ``/v1`` prefix becomes the upstream's base path."""
        rest = path[3:] if path == "/v1" or path.startswith("/v1/") else path
        return self.base_path + rest

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            conn = cls(self.host, self.port, timeout=self.timeout_s)
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._local.conn = conn
        return conn

    def drop(self) -> None:
        """Close this thread's connection (a reply left half read)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def request(self, method: str, path: str, body: bytes | None,
                headers: dict[str, str]) -> http.client.HTTPResponse:
        """Send one request on this thread's connection (a fresh one when the kept one was closed)."""
        for attempt in (0, 1):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=headers)
                return conn.getresponse()
            except (ConnectionError, http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


# -- replies to calls ---------------------------------------------------------------------------------------------

def _logprobs(kind: str, lp: Any) -> list[float] | None:
    if not isinstance(lp, dict):
        return None
    if kind == CHAT:
        content = lp.get("content")
        return [float(c["logprob"]) for c in content] if isinstance(content, list) else None
    values = lp.get("token_logprobs")
    return [float(v) for v in values] if isinstance(values, list) else None


def _ints(v: Any) -> list[int] | None:
    """A JSON list of token ids as it was parsed (JSON integers are ``int`` already: converting a prompt's
    thousands of ids again on every call was the proxy's largest cost; the writer's validation checks them)."""
    return v if isinstance(v, list) else None


def call_from_reply(kind: str, request: dict[str, Any], reply: dict[str, Any], started: dt.datetime) -> Call:
    """The ``Call`` of a whole (not streamed) reply: its first choice."""
    choice = (reply.get("choices") or [{}])[0]
    usage = reply.get("usage") or {}
    if kind == CHAT:
        msg = choice.get("message") or {}
        text, calls = content_text(msg.get("content")), tool_calls_of(msg)
    else:
        text, calls = str(choice.get("text") or ""), []
    return Call(kind, request, str(reply.get("model") or request.get("model") or "unknown"), text, calls,
                prompt_ids=_ints(reply.get("prompt_token_ids") or choice.get("prompt_token_ids")),
                gen_ids=_ints(choice.get("token_ids")), logprobs=_logprobs(kind, choice.get("logprobs")),
                prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
                started_at=started, ended_at=utcnow())


class StreamedCall:
    """Accumulates the chunks of a streamed reply (its first choice) into a ``Call``."""

    def __init__(self, kind: str, request: dict[str, Any], started: dt.datetime):
        self.kind, self.request, self.started = kind, request, started
        self.model = str(request.get("model") or "unknown")
        self.text: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.prompt_ids: list[int] | None = None
        self.gen_ids: list[int] | None = None
        self.logprobs: list[float] | None = None
        self.usage: dict[str, Any] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        if chunk.get("model"):
            self.model = str(chunk["model"])
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_ids = _ints(chunk["prompt_token_ids"])
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            if choice.get("prompt_token_ids") is not None:
                self.prompt_ids = _ints(choice["prompt_token_ids"])
            ids = _ints(choice.get("token_ids"))
            if ids is not None:
                self.gen_ids = (self.gen_ids or []) + ids
            lps = _logprobs(self.kind, choice.get("logprobs"))
            if lps is not None:
                self.logprobs = (self.logprobs or []) + lps
            if self.kind == COMPLETIONS:
                self.text.append(str(choice.get("text") or ""))
                continue
            delta = choice.get("delta") or {}
            self.text.append(content_text(delta.get("content")))
            for tc in delta.get("tool_calls") or []:
                slot = self.calls.setdefault(int(tc.get("index", 0)), {"id": "", "name": "", "arguments": ""})
                fn = tc.get("function") or {}
                if tc.get("id"):
                    slot["id"] = str(tc["id"])
                if fn.get("name"):
                    slot["name"] = str(fn["name"])
                slot["arguments"] += str(fn.get("arguments") or "")

    def call(self) -> Call:
        return Call(self.kind, self.request, self.model, "".join(self.text),
                    [self.calls[i] for i in sorted(self.calls)], prompt_ids=self.prompt_ids, gen_ids=self.gen_ids,
                    logprobs=self.logprobs, prompt_tokens=self.usage.get("prompt_tokens"),
                    completion_tokens=self.usage.get("completion_tokens"), started_at=self.started,
                    ended_at=utcnow())


def _strip(obj: dict[str, Any], added: set[str]) -> bool:
    """Take the fields the proxy asked for (and the agent did not) out of a reply or chunk; whether any was."""
    changed = False
    if "return_token_ids" in added:
        changed = obj.pop("prompt_token_ids", None) is not None or changed
    for choice in obj.get("choices") or []:
        if "return_token_ids" in added:
            changed = choice.pop("token_ids", None) is not None or changed
            changed = choice.pop("prompt_token_ids", None) is not None or changed
        if "logprobs" in added and choice.get("logprobs") is not None:
            choice["logprobs"] = None
            changed = True
    return changed


def _sse_events(resp: http.client.HTTPResponse) -> Iterator[bytes]:
    """The events of a server-sent-events body, each with its blank line."""
    buf: list[bytes] = []
    while True:
        line = resp.readline()
        if not line:
            break
        buf.append(line)
        if line in (b"\n", b"\r\n"):
            yield b"".join(buf)
            buf = []
    if buf:
        yield b"".join(buf)


# -- the server ---------------------------------------------------------------------------------------------------

class ProxyServer:
    """``with ProxyServer(recorder, upstream_url) as p: p.base_url``: serves on a thread; ``serve_forever`` in
    the foreground (the CLI). ``api_key`` (optional) is sent to the upstream instead of the agent's."""

    def __init__(self, recorder: ProxyRecorder, upstream: str, *, host: str = "127.0.0.1", port: int = 0,
                 api_key: str | None = None, timeout_s: float = 600.0, tick_s: float = 1.0):
        self.recorder = recorder
        self.upstream = Upstream(upstream, timeout_s=timeout_s)
        self._api_key = api_key
        self.refused: str | None = None
        """Why the upstream refused vLLM's extensions (then every call goes without them)."""
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        proxy = self

        class Handler(_Handler):
            server_proxy = proxy

        try:
            self.httpd = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:
            raise TrajlakeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
        self.httpd.daemon_threads = True

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    @property
    def base_url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}/v1"

    def _ticker(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.recorder.tick()
            except Exception as e:  # a failed commit: say it, keep serving (the writer re-raises it on close)
                print(f"error: trajlake proxy: {one_line(e)}", file=sys.stderr, flush=True)

    def start(self) -> ProxyServer:
        for target in (self.httpd.serve_forever, self._ticker):
            t = threading.Thread(target=target, daemon=True, name=f"trajlake-proxy-{target.__name__}")
            t.start()
            self._threads.append(t)
        return self

    def serve_forever(self) -> None:
        t = threading.Thread(target=self._ticker, daemon=True, name="trajlake-proxy-ticker")
        t.start()
        self._threads.append(t)
        self.httpd.serve_forever()

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- forwarding ------------------------------------------------------------------------------------------
    def headers_for(self, incoming: Any) -> dict[str, str]:
        out = {k: v for k, v in incoming.items() if k.lower() not in _NOT_FORWARDED}
        if self._api_key is not None:
            out = {k: v for k, v in out.items() if k.lower() != "authorization"}
            out["Authorization"] = f"Bearer {self._api_key}"
        return out

    def with_extensions(self, kind: str, request: dict[str, Any], raw: bytes) -> tuple[bytes, set[str]]:
        """The request's body with vLLM's token ids and log-probs asked for, and the fields added (none once the
        upstream refused them). The agent's bytes are kept: the fields go in front of them (a JSON text is not
        encoded again per call), unless the agent gave one of them itself (false), which is then replaced."""
        if self.refused is not None:
            return raw, set()
        added: dict[str, Any] = {name: True for name in OPTIONAL_EXTENSIONS if not request.get(name)}
        if request.get("logprobs") in (None, False):
            added["logprobs"] = True if kind == CHAT else 1
        if not added:
            return raw, set()
        body = raw.lstrip()
        if any(k in request for k in added) or not body.startswith(b"{"):
            return json.dumps({**request, **added}).encode(), set(added)
        rest = body[1:]
        head = json.dumps(added)[1:-1].encode()
        return b"{" + head + (b"" if rest.lstrip().startswith(b"}") else b",") + rest, set(added)

    def refuse(self, detail: str) -> None:
        if self.refused is None:
            self.refused = detail
            self.recorder.note("refused", f"the upstream {self.upstream.url} refused vLLM's "
                               f"{', '.join(OPTIONAL_EXTENSIONS)} and logprobs ({detail}): the proxy asks it "
                               f"without them; turns are recorded as text only (tokenizer_id null)")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_proxy: ProxyServer
    _headers_buffer: list[bytes]  # BaseHTTPRequestHandler's, which typeshed does not declare

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- plumbing ----------------------------------------------------------------------------------------------
    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, code: int, data: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        # the head and the body in one write (end_headers, then a write of the body, costs a second system call
        # and a wake-up of the agent per reply)
        self._headers_buffer.append(b"\r\n" + data)
        self.flush_headers()

    def _json(self, code: int, obj: Any) -> None:
        self._send(code, json.dumps(obj).encode())

    def _error(self, code: int, message: str) -> None:
        self._json(code, {"error": {"message": message, "type": "trajlake_proxy"}})

    def _relay(self, resp: http.client.HTTPResponse) -> None:
        data = resp.read()
        self._send(resp.status, data, resp.getheader("Content-Type") or "application/json")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    # -- requests ----------------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        p = self.server_proxy
        if path in _STATUS_PATHS:
            r = p.recorder
            open_ = r.open_sessions()
            return self._json(200, {"run_id": r.run_id, "open_sessions": len(open_), "sessions": open_,
                                    "finished": len(r.finished), "expired": len(r.expired),
                                    "upstream": p.upstream.url, "token_ids": p.refused is None})
        self._forward("GET", None)

    def do_POST(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        body = self._body()
        if path in _OUTCOME_PATHS:
            return self._outcome(body)
        kind = CHAT if path.endswith("/chat/completions") else COMPLETIONS if path.endswith("/completions") else None
        request: Any = None
        if kind is not None:
            try:
                request = json.loads(body)
            except ValueError:
                request = None
        if not isinstance(request, dict) or kind is None:
            return self._forward("POST", body)  # not a call the proxy records: the upstream answers it
        self._call(kind, request, body)

    def _forward(self, method: str, body: bytes | None) -> None:
        p = self.server_proxy
        try:
            resp = p.upstream.request(method, p.upstream.path_for(self.path), body, p.headers_for(self.headers))
        except OSError as e:
            return self._error(502, f"trajlake proxy: the upstream {p.upstream.url} did not answer: {e}")
        self._relay(resp)

    def _call(self, kind: str, request: dict[str, Any], raw: bytes) -> None:
        p = self.server_proxy
        key = self.headers.get(SESSION_HEADER) or request.get("user")
        key = str(key) if key else None
        started = utcnow()
        data, added = p.with_extensions(kind, request, raw)
        headers = {**p.headers_for(self.headers), "Content-Type": "application/json"}
        path = p.upstream.path_for(self.path)
        try:
            resp = p.upstream.request("POST", path, data, headers)
            if resp.status in (400, 422) and added:
                # maybe only the extensions are refused (transformers serve: 422 "Unexpected fields"): once more
                # without them; remembered only when that one is answered
                detail = _detail(resp.status, resp.read())
                resp = p.upstream.request("POST", path, raw, headers)
                if resp.status == 200:
                    p.refuse(detail)
                added = set()
        except OSError as e:
            return self._error(502, f"trajlake proxy: the upstream {p.upstream.url} did not answer: {e}")
        if resp.status != 200:
            return self._relay(resp)  # the agent sees the upstream's error; nothing is recorded
        ctype = resp.getheader("Content-Type") or ""
        if request.get("stream") and "text/event-stream" in ctype:
            return self._stream(kind, request, key, resp, added, started)
        data = resp.read()
        try:
            reply = json.loads(data)
        except ValueError:
            return self._send(200, data, ctype or "application/json")
        self._record(key, call_from_reply(kind, request, reply, started))
        if added and _strip(reply, added):
            data = json.dumps(reply).encode()
        self._send(200, data, ctype or "application/json")

    def _stream(self, kind: str, request: dict[str, Any], key: str | None, resp: http.client.HTTPResponse,
                added: set[str], started: dt.datetime) -> None:
        acc = StreamedCall(kind, request, started)
        self.send_response(200)
        self.send_header("Content-Type", resp.getheader("Content-Type") or "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        recorded = False
        try:
            for event in _sse_events(resp):
                lines = event.split(b"\n")
                out = []
                for line in lines:
                    if line.startswith(b"data:"):
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            if not recorded:  # before the agent may send its next call
                                self._record(key, acc.call())
                                recorded = True
                        elif payload:
                            try:
                                chunk = json.loads(payload)
                            except ValueError:
                                chunk = None
                            if isinstance(chunk, dict):
                                acc.add(chunk)
                                if added and _strip(chunk, added):
                                    line = b"data: " + json.dumps(chunk).encode()
                    out.append(line)
                self._chunk(b"\n".join(out))
            if not recorded:  # a server that ends its stream without [DONE]
                self._record(key, acc.call())
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):  # the agent went away: it never got the reply
            self.server_proxy.upstream.drop()
            self.close_connection = True

    def _record(self, key: str | None, call: Call) -> None:
        r = self.server_proxy.recorder
        try:
            r.record(key, call)
        except Exception as e:  # recording never breaks the agent's call; say why once per kind of failure
            r.note(f"record:{type(e).__name__}", f"a call was not recorded: {type(e).__name__}: {one_line(e)}")
            return
        if (call.prompt_ids is None or call.gen_ids is None) and self.server_proxy.refused is None:
            r.note("text_only", f"the upstream {self.server_proxy.upstream.url} returns no token ids (vLLM's "
                   f"return_token_ids): turns are recorded as text only (tokenizer_id null)")

    def _outcome(self, body: bytes) -> None:
        r = self.server_proxy.recorder
        try:
            obj = json.loads(body or b"{}")
        except ValueError:
            return self._error(400, "the outcome is not JSON")
        if not isinstance(obj, dict):
            return self._error(400, "the outcome is not a JSON object")
        flush = bool(obj.pop("flush", False))
        key = self.headers.get(SESSION_HEADER) or obj.get("session")
        if not key:
            return self._error(400, f"name the session: the {SESSION_HEADER} header or the outcome's \"session\"")
        try:
            outcome = Outcome.from_json(obj)
            done = r.finish(str(key), outcome)
            if flush:
                r.flush()
        except KeyError:
            return self._error(404, f"no open episode for session {key!r} (no call named it, or it ended)")
        except ValidationError as e:
            return self._error(400, f"the episode of session {key!r} is invalid and was dropped: "
                                    f"{e.issues[0] if e.issues else e}")
        except TrajlakeError as e:
            return self._error(400, one_line(e))
        self._json(200, {**done, "committed": flush})


def _detail(status: int, data: bytes) -> str:
    """An upstream's error on one line, read as ``openai:`` reads a server's error (FastAPI's ``detail``, OpenAI's
    ``error.message``, else the body's text)."""
    try:
        body = json.loads(data)
    except ValueError:
        body = None
    return f"HTTP {status}: " + server_detail(SimpleNamespace(body=body, response=None,
                                                              message=data.decode("utf-8", "replace")))


# -- the command --------------------------------------------------------------------------------------------------

def serve(lake: str | Path, *, upstream: str, run_id: str, policy_version: str | None = None,
          host: str = "127.0.0.1", port: int = 8300, idle_timeout_s: float = 900.0, env_id: str = "proxy",
          api_key: str | None = None, timeout_s: float = 600.0, ready: Any = None) -> dict[str, int]:
    """``trajlake proxy``: record every call through the proxy into ``lake`` (created when missing) as run
    ``run_id`` until interrupted (SIGINT/SIGTERM); returns counts. ``ready(server)`` is called once it listens."""
    import signal

    from trajlake.lake.store import Lake
    from trajlake.provenance import code_version
    from trajlake.query import connect
    from trajlake.record.writer import LakeWriter

    up = Upstream(upstream, timeout_s=timeout_s)
    version = policy_version or f"proxy:{up.url}"
    store = Lake.init(lake)
    writer = LakeWriter(store, handle_signals=False)
    exists = connect(store).execute("select count(*) from runs where run_id = ?", [run_id]).fetchone()
    if not (exists and exists[0]):
        config = {"proxy": {"upstream": up.url, "idle_timeout_s": idle_timeout_s, "env_id": env_id}}
        writer.write_runs([{"run_id": run_id, "created_at": utcnow(), "label": run_id, "config": json.dumps(config),
                            "policy_name": "proxy", "policy_version": version, "code_version": code_version()}])
    recorder = ProxyRecorder(writer, run_id=run_id, policy_version=version, env_id=env_id,
                             idle_timeout_s=idle_timeout_s)
    server = ProxyServer(recorder, upstream, host=host, port=port, api_key=api_key, timeout_s=timeout_s)
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"note: trajlake proxy listens on {host}, not only loopback: anyone who reaches it may use the "
              f"upstream model through it", file=sys.stderr, flush=True)

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.stop, daemon=True).start()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(f"trajlake proxy: {server.base_url} -> {up.url}; run {run_id}, policy version {version}; outcome: "
              f"POST {server.base_url.removesuffix('/v1')}/trajlake/outcome", file=sys.stderr, flush=True)
        if ready is not None:
            ready(server)
        server.serve_forever()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        server.httpd.server_close()
        dropped = recorder.close()
        writer.close()
    counts = {"episodes": len(recorder.finished), "expired": len(recorder.expired), "dropped": dropped}
    print(f"trajlake proxy: {counts['episodes']} episode(s) written ({counts['expired']} ended by the idle "
          f"timeout); {dropped} unfinished episode(s) dropped", file=sys.stderr, flush=True)
    return counts


__all__ = ["ProxyServer", "StreamedCall", "Upstream", "call_from_reply", "serve"]
