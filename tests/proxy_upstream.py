"""A scripted OpenAI-compatible upstream for the proxy's tests and its benchmark (no model): chat and completions,
streaming or not, tool calls, and vLLM's ``return_token_ids`` (``prompt_token_ids``, per-choice ``token_ids``)
and ``logprobs``.

Its "tokenizer" is UTF-8 bytes and its chat template renders each message as ``<|role|>content<|end|>`` (tool
calls as JSON after the content) followed by the generation prompt ``<|assistant|>``; a reply's ids are its text's
bytes and ``<|end|>``'s. So a conversation's prompt ids extend the previous prompt and reply exactly, as a real
template does. Replies come from ``script`` (text, or ``{"tool": name, "args": {...}}`` for a tool call), cycled;
log-probs are ``-(i + 1) / 1000`` for the i-th token of a reply plus ``lp_offset``.

``refuse_extensions``: HTTP 422 ``{"detail": "Unexpected fields in the request: {...}"}`` for vLLM's fields (as
``transformers serve`` answers); ``token_ids=False``: accepts them and returns none (a plain OpenAI server).
``bodies`` and ``headers`` (names in lower case) log what was received; ``replies`` what was sent (whole replies, or the chunks of a
stream)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.servers import LoopbackHTTPServer

END = "<|end|>"
GEN = "<|assistant|>"
VLLM_FIELDS = {"return_token_ids"}


def render_message(m: dict[str, Any]) -> str:
    content = m.get("content") or ""
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content)
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
             for c in m.get("tool_calls") or []]
    return f"<|{m['role']}|>{content}{json.dumps(calls) if calls else ''}{END}"


def ids_of(text: str) -> list[int]:
    return list(text.encode("utf-8"))


class ScriptedUpstream(LoopbackHTTPServer):
    def __init__(self, script: list[Any] | None = None, *, refuse_extensions: bool = False, token_ids: bool = True,
                 chunk_tokens: int = 4):
        self.script = script or ["hello"]
        self.refuse_extensions = refuse_extensions
        self.token_ids = token_ids
        self.chunk_tokens = chunk_tokens
        self.lp_offset = 0.0
        self.n = 0
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.replies: list[Any] = []
        self.lock = threading.Lock()
        up = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with up.lock:
                    up.bodies.append(body)
                    up.headers.append({k.lower(): v for k, v in self.headers.items()})
                    k = up.n
                bad = VLLM_FIELDS & body.keys()
                if up.refuse_extensions and bad:
                    return self._send(422, {"detail": f"Unexpected fields in the request: {bad}"})
                with up.lock:
                    up.n += 1
                chat = self.path.endswith("/chat/completions")
                reply = up.script[k % len(up.script)]
                if body.get("stream"):
                    return self._stream(up.stream_chunks(body, reply, chat))
                obj = up.chat(body, reply) if chat else up.completion(body, reply)
                with up.lock:
                    up.replies.append(obj)
                self._send(200, obj)

            def _send(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, chunks: list[dict[str, Any]]) -> None:
                with up.lock:
                    up.replies.append(chunks)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for c in [*(json.dumps(c) for c in chunks), "[DONE]"]:
                    data = f"data: {c}\n\n".encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.write(b"0\r\n\r\n")

        self.serve(Handler, daemon_threads=True)

    # -- replies -------------------------------------------------------------------------------------------------
    def _reply(self, reply: Any) -> tuple[str, list[dict[str, Any]], str]:
        """(content, tool calls, the text the ids are of)."""
        if isinstance(reply, dict):
            call = {"id": f"call_{self.n}", "type": "function",
                    "function": {"name": reply["tool"], "arguments": json.dumps(reply["args"])}}
            calls = [call]
            return "", calls, json.dumps([{"name": reply["tool"], "arguments": call["function"]["arguments"]}])
        return str(reply), [], str(reply)

    def _lps(self, n: int) -> list[float]:
        return [-(i + 1) / 1000 + self.lp_offset for i in range(n)]

    def _extras(self, body: dict[str, Any]) -> bool:
        return self.token_ids and bool(body.get("return_token_ids"))

    def chat(self, body: dict[str, Any], reply: Any) -> dict[str, Any]:
        prompt = ids_of("".join(render_message(m) for m in body["messages"]) + GEN)
        content, calls, text = self._reply(reply)
        out = ids_of(text + END)
        msg: dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            msg["tool_calls"] = calls
        choice: dict[str, Any] = {"index": 0, "message": msg, "finish_reason": "tool_calls" if calls else "stop"}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": chr(t), "logprob": lp, "bytes": [t], "top_logprobs": []}
                                              for t, lp in zip(out, self._lps(len(out)), strict=True)]}
        resp: dict[str, Any] = {"id": "chatcmpl-s", "object": "chat.completion", "created": 0, "model": "scripted",
                                "choices": [choice], "usage": {"prompt_tokens": len(prompt),
                                                               "completion_tokens": len(out),
                                                               "total_tokens": len(prompt) + len(out)}}
        if self._extras(body):
            choice["token_ids"] = out
            resp["prompt_token_ids"] = prompt
        return resp

    def completion(self, body: dict[str, Any], reply: Any) -> dict[str, Any]:
        p = body["prompt"]
        prompt = [int(i) for i in p] if isinstance(p, list) else ids_of(p)
        _, _, text = self._reply(reply)
        out = ids_of(text)
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": "stop"}
        if body.get("logprobs") is not None:
            choice["logprobs"] = {"tokens": [chr(t) for t in out], "token_logprobs": self._lps(len(out)),
                                  "top_logprobs": None, "text_offset": list(range(len(out)))}
        if self._extras(body):
            choice["token_ids"] = out
            choice["prompt_token_ids"] = prompt
        return {"id": "cmpl-s", "object": "text_completion", "created": 0, "model": "scripted", "choices": [choice],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(out),
                          "total_tokens": len(prompt) + len(out)}}

    def stream_chunks(self, body: dict[str, Any], reply: Any, chat: bool) -> list[dict[str, Any]]:
        """The reply as vLLM streams it: ``chunk_tokens`` tokens a chunk, each with its ids and log-probs."""
        whole = self.chat(body, reply) if chat else self.completion(body, reply)
        choice = whole["choices"][0]
        out = choice.get("token_ids") or ids_of(self._reply(reply)[2] + (END if chat else ""))
        lps = self._lps(len(out))
        content, calls, _ = self._reply(reply)
        n = self.chunk_tokens
        chunks: list[dict[str, Any]] = []
        base = {"id": "s", "object": "chat.completion.chunk" if chat else "text_completion", "created": 0,
                "model": "scripted"}
        spans = [(i, min(i + n, len(out))) for i in range(0, len(out), n)]
        text = content if chat else choice["text"]
        for k, (a, b) in enumerate(spans):
            part = bytes(out[a:b]).decode("utf-8", "replace") if not calls else ""
            c: dict[str, Any] = {"index": 0, "finish_reason": None}
            if chat:
                delta: dict[str, Any] = {"role": "assistant"} if k == 0 else {}
                if content:
                    delta["content"] = text[a:b] if b <= len(text) else text[a:]
                if calls and k == 0:
                    fn = calls[0]["function"]
                    delta["tool_calls"] = [{"index": 0, "id": calls[0]["id"], "type": "function",
                                            "function": {"name": fn["name"], "arguments": ""}}]
                elif calls:
                    args = calls[0]["function"]["arguments"]
                    m = max(1, len(args) // max(1, len(spans) - 1))
                    piece = args[(k - 1) * m:k * m] if k < len(spans) - 1 else args[(k - 1) * m:]
                    delta["tool_calls"] = [{"index": 0, "function": {"arguments": piece}}]
                c["delta"] = delta
                if body.get("logprobs"):
                    c["logprobs"] = {"content": [{"token": chr(t), "logprob": lp, "bytes": [t], "top_logprobs": []}
                                                 for t, lp in zip(out[a:b], lps[a:b], strict=True)]}
            else:
                c["text"] = part
                if body.get("logprobs") is not None:
                    c["logprobs"] = {"tokens": [chr(t) for t in out[a:b]], "token_logprobs": lps[a:b],
                                     "top_logprobs": None, "text_offset": list(range(a, b))}
            if self._extras(body):
                c["token_ids"] = out[a:b]
            chunk = {**base, "choices": [c]}
            if k == 0 and self._extras(body):
                if chat:
                    chunk["prompt_token_ids"] = whole["prompt_token_ids"]
                else:
                    c["prompt_token_ids"] = choice["prompt_token_ids"]
            chunks.append(chunk)
        chunks[-1]["choices"][0]["finish_reason"] = "tool_calls" if calls else "stop"
        chunks.append({**base, "choices": [], "usage": whole["usage"]})
        return chunks
