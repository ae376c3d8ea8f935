"""Context strategy ``summarize`` and the ``context_trim`` fault: the summariser ``extractive-v1``, summaries
recorded as ``summarizer`` turns (loss mask 0, no log-probs, ``summary_version``), token exactness of the contexts
that hold them, the trainer's samples (the loss never covers a summary), ``verify --strict``, and the fault that
forces trimming, end to end into ``trajlake eval``'s forgetting check.

The model is the tiny randomly initialised Llama (nothing downloaded); the fault tests script the replies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trajlake.envs import Budget, task_view_fn
from trajlake.envs.mini_swe.env import TOOL_DOCS, MiniSWEEnv
from trajlake.envs.tool_lookup.env import ToolLookupEnv

from trajlake import LakeWriter, open_lake
from trajlake.errors import TrajlakeError
from trajlake.policies import check_policy_spec
from trajlake.policies.hf import HFPolicy
from trajlake.policies.lm import Generation, LMPolicy
from trajlake.policies.settings import LMSettings
from trajlake.policies.summarize import DroppedTurn, ExtractiveSummarizer
from trajlake.render.chat import ChatRenderer
from trajlake.render.exactness import check_drift, model_contexts
from trajlake.render.toolcall import format_call
from trajlake.rollout.faults import FaultInjector
from trajlake.rollout.runner import EpisodeRecord, play_episode

TASK = "mini-swe/durations/drop_branch/0"
LOOKUP_TASK = "tool-lookup/code/p4/0"  # 'Submit the code stored for "Mufa".' (its code is 73)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trajlake.policies.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_extractive_summarizer_keeps_the_newest_calls_under_the_cap() -> None:
    s = ExtractiveSummarizer(head_chars=12)
    turns = [DroppedTurn(1, "policy", json.dumps({"tool": "read_file", "args": {"path": "a.py"}})),
             DroppedTurn(2, "observation", "def f(x):\n    return   x + 1\n"),
             DroppedTurn(3, "summary", "[an older summary]"),
             DroppedTurn(4, "policy", "not a call"),
             DroppedTurn(5, "observation", "invalid action")]
    assert s.lines(turns) == ['- turn 1 called read_file {"path": "a.py"}; turn 2 answered: def f(x): re ...',
                              "- turn 4 wrote no valid tool call (10 characters); turn 5 answered: invalid acti ..."]
    whole = s.summarize(turns, len, 10_000)
    assert whole.splitlines() == ["[Summary of turns 1-5, dropped from the context (extractive-v1)]", *s.lines(turns)]
    # a cap that holds the header, the count and one line keeps the newest line
    one = "\n".join([whole.splitlines()[0], "(1 older call(s) omitted)", s.lines(turns)[1]])
    for cap in (len(one), len(whole) - 1):
        assert s.summarize(turns, len, cap) == one
    newest = s.summarize(turns, len, len(one) - 1)
    assert newest.splitlines()[1:] == ["(2 older call(s) omitted)"]
    assert s.summarize(turns, len, 1) == newest  # the header and the count stay, whatever the cap


def test_summarize_settings_are_checked() -> None:
    assert LMSettings.from_args({"context_strategy": "summarize"}).summarizer == "extractive"
    with pytest.raises(TrajlakeError, match="summarizer must be one of extractive"):
        LMSettings.from_args({"context_strategy": "summarize", "summarizer": "abstractive"})
    with pytest.raises(TrajlakeError, match="summary_max_tokens must be >= 1"):
        LMSettings.from_args({"summary_max_tokens": "0"})
    with pytest.raises(TrajlakeError, match="needs --policy-arg tokenizer"):
        check_policy_spec("mini-swe", "openai:m", {"base_url": "http://x", "context_strategy": "summarize"})


def _play(env: Any, policy: Any, task: str = TASK, **kw: Any) -> EpisodeRecord:
    kw.setdefault("task_view", None if policy.needs_oracle else task_view_fn(env))
    return play_episode(env, policy, run_id=kw.pop("run_id", "r"), task_id=task, task_version=None, seed=0,
                        split="dev", **kw)


@pytest.fixture(scope="module")
def summarized(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[EpisodeRecord, list[list[int]], Any]:
    """An episode of the tiny model whose window holds the task prompt, a summary and about one pair, with what
    the model received at each turn."""
    env = MiniSWEEnv("dev", workdir=tmp_path_factory.mktemp("ws"), budget=Budget(max_steps=4))
    try:
        probe = HFPolicy("v1", str(tiny), LMSettings(max_new_tokens=8))
        assert probe.renderer is not None
        r = env.reset(0, task_id=TASK)
        probe.reset(env.task_view(r.task_id, r.task_version), 0)
        # the prompt, a summary (at most 100 tokens) and one action/observation pair (~116 tokens here)
        window = len(probe.renderer.initial(probe.system, r.observation)) + 8 + 120 + 100
        policy = HFPolicy("v1", str(tiny), LMSettings(max_new_tokens=8, max_context=window,
                                                      context_strategy="summarize", summary_max_tokens=100))
        contexts: list[list[int]] = []
        inner = policy.generate

        def generate(ids: list[int], n: int) -> Generation:
            contexts.append(list(ids))
            return inner(ids, n)

        policy.generate = generate  # type: ignore[method-assign,assignment]
        rec = _play(env, policy)
    finally:
        env.close()
    assert max(len(c) for c in contexts) <= window - 8
    return rec, contexts, policy


def test_summaries_are_recorded_as_summarizer_turns_and_contexts_stay_exact(
        summarized: tuple[EpisodeRecord, list[list[int]], Any]) -> None:
    rec, contexts, policy = summarized
    turns = rec.turns
    summaries = [t for t in turns if t["actor"] == "summarizer"]
    assert len(summaries) >= 2, "the window is small enough that later turns are summarised"
    for s in summaries:
        nxt = turns[s["turn_idx"] + 1]
        assert s["role"] == "user" and s["summary_version"] == "extractive-v1" and s.get("behavior_logprobs") is None
        assert not np.asarray(s["loss_mask"]).any() and len(s["loss_mask"]) == len(s["token_ids"])
        assert nxt["actor"] == "policy" and nxt["context_dropped_hash"] == s["context_dropped_hash"]
        assert s["raw_content"].startswith("[Summary of turns 1-") and "(extractive-v1)]" in s["raw_content"]
        assert list(s["token_ids"]) == policy.renderer.summary(s["raw_content"])
    assert {t["context_strategy"] for t in turns if t["actor"] == "policy"} == {"summarize"}
    # the recorded turns give back exactly the ids the model received, summary after the task prompt
    ctxs = model_contexts(turns)
    assert [c.context_ids for c in ctxs] == contexts
    for c in ctxs:
        if c.summary is not None:
            assert c.kept[:2] == (0, c.summary) and turns[c.summary]["actor"] == "summarizer"
            assert c.dropped is not None and c.dropped[0] == 1
    assert any(c.summary is not None for c in ctxs)
    assert check_drift(turns, policy.renderer, TOOL_DOCS) == []
    # a summary replaced by a newer one is in no later context
    later = [c for c in ctxs if c.summary is not None]
    assert len({c.summary for c in later}) >= 2


def test_the_trainer_never_learns_a_summary_and_verify_strict_accepts_it(
        summarized: tuple[EpisodeRecord, list[list[int]], Any], tiny: Path, tmp_path: Path) -> None:
    from trajlake.lake.maintenance import verify
    from trajlake.train.data import LakeTrajectories, Selection

    rec, _, _ = summarized
    lake = open_lake(tmp_path / "lake", create=True)
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_batch([rec.episode], rec.turns, rec.events or None).raise_if_rejected()
    report = verify(lake, strict=True)
    assert report.ok, report.problems
    ctxs = model_contexts(rec.turns)
    samples = list(LakeTrajectories(lake, Selection(runs=["r"]), tokenizer=tiny))
    assert len(samples) == len(ctxs)
    for smp, c in zip(samples, ctxs, strict=True):
        assert smp["input_ids"].tolist() == c.context_ids + c.generated_ids
        # loss mask 1 exactly on the sampled ids: never on the summary (nor any other context token)
        assert smp["loss_mask"].tolist() == [0] * len(c.context_ids) + [1] * len(c.generated_ids)
        assert np.isnan(smp["behavior_logprobs"][:len(c.context_ids)]).all()


class Canned(LMPolicy):
    """An LM policy whose 'model' replies from a script (the faults need meaningful calls)."""

    def __init__(self, tiny: Path, replies: list[str], settings: LMSettings):
        from transformers import AutoTokenizer

        super().__init__("v1", settings, ChatRenderer(AutoTokenizer.from_pretrained(str(tiny)), "canned"), None)
        self.replies = list(replies)

    def generate(self, context_ids: list[int], max_new_tokens: int) -> Generation:
        assert self.renderer is not None
        text = self.replies.pop(0)
        ids = [*self.renderer.encode(text), self.renderer.eos_id]
        return Generation(ids, [-0.5] * len(ids), text, len(context_ids), len(ids), ended_with_eos=True)


REPLIES = [format_call("lookup", {"name": "Mufa"}), format_call("lookup", {"name": "Lodi"}),
           format_call("lookup", {"name": "Mufa"}), format_call("submit", {"answer": "99"})]


@pytest.mark.parametrize("strategy", ["drop_oldest", "summarize"])
def test_context_trim_fault_forces_trimming_and_eval_sees_the_forgetting(tiny: Path, tmp_path: Path,
                                                                         strategy: str) -> None:
    """A context_trim fault on every step: from the second step on the policy's next context loses the earlier
    pairs. The scripted policy then re-reads Mufa, whose answer trimming dropped, and fails: under drop_oldest
    eval flags it as forgetting; under summarize the summary held that answer, so it is not."""
    from trajlake.evaluators.data import load
    from trajlake.evaluators.metrics import Settings
    from trajlake.evaluators.report import evaluate

    env = ToolLookupEnv("dev", workdir=tmp_path)
    faults = FaultInjector(rate=1.0, kinds=("context_trim",))
    try:
        policy = Canned(tiny, REPLIES, LMSettings(context_strategy=strategy))
        rec = _play(env, policy, LOOKUP_TASK, faults=faults, run_id="canned")
        oracle = _play(env, env.policies()["oracle"]("v1"), LOOKUP_TASK, faults=faults, run_id="oracle")
    finally:
        env.close()
    turns = rec.turns
    assert rec.episode["success"] is False
    pol = [t for t in turns if t["actor"] == "policy"]
    faulted = [t["turn_idx"] for t in turns if t.get("fault_injected") == "context_trim"]
    # step 0 had nothing before the newest reply to lose; steps 1 and 2 did; the last step ended the episode
    assert faulted == [t["turn_idx"] + 1 for t in pol[1:3]]
    assert [t["context_dropped_hash"] is not None for t in pol] == [False, False, True, True]
    ctxs = model_contexts(turns)
    assert ctxs[2].dropped == (1, 3) and ctxs[3].dropped is not None and ctxs[3].dropped[0] == 1
    if strategy == "summarize":
        assert ctxs[2].summary is not None
        s = turns[ctxs[2].summary]
        assert '"Mufa"' in s["raw_content"] and '"73"' in s["raw_content"]  # lookup and its answer, kept
    # a scripted policy has no context: the fault is not recorded and the episode is unaffected
    assert oracle.episode["success"] is True and not any(t.get("fault_injected") for t in oracle.turns)
    lake = open_lake(tmp_path / "lake", create=True)
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_runs([{"run_id": "canned", "created_at": rec.episode["started_at"], "trajlake_version": "t"}])
        w.write_batch([rec.episode], rec.turns, rec.events or None).raise_if_rejected()
    data = load(lake, ["canned"])
    try:
        rep = evaluate(data, taxonomy=False, breakdown=False, settings=Settings(resamples=50))
    finally:
        data.close()
    m = rep["runs"]["canned"]["metrics"]
    assert m["trimmed_rate"]["estimate"] == 1.0
    assert m["recovery_rate_context_trim"]["n"] == 1 and m["recovery_rate_context_trim"]["estimate"] == 0.0
    assert m["forgetting_rate"]["estimate"] == (1.0 if strategy == "drop_oldest" else 0.0)
