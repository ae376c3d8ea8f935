"""Batched decoding across episodes (``--policy-arg batch_episodes=N``, ``trajlake.policies.batched``): episodes
played at once, their turns decoded in shared forward passes, record the same ids, loss masks and behaviour
log-probs as the same episodes played one at a time (greedy, sampled with each episode's own generator, under the
tool-call grammar, with trimmed and with summarised contexts), and the runner plays and resumes them.

Every model is the tiny randomly initialised Llama (nothing downloaded)."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trajlake.envs import Budget, list_tasks, task_view_fn
from trajlake.envs.mini_swe.env import MiniSWEEnv

from trajlake.errors import TrajlakeError
from trajlake.policies import check_policy_spec
from trajlake.policies.batched import BatchedEpisodePolicy
from trajlake.policies.hf import HFPolicy
from trajlake.policies.settings import LMSettings
from trajlake.rollout.runner import EpisodeRecord, RolloutConfig, play_episode, run_rollout

N = 4
ITEMS = [(t["task_id"], seed) for t in list_tasks("mini-swe", "dev")[:3] for seed in (0, 1)]
"""Six episodes: more than N, so finished episodes' slots take new ones (continuous batching)."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trajlake.policies.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def _episode(policy: Any, task_id: str, seed: int, workdir: Path) -> EpisodeRecord:
    env = MiniSWEEnv("dev", workdir=workdir, budget=Budget(max_steps=3))
    try:
        return play_episode(env, policy, run_id="r", task_id=task_id, task_version=None, seed=seed, split="dev",
                            task_view=task_view_fn(env))
    finally:
        env.close()


def _both(tiny: Path, settings: LMSettings, tmp_path: Path) -> tuple[list[EpisodeRecord], list[EpisodeRecord],
                                                                         list[BatchedEpisodePolicy]]:
    """The episodes of ITEMS played one at a time, then N at a time on threads (as a batched worker plays)."""
    parent = HFPolicy("v1", str(tiny), settings)
    alone = [_episode(parent, t, s, tmp_path / "alone") for t, s in ITEMS]
    views = parent.concurrent(N)
    assert all(isinstance(v, BatchedEpisodePolicy) for v in views)
    free = list(views)

    def play(item: tuple[str, int]) -> EpisodeRecord:
        policy = free.pop()  # list.pop/append are atomic: each thread holds one policy at a time
        try:
            return _episode(policy, *item, tmp_path / "batched")
        finally:
            free.append(policy)

    with ThreadPoolExecutor(N) as pool:
        together = list(pool.map(play, ITEMS))
    return alone, together, [v for v in views if isinstance(v, BatchedEpisodePolicy)]


def _assert_same(alone: list[EpisodeRecord], together: list[EpisodeRecord], views: list[BatchedEpisodePolicy]
                 ) -> None:
    engine = views[0].engine
    assert engine.row_steps > engine.steps, "the episodes' turns were decoded in shared forward passes"
    for a, b in zip(alone, together, strict=True):
        assert len(a.turns) == len(b.turns)
        for x, y in zip(a.turns, b.turns, strict=True):
            where = f"{a.episode['episode_id']} turn {x['turn_idx']}"
            assert x["raw_content"] == y["raw_content"], where
            assert list(x["token_ids"]) == list(y["token_ids"]), where
            assert list(x["loss_mask"]) == list(y["loss_mask"]), where
            assert x.get("context_dropped_hash") == y.get("context_dropped_hash"), where
            if x["actor"] == "policy":
                # batched matmuls round differently from single rows: equal to float32 rounding
                np.testing.assert_allclose(y["behavior_logprobs"], x["behavior_logprobs"], atol=1e-5, err_msg=where)


def test_batched_greedy_episodes_record_as_unbatched(tiny: Path, tmp_path: Path) -> None:
    alone, together, views = _both(tiny, LMSettings(temperature=0.0, max_new_tokens=10), tmp_path)
    _assert_same(alone, together, views)


@pytest.mark.slow
@pytest.mark.parametrize("headroom", [0, 40])
def test_batched_sampled_episodes_draw_their_own_streams(tiny: Path, tmp_path: Path, headroom: int) -> None:
    # A window of about two pairs: later turns are trimmed (drop_oldest), so their contexts no longer extend the
    # cached ones and the engine runs them whole; trim_headroom trims deeper, and the turns after extend again.
    settings = LMSettings(temperature=1.0, top_p=0.9, seed=5, max_new_tokens=10, max_context=_window(tiny),
                          trim_headroom=headroom)
    alone, together, views = _both(tiny, settings, tmp_path)
    _assert_same(alone, together, views)
    assert any(t.get("context_dropped_hash") for r in alone for t in r.turns), "some contexts were trimmed"
    engine = views[0].engine
    policy_turns = sum(t["actor"] == "policy" for r in together for t in r.turns)
    assert engine.turns == policy_turns and 0 < engine.turns_cached < policy_turns
    # distinct episodes sampled distinct streams (no generator shared between them)
    firsts = {tuple(r.turns[1]["token_ids"]) for r in alone}
    assert len(firsts) == len(alone)


@pytest.mark.slow
def test_batched_summarized_episodes_record_as_unbatched(tiny: Path, tmp_path: Path) -> None:
    """Under ``summarize`` a trimmed context is the prompt, the summary and the kept turns: not an extension of
    the cached one, so the engine runs it whole; the episodes record the same summaries and ids as alone."""
    settings = LMSettings(temperature=0.0, max_new_tokens=10, max_context=_window(tiny) + 70,
                          context_strategy="summarize", summary_max_tokens=64)
    alone, together, views = _both(tiny, settings, tmp_path)
    _assert_same(alone, together, views)
    summaries = [(x, y) for a, b in zip(alone, together, strict=True)
                 for x, y in zip(a.turns, b.turns, strict=True) if x["actor"] == "summarizer"]
    assert summaries, "some contexts were summarised"
    assert all(y["actor"] == "summarizer" and y["summary_version"] == x["summary_version"] for x, y in summaries)


def _window(tiny: Path) -> int:
    """A context window that holds the longest task prompt of ITEMS and about one action/observation pair."""
    policy = HFPolicy("v1", str(tiny), LMSettings(max_new_tokens=10))
    assert policy.renderer is not None
    env = MiniSWEEnv("dev", budget=Budget(max_steps=3))
    try:
        longest = 0
        for task_id, seed in ITEMS:
            r = env.reset(seed, task_id=task_id)
            policy.reset(env.task_view(r.task_id, r.task_version), seed)
            longest = max(longest, len(policy.renderer.initial(policy.system, r.observation)))
    finally:
        env.close()
    return longest + 10 + 120


@pytest.mark.slow
def test_batched_grammar_constrained_episodes_record_as_unbatched(tiny: Path, tmp_path: Path) -> None:
    pytest.importorskip("llguidance")
    settings = LMSettings(temperature=0.8, seed=2, max_new_tokens=40, grammar="tools", grammar_max_chars=8)
    alone, together, views = _both(tiny, settings, tmp_path)
    _assert_same(alone, together, views)
    forced = [m for r in alone for t in r.turns if t["actor"] == "policy" for m in t["loss_mask"]]
    assert 0 in forced and 1 in forced, "the grammar forced some tokens and left others to the policy"


def test_batch_episodes_setting_is_checked() -> None:
    assert LMSettings.from_args({"batch_episodes": "8"}).batch_episodes == 8
    assert LMSettings().batch_episodes == 1
    with pytest.raises(TrajlakeError, match="batch_episodes must be >= 1"):
        LMSettings.from_args({"batch_episodes": "0"})
    with pytest.raises(TrajlakeError, match="batch_episodes batches the forward passes of an hf: model"):
        check_policy_spec("mini-swe", "openai:m", {"batch_episodes": "4", "base_url": "http://127.0.0.1:1/v1"})


@pytest.mark.slow
def test_batched_rollout_writes_the_same_episodes_and_resumes(tiny: Path, tmp_path: Path) -> None:
    from trajlake.lake.maintenance import verify
    from trajlake.lake.store import Lake
    from trajlake.query import connect

    lake = str(tmp_path / "lake")
    tasks = tuple(t for t, _ in ITEMS[::2])

    def cfg(run_id: str, batch: int) -> RolloutConfig:
        return RolloutConfig(lake=lake, run_id=run_id, env="mini-swe", policy=f"hf:{tiny}", split="dev",
                             seeds=(0, 1), task_ids=tasks, env_kwargs={"budget": {"max_steps": 3}},
                             commit_every_s=0.0, policy_args={"max_new_tokens": "8", "temperature": "0.7",
                                                              "batch_episodes": str(batch)})

    assert run_rollout(cfg("one", 1)).written == 6
    s = run_rollout(cfg("many", N))
    assert s.written == 6 and not s.failed_items
    # resumed with another batch size: the same run (how many play at once does not change its episodes)
    s = run_rollout(cfg("many", 2))
    assert s.written == 0 and s.skipped_existing == 6 and not s.failed_items
    con = connect(lake)
    rows = con.execute("""select e.run_id, e.task_id, e.env_seed, t.turn_idx, t.token_ids, t.loss_mask,
                          t.behavior_logprobs from turns t join episodes e using (episode_id)
                          order by 2, 3, 4, 1""").fetchall()
    by_run: dict[str, list[Any]] = {"one": [], "many": []}
    for run, *rest in rows:
        by_run[run].append(rest)
    assert len(by_run["one"]) == len(by_run["many"]) > 0
    for x, y in zip(by_run["one"], by_run["many"], strict=True):
        assert x[:5] == y[:5]
        if x[5] is not None:
            np.testing.assert_allclose(y[5], x[5], atol=1e-5)
    config = json.loads(con.execute("select config from runs where run_id = 'many'").fetchone()[0])
    assert config["policy_args"]["batch_episodes"] == str(N)
    assert verify(Lake.open(lake), strict=True).ok


def test_a_failing_batched_forward_fails_its_episodes_instead_of_hanging(tiny: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from trajlake.policies import batched

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the batched forward failed")

    monkeypatch.setattr(batched, "forward_rows", broken)
    views = HFPolicy("v1", str(tiny), LMSettings(max_new_tokens=4)).concurrent(2)
    errors: list[BaseException] = []

    def play(policy: Any, item: tuple[str, int]) -> None:
        try:
            _episode(policy, *item, tmp_path)
        except BaseException as e:
            errors.append(e)

    # daemon threads: an episode left waiting must fail the test, not hang it
    threads = [threading.Thread(target=play, args=(v, item), daemon=True) for v, item in zip(views, ITEMS,
                                                                                              strict=False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "an episode is still waiting for its turn"
    assert len(errors) == 2 and all("the batched forward failed" in str(e) for e in errors)


@pytest.mark.parametrize("seed", range(4))
def test_the_batch_buffer_holds_every_rows_cache_through_joins_steps_and_leaves(seed: int) -> None:
    """The engine's preallocated buffer against a plain list of per-row caches: random joins (rows shorter and
    longer than the window, more rows than its first slots), decoding steps and leaves (first, middle, last),
    with the buffer starting small so that it re-lays out on both sides."""
    import torch

    from trajlake.policies.batched import _buffer_cache, _KVBuffer

    rng = np.random.default_rng(seed)
    layers, heads, dim = 2, 3, 4

    def kv(length: int) -> list[tuple[Any, Any]]:
        return [(torch.randn(1, heads, length, dim), torch.randn(1, heads, length, dim)) for _ in range(layers)]

    first = kv(5)
    buf = _KVBuffer(first, slots=1, capacity=7, end=6)
    cache = _buffer_cache(buf)
    buf.add(first, 5)
    rows = [first]  # the reference: each row's own keys and values
    relayouts = 0
    for _ in range(200):
        op = rng.choice(["join", "step", "step", "step", "leave"]) if rows else "join"
        if op == "join":
            new = kv(int(rng.integers(1, 40)))
            buf.add(new, new[0][0].shape[2])
            rows.append(new)
        elif op == "step":
            capacity = buf.capacity
            mask = buf.open_column()
            relayouts += buf.capacity != capacity  # the window reached the buffer's right end
            assert mask.shape == (len(rows), buf.width + 1) and bool(mask[:, -1].all())
            step = [(torch.randn(len(rows), heads, 1, dim), torch.randn(len(rows), heads, 1, dim))
                    for _ in range(layers)]
            for layer, (k, v) in zip(cache.layers, step, strict=True):
                keys, _ = layer.update(k, v)
                assert keys.shape[2] == buf.width + 1
            buf.close_column()
            rows = [[(torch.cat([rk, k[i:i + 1]], dim=2), torch.cat([rv, v[i:i + 1]], dim=2))
                     for (rk, rv), (k, v) in zip(row, step, strict=True)] for i, row in enumerate(rows)]
        else:
            i = int(rng.integers(len(rows)))
            buf.remove(i)
            last = rows.pop()
            if i < len(rows):
                rows[i] = last
            if rows:
                buf.fit(max(r[0][0].shape[2] for r in rows))
        assert buf.rows == len(rows)
        for i, row in enumerate(rows):
            length = row[0][0].shape[2]
            for (k, v), (rk, rv) in zip(buf.own(i, length), row, strict=True):
                assert torch.equal(k, rk) and torch.equal(v, rv)
            mask = buf.mask[i, buf.start:buf.end].tolist()
            assert mask == [0] * (buf.width - length) + [1] * length
    assert relayouts > 0 and buf.slots > 1
