"""B0 (`single-turn:`) in environments that finish with an answer: one model answer from the statement alone, no
tools, recorded as the episode's one model turn (Mini Web's `answer`, tool-lookup's `submit`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trajlake.envs import make_env, task_view_fn
from trajlake.envs.mini_web import load_tasks

from tests.test_lm_policies import Canned
from trajlake.policies.single_turn import B0_ANSWER_SYSTEM, SingleTurnPolicy, answer_call
from trajlake.rollout.runner import play_episode


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trajlake.policies.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", layers=1)


def play(env_name: str, task_id: str, policy: Any, split: str) -> Any:
    env = make_env(env_name, split=split)
    try:
        return play_episode(env, policy, run_id="b0", task_id=task_id, task_version=None, seed=0, split=split,
                            task_view=task_view_fn(env))
    finally:
        env.close()


def test_the_answer_call_of_each_environment() -> None:
    from trajlake.envs.mini_swe.env import TOOL_DOCS as SWE
    from trajlake.envs.mini_web.env import TOOL_DOCS as WEB
    from trajlake.envs.tool_lookup.env import TOOL_DOCS as LOOKUP

    assert answer_call(WEB) == ("answer", "text") and answer_call(LOOKUP) == ("submit", "answer")
    assert answer_call(SWE) is None  # Mini SWE's B0 answers with a diff


@pytest.mark.parametrize("right", [True, False])
def test_b0_on_mini_web_is_one_answer_from_the_statement(tiny: Path, right: bool) -> None:
    task = next(t for t in load_tasks() if t["family"] == "compare/cheapest-in-category")
    expected = next(step["text"] for step in task["oracle"] if step["op"] == "answer")
    inner = Canned(tiny, [f"{expected if right else '$0.01'}\nbecause it is cheap"])
    rec = play("mini-web", task["task_id"], SingleTurnPolicy(inner), task["split"])
    policy_turns = [t for t in rec.turns if t["actor"] == "policy"]
    assert len(policy_turns) == 1 and policy_turns[0]["action_schema"] == "answer"
    assert rec.episode["success"] is right and rec.episode["terminated"]
    t = policy_turns[0]
    assert t["context_strategy"] == "single_turn" and t["token_ids"] is not None and sum(t["loss_mask"]) > 0
    prompt = inner.renderer.decode(rec.turns[0]["token_ids"]) if rec.turns[0]["token_ids"] is not None else ""
    assert task["statement"] in prompt and B0_ANSWER_SYSTEM in prompt  # the statement, no page, no tools


def test_b0_on_tool_lookup_submits_its_answer(tiny: Path) -> None:
    from trajlake.envs.tool_lookup.env import ToolLookupEnv

    env = ToolLookupEnv(split="train")
    task = env.list_tasks()[0]
    env.close()
    rec = play("tool-lookup", task["task_id"], SingleTurnPolicy(Canned(tiny, ["I cannot know"])), "train")
    (t,) = [t for t in rec.turns if t["actor"] == "policy"]
    assert t["action_schema"] == "submit" and rec.episode["success"] is False and rec.episode["terminated"]
