"""A small OpenAI-compatible HTTP server on loopback that serves a local Hugging Face model (for tests and the
benchmark): ``/v1/chat/completions`` and ``/v1/completions`` with vLLM's extra fields (``return_token_ids`` gives
``prompt_token_ids`` and per-choice ``token_ids``; ``logprobs``; ``structured_outputs.grammar``, a Lark grammar the
sampler masks with, as vLLM does, returning the processed log-probs), and scripted failures (HTTP 5xx, timeouts,
a server that refuses structured outputs)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

import torch

from tests.servers import LoopbackHTTPServer
from trajlake.policies.hf import forward_step, load_model, process_logits
from trajlake.render.grammar import TokenMasker


class ModelServer(LoopbackHTTPServer):
    """``with ModelServer(path) as srv: srv.base_url``; ``srv.faults`` is a list of "503", "500" or "timeout"
    consumed one per request; ``srv.requests`` logs (endpoint, prompt token ids) of the requests answered and
    ``srv.bodies`` their JSON bodies; with ``srv.reject_structured`` a request carrying ``structured_outputs`` gets
    HTTP 400 (a server without structured outputs); a request carrying a field of ``srv.reject_fields`` gets HTTP 422
    ``{"detail": "Unexpected fields in the request: {...}"}``, as ``transformers serve`` answers vLLM's fields."""

    def __init__(self, model_path: str, *, token_ids: bool = True, timeout_sleep_s: float = 1.5):
        self.model, self.tok = load_model(model_path)
        self.token_ids = token_ids
        self.timeout_sleep_s = timeout_sleep_s
        self.faults: list[str] = []
        self.requests: list[tuple[str, list[int]]] = []
        self.bodies: list[dict[str, Any]] = []
        self.reject_structured = False
        self.reject_fields: set[str] = set()
        self._maskers: dict[str, TokenMasker] = {}
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    fault = server.faults.pop(0) if server.faults else None
                    server.bodies.append(body)
                unexpected = server.reject_fields & body.keys()
                if unexpected:  # as transformers serve (FastAPI) answers fields it does not know
                    return self._send(422, {"detail": f"Unexpected fields in the request: {unexpected}"})
                if server.reject_structured and "structured_outputs" in body:
                    return self._send(400, {"error": {"message": "unknown field: structured_outputs"}})
                if fault == "timeout":
                    time.sleep(server.timeout_sleep_s)
                    return self._send(504, {"error": {"message": "too late"}})
                if fault is not None:
                    return self._send(int(fault), {"error": {"message": f"injected {fault}"}})
                if self.path.endswith("/chat/completions"):
                    return self._send(200, server.chat(body))
                if self.path.endswith("/completions"):
                    return self._send(200, server.completion(body))
                return self._send(404, {"error": {"message": "unknown path"}})

            def _send(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

        self.serve(Handler)

    # -- the model ---------------------------------------------------------------------------------------------
    def sample(self, ids: list[int], body: dict[str, Any]) -> tuple[list[int], list[float], str]:
        g = torch.Generator().manual_seed(int(body.get("seed") or 0))
        temp, top_p = float(body.get("temperature", 1.0)), float(body.get("top_p", 1.0))
        out: list[int] = []
        lps: list[float] = []
        grammar = (body.get("structured_outputs") or {}).get("grammar")
        with self.lock, torch.inference_mode():  # one request at a time on the model
            masker = None
            if grammar:
                masker = self._maskers.get(grammar)
                if masker is None:
                    masker = self._maskers[grammar] = TokenMasker(grammar, self.tok, self.model.config.vocab_size)
                masker.reset()
            logits, cache = forward_step(self.model, torch.tensor([ids]))
            for _ in range(int(body.get("max_tokens") or 16)):
                allowed = None if masker is None else torch.from_numpy(masker.allowed())
                logp = process_logits(logits, temp, top_p, allowed)
                tok = int(torch.argmax(logp)) if temp == 0 else int(torch.multinomial(logp.exp(), 1, generator=g))
                out.append(tok)
                lps.append(float(logp[tok]))
                if masker is not None:
                    masker.consume(tok)
                if tok == self.tok.eos_token_id:
                    break
                logits, cache = forward_step(self.model, torch.tensor([[tok]]), cache)
        text_ids = out[:-1] if out and out[-1] == self.tok.eos_token_id else out
        return out, lps, self.tok.decode(text_ids)

    def _usage(self, prompt: list[int], out: list[int]) -> dict[str, int]:
        return {"prompt_tokens": len(prompt), "completion_tokens": len(out), "total_tokens": len(prompt) + len(out)}

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        text = self.tok.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True)
        prompt = list(self.tok(text, add_special_tokens=False)["input_ids"])
        self.requests.append(("chat", prompt))
        out, lps, content = self.sample(prompt, body)
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": content},
                                  "finish_reason": "stop" if out and out[-1] == self.tok.eos_token_id else "length"}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": self.tok.decode([t]), "logprob": lp, "bytes": None,
                                               "top_logprobs": []} for t, lp in zip(out, lps, strict=True)]}
        resp: dict[str, Any] = {"id": "chatcmpl-test", "object": "chat.completion", "created": 0,
                                "model": body["model"], "choices": [choice], "usage": self._usage(prompt, out)}
        if self.token_ids and body.get("return_token_ids"):
            choice["token_ids"] = out
            resp["prompt_token_ids"] = prompt
        return resp

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        p = body["prompt"]
        prompt = [int(i) for i in p] if isinstance(p, list) else list(self.tok(p, add_special_tokens=False)["input_ids"])
        self.requests.append(("completions", prompt))
        out, lps, text = self.sample(prompt, body)
        choice: dict[str, Any] = {"index": 0, "text": text,
                                  "finish_reason": "stop" if out and out[-1] == self.tok.eos_token_id else "length"}
        if body.get("logprobs") is not None:
            choice["logprobs"] = {"tokens": [self.tok.decode([t]) for t in out], "token_logprobs": lps,
                                  "top_logprobs": None, "text_offset": [0] * len(out)}
        if self.token_ids and body.get("return_token_ids"):
            choice["token_ids"] = out
            choice["prompt_token_ids"] = prompt
        return {"id": "cmpl-test", "object": "text_completion", "created": 0, "model": body["model"],
                "choices": [choice], "usage": self._usage(prompt, out)}
