"""Language-model policies: token exactness, tool-call parsing, context trimming, the openai: policy over a real
loopback HTTP server (token fields, retries, cost), group rollouts through the CLI, and baselines B0 / B2.

Every model is a tiny randomly initialised Llama with a tokenizer trained in the test (nothing downloaded)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")
pytest.importorskip("transformers")

import itertools

from trajlake.envs import Budget, list_tasks, task_view_fn
from trajlake.envs.mini_swe.env import TOOL_DOCS, MiniSWEEnv

from trajlake.errors import TrajlakeError
from trajlake.policies.hf import HFPolicy, score_tokens
from trajlake.policies.lm import Generation, LMPolicy
from trajlake.policies.settings import LMSettings, parse_policy_args
from trajlake.render.chat import ChatRenderer
from trajlake.render.exactness import check_drift, model_contexts
from trajlake.render.toolcall import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, format_call, parse_tool_call
from trajlake.rollout.runner import play_episode

TASK = "mini-swe/durations/drop_branch/0"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trajlake.policies.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture()
def env(tmp_path: Path) -> Any:
    e = MiniSWEEnv("dev", workdir=tmp_path / "ws", budget=Budget(max_steps=4))
    yield e
    e.close()


class Recording:
    """Wraps a policy's ``generate`` to keep exactly what the model received."""

    def __init__(self, policy: LMPolicy):
        self.contexts: list[list[int]] = []
        inner = policy.generate

        def generate(ids: list[int], n: int) -> Generation:
            self.contexts.append(list(ids))
            return inner(ids, n)

        policy.generate = generate  # type: ignore[method-assign]


def _play(env: Any, policy: Any, attempt: int = 0, seed: int = 0, cost_model: Any = None) -> Any:
    return play_episode(env, policy, run_id="r", task_id=TASK, task_version=None, seed=seed, attempt=attempt,
                        split="dev", task_view=task_view_fn(env), cost_model=cost_model)


# -- the tool-call format ----------------------------------------------------------------------------------------

def test_tool_call_parser_formats_and_never_raises() -> None:
    ok = parse_tool_call("thinking...\n" + format_call("read_file", {"path": "src/a.py"}) + " trailing")
    assert ok.ok and ok.tool == "read_file" and json.loads(ok.action) == {"tool": "read_file",
                                                                           "args": {"path": "src/a.py"}}
    assert parse_tool_call('{"tool": "submit", "args": {}}').tool == "submit"
    assert parse_tool_call('<tool_call>{"name": "edit", "arguments": "{\\"path\\": \\"x\\"}"}</tool_call>').ok
    for bad in ["", "hello", "<tool_call>{}</tool_call>", "<tool_call>{\"name\": 3}</tool_call>",
                "<tool_call>{\"name\": \"x\"", "[1, 2]", '<tool_call>{"name": "x", "arguments": [1]}</tool_call>',
                "{" * 5000]:
        p = parse_tool_call(bad)
        assert not p.ok and p.action == bad and p.error
    rng = random.Random(0)
    alphabet = '{}[]":,<>/_toolcalnmergus \n\\'
    for _ in range(2000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        parse_tool_call(s)  # must not raise


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["read_file", "edit", "submit"]),
       st.dictionaries(st.sampled_from(["path", "old", "new"]),
                       st.lists(st.sampled_from([*'ab"\\\n{}<>/', TOOL_CALL_OPEN, TOOL_CALL_CLOSE]),
                                max_size=12).map("".join), max_size=3))
def test_parser_reads_back_every_call_format_call_writes(tool: str, args: dict[str, str]) -> None:
    """Whatever the arguments hold, the tags' text included (the grammar allows it inside a JSON string, and a
    constrained Mini SWE model wrote it: 50 of its 365 calls read as unparsable), the parser gives the call
    back; text after the call does not change that."""
    text = "".join(args.values())
    for reply in (format_call(tool, args), format_call(tool, args) + text, format_call(tool, args) + "\n"):
        p = parse_tool_call(reply)
        assert p.ok and json.loads(p.action) == {"tool": tool, "args": args}, reply


def test_draw_token_is_torchs_multinomial_draw_bit_for_bit() -> None:
    import torch

    from trajlake.policies.hf import draw_token, process_logits

    gen = torch.Generator().manual_seed(11)
    for trial in range(200):
        v = [2, 7, 512, 49152][trial % 4]
        logits = torch.randn(v, generator=gen) * [0.1, 1.0, 8.0, 30.0][trial % 3]
        allowed = None
        if trial % 5 == 0:  # a grammar's mask: most tokens at probability 0 exactly
            allowed = torch.rand(v, generator=gen) < 0.05
            allowed[trial % v] = True
        logp = process_logits(logits, [1.0, 0.7, 1.3][trial % 3], [1.0, 0.9][trial % 2], allowed)
        ours, theirs = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        assert [draw_token(logp, ours) for _ in range(3)] == \
            [int(torch.multinomial(logp.exp().cpu(), 1, generator=theirs)) for _ in range(3)], trial
        assert torch.equal(ours.get_state(), theirs.get_state())  # the stream continues identically
    with pytest.raises(TrajlakeError, match="non-finite probability"):
        draw_token(torch.tensor([0.0, float("nan"), -1.0]), torch.Generator().manual_seed(0))


def test_policy_args_are_checked() -> None:
    s = LMSettings.from_args(parse_policy_args(["temperature=0.5", "max_new_tokens=7", "price_in=2"]))
    assert (s.temperature, s.max_new_tokens, s.price_in) == (0.5, 7, 2.0)
    with pytest.raises(TrajlakeError, match="unknown --policy-arg 'temp'"):
        LMSettings.from_args({"temp": "1"})
    with pytest.raises(TrajlakeError, match="max_new_tokens='many': not a int"):
        LMSettings.from_args({"max_new_tokens": "many"})
    with pytest.raises(TrajlakeError, match="KEY=VALUE"):
        parse_policy_args(["temperature"])


# -- token exactness ---------------------------------------------------------------------------------------------

def _check_exact(rec: Any, contexts: list[list[int]]) -> None:
    turns = rec.turns
    pol = [t for t in turns if t["actor"] == "policy"]
    assert len(pol) == len(contexts) >= 2
    # loss_mask is 1 exactly on sampled tokens: every policy token, no other turn's.
    for t in turns:
        mask = np.asarray(t["loss_mask"])
        assert len(mask) == len(t["token_ids"])
        assert (mask == (1 if t["actor"] == "policy" else 0)).all()
    # The stored turns give back exactly the ids the model received, turn after turn.
    ctxs = model_contexts(turns)
    assert [c.context_ids for c in ctxs] == contexts
    # ... and, without trimming, each context is a prefix of the next (the prefix property).
    if all(t.get("context_dropped_hash") is None for t in pol):
        for a, b in itertools.pairwise(ctxs):
            assert b.context_ids[:len(a.context_ids) + len(a.generated_ids)] == a.context_ids + a.generated_ids


def test_hf_policy_is_token_exact_and_rescores(tiny: Path, env: Any) -> None:
    policy = HFPolicy("v1", str(tiny), LMSettings(max_new_tokens=12, temperature=0.8, top_p=0.9, seed=3))
    seen = Recording(policy)
    rec = _play(env, policy)
    _check_exact(rec, seen.contexts)
    turns = rec.turns
    assert {t["tokenizer_id"] for t in turns} == {policy.tokenizer_id}
    # The re-score of the stored turns with the same model gives the recorded behaviour log-probs.
    for c in model_contexts(turns):
        again = score_tokens(policy.model, c.context_ids, c.generated_ids, 0.8, 0.9)
        assert c.behavior_logprobs is not None
        np.testing.assert_allclose(again, c.behavior_logprobs, atol=1e-4)
    # The random model's noise does not parse: invalid-action turns, not a crash.
    assert all(t["status"] == "MODEL_INVALID_ACTION" for t in turns if t["actor"] == "policy")
    assert rec.episode["termination_reason"] == "budget_steps"
    assert check_drift(turns, policy.renderer, TOOL_DOCS) == []


@pytest.mark.slow
def test_drift_in_template_or_tokenizer_is_named(tiny: Path, env: Any, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    policy = HFPolicy("v1", str(tiny), LMSettings(max_new_tokens=6, seed=1))
    turns = _play(env, policy).turns
    tok = AutoTokenizer.from_pretrained(str(tiny))
    tok.chat_template = tok.chat_template.replace("'\\n' + message['content']", "':\\n' + message['content']")
    problems = check_drift(turns, ChatRenderer(tok, policy.renderer.name), TOOL_DOCS)
    assert problems[0].startswith("chat template drift")
    assert any(p.startswith("re-tokenization drift") or p.startswith("consequence") for p in problems)
    other = AutoTokenizer.from_pretrained(str(tiny))
    other.add_tokens(["tool_response"])  # a changed tokenizer splits the wrapper differently
    problems = check_drift(turns, ChatRenderer(other, policy.renderer.name), TOOL_DOCS)
    assert problems[0].startswith("tokenizer drift") and "token" in problems[-1]


@pytest.mark.slow
def test_attempts_sample_with_distinct_seeds(tiny: Path, env: Any) -> None:
    policy = HFPolicy("v1", str(tiny), LMSettings(max_new_tokens=8))
    a0, a0_again, a1 = _play(env, policy, 0), _play(env, policy, 0), _play(env, policy, 1)
    ids = [[list(t["token_ids"]) for t in r.turns if t["actor"] == "policy"] for r in (a0, a0_again, a1)]
    assert ids[0] == ids[1] and ids[0] != ids[2]
    assert a0.episode["group_id"] == a1.episode["group_id"] and a1.episode["attempt"] == 1


@pytest.mark.slow
def test_context_trimming_drops_oldest_pairs_and_records_it(tiny: Path, tmp_path: Path) -> None:
    env = MiniSWEEnv("dev", workdir=tmp_path / "ws", budget=Budget(max_steps=8))
    try:
        probe = HFPolicy("v1", str(tiny), LMSettings(max_new_tokens=8))
        probe_seen = Recording(probe)
        _play(env, probe)
        lengths = [len(c) for c in probe_seen.contexts]
        # A window that holds the task prompt and about one action/observation pair.
        window = lengths[0] + (lengths[2] - lengths[0]) // 2 + 8
        policy = HFPolicy("v1", str(tiny), LMSettings(max_new_tokens=8, max_context=window))
        seen = Recording(policy)
        rec = _play(env, policy)
    finally:
        env.close()
    pol = [t for t in rec.turns if t["actor"] == "policy"]
    assert max(len(c) for c in seen.contexts) <= window - 8
    trimmed = [t for t in pol if t["context_dropped_hash"]]
    assert trimmed, "the window is small enough that later turns must be trimmed"
    assert all(t.get("context_strategy", "drop_oldest") == "drop_oldest" for t in pol)
    _check_exact(rec, seen.contexts)
    ctxs = model_contexts(rec.turns)
    assert all(c.dropped is not None and c.dropped[0] == 1 for c in ctxs if c.turn_idx in
               {t["turn_idx"] for t in trimmed})


def test_context_strategy_none_fails_clearly(tiny: Path, env: Any) -> None:
    from trajlake.policies.lm import ContextOverflowError

    policy = HFPolicy("v1", str(tiny), LMSettings(max_new_tokens=8, max_context=64, context_strategy="none"))
    with pytest.raises(ContextOverflowError, match="over the window of 64"):
        _play(env, policy)


class Canned(LMPolicy):
    """An LM policy whose 'model' replies from a script (to exercise the parse -> environment path)."""

    def __init__(self, tiny: Path, replies: list[str]):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tiny))
        super().__init__("v1", LMSettings(), ChatRenderer(tok, "canned"), None)
        self.replies = replies

    def generate(self, context_ids: list[int], max_new_tokens: int) -> Generation:
        assert self.renderer is not None
        text = self.replies.pop(0)
        ids = [*self.renderer.encode(text), self.renderer.eos_id]
        return Generation(ids, [-0.5] * len(ids), text, len(context_ids), len(ids), ended_with_eos=True)


def test_parsed_tool_calls_reach_the_environment(tiny: Path, env: Any) -> None:
    policy = Canned(tiny, [format_call("list_files", {}), "I am not sure", format_call("submit", {})])
    rec = _play(env, policy)
    pol = [t for t in rec.turns if t["actor"] == "policy"]
    assert [t["status"] for t in pol] == ["OK", "MODEL_INVALID_ACTION", "OK"]
    assert [t["action_schema"] for t in pol] == ["list_files", None, "submit"]
    assert "src/durations.py" in rec.turns[2]["raw_content"]
    assert rec.episode["terminated"] and rec.episode["termination_reason"] == "submitted"


# -- B0: single turn -----------------------------------------------------------------------------------------------

def test_single_turn_b0_applies_one_patch(tiny: Path, env: Any) -> None:
    from trajlake.policies.single_turn import SingleTurnPolicy

    fix = next(t for t in list_tasks("mini-swe", "dev") if t["task_id"] == TASK)["fix_diff"]
    inner = Canned(tiny, ["Here is the fix:\n```diff\n" + fix + "```"])
    seen = Recording(inner)
    rec = _play(env, SingleTurnPolicy(inner))
    assert rec.episode["success"] is True
    model_turns = [t for t in rec.turns if t["actor"] == "policy" and t["token_ids"] is not None]
    assert len(model_turns) == 1 and len(seen.contexts) == 1
    t = model_turns[0]
    assert t.get("context_strategy", "single_turn") == "single_turn"
    # The file the statement names was in the prompt; earlier (mechanical) turns are named as dropped.
    prompt = inner.renderer.decode(seen.contexts[0])
    assert "src/durations.py" in prompt and "def parse_duration" in prompt
    assert [c.context_ids for c in model_contexts(rec.turns)] == seen.contexts
    # A reply without a usable diff is an invalid action, then the episode submits.
    rec = _play(env, SingleTurnPolicy(Canned(tiny, ["no idea"])))
    statuses = [t["status"] for t in rec.turns if t["actor"] == "policy"]
    assert statuses[-1] == "MODEL_INVALID_ACTION" and rec.episode["success"] is False


# -- openai: over a real loopback HTTP server ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tiny: Path) -> Any:
    pytest.importorskip("openai")
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from openai_server import ModelServer

    with ModelServer(str(tiny)) as srv:
        yield srv


def _openai(model: str, server: Any, **args: Any) -> Any:
    from trajlake.policies.openai_policy import OpenAIPolicy

    base = {"base_url": server.base_url, "max_new_tokens": 8, "backoff_s": 0.01, "timeout_s": 20}
    return OpenAIPolicy("v1", model, LMSettings.from_args({**base, **args}))


def test_openai_token_in_token_out_is_exact(tiny: Path, env: Any, server: Any) -> None:
    server.requests.clear()
    from trajlake.record.episode import CostModel

    policy = _openai("tiny", server, tokenizer=str(tiny))
    rec = _play(env, policy, cost_model=CostModel(price_in=2.0, price_out=10.0))
    sent = [ids for kind, ids in server.requests]
    assert {kind for kind, _ in server.requests} == {"completions"}
    _check_exact(rec, sent)  # what the server received is what the turns concatenate to
    hf = HFPolicy("v1", str(tiny), LMSettings())
    for c in model_contexts(rec.turns):
        np.testing.assert_allclose(score_tokens(hf.model, c.context_ids, c.generated_ids), c.behavior_logprobs,
                                   atol=1e-4)
    pol = [t for t in rec.turns if t["actor"] == "policy"]
    for t, ids in zip(pol, sent, strict=True):  # cost from the reported usage and the configured prices
        assert t["prompt_tokens"] == len(ids)
        assert t["cost_usd"] == pytest.approx((len(ids) * 2.0 + len(t["token_ids"]) * 10.0) / 1e6)
        assert t["status"] == "MODEL_INVALID_ACTION"


def test_openai_chat_mode_records_server_token_ids(env: Any, server: Any) -> None:
    server.requests.clear()
    rec = _play(env, _openai("tiny", server))
    sent = [ids for kind, ids in server.requests]
    assert {kind for kind, _ in server.requests} == {"chat"}
    # Chat servers re-render the history; either it extends the context, or the whole context is recorded on the
    # observation turn and the earlier turns are named as dropped: the reconstruction is exact in both cases.
    assert [c.context_ids for c in model_contexts(rec.turns)] == sent
    pol = [t for t in rec.turns if t["actor"] == "policy"]
    assert all(t["tokenizer_id"] == "served:tiny" and t["behavior_logprobs"] is not None for t in pol)


def test_openai_chat_mode_is_one_tokenizer_per_episode(env: Any, server: Any, tmp_path: Path) -> None:
    """Issue 27: the last observation of a chat-mode episode (the server never tokenizes it: nothing is sent after
    it) used to keep byte tokens (trajlake-bytes-v1) beside the server's ids; it is now text only, and verify
    reports an episode that mixes tokenizer ids."""
    import dataclasses

    from trajlake.envs.policy import BYTE_TOKENIZER_ID, byte_tokenize

    import trajlake
    from trajlake.rollout.runner import write_records

    rec = _play(env, _openai("tiny", server))
    last = rec.turns[-1]
    assert last["actor"] == "env" and last["raw_content"]
    assert last["token_ids"] is None and last["loss_mask"] is None and last["tokenizer_id"] is None
    assert all(t["tokenizer_id"] == "served:tiny" and t["token_ids"] is not None for t in rec.turns[:-1])
    lake = trajlake.open_lake(tmp_path / "lake", create=True)
    with trajlake.LakeWriter(lake, handle_signals=False) as w:
        write_records(w, [rec], wait=True)
    assert trajlake.verify(lake, strict=True).ok
    # the old recording: byte tokens on the last observation, served ids on the rest
    ids = byte_tokenize(last["raw_content"])
    old_turns = [{**t, "run_id": "old", "episode_id": "old-ep"} for t in rec.turns]
    old_turns[-1].update(token_ids=ids, loss_mask=np.zeros(len(ids), dtype=np.int8), tokenizer_id=BYTE_TOKENIZER_ID)
    old = dataclasses.replace(rec, episode={**rec.episode, "run_id": "old", "episode_id": "old-ep"}, turns=old_turns,
                              events=[])
    with trajlake.LakeWriter(lake, handle_signals=False) as w:
        write_records(w, [old], wait=True)
    report = trajlake.verify(lake)
    assert not report.ok
    (problem,) = report.problems
    assert "episode old-ep mixes tokenizer ids: turn 0 has 'served:tiny', turn " in problem
    assert f"has {BYTE_TOKENIZER_ID!r}" in problem


def test_openai_negotiates_vllm_extensions_with_the_server(tiny: Path, env: Any, server: Any,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 27: a server that refuses vLLM's return_token_ids (transformers serve: HTTP 422 "Unexpected fields in
    the request") is asked once more without it, remembered for the run, and gives text-only turns with one note;
    errors keep the server's explanation."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from openai_server import ModelServer

    from trajlake.policies import openai_policy
    from trajlake.policies.lm import ModelServerError

    with ModelServer(str(tiny)) as srv:
        srv.reject_fields = {"return_token_ids"}
        monkey_warned = openai_policy._warned_text_only
        openai_policy._warned_text_only = False
        try:
            recs = [_play(env, _openai("tiny", srv), seed=seed) for seed in (0, 1)]  # two episodes, one run
        finally:
            openai_policy._warned_text_only = monkey_warned
        err = capsys.readouterr().err
        # one refused request in the whole run, then every request without the extension
        sent = [("return_token_ids" in b) for b in srv.bodies]
        assert sent[:2] == [True, False] and not any(sent[2:]) and len(sent) == 1 + len(srv.requests)
        assert err.count("note: ") == 1 and "refused vLLM's return_token_ids (HTTP 422: Unexpected fields in the " \
            "request: {'return_token_ids'})" in err and "text only" in err
        for rec in recs:
            pol = [t for t in rec.turns if t["actor"] == "policy"]
            assert all(t["token_ids"] is None and t["tokenizer_id"] is None and t["tokens"] > 0 for t in pol)
            assert all(t["status"] != "ENV_TRANSIENT" for t in pol)  # a negotiation is not a retry
            assert {t["tokenizer_id"] for t in rec.turns} - {None} == {"trajlake-bytes-v1"}
        # token in, token out cannot do without token ids: one line with the server's explanation
        with pytest.raises(ModelServerError) as ei:
            _play(env, _openai("tiny", srv, tokenizer=str(tiny)))
        msg = str(ei.value)
        assert "\n" not in msg and "HTTP 422: Unexpected fields in the request: {'return_token_ids'}" in msg
        assert "--policy-arg tokenizer" in msg
    # a 4xx that is not about the extensions: asked once more, then one line with the server's words, not remembered
    server.faults[:] = ["400", "400"]
    try:
        with pytest.raises(ModelServerError, match=r"HTTP 400: injected 400$"):
            _play(env, _openai("tiny", server))
    finally:
        server.faults.clear()
    assert server.base_url not in openai_policy._refused


def test_openai_chat_without_token_ids_records_text(tiny: Path, env: Any) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from openai_server import ModelServer

    from trajlake.record.episode import CostModel

    with ModelServer(str(tiny), token_ids=False) as srv:
        rec = _play(env, _openai("tiny", srv), cost_model=CostModel(price_in=0.0, price_out=1.0))
    pol = [t for t in rec.turns if t["actor"] == "policy"]
    assert all(t["tokenizer_id"] is None and t["token_ids"] is None for t in pol)
    assert all(t["tokens"] > 0 and t["cost_usd"] == pytest.approx(t["tokens"] / 1e6) for t in pol)


def test_openai_sends_the_grammar_and_records_which_logprobs(tiny: Path, env: Any, server: Any) -> None:
    pytest.importorskip("llguidance")
    from trajlake.policies import lm_run_config
    from trajlake.render.grammar import tool_call_grammar

    for mode in ({"tokenizer": str(tiny)}, {}):  # token in, token out; chat
        server.bodies.clear()
        policy = _openai("tiny", server, grammar="tools", grammar_max_chars=4, max_new_tokens=200, **mode)
        rec = _play(env, policy)
        assert policy.grammar == tool_call_grammar(TOOL_DOCS, 4)
        # every request carried the grammar as vLLM's structured outputs ...
        sent = [b.get("structured_outputs") for b in server.bodies]
        assert sent and all(s == {"grammar": policy.grammar.text} for s in sent)
        # ... which the server enforced: every reply is a call of the environment's tools
        pol = [t for t in rec.turns if t["actor"] == "policy"]
        assert pol and all(t["status"] != "MODEL_INVALID_ACTION" for t in pol)
    # the run's config says the run was constrained and which log-probs the server returns
    args = {"base_url": server.base_url, "grammar": "tools", "grammar_max_chars": "4", "server_logprobs": "processed"}
    assert lm_run_config("openai:tiny", args, TOOL_DOCS) == {"grammar": tool_call_grammar(TOOL_DOCS, 4).to_config(),
                                                             "server_logprobs": "processed"}


def test_openai_server_refusing_the_grammar_fails_in_one_line(env: Any, server: Any) -> None:
    pytest.importorskip("llguidance")
    from trajlake.policies.lm import ModelServerError

    server.reject_structured = True
    try:
        with pytest.raises(ModelServerError, match="refused the request with the tool-call grammar") as err:
            _play(env, _openai("tiny", server, grammar="tools"))
        assert "\n" not in str(err.value) and "HTTP 400" in str(err.value)
    finally:
        server.reject_structured = False


@pytest.mark.slow
def test_openai_retries_timeouts_and_5xx_as_infrastructure(tiny: Path, env: Any, server: Any) -> None:
    from trajlake.policies.lm import ModelServerError

    server.faults[:] = ["503", "timeout", "500"]
    server.timeout_sleep_s = 7.0
    rec = _play(env, _openai("tiny", server, tokenizer=str(tiny), timeout_s=6))
    assert server.faults == []
    pol = [t for t in rec.turns if t["actor"] == "policy"]
    # The first call needed three retries: recorded as infrastructure status on that turn, not as a model error
    # (the later turns are invalid actions of the random model, unless this shared machine was slow enough for a
    # real timeout: that is infrastructure too).
    assert pol[0]["status"] == "ENV_TRANSIENT"
    assert {t["status"] for t in pol[1:]} <= {"MODEL_INVALID_ACTION", "ENV_TRANSIENT"}
    # The reply itself did not parse: the environment's answering turn still says so.
    assert rec.turns[pol[0]["turn_idx"] + 1]["status"] == "MODEL_INVALID_ACTION"
    assert rec.episode["error_class"] != "ENV_TRANSIENT"
    server.faults[:] = ["503"] * 3
    with pytest.raises(ModelServerError, match=r"3 attempt\(s\) failed; last: InternalServerError"):
        _play(env, _openai("tiny", server, tokenizer=str(tiny), max_retries=2))
    server.faults.clear()


# -- group rollouts, B0 and B2 through the command line, then eval -------------------------------------------------

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_cli_group_rollout_b0_b2_and_eval(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    from conftest import run_cli

    from trajlake.query import connect

    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny, tmp_path / "models" / "tiny")  # where the shipped configs expect the tiny model
    cfg = REPO / "configs"
    # one task, short answers, and episodes cut at 4 steps (the task's own budget is 30): a tiny random model
    # never submits, so the length of its episodes is only time
    small = ["--tasks", TASK, "--policy-arg", "max_new_tokens=8", "--env-arg", 'budget={"max_steps": 4}']
    code, out, err = run_cli(capsys, "--lake", "lake", "rollout", "--config", str(cfg / "agent-tiny.toml"), *small)
    assert code == 0, err
    # The shipped B2 config (N = 4 there), with 2 attempts on one task to keep the test short.
    group = ["--lake", "lake", "rollout", "--config", str(cfg / "b2-tiny.toml"), "--attempts", "2", *small]
    code, out, err = run_cli(capsys, *group)
    assert code == 0, err
    assert "2 episode(s) written" in out
    code, out, err = run_cli(capsys, *group)  # resumable: nothing played twice
    assert code == 0 and "0 episode(s) written" in out and "2 already in the lake" in out
    con = connect("lake")
    rows = con.execute("select attempt, group_id, episode_id from episodes where run_id = 'b2-pool-tiny' "
                       "order by attempt").fetchall()
    assert [r[0] for r in rows] == [0, 1] and rows[0][1] == rows[1][1]
    toks = [con.execute("select flatten(list(token_ids order by turn_idx)) from turns where episode_id = ? and "
                        "actor = 'policy'", [r[2]]).fetchone()[0] for r in rows]
    assert toks[0] != toks[1]  # distinct sampling seeds
    config = json.loads(con.execute("select config from runs where run_id = 'b2-pool-tiny'").fetchone()[0])
    assert config["attempts"] == 2 and config["policy_args"]["max_new_tokens"] == "8"
    ckpt = con.execute("select policy_checkpoint_hash from runs where run_id = 'b2-pool-tiny'").fetchone()[0]
    assert ckpt is not None and ckpt.startswith("sha256:")

    code, out, err = run_cli(capsys, "--lake", "lake", "best-of", "--config", str(cfg / "b2-tiny.toml"))
    assert code == 0, err
    assert "matched to run agent-tiny" in out and "never hidden tests" in out
    code, out, err = run_cli(capsys, "--lake", "lake", "rollout", "--config", str(cfg / "b0-tiny.toml"), *small)
    assert code == 0, err
    for run in ("b2-pool-tiny", "b2-tiny", "b0-tiny", "agent-tiny"):
        code, out, err = run_cli(capsys, "--lake", "lake", "eval", "--run", run, "--format", "json")
        assert code == 0, err
    n = connect("lake").execute("select count(*) from episodes where run_id in ('b2-tiny', 'b0-tiny')"
                                ).fetchone()[0]
    assert n == 2


def test_best_of_uses_only_visible_signals_within_budget() -> None:
    from trajlake.policies.best_of import Candidate, choose, visible_pass_rate

    assert visible_pass_rate("3 passed, 1 failed (exit code 1)\nFAILED t") == 0.75
    assert visible_pass_rate("tests timed out") is None

    def c(attempt: int, tokens: int, vis: float | None, lp: float | None) -> Candidate:
        return Candidate(f"e{attempt}", "g", "t", attempt, tokens, 0.0, vis, lp)

    pool = [c(0, 100, 0.5, -1.0), c(1, 100, None, -0.1), c(2, 100, 1.0, -3.0), c(3, 100, 1.0, -2.0)]
    chosen, considered = choose(pool, None)
    assert chosen["g"].attempt == 3  # all visible tests pass, then the higher own log-prob
    chosen, considered = choose(pool, 250)  # only attempts 0 and 1 fit the budget
    assert [x.attempt for x in considered["g"]] == [0, 1] and chosen["g"].attempt == 0
    chosen, considered = choose(pool, 10)  # attempt 0 is always considered
    assert chosen["g"].attempt == 0
    costly = [Candidate(x.episode_id, "g", "t", x.attempt, x.tokens, 0.5, x.visible_pass_rate, x.mean_logprob)
              for x in pool]
    chosen, considered = choose(costly, None, budget_cost=1.6)  # a cost budget: three attempts fit
    assert len(considered["g"]) == 3 and chosen["g"].attempt == 2
