"""The trainer's lake reader (trajlake.train.data): selection, token-exact and re-rendered episodes, the prefix
check, trimmed contexts, time travel, sharding over ranks and dataloader workers, bad input, batches.

Tokenizers are trained in the test on local text (nothing downloaded); the slow test rolls out the tiny model."""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from conftest import T0, make_episode
from trajlake.envs import Budget, make_policy
from trajlake.envs.mini_swe.env import TOOL_DOCS, MiniSWEEnv

from trajlake import Lake, LakeWriter, open_lake
from trajlake.errors import TrajlakeError
from trajlake.policies.lm import Generation, LMPolicy
from trajlake.policies.settings import LMSettings
from trajlake.record.writer import to_table
from trajlake.render.chat import TOOL_RESPONSE_OPEN, ChatRenderer, system_prompt
from trajlake.render.exactness import model_contexts
from trajlake.render.toolcall import format_call, parse_tool_call
from trajlake.rollout.runner import play_episode
from trajlake.train.data import (
    EPISODE_COLUMNS,
    LakeTrajectories,
    RetokenizationError,
    Selection,
    TrainDataError,
    pack,
    pad_collate,
    select_episodes,
)

TASK = "mini-swe/durations/drop_branch/0"
GOLDEN = Path(__file__).parent / "golden" / "v1" / "lake"
FP = "model|tok:aaaa|tmpl:bbbb"  # a policy-recorded fingerprint for hand-made token-exact episodes


# -- helpers -----------------------------------------------------------------------------------------------------

def build_tokenizer(out: Path, *, template_comment: str = "") -> Path:
    """A small byte-level BPE with a ChatML template, trained on the agent prompt and a Mini SWE source file."""
    import trajlake.envs.mini_swe as mini_swe
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from trajlake.policies.tiny import CHATML_TEMPLATE, SPECIAL_TOKENS

    corpus = [system_prompt(TOOL_DOCS), format_call("read_file", {"path": "src/durations.py"}),
              *(p.read_text() for p in sorted((Path(mini_swe.__file__).parent / "libraries").rglob("*.py"))[:3])]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainer=trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = template_comment + CHATML_TEMPLATE
    tok.save_pretrained(str(out))
    return out


class Canned(LMPolicy):
    """An LM policy whose 'model' replies from a script: hf-style turns (fingerprint, token ids, log-probs)."""

    def __init__(self, tokenizer: Path, replies: list[str], settings: LMSettings | None = None):
        from transformers import AutoTokenizer

        super().__init__("lm-v1", settings or LMSettings(),
                         ChatRenderer(AutoTokenizer.from_pretrained(str(tokenizer)), tokenizer.name), None)
        self.replies = list(replies)

    def generate(self, context_ids: list[int], max_new_tokens: int) -> Generation:
        assert self.renderer is not None
        text = self.replies.pop(0)
        ids = [*self.renderer.encode(text), self.renderer.eos_id]
        lps = [-0.25 - 0.01 * i for i in range(len(ids))]
        return Generation(ids, lps, text, len(context_ids), len(ids), ended_with_eos=True)


def _write(lake: Lake, *records: Any) -> None:
    with LakeWriter(lake, handle_signals=False) as w:
        for rec in records:
            w.write_batch([rec.episode], rec.turns, rec.events or None).raise_if_rejected()


def _stored_turns(lake: Lake, episode_id: str) -> list[dict[str, Any]]:
    from trajlake import connect

    rows = connect(lake).execute("select * from turns where episode_id = ? order by turn_idx", [episode_id])
    cols = [d[0] for d in rows.description]
    return [dict(zip(cols, r, strict=True)) for r in rows.fetchall()]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


@pytest.fixture(scope="module")
def swe_lake(tmp_path_factory: pytest.TempPathFactory, tok_dir: Path) -> Lake:
    """One oracle episode (byte tokens) and one LM episode with the test tokenizer on Mini SWE."""
    root = tmp_path_factory.mktemp("swe")
    lake = open_lake(root / "lake", create=True)
    env = MiniSWEEnv("dev", workdir=root / "ws", budget=Budget(max_steps=6))
    try:
        oracle = play_episode(env, make_policy("mini-swe", "oracle", "oracle-v0"), run_id="oracle", task_id=TASK,
                              task_version=None, seed=0, split="dev")
        canned = Canned(tok_dir, [format_call("list_files", {}), "I am not sure",
                                  format_call("read_file", {"path": "src/durations.py"}), format_call("submit", {})])
        lm = play_episode(env, canned, run_id="lm", task_id=TASK, task_version=None, seed=0, split="dev")
        # a window holding the task prompt and about one action/observation pair: later turns drop the oldest
        lengths = [len(c.context_ids) for c in model_contexts(lm.turns)]
        window = lengths[0] + (lengths[2] - lengths[0]) // 2 + 8
        short = Canned(tok_dir, [format_call("list_files", {})] * 4 + [format_call("submit", {})],
                       LMSettings(max_new_tokens=8, max_context=window))
        trim = play_episode(env, short, run_id="trim", task_id=TASK, task_version=None, seed=0, split="dev")
    finally:
        env.close()
    assert oracle.episode["success"] is True
    _write(lake, oracle, lm, trim)
    return lake


def _hand_episodes(lake: Lake, specs: list[dict[str, Any]]) -> None:
    rows, turns = [], []
    for i, overrides in enumerate(specs):
        ep, tu = make_episode(f"ep-{i:03d}", **overrides)
        for t in tu:
            t["tokenizer_id"] = FP
        rows.append(ep)
        turns += tu
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_batch(rows, turns).raise_if_rejected()


def _ids(samples: list[dict[str, Any]]) -> list[str]:
    return sorted(s["episode_id"] for s in samples)


# -- selection -------------------------------------------------------------------------------------------------

SPECS: list[dict[str, Any]] = [
    # run, split, env version, policy version, success, terminated, lag
    {"run_id": "r1", "split": "train", "env_version": "1", "policy_version_start": "p1", "success": True,
     "policy_lag": None},
    {"run_id": "r1", "split": "train", "env_version": "1", "policy_version_start": "p1", "success": False,
     "policy_lag": 0, "reward_components": {"resolved": 0.0}, "reward_total": 0.0},
    {"run_id": "r1", "split": "dev", "env_version": "2", "policy_version_start": "p2", "success": None,
     "policy_lag": 1, "terminated": False, "truncated": True, "termination_reason": "budget_steps",
     "error_class": "BUDGET_EXHAUSTED", "reward_components": {}, "reward_total": 0.0},
    {"run_id": "r2", "split": "train", "env_version": "2", "policy_version_start": "p2", "success": True,
     "policy_lag": 3},
    {"run_id": "r2", "split": "hidden", "env_version": "1", "policy_version_start": "p1", "success": False,
     "policy_lag": 2, "terminated": False, "truncated": True, "termination_reason": "timeout",
     "error_class": "BUDGET_EXHAUSTED", "reward_components": {"resolved": 0.0}, "reward_total": 0.0},
]


def test_selection_filters_match_hand_counted_rows(lake: Lake) -> None:
    _hand_episodes(lake, SPECS)
    sel = select_episodes(lake)
    assert sel.column_names == list(EPISODE_COLUMNS)
    assert sel["episode_id"].to_pylist() == [f"ep-{i:03d}" for i in range(5)]  # sorted, all
    cases: list[tuple[Selection, list[int]]] = [
        (Selection(runs=["r1"]), [0, 1, 2]),
        (Selection(runs="r2"), [3, 4]),                        # one string is one run
        (Selection(splits=["train"]), [0, 1, 3]),
        (Selection(splits=["dev", "hidden"]), [2, 4]),
        (Selection(env_versions=["2"]), [2, 3]),
        (Selection(policy_versions=["p1"]), [0, 1, 4]),
        (Selection(success=True), [0, 3]),                     # ungraded episode 2 is in neither set
        (Selection(success=False), [1, 4]),
        (Selection(terminated_only=True), [0, 1, 3]),
        (Selection(max_policy_lag=0), [0, 1]),                 # a null lag counts as 0
        (Selection(max_policy_lag=2), [0, 1, 2, 4]),
        (Selection(runs=["r1", "r2"], splits=["train"], success=True, max_policy_lag=5), [0, 3]),
        (Selection(runs=["nope"]), []),
    ]
    for s, want in cases:
        got = select_episodes(lake, s)["episode_id"].to_pylist()
        assert got == [f"ep-{i:03d}" for i in want], s
    # the dataset reads exactly the selected episodes
    ds = LakeTrajectories(lake, Selection(splits=["train"], success=True))
    assert _ids(list(ds)) == ["ep-000", "ep-003"] and len(ds) == 2


def test_token_exact_hand_episodes_and_sample_fields(lake: Lake) -> None:
    _hand_episodes(lake, SPECS[:2])
    ds = LakeTrajectories(lake, advantages={"ep-000": 0.5})
    samples = {s["episode_id"]: s for s in ds}
    s = samples["ep-000"]
    # make_episode: system [1,2,3], then (policy [10+s, 11+s], env [20+s, 21+s, 22+s]) for s = 0, 1
    assert s["input_ids"].tolist() == [1, 2, 3, 10, 11, 20, 21, 22, 11, 12, 21, 22, 23]
    assert s["input_ids"].dtype == np.int64
    assert s["loss_mask"].tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0]
    assert s["token_turn"].tolist() == [-1, -1, -1, 0, 0, -1, -1, -1, 1, 1, -1, -1, -1]
    lp = s["behavior_logprobs"]
    assert np.isnan(lp[s["loss_mask"] == 0]).all() and (lp[s["loss_mask"] == 1] == -0.5).all()
    assert (s["n_policy_turns"], s["advantage"], s["reward"], s["terminated"], s["policy_version"],
            s["policy_lag"], s["retokenized"]) == (2, 0.5, 1.0, True, "p1", None, False)
    assert math.isnan(samples["ep-001"]["advantage"]) and samples["ep-001"]["policy_lag"] == 0
    assert ds.stats == {"n_episodes": 2, "n_samples": 2, "n_tokens": 26, "n_policy_tokens": 8, "n_retokenized": 0,
                        "n_skipped_too_long": 0, "n_skipped_mismatch": 0}
    short = LakeTrajectories(lake, max_length=12)
    assert list(short) == [] and short.stats["n_skipped_too_long"] == 2


def test_as_of_pins_the_tables(lake: Lake) -> None:
    _hand_episodes(lake, SPECS[:2])
    pin = lake.versions()
    ep, tu = make_episode("ep-late", run_id="r1")
    for t in tu:
        t["tokenizer_id"] = FP
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_batch([ep], tu).raise_if_rejected()
    assert select_episodes(lake)["episode_id"].to_pylist() == ["ep-000", "ep-001", "ep-late"]
    text = ",".join(f"{k}={v}" for k, v in pin.items())
    for as_of in (pin, text, json.dumps(pin)):
        assert select_episodes(lake, Selection(as_of=as_of))["episode_id"].to_pylist() == ["ep-000", "ep-001"]
        assert _ids(list(LakeTrajectories(lake, Selection(as_of=as_of)))) == ["ep-000", "ep-001"]
    # the dataset pins the versions it was built at: later commits do not change what it reads
    ds = LakeTrajectories(lake)
    ep2, tu2 = make_episode("ep-later", run_id="r1")
    for t in tu2:
        t["tokenizer_id"] = FP
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_batch([ep2], tu2).raise_if_rejected()
    assert _ids(list(ds)) == ["ep-000", "ep-001", "ep-late"]
    with pytest.raises(TrajlakeError, match="episodes has versions"):
        select_episodes(lake, Selection(as_of={"episodes": 999}))


def test_shards_over_two_ranks_and_two_dataloader_workers(lake: Lake) -> None:
    _hand_episodes(lake, [{"run_id": f"r{i % 3}"} for i in range(23)])
    every = select_episodes(lake)["episode_id"].to_pylist()
    seen: list[list[str]] = []
    for rank in range(2):
        ds = LakeTrajectories(lake, rank=rank, world_size=2, batch_rows=5)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        seen.append([s["episode_id"] for s in loader])
        # the shards are the sorted selection's every 4th episode from offset rank * 2 + worker
        want = sorted(every[j] for w in range(2) for j in ds.shard_indices(w, 2))
        assert sorted(seen[-1]) == want
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == every and len(every) == 23
    # batches through the dataloader
    loader = torch.utils.data.DataLoader(LakeTrajectories(lake), batch_size=4, collate_fn=pad_collate, num_workers=2)
    assert sum(b["input_ids"].shape[0] for b in loader) == 23


def test_golden_schema_1_0_lake_is_readable(tmp_path: Path) -> None:
    import shutil

    from trajlake import connect

    golden = tmp_path / "golden"
    shutil.copytree(GOLDEN, golden)  # reading with DuckDB creates caches inside a lake: never in the repository
    eps = select_episodes(golden)
    assert eps.num_rows == 12 and eps["policy_lag"].null_count == 12  # policy_lag came in 1.1: null
    assert select_episodes(golden, Selection(max_policy_lag=0)).num_rows == 12
    samples = {s["episode_id"]: s for s in LakeTrajectories(golden)}
    con = connect(Lake.open(golden))
    want = dict(con.execute("select episode_id, sum(len(token_ids)) from turns group by 1").fetchall())
    assert {k: len(s["input_ids"]) for k, s in samples.items()} == {k: int(v) for k, v in want.items()}
    npt = dict(zip(eps["episode_id"].to_pylist(), eps["n_policy_tokens"].to_pylist(), strict=True))
    assert {k: int(s["loss_mask"].sum()) for k, s in samples.items()} == npt


# -- re-rendering and the prefix check ---------------------------------------------------------------------------

def test_lm_episode_is_used_token_for_token(swe_lake: Lake, tok_dir: Path) -> None:
    stored = _stored_turns(swe_lake, select_episodes(swe_lake, Selection(runs=["lm"]))["episode_id"][0].as_py())
    for tokenizer in (tok_dir, None):
        ds = LakeTrajectories(swe_lake, Selection(runs=["lm"]), tokenizer=tokenizer)
        (s,) = list(ds)
        assert not s["retokenized"] and ds.stats["n_retokenized"] == 0
        assert s["input_ids"].tolist() == [i for t in stored for i in t["token_ids"]]
        assert s["loss_mask"].tolist() == [m for t in stored for m in t["loss_mask"]]
        pol = [t for t in stored if t["actor"] == "policy"]
        masked = s["behavior_logprobs"][s["loss_mask"] == 1]
        np.testing.assert_allclose(masked, [v for t in pol for v in t["behavior_logprobs"]], rtol=1e-6)
        assert s["n_policy_turns"] == len(pol) == 4
        assert sorted(set(s["token_turn"].tolist())) == [-1, 0, 1, 2, 3]


def test_lm_episode_rerendered_by_another_template_gives_the_same_ids(swe_lake: Lake, tmp_path: Path) -> None:
    """A template that renders the same text but hashes differently forces the re-render path: it must rebuild
    exactly what the LM policy recorded (an hf: policy's context, token for token)."""
    other = build_tokenizer(tmp_path / "other", template_comment="{# same text, other hash #}")
    ds = LakeTrajectories(swe_lake, Selection(runs=["lm"]), tokenizer=other)
    (s,) = list(ds)
    exact = next(iter(LakeTrajectories(swe_lake, Selection(runs=["lm"]))))
    assert s["retokenized"] and ds.stats["n_retokenized"] == 1
    assert s["input_ids"].tolist() == exact["input_ids"].tolist()
    assert s["loss_mask"].tolist() == exact["loss_mask"].tolist()
    assert np.isnan(s["behavior_logprobs"]).all()


def test_oracle_episode_is_rerendered_with_the_trainers_tokenizer(swe_lake: Lake, tok_dir: Path) -> None:
    from transformers import AutoTokenizer

    sel = Selection(runs=["oracle"])
    with pytest.raises(TrainDataError, match=r"text-only episode oracle/.*pass the trainer's tokenizer"):
        list(LakeTrajectories(swe_lake, sel))
    ds = LakeTrajectories(swe_lake, sel, tokenizer=tok_dir)
    (s,) = list(ds)  # the prefix check passed
    assert s["retokenized"] and ds.stats["n_retokenized"] == 1
    r = ChatRenderer(AutoTokenizer.from_pretrained(str(tok_dir)), "t")
    stored = _stored_turns(swe_lake, s["episode_id"])
    pol = [t for t in stored if t["actor"] == "policy"]
    assert s["n_policy_turns"] == len(pol) == 4
    for k, t in enumerate(pol):
        parsed = parse_tool_call(t["raw_content"])
        text = format_call(parsed.tool or "", json.loads(parsed.action)["args"])
        mine = s["input_ids"][s["token_turn"] == k]
        assert r.decode(mine.tolist()) == text + r.eos_text
        assert mine[-1] == r.eos_id
    assert (s["token_turn"] >= 0).sum() == s["loss_mask"].sum()
    # the context starts with the hf: policy's initial piece and is one tokenization of the whole text
    first = r.initial(system_prompt(TOOL_DOCS), stored[0]["raw_content"])
    assert s["input_ids"][:len(first)].tolist() == first
    assert r.encode(r.decode(s["input_ids"].tolist())) == s["input_ids"].tolist()


def test_trimmed_context_gives_one_sample_per_policy_turn(swe_lake: Lake, tok_dir: Path) -> None:
    eid = select_episodes(swe_lake, Selection(runs=["trim"]))["episode_id"][0].as_py()
    stored = _stored_turns(swe_lake, eid)
    ctxs = model_contexts(stored)
    assert any(c.dropped for c in ctxs), "the window is small enough that later turns are trimmed"
    ds = LakeTrajectories(swe_lake, Selection(runs=["trim"]), tokenizer=tok_dir)
    samples = list(ds)
    assert len(samples) == len(ctxs) == 5 and ds.stats["n_samples"] == 5 and ds.stats["n_episodes"] == 1
    for k, (smp, c) in enumerate(zip(samples, ctxs, strict=True)):
        n = len(c.context_ids)
        assert smp["input_ids"].tolist() == c.context_ids + c.generated_ids
        assert smp["loss_mask"].tolist() == [0] * n + [1] * len(c.generated_ids)
        np.testing.assert_allclose(smp["behavior_logprobs"][n:], c.behavior_logprobs or [], rtol=1e-6)
        assert np.isnan(smp["behavior_logprobs"][:n]).all()
        assert smp["policy_turn"] == k and set(smp["token_turn"][n:].tolist()) == {k}
        assert (smp["token_turn"][:n] == -1).all() and smp["n_policy_turns"] == 5
    # a trimmed context recorded with another tokenizer is not re-rendered: a mismatch, skippable
    other_tok = build_tokenizer(tok_dir.parent / "other", template_comment="{# other #}")
    with pytest.raises(RetokenizationError, match=f"episode {eid} turn 0: .*trimmed context"):
        list(LakeTrajectories(swe_lake, Selection(runs=["trim"]), tokenizer=other_tok))
    skip = LakeTrajectories(swe_lake, Selection(runs=["trim"]), tokenizer=other_tok, on_mismatch="skip")
    assert list(skip) == [] and skip.stats["n_skipped_mismatch"] == 1


def test_mini_web_oracle_is_rendered_with_its_own_tools(lake: Lake, tok_dir: Path) -> None:
    from trajlake.envs import list_tasks, make
    from trajlake.envs.mini_web import TOOL_DOCS as WEB_TOOLS
    from transformers import AutoTokenizer

    env = make("mini-web", split="dev")
    try:
        rec = play_episode(env, make_policy("mini-web", "oracle", "o"), run_id="web", seed=0, split="dev",
                           task_id=list_tasks("mini-web", "dev")[0]["task_id"], task_version=None)
    finally:
        env.close()
    _write(lake, rec)
    (s,) = list(LakeTrajectories(lake, tokenizer=tok_dir))
    r = ChatRenderer(AutoTokenizer.from_pretrained(str(tok_dir)), "t")
    first = r.initial(system_prompt(WEB_TOOLS), rec.turns[0]["raw_content"])  # the class's tool_docs
    assert s["retokenized"] and s["input_ids"][:len(first)].tolist() == first
    assert s["n_policy_turns"] == sum(1 for t in rec.turns if t["actor"] == "policy")


def test_a_user_answer_to_ask_user_is_re_rendered_as_the_calls_response(lake: Lake, tok_dir: Path) -> None:
    """Mini Web's ask_user: the answer is stored as a role/actor user turn, and the trainer re-renders it as the
    observation the policy saw (a tool response, mask 0), so the episode's text continues token-exactly."""
    from trajlake.envs import make
    from trajlake.envs.mini_web import TOOL_DOCS as WEB_TOOLS
    from transformers import AutoTokenizer

    env = make("mini-web", split="hidden", underspecified=True)
    try:
        task = env.list_tasks()[0]
        rec = play_episode(env, make_policy("mini-web", "oracle", "o"), run_id="ask", seed=0, split="hidden",
                           task_id=task["task_id"], task_version=None)
    finally:
        env.close()
    assert (rec.turns[2]["actor"], rec.turns[2]["role"]) == ("user", "user")
    _write(lake, rec)
    (s,) = list(LakeTrajectories(lake, tokenizer=tok_dir))
    r = ChatRenderer(AutoTokenizer.from_pretrained(str(tok_dir)), "t")
    first = r.initial(system_prompt(WEB_TOOLS), rec.turns[0]["raw_content"])
    assert s["retokenized"] and s["input_ids"][:len(first)].tolist() == first
    text = r.tokenizer.decode(s["input_ids"].tolist())
    assert f"{TOOL_RESPONSE_OPEN}{rec.turns[2]['raw_content']}" in text
    assert s["n_policy_turns"] == sum(1 for t in rec.turns if t["actor"] == "policy")


def test_broken_prefix_names_episode_and_turn(lake: Lake, tok_dir: Path) -> None:
    """Turn 1's text starts with newlines that merge with the end of turn 0's piece when the whole text is
    tokenized: the per-turn pieces do not continue the previous turns exactly."""
    with LakeWriter(lake, handle_signals=False) as w:
        ep = w.start_episode(run_id="hand", task_id=TASK, task_version="v", env_id="mini-swe", env_version="1",
                             env_seed=0, policy_version="p", episode_id="hand-broken", started_at=T0)
        ep.add_turn("user", "Fix it.", started_at=T0, ended_at=T0)
        ep.add_turn("assistant", "\n\n\n\nno tool call", started_at=T0, ended_at=T0)
        ep.add_turn("tool", "invalid action", started_at=T0, ended_at=T0)
        ep.finish(terminated=True, truncated=False, termination_reason="submitted", success=False,
                  reward_components={"resolved": 0.0}, ended_at=T0 + dt.timedelta(seconds=1))
    with pytest.raises(RetokenizationError, match=r"^episode hand-broken turn 1: .*do not continue"):
        list(LakeTrajectories(lake, tokenizer=tok_dir))
    ds = LakeTrajectories(lake, tokenizer=tok_dir, on_mismatch="skip")
    assert list(ds) == [] and ds.stats["n_skipped_mismatch"] == 1


def test_episode_spanning_row_groups_gets_its_text_when_re_rendered(lake: Lake, tok_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Row groups of 2 rows: the first ones of ep-span hold turns in the trainer's tokenizer (read without
    raw_content), the last a text-only turn; the episode is re-rendered, and the earlier turns' text is read back
    for it. The row groups of the episodes before it in the file are skipped by their episode_id statistics."""
    from transformers import AutoTokenizer

    import trajlake.lake.store as store
    from trajlake.render.chat import tokenizer_fingerprint

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    r = ChatRenderer(tok, "t")
    fp = tokenizer_fingerprint(tok, "trainer")
    texts = ["Fix it.", format_call("list_files", {}), "src/a.py", format_call("submit", {}), "done"]
    monkeypatch.setattr(store, "ROW_GROUP_ROWS", 2)
    others = [make_episode(f"ep-{i:03d}", run_id="r1") for i in range(2)]  # in the same file, before ep-span
    ep, tu = make_episode("ep-span", run_id="r1", env_id="mini-swe")
    tu[0].update(role="user", actor="user")
    for i, t in enumerate(tu):
        t["raw_content"] = texts[i]
        if i < 4:
            ids = r.initial(system_prompt(TOOL_DOCS), texts[0]) if i == 0 else (
                [*r.encode(texts[i]), r.eos_id] if i % 2 else r.observation(texts[i], True))
            t.update(token_ids=ids, loss_mask=[i % 2] * len(ids), behavior_logprobs=None, tokenizer_id=fp)
        else:
            t.update(token_ids=None, loss_mask=None, behavior_logprobs=None, tokenizer_id=None)
    _append_raw(lake, [e for e, _ in others] + [ep], [t for _, ts in others for t in ts] + tu)
    ds = LakeTrajectories(lake, tokenizer=tok_dir, episodes=select_episodes(lake).filter(pa.compute.equal(
        select_episodes(lake)["episode_id"], "ep-span")))
    lacking: list[int] = []
    fill = LakeTrajectories._fill_raw

    def spy(eid: str, turns: Any) -> None:
        lacking.append(sum(not t.raw_read for t in turns))
        fill(eid, turns)

    monkeypatch.setattr(LakeTrajectories, "_fill_raw", staticmethod(spy))
    pruned: list[bool] = []
    may_hold = LakeTrajectories._row_group_may_hold

    def spy_rg(*args: Any) -> bool:
        pruned.append(not may_hold(*args))
        return not pruned[-1]

    monkeypatch.setattr(LakeTrajectories, "_row_group_may_hold", staticmethod(spy_rg))
    (s,) = list(ds)
    assert s["retokenized"] and lacking == [4]  # turns 0-3 came from row groups read without their text
    assert pruned == [True] * 5 + [False] * 3  # the other episodes' 10 rows: 5 row groups skipped unread
    head = [i for t in tu[:4] for i in t["token_ids"]]
    assert s["input_ids"].tolist() == head + r.observation("done", True)
    assert s["loss_mask"].tolist() == [m for t in tu[:4] for m in t["loss_mask"]] + [0] * (len(s["input_ids"]) -
                                                                                           len(head))


# -- bad input ---------------------------------------------------------------------------------------------------

def _append_raw(lake: Lake, ep: dict[str, Any] | list[dict[str, Any]], turns: list[dict[str, Any]]) -> None:
    """Commit rows without the writer's validation (what a foreign or damaged writer could leave)."""
    from trajlake.schema import arrow_schema

    eps = ep if isinstance(ep, list) else [ep]
    run_of = {e["episode_id"]: e["run_id"] for e in eps}
    turns = [{**t, "run_id": run_of[t["episode_id"]]} for t in turns]
    for name, rows in (("turns", turns), ("episodes", eps)):
        t = to_table(rows, name)
        full = arrow_schema(name)
        cols = {f.name: (t[f.name] if f.name in t.column_names else pa.nulls(t.num_rows, f.type)) for f in full}
        lake.append(name, pa.table(cols))


def test_missing_turn_and_misaligned_arrays_name_episode_turn_and_field(lake: Lake) -> None:
    ep, tu = make_episode("ep-gap")
    for t in tu:
        t["tokenizer_id"] = FP
    _append_raw(lake, ep, [t for t in tu if t["turn_idx"] != 2])
    with pytest.raises(TrainDataError, match=r"episode ep-gap turn 2: turns.turn_idx: missing"):
        list(LakeTrajectories(lake))


def test_misaligned_loss_mask(lake: Lake) -> None:
    ep, tu = make_episode("ep-bad")
    for t in tu:
        t["tokenizer_id"] = FP
    tu[3]["loss_mask"] = [1, 1, 1]  # 2 token ids
    _append_raw(lake, ep, tu)
    with pytest.raises(TrainDataError, match=r"episode ep-bad turn 3: turns.loss_mask: has 3 values, token_ids 2"):
        list(LakeTrajectories(lake))


def test_tokenizer_mixture_without_a_tokenizer_is_refused(lake: Lake) -> None:
    ep, tu = make_episode("ep-mix")
    for t in tu:
        t["tokenizer_id"] = FP
    tu[2]["tokenizer_id"] = "other|tok:cccc|tmpl:bbbb"
    _append_raw(lake, ep, tu)
    with pytest.raises(TrainDataError, match=r"episode ep-mix turn 2: turns.tokenizer_id"):
        list(LakeTrajectories(lake))


# -- batches -----------------------------------------------------------------------------------------------------

def _sample(eid: str, n: int, k: int = 0, lp: float | None = -0.5) -> dict[str, Any]:
    mask = np.array([0] * (n // 2) + [1] * (n - n // 2), np.int8)
    lps = np.where(mask == 1, np.float32(lp if lp is not None else np.nan), np.float32(np.nan)).astype(np.float32)
    return {"episode_id": eid, "group_id": "g", "task_id": "t", "input_ids": np.arange(1, n + 1, dtype=np.int64),
            "loss_mask": mask, "behavior_logprobs": lps, "token_turn": np.where(mask == 1, k, -1).astype(np.int32),
            "n_policy_turns": 1, "advantage": 1.5, "reward": 1.0, "terminated": True, "policy_version": "p",
            "policy_lag": None, "retokenized": False}


def test_pad_collate() -> None:
    b = pad_collate([_sample("a", 4), _sample("b", 2, lp=None)], pad_id=9)
    assert b["input_ids"].tolist() == [[1, 2, 3, 4], [1, 2, 9, 9]] and b["input_ids"].dtype == torch.long
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert b["loss_mask"].tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]] and b["loss_mask"].dtype == torch.float32
    assert b["behavior_logprobs"].tolist() == [[0, 0, -0.5, -0.5], [0, 0, 0, 0]]
    assert b["has_behavior_logprobs"].tolist() == [True, False]
    assert b["token_turn"].tolist() == [[-1, -1, 0, 0], [-1, 0, -1, -1]]
    assert b["advantage"].tolist() == [1.5, 1.5] and b["episode_id"] == ["a", "b"]


def test_pack_restarts_positions_per_sample() -> None:
    rows = list(pack([_sample("a", 3), _sample("b", 2), _sample("c", 4)], max_tokens=6))
    assert len(rows) == 2
    r = rows[0]
    assert r["input_ids"].tolist() == [[1, 2, 3, 1, 2, 0]]
    assert r["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0]]
    assert r["segment"].tolist() == [[0, 0, 0, 1, 1, -1]]
    assert r["cu_seqlens"].tolist() == [0, 3, 5] and r["episode_id"] == ["a", "b"]
    assert rows[1]["episode_id"] == ["c"]
    with pytest.raises(TrajlakeError, match="over max_tokens"):
        list(pack([_sample("x", 9)], max_tokens=6))


# -- a real model --------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_tiny_hf_policy_episodes_exact_and_trimmed(tmp_path: Path) -> None:
    """Episodes of the tiny hf: model: used token for token; with a trimmed window, one sample per policy turn
    holding exactly the context the model saw plus its sampled ids."""
    from trajlake.policies.hf import HFPolicy
    from trajlake.policies.tiny import build_tiny_model
    from trajlake.render.exactness import model_contexts

    tiny = build_tiny_model(tmp_path / "tiny")
    lake = open_lake(tmp_path / "lake", create=True)
    env = MiniSWEEnv("dev", workdir=tmp_path / "ws", budget=Budget(max_steps=6))
    try:
        full = play_episode(env, HFPolicy("v1", str(tiny), LMSettings(max_new_tokens=8, seed=1)), run_id="full",
                            task_id=TASK, task_version=None, seed=0, split="dev")
        lengths = [len(c.context_ids) for c in model_contexts(full.turns)]
        window = lengths[0] + (lengths[2] - lengths[0]) // 2 + 8
        trimmed = play_episode(env, HFPolicy("v1", str(tiny), LMSettings(max_new_tokens=8, max_context=window)),
                               run_id="trim", task_id=TASK, task_version=None, seed=0, split="dev")
    finally:
        env.close()
    _write(lake, full, trimmed)
    (s,) = list(LakeTrajectories(lake, Selection(runs=["full"]), tokenizer=tiny))
    assert s["input_ids"].tolist() == [int(i) for t in full.turns for i in t["token_ids"]]
    assert not s["retokenized"]
    ctxs = model_contexts(trimmed.turns)
    assert any(c.dropped for c in ctxs)
    ds = LakeTrajectories(lake, Selection(runs=["trim"]), tokenizer=tiny)
    samples = list(ds)
    assert len(samples) == len(ctxs) == ds.stats["n_samples"]
    for smp, c in zip(samples, ctxs, strict=True):
        assert smp["input_ids"].tolist() == c.context_ids + c.generated_ids
        assert smp["loss_mask"].tolist() == [0] * len(c.context_ids) + [1] * len(c.generated_ids)
        np.testing.assert_allclose(smp["behavior_logprobs"][len(c.context_ids):], c.behavior_logprobs, rtol=1e-6)
        assert set(smp["token_turn"][len(c.context_ids):].tolist()) == {smp["policy_turn"]}
