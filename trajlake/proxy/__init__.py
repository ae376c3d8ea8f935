"""``trajlake proxy``: an OpenAI-compatible endpoint in front of a model server that records every call of an
unmodified agent into the lake, token in, token out (docs/proxy.md).

- ``session.py``: ``ProxyRecorder``, the recording: sessions, turns from each (request, reply) pair, the prefix
  check of the recorded tokens, the outcome, the idle timeout, the writer;
- ``server.py``: ``ProxyServer``, the HTTP side: forwarding to the upstream (streaming or not), asking it for
  vLLM's token ids and log-probs and doing without them when it refuses, the outcome endpoint.
"""

from __future__ import annotations

from trajlake.proxy.server import ProxyServer, serve
from trajlake.proxy.session import Call, Outcome, ProxyRecorder

__all__ = ["Call", "Outcome", "ProxyRecorder", "ProxyServer", "serve"]
