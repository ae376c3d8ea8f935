"""Mini Web in a real browser: the same pages driven through Playwright with the system's Chromium."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from trajlake.envs.core import EnvError
from trajlake.envs.mini_web import POLICIES, MiniWebEnv, load_tasks, task_view
from trajlake.envs.mini_web.browser import find_chromium

needs_chromium = pytest.mark.skipif(
    find_chromium() is None or importlib.util.find_spec("playwright") is None,
    reason="needs Debian's chromium (apt-get install chromium) and the playwright package")

TASKS = {t["family"]: t for t in load_tasks()}


def play(env: MiniWebEnv, task: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(action, observation, state hash) per step of the oracle."""
    pol = POLICIES["oracle"]("o")
    r = env.reset(0, task_id=task["task_id"])
    pol.reset(task_view(env, task["task_id"], task["task_version"], oracle=True), 0)
    out = [("", r.observation, r.state_hash)]
    obs = r.observation
    for i in range(60):
        action = pol.act(obs).action
        res = env.step(action, f"k{i}")
        assert res.status == "OK", res.observation
        out.append((action, res.observation, res.state_hash))
        obs = res.observation
        if res.done:
            assert res.reward_components == {"resolved": 1.0}, env.failures
            break
    return out


def without_screenshot(observation: str) -> tuple[str, str | None]:
    lines, shot = [], None
    for line in observation.splitlines():
        if line.startswith("Screenshot: "):
            shot = line.removeprefix("Screenshot: ")
        else:
            lines.append(line)
    return "\n".join(lines), shot


@pytest.mark.slow
@needs_chromium
def test_chromium_plays_the_same_pages_with_screenshots() -> None:
    tasks = [TASKS["orders/two-items-coupon"], TASKS["tickets/triage"], TASKS["compare/cheapest-in-category"]]
    plain, chrome = MiniWebEnv(tasks=tasks), MiniWebEnv(tasks=tasks, browser="chromium")
    try:
        for t in tasks:
            expected = play(plain, t)
            got = play(chrome, t)
            assert [a for a, _, _ in got] == [a for a, _, _ in expected]
            assert [h for _, _, h in got] == [h for _, _, h in expected]  # same backend states
            for (_, want, _), (_, obs, _) in zip(expected[:-1], got[:-1], strict=True):
                tree, shot = without_screenshot(obs)
                assert tree == want  # the same accessibility tree from the browser's DOM
                assert shot is not None and Path(shot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        plain.close()
        chrome.close()


def test_missing_chromium_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJLAKE_CHROMIUM", "/nonexistent/chromium")
    env = MiniWebEnv(split="dev", browser="chromium")
    try:
        with pytest.raises(EnvError, match="no chromium executable"):
            env.reset(0)
    finally:
        env.close()


@pytest.mark.slow
@needs_chromium
def test_restore_in_the_browser_returns_to_the_snapshot_page() -> None:
    task = TASKS["orders/two-items-coupon"]
    env = MiniWebEnv(tasks=[task], browser="chromium")
    try:
        steps = play(env, task)
        cart = next(i for i, (a, _, _) in enumerate(steps) if '"/cart"' in a)
        env.reset(0, task_id=task["task_id"])
        for action, _, _ in steps[1:cart + 1]:
            env.step(action)
        snap = env.snapshot()
        rest = [a for a, _, _ in steps[cart + 1:]]
        first = [env.step(a) for a in rest]
        env.reset(0, task_id=task["task_id"])
        env.restore(snap)  # Chromium still shows the order page; the next form post must happen on /cart
        again = [env.step(a) for a in rest]
        assert [r.state_hash for r in again] == [r.state_hash for r in first]
        assert again[-1].reward_components == {"resolved": 1.0}
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.security
@needs_chromium
def test_http_and_chromium_give_the_same_status_for_the_same_odd_characters() -> None:
    """A character in an action is judged once, before either mode runs it: the same status (and the same
    error line) whether the page is fetched over HTTP or driven in Chromium."""
    import json

    def act(tool: str, **args: Any) -> str:
        return json.dumps({"tool": tool, "args": args})

    actions = [act("goto", path="/produçts"), act("goto", path="/products?q=red shoes"),
               act("goto", path="/prod ucts"), act("goto", path="/products\x7f"),
               '{"tool": "type", "args": {"id": 3, "text": "\\ud800"}}', '{"tool": "answer", "args": {"text": "a\\udfffb"}}']
    task = TASKS["compare/cheapest-in-category"]
    plain, chrome = MiniWebEnv(tasks=[task]), MiniWebEnv(tasks=[task], browser="chromium")
    try:
        for action in actions:
            got = []
            for env in (plain, chrome):
                env.reset(0, task_id=task["task_id"])
                env.step(act("goto", path="/products"), "k0")
                res = env.step(action, "k1")
                error = next((ln for ln in res.observation.splitlines() if ln.startswith("Last action error:")), "")
                got.append((res.status, res.done, error))
            assert got[0] == got[1], (action, got)
            assert got[0][0] in {"OK", "MODEL_INVALID_ACTION"} and not got[0][1], (action, got)
    finally:
        plain.close()
        chrome.close()
