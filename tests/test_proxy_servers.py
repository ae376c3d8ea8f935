"""``trajlake proxy`` in front of real model servers (issue 27, part 2), the agent being the ``openai`` package's
tool-calling loop of ``test_proxy.py`` driving Mini SWE's tools, unchanged but for its base URL:

- the tiny model served with vLLM's fields (``openai_server.ModelServer``: ``return_token_ids``, ``logprobs``):
  the lake's token ids and log-probs are the ones the server sampled, and the trainer's reader takes the episodes
  token for token;
- ``transformers serve`` (the ``transformers`` package's own server, started as in ``test_openai_servers.py``),
  whole and streamed replies: it refuses vLLM's fields, so the turns are text only (one note) and hold the text the
  server sent; the trainer's reader re-renders them with the model's tokenizer (or names the turn its prefix check
  rejects); ``trajlake eval`` reads both;
- vLLM's CPU build when present (``TRAJLAKE_VLLM_PYTHON``, as in ``test_openai_servers.py``; else it skips): the
  agent asks for the token ids and log-probs itself, so the test sees what the server returned, and the lake holds
  exactly that.

Slow: a model is loaded, and ``transformers serve`` takes tens of seconds to start on 2 cores."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("openai")

import trajlake
from tests.conftest import run_cli
from trajlake.render.exactness import model_contexts
from trajlake.train.data.selection import Selection
from trajlake.train.data.stream import LakeTrajectories

sys.path.insert(0, str(Path(__file__).parent))
from openai_server import ModelServer
from test_openai_servers import tiny, transformers_serve, vllm_server  # noqa: F401 - the fixtures, shared
from test_proxy import Proxy, agent, env, outcome_of, post, turns_of  # noqa: F401 - env is a fixture

pytestmark = pytest.mark.slow


@pytest.fixture()
def lake(tmp_path: Path) -> Any:
    return trajlake.open_lake(tmp_path / "lake", create=True)


@pytest.fixture()
def model_server(tiny: Path) -> Iterator[tuple[ModelServer, list[dict[str, Any]]]]:  # noqa: F811
    with ModelServer(str(tiny)) as srv:
        sent: list[dict[str, Any]] = []
        chat = srv.chat

        def logged(body: dict[str, Any]) -> dict[str, Any]:  # what the server answered, as it answered it
            reply = chat(body)
            sent.append(json.loads(json.dumps(reply)))
            return reply

        srv.chat = logged  # type: ignore[method-assign]
        yield srv, sent


def test_tiny_model_with_vllm_fields_token_for_token(model_server: Any, env: Any, lake: Any,  # noqa: F811
                                                     tiny: Path) -> None:  # noqa: F811
    srv, sent = model_server
    p = Proxy(lake, srv.base_url)
    try:
        replies, res = agent(p.client("tiny-1"), env, model="tiny", max_tokens=12, temperature=1.0, seed=3)
        assert res is not None and replies
        assert post(p.base_url, "/trajlake/outcome", outcome_of(res, "tiny-1"))[0] == 200
    finally:
        p.close()
    assert len(sent) == len(replies)
    turns = turns_of(lake)
    pol = [t for t in turns if t["actor"] == "policy"]
    assert [t["token_ids"] for t in pol] == [r["choices"][0]["token_ids"] for r in sent]
    assert [t["behavior_logprobs"] for t in pol] == [
        np.asarray([c["logprob"] for c in r["choices"][0]["logprobs"]["content"]], np.float32).tolist() for r in sent]
    assert [c.context_ids for c in model_contexts(turns)] == [r["prompt_token_ids"] for r in sent]
    assert {t["tokenizer_id"] for t in turns} == {"served:tiny"}
    assert trajlake.verify(lake, strict=True).ok
    # the trainer's reader: one sample of the whole episode when each prompt extends the previous one; when the
    # server's template re-tokenized an earlier reply (the tiny model's replies are random bytes, which do not
    # survive decoding and encoding), one sample per call, its prompt and its reply, as the server saw them
    samples = [[int(i) for i in s["input_ids"]] for s in LakeTrajectories(lake, Selection(runs=["r"]))]
    if any(t["context_strategy"] == "rerendered" for t in pol):
        assert samples == [r["prompt_token_ids"] + r["choices"][0]["token_ids"] for r in sent]
    else:
        assert samples == [[i for t in turns for i in t["token_ids"]]]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_transformers_serve_through_the_proxy_text_only(stream: bool, transformers_serve: str,  # noqa: F811
                                                        tiny: Path, env: Any, lake: Any,  # noqa: F811
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    p = Proxy(lake, transformers_serve)
    try:
        replies, res = agent(p.client("ts"), env, stream=stream, model=str(tiny), max_tokens=8, max_steps=3)
        assert res is not None and len(replies) >= 1
        code, done = post(p.base_url, "/trajlake/outcome", outcome_of(res, "ts"))
        assert code == 200 and done["text_only"] is True
    finally:
        p.close()
    assert len(p.notes) == 1 and "refused vLLM's return_token_ids" in p.notes[0] and "HTTP 422" in p.notes[0]
    turns = turns_of(lake)
    pol = [t for t in turns if t["actor"] == "policy"]
    # the text the server sent, as the agent got it
    assert [t["raw_content"] for t in pol] == [r.choices[0].message.content or "" for r in replies]
    assert all(t["token_ids"] is None and t["tokenizer_id"] is None for t in turns)
    assert all(t["prompt_tokens"] and t["prompt_tokens"] > 0 for t in pol) or stream  # usage: whole replies only
    assert trajlake.verify(lake, strict=True).ok
    # the trainer's reader re-renders the text with the model's tokenizer, with its prefix check: the tiny model's
    # random replies may not survive it (a reply starting with a newline merges with the template's), which the
    # reader then names and skips; either way it read the episode, policy turns and all
    ds = LakeTrajectories(lake, Selection(runs=["r"]), tokenizer=tiny, on_mismatch="skip")
    samples = list(ds)
    assert ds.stats["n_episodes"] == 1 and ds.stats["n_retokenized"] + ds.stats["n_skipped_mismatch"] == 1
    assert all(int(np.sum(s["loss_mask"])) > 0 for s in samples)
    code, out, err = run_cli(capsys, "--lake", str(lake.root), "eval", "--run", "r", "--format", "json",
                             "--resamples", "50")
    assert code == 0, err
    assert json.loads(out)["runs"]


def test_vllm_cpu_through_the_proxy_token_for_token(vllm_server: tuple[Path, str], env: Any,  # noqa: F811
                                                    lake: Any) -> None:
    _, url = vllm_server
    p = Proxy(lake, url)
    try:
        replies, res = agent(p.client("v"), env, model="tiny", max_tokens=12, max_steps=3, logprobs=True,
                             extra_body={"return_token_ids": True})
        assert res is not None and replies
        assert post(p.base_url, "/trajlake/outcome", outcome_of(res, "v"))[0] == 200
    finally:
        p.close()
    turns = turns_of(lake)
    pol = [t for t in turns if t["actor"] == "policy"]
    assert [t["token_ids"] for t in pol] == [r.choices[0].model_extra["token_ids"] for r in replies]
    assert [t["behavior_logprobs"] for t in pol] == [
        np.asarray([c.logprob for c in r.choices[0].logprobs.content], np.float32).tolist() for r in replies]
    assert [c.context_ids for c in model_contexts(turns)] == [r.model_extra["prompt_token_ids"] for r in replies]
    assert {t["tokenizer_id"] for t in turns} == {"served:tiny"}
    assert trajlake.verify(lake, strict=True).ok
