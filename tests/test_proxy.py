"""``trajlake proxy`` (issue 27, part 2) against a scripted upstream (``proxy_upstream.py``: vLLM's token ids and
log-probs, tool calls, streaming, a server that refuses vLLM's fields): the agent is the ``openai`` package's
tool-calling loop driving Mini SWE's tools, unchanged but for its base URL. The same loop against real servers
(the tiny model, ``transformers serve``) is in ``test_proxy_servers.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("openai")

import openai
from trajlake.envs import Budget
from trajlake.envs.mini_swe.env import MiniSWEEnv

import trajlake
from tests.conftest import run_cli
from trajlake.proxy import Outcome, ProxyRecorder, ProxyServer
from trajlake.proxy.session import SESSION_HEADER
from trajlake.record.writer import LakeWriter
from trajlake.render.exactness import model_contexts

sys.path.insert(0, str(Path(__file__).parent))
from proxy_upstream import ScriptedUpstream

TASK = "mini-swe/durations/drop_branch/0"
SECRET = "sk-trajlake-test-0123456789-SECRET"
SYSTEM = "You fix bugs in a small Python library with the tools given."


# -- the agent: the openai package's tool-calling loop -------------------------------------------------------------

def tools_of(env: Any) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {
        "name": name, "description": doc["description"],
        "parameters": {"type": "object", "properties": {a: {"type": "string", "description": d}
                                                        for a, d in doc["args"].items()}}}}
        for name, doc in env.tool_docs.items()]


def agent(client: Any, env: Any, *, stream: bool = False, max_steps: int = 6, model: str = "m",
          **create: Any) -> tuple[list[Any], Any]:
    """The tool-calling loop of the openai documentation: call, run each tool call, send the results back. Text
    without a tool call is parsed as one (trajlake's own format, for models that cannot call tools). Returns the
    replies it got and the last step result."""
    r = env.reset(0, task_id=TASK)
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": r.observation}]
    replies: list[Any] = []
    res = None
    for step in range(max_steps):
        if stream:
            completion = streamed(client.chat.completions.create(model=model, messages=messages, tools=tools_of(env),
                                                                 stream=True, **create))
        else:
            completion = client.chat.completions.create(model=model, messages=messages, tools=tools_of(env),
                                                        **create)
        msg = completion.choices[0].message
        replies.append(completion)
        messages.append(msg)
        if msg.tool_calls:
            for tc in msg.tool_calls:
                try:
                    args = json.loads(tc.function.arguments or "{}")
                except ValueError:
                    args = {}
                res = env.step(json.dumps({"tool": tc.function.name, "args": args}), f"k{step}")
                messages.append({"role": "tool", "tool_call_id": tc.id, "content": res.observation})
                if res.done:
                    return replies, res
        else:
            res = env.step(msg.content or "", f"k{step}")
            messages.append({"role": "user", "content": res.observation})
            if res.done:
                return replies, res
    return replies, res


def streamed(chunks: Any) -> Any:
    """A streamed reply put together as the openai documentation does: content and tool-call deltas by index."""
    from openai.types.chat import ChatCompletion

    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk.choices:
            d = choice.delta
            content.append(d.content or "")
            for tc in d.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": "", "type": "function",
                                                   "function": {"name": "", "arguments": ""}})
                slot["id"] = tc.id or slot["id"]
                if tc.function is not None:
                    slot["function"]["name"] = tc.function.name or slot["function"]["name"]
                    slot["function"]["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return ChatCompletion.model_validate({"id": "streamed", "object": "chat.completion", "created": 0, "model": "m",
                                          "choices": [{"index": 0, "message": msg,
                                                       "finish_reason": finish or "stop"}]})


def post(base_url: str, path: str, obj: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(base_url.removesuffix("/v1") + path, data=json.dumps(obj).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def outcome_of(res: Any, session: str, **extra: Any) -> dict[str, Any]:
    comps = dict(res.reward_components)
    return {"session": session, "success": bool(comps.get("resolved", 0.0) >= 1.0), "reward_components": comps,
            "termination_reason": res.termination_reason or "submitted", "task_id": TASK, "env_id": "mini-swe",
            "split": "dev", "env_seed": 0, "flush": True, **extra}


# -- fixtures -----------------------------------------------------------------------------------------------------

@pytest.fixture()
def env(tmp_path: Path) -> Iterator[Any]:
    e = MiniSWEEnv("dev", workdir=tmp_path / "ws", budget=Budget(max_steps=6))
    yield e
    e.close()


@pytest.fixture()
def lake(tmp_path: Path) -> Any:
    return trajlake.open_lake(tmp_path / "lake", create=True)


class Proxy:
    def __init__(self, lake: Any, upstream: str, *, max_age_seconds: float = 30.0, **kw: Any):
        self.notes: list[str] = []
        self.writer = LakeWriter(lake, handle_signals=False, max_age_seconds=max_age_seconds)
        self.recorder = ProxyRecorder(self.writer, run_id="r", policy_version="v7", notes=self.notes.append,
                                      **{k: kw.pop(k) for k in ("idle_timeout_s", "clock") if k in kw})
        self.server = ProxyServer(self.recorder, upstream, **kw).start()
        self.base_url = self.server.base_url

    def client(self, session: str | None = None, api_key: str = SECRET) -> Any:
        return openai.OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0,
                             default_headers={SESSION_HEADER: session} if session else None)

    def close(self) -> None:
        self.server.stop()
        self.recorder.close()
        self.writer.close()


@pytest.fixture()
def proxy_of(lake: Any) -> Iterator[Any]:
    made: list[Proxy] = []

    def make(upstream: str, **kw: Any) -> Proxy:
        made.append(Proxy(lake, upstream, **kw))
        return made[-1]

    yield make
    for p in made:
        p.close()


def turns_of(lake: Any, episode_id: str | None = None) -> list[dict[str, Any]]:
    con = trajlake.connect(lake)
    where = "where episode_id = ?" if episode_id else ""
    return con.execute(f"select * from turns {where} order by episode_id, turn_idx",
                       [episode_id] if episode_id else []).to_arrow_table().to_pylist()


TOOL_SCRIPT = [{"tool": "list_files", "args": {}}, {"tool": "read_file", "args": {"path": "durations.py"}},
               {"tool": "submit", "args": {}}]


def upstream_calls(up: ScriptedUpstream) -> list[tuple[list[int], list[int], list[float]]]:
    """(prompt ids, reply ids, log-probs) of each reply the upstream sent, whole or streamed."""
    out = []
    for rep in up.replies:
        if isinstance(rep, list):  # the chunks of a stream
            chunks = [c for c in rep if c["choices"]]
            prompt = chunks[0]["prompt_token_ids"]
            ids = [i for c in chunks for i in c["choices"][0]["token_ids"]]
            lps = [x["logprob"] for c in chunks for x in c["choices"][0]["logprobs"]["content"]]
        else:
            prompt, ids = rep["prompt_token_ids"], rep["choices"][0]["token_ids"]
            lps = [x["logprob"] for x in rep["choices"][0]["logprobs"]["content"]]
        out.append((prompt, ids, lps))
    return out


# -- token in, token out ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_tool_loop_records_the_upstreams_tokens_exactly(stream: bool, proxy_of: Any, env: Any, lake: Any,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with ScriptedUpstream(TOOL_SCRIPT) as up:
        p = proxy_of(up.base_url)
        replies, res = agent(p.client("ep-1"), env, stream=stream)
        assert res is not None and res.done and len(replies) == 3
        # the agent got what it asked for: no token ids, no log-probs (the proxy asked for them, not the agent)
        for c in replies:
            assert c.choices[0].logprobs is None
            assert "token_ids" not in (c.choices[0].model_extra or {}) and "prompt_token_ids" not in \
                (c.model_extra or {})
        assert all(b.get("return_token_ids") is True and b.get("logprobs") for b in up.bodies)
        code, done = post(p.base_url, "/trajlake/outcome", outcome_of(res, "ep-1"))
        # the last tool result never reaches the proxy (no call follows it): the episode ends with the reply
        assert code == 200 and done["committed"] and done["turns"] == 2 + 3 + 2
        calls = upstream_calls(up)
    turns = turns_of(lake)
    assert [(t["role"], t["actor"]) for t in turns] == [("system", "system"), ("user", "user")] + \
        [("assistant", "policy"), ("tool", "env")] * 2 + [("assistant", "policy")]
    pol = [t for t in turns if t["actor"] == "policy"]
    # each policy turn: exactly the ids and log-probs the upstream sampled
    assert [t["token_ids"] for t in pol] == [ids for _, ids, _ in calls]
    for t, (_, ids, lps) in zip(pol, calls, strict=True):
        assert t["behavior_logprobs"] == np.asarray(lps, np.float32).tolist()
        assert t["loss_mask"] == [1] * len(ids) and t["policy_version"] == "v7"
    # the prefix check: the turns before each policy turn concatenate to the prompt the upstream saw
    ctx = model_contexts(turns)
    assert [c.context_ids for c in ctx] == [prompt for prompt, _, _ in calls]
    assert {t["tokenizer_id"] for t in turns} == {"served:scripted"}
    # tool calls: the policy turn names the call, its observation answers it
    assert [t["action_schema"] for t in pol] == ["list_files", "read_file", "submit"]
    tools = [t for t in turns if t["role"] == "tool"]
    assert [t["tool_call_id"] for t in tools] == [t["tool_call_id"] for t in pol[:2]] and tools[0]["tool_call_id"]
    assert [t["action_schema"] for t in tools] == ["list_files", "read_file"]
    assert json.loads(pol[1]["tool_args"]) == {"path": "durations.py"}
    ep = trajlake.connect(lake).execute("select success, termination_reason, served_model, reward_components, "
                                        "policy_version_start, env_id, task_id from episodes").fetchall()
    assert len(ep) == 1 and ep[0][2] == "scripted" and ep[0][4] == "v7" and ep[0][5:] == ("mini-swe", TASK)
    assert dict(ep[0][3]) == dict(res.reward_components) and ep[0][0] == (res.reward_components["resolved"] >= 1)
    report = trajlake.verify(lake, strict=True)
    assert report.ok, report.problems
    # the trainer's reader takes the episode token for token; eval reads it
    from trajlake.train.data.selection import Selection
    from trajlake.train.data.stream import LakeTrajectories

    (sample,) = list(LakeTrajectories(lake, Selection(runs=["r"])))
    assert [int(i) for i in sample["input_ids"]] == [i for t in turns for i in t["token_ids"]]
    code, out, err = run_cli(capsys, "--lake", str(lake.root), "eval", "--run", "r", "--format", "json",
                             "--resamples", "50")
    assert code == 0, err
    assert json.loads(out)["runs"]


def test_fields_the_agent_asks_for_itself_stay_in_its_reply(proxy_of: Any, lake: Any) -> None:
    with ScriptedUpstream(["ab", "cd"]) as up:
        p = proxy_of(up.base_url)
        c = p.client("f")
        msgs: list[Any] = [{"role": "user", "content": "hi"}]
        asked = c.chat.completions.create(model="m", messages=msgs, logprobs=True,
                                          extra_body={"return_token_ids": True})
        assert [x.logprob for x in asked.choices[0].logprobs.content] == [-0.001, -0.002, -0.003, -0.004, -0.005,
                                                                         -0.006, -0.007, -0.008, -0.009]
        assert asked.choices[0].model_extra["token_ids"] and asked.model_extra["prompt_token_ids"]
        msgs += [asked.choices[0].message, {"role": "user", "content": "more"}]
        # logprobs=false: the upstream is asked for them all the same, the agent does not get them
        plain = c.chat.completions.create(model="m", messages=msgs, logprobs=False)
        assert plain.choices[0].logprobs is None and up.bodies[-1]["logprobs"] is True
        assert post(p.base_url, "/trajlake/outcome", {"session": "f", "flush": True})[0] == 200
    pol = [t for t in turns_of(lake) if t["actor"] == "policy"]
    assert [len(t["behavior_logprobs"]) for t in pol] == [9, 9]


def test_completions_whole_and_streamed_continue_each_other(proxy_of: Any, lake: Any) -> None:
    with ScriptedUpstream(["first answer", "second answer"]) as up:
        p = proxy_of(up.base_url)
        c = p.client("c1")
        prompt = "Q: what?\nA:"
        r1 = c.completions.create(model="m", prompt=prompt, max_tokens=8)
        prompt += r1.choices[0].text + "\nObservation: ok\nA:"
        text = "".join(ch.choices[0].text for ch in c.completions.create(model="m", prompt=prompt, stream=True)
                       if ch.choices)
        assert text == "second answer" and r1.choices[0].logprobs is None
        assert post(p.base_url, "/trajlake/outcome", {"session": "c1", "flush": True})[0] == 200
        calls = [(r["choices"][0]["prompt_token_ids"], r["choices"][0]["token_ids"]) if isinstance(r, dict) else
                 (r[0]["choices"][0]["prompt_token_ids"], [i for ch in r if ch["choices"]
                                                            for i in ch["choices"][0]["token_ids"]])
                 for r in up.replies]
    turns = turns_of(lake)
    assert [(t["role"], t["raw_content"]) for t in turns] == [
        ("user", "Q: what?\nA:"), ("assistant", "first answer"), ("env", "\nObservation: ok\nA:"),
        ("assistant", "second answer")]
    assert [c.context_ids for c in model_contexts(turns)] == [p for p, _ in calls]
    assert [c.generated_ids for c in model_contexts(turns)] == [g for _, g in calls]
    assert trajlake.verify(lake, strict=True).ok


def test_rewritten_history_is_recorded_whole_and_marked(proxy_of: Any, lake: Any) -> None:
    with ScriptedUpstream(["one", "two", "three"]) as up:
        p = proxy_of(up.base_url)
        c = p.client("rw")
        msgs: list[Any] = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"}]
        msgs.append(c.chat.completions.create(model="m", messages=msgs).choices[0].message)
        msgs.append({"role": "user", "content": "u2"})
        c.chat.completions.create(model="m", messages=msgs)
        # the agent drops its history (a context manager of its own): the next call does not extend the last
        c.chat.completions.create(model="m", messages=[msgs[0], {"role": "user", "content": "summary; u3"}])
        post(p.base_url, "/trajlake/outcome", {"session": "rw", "flush": True})
        prompts = [r["prompt_token_ids"] for r in up.replies]
    turns = turns_of(lake)
    pol = [t for t in turns if t["actor"] == "policy"]
    assert [t["context_strategy"] for t in pol] == ["server_chat", "server_chat", "rerendered"]
    assert pol[2]["context_dropped_hash"] and pol[1]["context_dropped_hash"] is None
    assert [c.context_ids for c in model_contexts(turns)] == prompts
    assert [t["raw_content"] for t in turns[-3:]] == ["s", "summary; u3", "three"]
    assert trajlake.verify(lake, strict=True).ok


# -- sessions -----------------------------------------------------------------------------------------------------

def test_sessions_by_header_user_field_and_continuation(proxy_of: Any, lake: Any) -> None:
    with ScriptedUpstream(["ok"]) as up:
        p = proxy_of(up.base_url)
        convs: dict[str, list[Any]] = {k: [{"role": "user", "content": f"task {k}"}] for k in "ABCD"}
        clients = {"A": p.client("sess-A"), "B": p.client(), "C": p.client(), "D": p.client()}
        extra = {"B": {"user": "sess-B"}}
        for _ in range(3):  # interleaved, as concurrent agents are
            for k in "ABCD":
                m = clients[k].chat.completions.create(model="m", messages=convs[k], **extra.get(k, {}))
                convs[k] += [m.choices[0].message, {"role": "user", "content": f"more {k}"}]
        assert {"sess-A", "sess-B"} < set(p.recorder.open_sessions())
        assert len(p.recorder.open_sessions()) == 4  # C and D: one unnamed session each, by continuation
        for key in ("sess-A", "sess-B"):
            assert post(p.base_url, "/trajlake/outcome", {"session": key})[0] == 200
        for key in [k for k in p.recorder.open_sessions() if k.startswith("auto:")]:
            assert post(p.base_url, "/trajlake/outcome", {"session": key, "flush": True})[0] == 200
        assert "sess-B" in [b.get("user") for b in up.bodies]  # the user field still goes upstream
    eps = trajlake.connect(lake).execute("select episode_id, task_id, n_turns from episodes").fetchall()
    assert len(eps) == 4 and all(n == 6 for _, _, n in eps)
    for eid, _, _ in eps:  # no conversation leaked into another's episode
        texts = {t["raw_content"] for t in turns_of(lake, eid) if t["actor"] == "user"}
        assert len({s.split()[-1] for s in texts}) == 1
    assert {"sess-A", "sess-B"} <= {task for _, task, _ in eps}


# -- servers without vLLM's fields --------------------------------------------------------------------------------

def test_upstream_refusing_vllm_fields_gives_text_only_turns_and_one_note(proxy_of: Any, env: Any,
                                                                         lake: Any) -> None:
    with ScriptedUpstream(TOOL_SCRIPT, refuse_extensions=True) as up:
        p = proxy_of(up.base_url)
        replies, res = agent(p.client("t"), env)
        assert len(replies) == 3 and replies[0].choices[0].message.tool_calls  # the agent never noticed
        # asked once with the fields (422), then without them, and without them from then on
        assert [("return_token_ids" in b) for b in up.bodies] == [True, False, False, False]
        assert post(p.base_url, "/trajlake/outcome", outcome_of(res, "t"))[0] == 200
    assert len(p.notes) == 1 and "refused vLLM's return_token_ids" in p.notes[0] and "HTTP 422: Unexpected " \
        "fields in the request" in p.notes[0] and "text only" in p.notes[0]
    turns = turns_of(lake)
    assert len(turns) == 7 and all(t["token_ids"] is None and t["tokenizer_id"] is None for t in turns)
    pol = [t for t in turns if t["actor"] == "policy"]
    assert all(t["tokens"] > 0 and t["prompt_tokens"] > 0 for t in pol)  # the server's usage
    assert [t["action_schema"] for t in pol] == ["list_files", "read_file", "submit"]
    assert trajlake.verify(lake, strict=True).ok


def test_upstream_without_token_ids_is_text_only_with_a_note(proxy_of: Any, lake: Any) -> None:
    with ScriptedUpstream(["a", "b"], token_ids=False) as up:
        p = proxy_of(up.base_url)
        c = p.client("n")
        msgs: list[Any] = [{"role": "user", "content": "hi"}]
        for _ in range(2):
            msgs += [c.chat.completions.create(model="m", messages=msgs).choices[0].message,
                     {"role": "user", "content": "again"}]
        assert post(p.base_url, "/trajlake/outcome", {"session": "n", "flush": True})[1]["text_only"] is True
    assert len(p.notes) == 1 and "returns no token ids" in p.notes[0]
    assert all(t["token_ids"] is None for t in turns_of(lake))


# -- ends ---------------------------------------------------------------------------------------------------------

def test_idle_timeout_truncates_and_unfinished_episodes_never_land(proxy_of: Any, lake: Any) -> None:
    now = [0.0]
    with ScriptedUpstream(["x"]) as up:
        p = proxy_of(up.base_url, idle_timeout_s=60.0, clock=lambda: now[0])
        p.client("idle").chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        now[0] = 50.0
        p.client("open").chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])
        now[0] = 61.0
        assert len(p.recorder.expire()) == 1 and p.recorder.open_sessions() == ["open"]
        p.recorder.flush()
        dropped = p.recorder.close()
    assert dropped == 1
    con = trajlake.connect(lake)
    rows = con.execute("select task_id, truncated, terminated, termination_reason, success from episodes").fetchall()
    assert rows == [("idle", True, False, "timeout", None)]
    # nothing of the open session's episode was written, visible or not
    assert con.execute("select count(*) from turns_uncommitted").fetchone() == (0,)
    assert {t["raw_content"] for t in turns_of(lake)} == {"a", "x"}


def test_the_ticker_ends_idle_sessions_and_commits_without_being_asked(proxy_of: Any, lake: Any) -> None:
    import time

    with ScriptedUpstream(["x"]) as up:
        # a short idle timeout and writer age: the proxy's own ticker ends the session and commits the episode
        p = proxy_of(up.base_url, idle_timeout_s=0.2, tick_s=0.05, max_age_seconds=0.2)
        p.client("quiet").chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        con = trajlake.connect(lake)
        for _ in range(400):  # (a bound on the wait, not a timing assertion)
            if con.execute("select count(*) from episodes").fetchone() == (1,):
                break
            time.sleep(0.05)
            con = trajlake.connect(lake)
        assert p.recorder.expired and p.recorder.open_sessions() == []
        assert con.execute("select termination_reason, truncated from episodes").fetchall() == [("timeout", True)]


def test_outcome_endpoint_says_what_is_wrong(proxy_of: Any, lake: Any) -> None:
    with ScriptedUpstream(["x"]) as up:
        p = proxy_of(up.base_url)
        code, body = post(p.base_url, "/trajlake/outcome", {"session": "nobody"})
        assert code == 404 and "no open episode for session 'nobody'" in body["error"]["message"]
        p.client("s").chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        code, body = post(p.base_url, "/trajlake/outcome", {"session": "s", "success": "yes"})
        assert code == 400 and "outcome.success" in body["error"]["message"]
        code, body = post(p.base_url, "/v1/trajlake/outcome", {"session": "s", "termination_reason": "bored"})
        assert code == 400 and "termination_reason 'bored'" in body["error"]["message"]
        code, body = post(p.base_url, "/trajlake/outcome", {"success": True})
        assert code == 400 and SESSION_HEADER in body["error"]["message"]
        # the header names the session too; a truncating reason makes the episode truncated
        code, body = post(p.base_url, "/trajlake/outcome", {"termination_reason": "budget_steps", "flush": True},
                          headers={SESSION_HEADER: "s"})
        assert code == 200
    assert trajlake.connect(lake).execute("select truncated, terminated from episodes").fetchall() == [(True, False)]


def test_outcome_parsing() -> None:
    o = Outcome.from_json({"session": "s", "success": False, "reward_components": {"resolved": 0, "partial": 0.5},
                           "env_seed": 3, "attempt": 1, "task_id": "t"})
    assert (o.success, o.reward_components, o.env_seed, o.attempt, o.task_id) == \
        (False, {"resolved": 0.0, "partial": 0.5}, 3, 1, "t")
    for bad in ({"reward_components": {"r": "high"}}, {"env_seed": -1}, {"color": "red"}, {"task_id": ""},
                {"reward_total": float("nan")}):
        with pytest.raises(trajlake.TrajlakeError):
            Outcome.from_json(bad)


# -- keys and addresses -------------------------------------------------------------------------------------------

def test_api_keys_reach_the_upstream_and_never_the_lake(proxy_of: Any, lake: Any, tmp_path: Path) -> None:
    with ScriptedUpstream(["x"]) as up:
        p = proxy_of(up.base_url)
        p.client("k").chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        assert post(p.base_url, "/trajlake/outcome", {"session": "k", "flush": True})[0] == 200
        assert up.headers[-1]["authorization"] == f"Bearer {SECRET}"
        assert SESSION_HEADER.lower() not in up.headers[-1]
        own = proxy_of(up.base_url, api_key="sk-proxy-own-key")  # the proxy's key replaces the agent's
        own.client("k2").chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        assert up.headers[-1]["authorization"] == "Bearer sk-proxy-own-key"
        assert own.server.address[0] == "127.0.0.1"  # loopback unless told otherwise
        own.recorder.finish("k2", Outcome())
        own.recorder.flush()
    files = [f for f in Path(lake.root).rglob("*") if f.is_file()]
    assert len(files) > 5
    assert not [f for f in files if SECRET.encode() in f.read_bytes() or b"sk-proxy-own-key" in f.read_bytes()]


def test_other_endpoints_pass_through_unrecorded(proxy_of: Any, lake: Any) -> None:
    with ScriptedUpstream(["x"]) as up:
        p = proxy_of(up.base_url)
        assert [m.id for m in p.client().models.list()] == ["scripted"]
        with urllib.request.urlopen(p.base_url.removesuffix("/v1") + "/trajlake/status") as r:
            status = json.loads(r.read())
        assert status["open_sessions"] == 0 and status["token_ids"] is True
    assert p.recorder.open_sessions() == []


# -- the command --------------------------------------------------------------------------------------------------

def test_cli_serves_records_and_stops_on_sigterm(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    with ScriptedUpstream(["hello"]) as up:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "trajlake", "proxy", "--upstream", up.base_url, "--lake",
                                 str(lake), "--run-id", "cli", "--port", "0", "--policy-version", "pv"],
                                stderr=subprocess.PIPE, text=True, env=env)
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline()
            assert line.startswith("trajlake proxy: http://127.0.0.1:"), line
            base = line.split()[2]
            c = openai.OpenAI(base_url=base, api_key="k", max_retries=0)
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], user="u1")
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "left open"}], user="u2")
            assert post(base, "/trajlake/outcome", {"session": "u1", "success": True})[0] == 200
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "1 episode(s) written" in err and "1 unfinished episode(s) dropped" in err
    con = trajlake.connect(lake)
    assert con.execute("select run_id, success, policy_version_start from episodes").fetchall() == \
        [("cli", True, "pv")]
    (config,) = con.execute("select config from runs where run_id = 'cli'").fetchone()
    assert json.loads(config)["proxy"]["upstream"] == up.base_url.replace("/v1", "") + "/v1"


def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "proxy", "--upstream", "ftp://x", "--run-id", "r", "--lake", str(tmp_path / "l"))
    assert code == 1 and err.count("\n") == 1 and "give the server's base URL" in err
    code, _, err = run_cli(capsys, "proxy", "--upstream", "http://127.0.0.1:9/v1", "--run-id", "r",
                           "--api-key-env", "TRAJLAKE_NO_SUCH_VARIABLE")
    assert code == 1 and "TRAJLAKE_NO_SUCH_VARIABLE" in err and err.count("\n") == 1
