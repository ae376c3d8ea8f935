"""``trajlake export hf --layout sft|rl``: TRL's conversational layout and verl's prompt layout, checked against a
lake of Mini SWE episodes played here (oracle, an oracle that first sends an unparsable action, and a policy that
submits at once and fails) and against hand-counted rows.

The outputs are loaded with ``datasets`` offline. The assistant-only loss is checked with ``transformers``'
``apply_chat_template(..., return_assistant_tokens_mask=True)`` (what TRL's ``SFTTrainer`` calls with
``assistant_only_loss=True``) on a byte-level tokenizer built in the test; TRL's own data utilities run only when
``trl`` is installed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
from conftest import run_cli
from trajlake.envs import make_policy, task_view_fn
from trajlake.envs.mini_swe.env import TOOL_DOCS, MiniSWEEnv
from trajlake.envs.mini_swe.grading import load_tasks
from trajlake.envs.mini_swe.policies import OraclePolicy
from trajlake.envs.policy import Policy, PolicyOutput, TaskView

from trajlake import Lake, LakeWriter, connect, open_lake
from trajlake.errors import TrajlakeError
from trajlake.io.hf import ExportSummary, export_hf
from trajlake.io.hf_layouts import RL_SCHEMA, SFT_SCHEMA, agent_system_prompt, episode_messages, tool_schemas
from trajlake.rollout.runner import play_episode

GARBAGE = "I think I should look at the code first"  # not JSON: the environment cannot parse it


class GarbageFirst(OraclePolicy):
    """The oracle, after one unparsable action."""

    def reset(self, task: TaskView, seed: int) -> None:
        super().reset(task, seed)
        self.plan.insert(0, GARBAGE)


class SubmitAtOnce(Policy):
    """Submits without touching the code: the hidden tests fail."""

    def reset(self, task: TaskView, seed: int) -> None:
        pass

    def act(self, observation: str) -> PolicyOutput:
        return self.scripted_output('{"tool": "submit", "args": {}}')


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Episodes: oracle on 2 train, 3 dev and 1 hidden task (run O); GarbageFirst on dev task 0 (run G, succeeds);
    SubmitAtOnce on train task 0 and dev task 1 (run S, fail). Tasks: every Mini SWE task (44 train, 14 dev,
    22 hidden)."""
    base = tmp_path_factory.mktemp("layouts")
    lk = open_lake(base / "lake", create=True)
    env = MiniSWEEnv(None, workdir=base / "ws")
    by_split: dict[str, list[dict[str, Any]]] = {}
    for t in env.tasks:
        by_split.setdefault(t["split"], []).append(t)
    train, dev, hidden = by_split["train"][:2], by_split["dev"][:3], by_split["hidden"][:1]
    plays: list[tuple[str, Policy, dict[str, Any]]] = []
    plays += [("O", make_policy("mini-swe", "oracle", "oracle-v1"), t) for t in [*train, *dev, *hidden]]
    plays.append(("G", GarbageFirst("garbage-v1"), dev[0]))
    plays += [("S", SubmitAtOnce("submit-v1"), t) for t in (train[0], dev[1])]
    records = []
    try:
        for run, policy, task in plays:
            records.append(play_episode(env, policy, run_id=run, task_id=task["task_id"],
                                        task_version=task["task_version"], seed=0, split=task["split"],
                                        task_view=task_view_fn(env, oracle=policy.needs_oracle)))
        task_rows = [env.task_row(t) for t in env.tasks]
    finally:
        env.close()
    with LakeWriter(lk, handle_signals=False) as w:
        w.write_batch([r.episode for r in records], [t for r in records for t in r.turns],
                      [e for r in records for e in r.events]).raise_if_rejected()
        w.write_tasks(task_rows)
    ok = {r.episode["run_id"] + ":" + r.episode["task_id"]: r.episode["success"] for r in records}
    assert sum(ok.values()) == 7 and len(ok) == 9  # 6 oracle + 1 garbage-first solved, 2 submitted at once
    return {"lake": lk, "records": records, "dev": dev, "train": train, "hidden": hidden}


@pytest.fixture(scope="module")
def lake(built: dict[str, Any]) -> Lake:
    return built["lake"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def sft(lake: Lake, tmp_path_factory: pytest.TempPathFactory) -> ExportSummary:
    return export_hf(lake, tmp_path_factory.mktemp("sft") / "out", layout="sft", contamination=False)


@pytest.fixture(scope="module")
def rl(lake: Lake, tmp_path_factory: pytest.TempPathFactory) -> ExportSummary:
    return export_hf(lake, tmp_path_factory.mktemp("rl") / "out", layout="rl", contamination=False)


def _datasets() -> Any:
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    return datasets


def _load(out: Path, cache: Path, split: str) -> Any:
    return _datasets().load_dataset(str(out), split=split, cache_dir=str(cache))


def _turns(lake: Lake, episode_id: str) -> list[dict[str, Any]]:
    cur = connect(lake).execute(
        "select turn_idx, role, actor, raw_content, action_schema, tool_call_id, tool_args from turns "
        "where episode_id = ? order by turn_idx", [episode_id])
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def _episodes(lake: Lake) -> dict[str, dict[str, Any]]:
    cur = connect(lake).execute("select * from episodes")
    cols = [d[0] for d in cur.description]
    return {r[0]: dict(zip(cols, r, strict=True)) for r in cur.fetchall()}


# ------------------------------------------------------------------------------------------------ sft
def test_sft_rows_are_the_selected_episodes(lake: Lake, sft: ExportSummary, tmp_path: Path) -> None:
    te = sft.tables["sft"]
    # hand count: successful and not hidden: oracle 2 train + 3 dev, garbage-first 1 dev
    assert {s.split: s.rows for s in te.splits} == {"train": 2, "dev": 4}
    assert te.excluded_hidden == 1 and dict(te.left_out) == {"not successful (success false or null)": 2}
    assert sorted(p.name for p in (sft.out / "data").iterdir()) == ["dev-00000-of-00001.parquet",
                                                                     "train-00000-of-00001.parquet"]
    eps = _episodes(lake)
    ds = _load(sft.out, tmp_path / "cache", "dev")
    assert ds.column_names == SFT_SCHEMA.names and len(ds) == 4
    for row in ds:
        ep = eps[row["episode_id"]]
        assert ep["success"] is True and ep["split"] == "dev" and ep["run_id"] in ("O", "G")
        assert (row["task_id"], row["success"], row["reward_total"], row["policy_version"]) == (
            ep["task_id"], ep["success"], ep["reward_total"], ep["policy_version_start"])
    assert len(_load(sft.out, tmp_path / "cache", "train")) == 2
    card = (sft.out / "README.md").read_text()
    assert "config_name: \"default\"" in card and "assistant_only_loss=True" in card and "hidden split: 1" in card


def _check_conversation(row: dict[str, Any], turns: list[dict[str, Any]]) -> None:
    """messages against the lake's turns: system, user task, then (assistant, tool|user) pairs."""
    msgs = row["messages"]
    tools = json.loads(row["tools"])
    assert tools == tool_schemas(TOOL_DOCS) and [t["function"]["name"] for t in tools] == sorted(TOOL_DOCS)
    assert msgs[0] == {"role": "system", "content": agent_system_prompt(tools), "tool_calls": None,
                       "tool_call_id": None, "name": None}
    assert msgs[1]["role"] == "user" and msgs[1]["content"] == turns[0]["raw_content"]
    body, rest = msgs[2:], turns[1:]
    assert len(body) == len(rest) and len(body) % 2 == 0
    for i in range(0, len(body), 2):
        a, obs, pol, env = body[i], body[i + 1], rest[i], rest[i + 1]
        assert a["role"] == "assistant" and pol["actor"] == "policy" and env["actor"] == "env"
        assert obs["content"] == env["raw_content"]  # the observation text, unchanged
        if pol["action_schema"] is None:  # unparsable: plain assistant text, the answer is a user message
            assert a["content"] == pol["raw_content"] and a["tool_calls"] is None
            assert obs["role"] == "user" and obs["tool_call_id"] is None
            continue
        (call,) = a["tool_calls"]
        assert a["content"] == ""  # the turn's text was nothing but the call
        assert call == {"id": pol["tool_call_id"], "type": "function",
                        "function": {"name": pol["action_schema"], "arguments": pol["tool_args"]}}
        assert obs["role"] == "tool" and obs["tool_call_id"] == pol["tool_call_id"]
        assert obs["name"] == env["action_schema"] == pol["action_schema"]


def test_sft_messages_match_the_turns(lake: Lake, sft: ExportSummary, built: dict[str, Any], tmp_path: Path) -> None:
    ds = _load(sft.out, tmp_path / "cache", "dev")
    seen_garbage = False
    for row in ds:
        turns = _turns(lake, row["episode_id"])
        _check_conversation(row, turns)
        roles = [m["role"] for m in row["messages"]]
        if row["episode_id"].startswith("G") or GARBAGE in json.dumps(row["messages"]):
            seen_garbage = True
            assert roles[:5] == ["system", "user", "assistant", "user", "assistant"]
            assert row["messages"][2]["content"] == GARBAGE
        else:
            assert roles == ["system", "user"] + ["assistant", "tool"] * ((len(roles) - 2) // 2)
        # every call's name and arguments are the lake's (action_schema, tool_args), in order
        calls = [(c["function"]["name"], c["function"]["arguments"]) for m in row["messages"]
                 for c in (m["tool_calls"] or [])]
        assert calls == [(t["action_schema"], t["tool_args"]) for t in turns
                         if t["actor"] == "policy" and t["action_schema"] is not None]
        assert calls[-1] == ("submit", "{}") and len(calls) >= 4
    assert seen_garbage


def test_sft_also_loads_as_plain_parquet(sft: ExportSummary, tmp_path: Path) -> None:
    datasets = _datasets()
    files = sorted(str(p) for p in (sft.out / "data").glob("*.parquet"))
    ds = datasets.Dataset.from_parquet(files, cache_dir=str(tmp_path / "c"))
    assert len(ds) == 6 and set(ds.column_names) == set(SFT_SCHEMA.names)


def test_sft_filters(lake: Lake, tmp_path: Path) -> None:
    every = export_hf(lake, tmp_path / "all", layout="sft", success_only=False, contamination=False)
    assert {s.split: s.rows for s in every.tables["sft"].splits} == {"train": 3, "dev": 5}
    assert every.tables["sft"].left_out == ()
    oracle = export_hf(lake, tmp_path / "o", layout="sft", runs="O", contamination=False)
    assert oracle.rows("sft") == 5 and oracle.tables["sft"].excluded_hidden == 1
    hidden = export_hf(lake, tmp_path / "h", layout="sft", include_hidden=True, contamination=False)
    assert {s.split: s.rows for s in hidden.tables["sft"].splits} == {"train": 2, "dev": 4, "hidden": 1}
    bare = export_hf(lake, tmp_path / "b", layout="sft", system_prompt=False, contamination=False)
    ds = _load(bare.out, tmp_path / "cache", "train")
    assert all(r["messages"][0]["role"] == "user" and r["tools"] for r in ds)


def _byte_tokenizer() -> Any:
    """A fast byte-level tokenizer (no merges) with a chat template that marks assistant text for the loss."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe)
    tok.chat_template = (
        "{%- if tools %}[tools]{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
        "{%- for m in messages %}"
        "{%- if m.role == 'assistant' %}[assistant]{% generation %}{{ m.content }}"
        "{%- for c in m.tool_calls or [] %}<call>{{ c.function.name }} {{ c.function.arguments }}</call>{% endfor %}"
        "[end]{% endgeneration %}\n"
        "{%- else %}[{{ m.role }}]{{ m.content }}[end]\n{% endif %}"
        "{%- endfor %}")
    return tok


def _drop_nulls(v: Any) -> Any:
    if isinstance(v, list):
        return [_drop_nulls(x) for x in v]
    if isinstance(v, dict):
        return {k: _drop_nulls(x) for k, x in v.items() if x is not None}
    return v


def test_sft_assistant_only_loss_masks_exactly_the_assistant_messages(sft: ExportSummary, tmp_path: Path) -> None:
    """What SFTTrainer(assistant_only_loss=True) does: apply_chat_template with the row's tools and
    return_assistant_tokens_mask; the masked text must be the assistant messages and nothing else."""
    tok = _byte_tokenizer()
    ds = _load(sft.out, tmp_path / "cache", "dev")
    for row in ds:
        msgs = _drop_nulls(row["messages"])
        out = tok.apply_chat_template(msgs, tools=json.loads(row["tools"]), tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        ids, mask = out["input_ids"], out["assistant_masks"]
        trained = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
        expected = "".join(m.get("content", "") + "".join(
            f"<call>{c['function']['name']} {c['function']['arguments']}</call>" for c in m.get("tool_calls", []))
            + "[end]" for m in msgs if m["role"] == "assistant")
        assert trained == expected
        context = tok.decode([i for i, m in zip(ids, mask, strict=True) if not m])
        assert all(m["content"] in context for m in msgs if m["role"] in ("tool", "user", "system"))
        assert context.startswith("[tools]" + "".join(f"{n};" for n in sorted(TOOL_DOCS)))


def test_sft_with_trl_data_utilities(sft: ExportSummary, tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from trl.data_utils import apply_chat_template, is_conversational

    tok = _byte_tokenizer()
    for row in _load(sft.out, tmp_path / "cache", "dev"):
        example = {"messages": _drop_nulls(row["messages"])}
        assert is_conversational(example)
        text = apply_chat_template(example, tok, tools=json.loads(row["tools"]))["text"]
        assert "<call>submit {}</call>" in text


# ------------------------------------------------------------------------------------------------ rl
def _rl_rows(rl: ExportSummary, tmp_path: Path) -> dict[str, Any]:
    files = {s.split: str(rl.out / s.files[0]) for s in rl.tables["rl"].splits}
    return _datasets().load_dataset("parquet", data_files=files, cache_dir=str(tmp_path / "cache"))  # type: ignore[no-any-return]


def test_rl_one_row_per_task_in_train_and_test(lake: Lake, rl: ExportSummary, tmp_path: Path) -> None:
    assert sorted(p.name for p in (rl.out / "data").iterdir()) == ["test.parquet", "train.parquet"]
    te = rl.tables["rl"]
    # Mini SWE: 44 train tasks -> train; 14 dev -> test; 22 hidden left out
    assert {s.split: s.rows for s in te.splits} == {"train": 44, "test": 14} and te.excluded_hidden == 22
    dd = _rl_rows(rl, tmp_path)
    tasks = {(r[0], r[1]): r for r in connect(lake).execute(
        "select task_id, task_version, split, statement, family, difficulty from tasks").fetchall()}
    for split, lake_splits in (("train", {"train"}), ("test", {"dev", "test"})):
        ds = dd[split]
        assert ds.column_names == RL_SCHEMA.names
        assert [r["extra_info"]["index"] for r in ds] == list(range(len(ds)))
        for r in ds:
            x = r["extra_info"]
            _, _, lake_split, statement, family, difficulty = tasks[(x["task_id"], x["task_version"])]
            assert lake_split in lake_splits and x["lake_split"] == lake_split and x["split"] == split
            assert (x["family"], x["difficulty"], x["env_id"]) == (family, difficulty, "mini-swe")
            assert r["data_source"] == "trajlake/mini-swe" and r["ability"] == "mini-swe"
            assert r["prompt"] == [{"role": "system", "content": agent_system_prompt(tool_schemas(TOOL_DOCS))},
                                   {"role": "user", "content": statement}]
            assert r["reward_model"]["style"] == "rule"
            assert json.loads(r["reward_model"]["ground_truth"]) == {
                "env_id": "mini-swe", "task_id": x["task_id"], "task_version": x["task_version"]}
            assert json.loads(x["tools"]) == tool_schemas(TOOL_DOCS)


def _strings(v: Any) -> list[str]:
    """Every string in a row, unescaped (json.dumps would escape quotes and newlines and hide a leak)."""
    if isinstance(v, str):
        return [v]
    if isinstance(v, dict):
        return [s for x in v.values() for s in _strings(x)]
    if isinstance(v, list):
        return [s for x in v for s in _strings(x)]
    return []


def _leaks(row: dict[str, Any], task: dict[str, Any]) -> list[str]:
    """Pieces of the task's hidden tests or known fix found anywhere in ``row``."""
    text = "\n".join(_strings(row))
    fix_lines = [ln[1:].strip() for ln in task["fix_diff"].splitlines()
                 if ln.startswith("+") and not ln.startswith("+++") and len(ln[1:].strip()) >= 8]
    hidden_tests = [n.split("::")[-1] for n in task["FAIL_TO_PASS"]]
    assert fix_lines and hidden_tests
    return [s for s in [task["fix_diff"], *fix_lines, *hidden_tests] if s in text]


def test_rl_never_carries_hidden_tests_or_the_fix(rl: ExportSummary, tmp_path: Path) -> None:
    dd = _rl_rows(rl, tmp_path)
    secret_of = {(t["task_id"], t["task_version"]): t for t in load_tasks()}
    checked = 0
    for split in ("train", "test"):
        for r in dd[split]:
            task = secret_of[(r["extra_info"]["task_id"], r["extra_info"]["task_version"])]
            assert _leaks(r, task) == [], task["task_id"]
            # the check does find a leak where there is one
            planted = {**r, "prompt": [*r["prompt"], {"role": "user", "content": task["fix_diff"]}]}
            assert task["fix_diff"] in _leaks(planted, task)
            checked += 1
    assert checked == 58
    assert not any(r["extra_info"]["lake_split"] == "hidden" for r in dd["test"])


def test_rl_include_hidden_goes_to_test(lake: Lake, tmp_path: Path) -> None:
    s = export_hf(lake, tmp_path / "out", layout="rl", include_hidden=True, contamination=False)
    assert {sp.split: sp.rows for sp in s.tables["rl"].splits} == {"train": 44, "test": 36}
    assert "WARNING" in (s.out / "README.md").read_text()


# ------------------------------------------------------------------------------------------------ messages
def test_episode_messages_of_imported_turns() -> None:
    """Several calls of one message, ids missing, arguments that are not JSON, environment messages."""
    def t(i: int, role: str, text: str | None, name: str | None = None, cid: str | None = None,
          args: str | None = None) -> dict[str, Any]:
        return {"turn_idx": i, "role": role, "raw_content": text, "action_schema": name, "tool_call_id": cid,
                "tool_args": args}

    msgs = episode_messages([
        t(0, "system", "be brief"), t(1, "user", "task"),
        t(2, "assistant", "let me look", "ls", "a", '{"path":"."}'), t(3, "assistant", None, "cat", "b", '{"f":"x"}'),
        t(4, "tool", "x.py", "ls", "a"), t(5, "tool", "content", "cat", "b"),
        t(6, "assistant", "run it", "run", None, None), t(7, "tool", "ok", "run", None),
        t(8, "assistant", "{broken", "edit", "c", "{broken"), t(9, "env", "budget spent"),
    ], system="ignored: the episode has its own")
    assert [(m["role"], m["content"]) for m in msgs] == [
        ("system", "be brief"), ("user", "task"), ("assistant", "let me look"), ("tool", "x.py"),
        ("tool", "content"), ("assistant", "run it"), ("tool", "ok"), ("assistant", "{broken"),
        ("user", "budget spent")]
    assert [c["id"] for c in msgs[2]["tool_calls"]] == ["a", "b"]
    assert (msgs[3]["tool_call_id"], msgs[4]["tool_call_id"]) == ("a", "b")
    assert msgs[5]["tool_calls"] == [{"id": "call-6", "type": "function",
                                      "function": {"name": "run", "arguments": "{}"}}]
    assert msgs[6]["tool_call_id"] == "call-6" and msgs[7]["tool_calls"] is None
    with pytest.raises(TrajlakeError, match="turn 0: role 'narrator'"):
        episode_messages([t(0, "narrator", "x")])


# ------------------------------------------------------------------------------------------------ CLI
def test_cli_layouts_and_their_errors(lake: Lake, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(lake.root)
    code, out, err = run_cli(capsys, "--lake", root, "export", "hf", "--out", str(tmp_path / "s"), "--layout",
                             "sft", "--all-episodes", "--runs", "O,S")
    assert code == 0, err
    assert "sft: 7 row(s): dev 4 (1 shard), train 3 (1 shard); 1 hidden row(s) left out" in out
    assert "reproduce with --layout sft --as-of" in out
    code, out, err = run_cli(capsys, "--lake", root, "export", "hf", "--out", str(tmp_path / "r"), "--layout", "rl")
    assert code == 0 and "rl: 58 row(s): train 44 (1 shard), test 14 (1 shard); 22 hidden row(s) left out" in out
    for args, msg in [
        (["--layout", "rl", "--runs", "O"], "--runs applies to --layout sft"),
        (["--layout", "rl", "--success-only"], "applies to --layout sft"),
        (["--layout", "sft", "--tables", "turns"], "--tables applies to --layout trajectories only"),
        (["--success-only"], "applies to --layout sft or rl"),
        (["--layout", "chat"], "--layout 'chat': layouts are trajectories, sft, rl"),
        (["--layout", "sft", "--runs", "nope"], "nothing to export: no episodes selected for --layout sft"),
    ]:
        dest = tmp_path / "bad"
        code, out, err = run_cli(capsys, "--lake", root, "export", "hf", "--out", str(dest), *args)
        assert code == 1 and msg in err and len(err.strip().splitlines()) == 1, (args, err)
        assert not dest.exists()  # no partial export left behind


def test_episodes_of_an_environment_not_installed_have_no_tools(tmp_path: Path) -> None:
    """An episode of an unknown environment keeps its conversation; no tool list and no system message is made
    up, and the summary says why."""
    from conftest import make_episode

    lk = open_lake(tmp_path / "lake", create=True)
    ep, turns = make_episode("ep-x", n_steps=2, env_id="elsewhere-env")
    turns[1].update(action_schema="look", tool_call_id="c1", tool_args='{"at": "door"}')
    turns[2].update(action_schema="look", tool_call_id="c1")
    with LakeWriter(lk, handle_signals=False) as w:
        w.write_batch([ep], turns).raise_if_rejected()
    s = export_hf(lk, tmp_path / "out", layout="sft", contamination=False)
    assert s.rows("sft", "dev") == 1 and any("'elsewhere-env' is not available here" in n for n in s.notes)
    (row,) = _load(s.out, tmp_path / "cache", "dev")
    assert row["tools"] is None
    assert [m["role"] for m in row["messages"]] == ["system", "assistant", "tool", "assistant", "user"]
    assert row["messages"][0]["content"] == "system text 0"  # the episode's own system turn
    assert row["messages"][1]["tool_calls"][0]["function"] == {"name": "look", "arguments": '{"at": "door"}'}
    assert row["messages"][1]["content"] == "assistant text 1"  # text beside the call is kept
    assert row["messages"][2]["tool_call_id"] == "c1" and row["messages"][2]["content"] == "tool text 2"
    assert "is not available here" in (s.out / "README.md").read_text()


def test_push_of_a_layout_uploads_card_and_data(lake: Lake, tmp_path: Path) -> None:
    class Api:
        def __init__(self) -> None:
            self.kw: dict[str, Any] = {}

        def create_repo(self, repo_id: str, **kw: Any) -> str:
            return repo_id

        def upload_folder(self, **kw: Any) -> Any:
            self.kw = kw
            return None

    api = Api()
    s = export_hf(lake, tmp_path / "out", layout="rl", push="me/tasks", api=api, contamination=False)
    assert s.pushed_to == "https://huggingface.co/datasets/me/tasks"
    assert api.kw["allow_patterns"] == ["README.md", "data/**"]
    assert api.kw["commit_message"].startswith("trajlake export hf --layout rl --as-of ")


@pytest.mark.slow
def test_trl_sft_trainer_trains_only_the_assistant_turns_of_the_export(sft: ExportSummary, tmp_path: Path) -> None:
    """Issue 27: TRL's SFTTrainer(assistant_only_loss=True) runs 2 steps on the sft export with the bundled tiny
    model, whose template marks the assistant turns with {% generation %}; the tokens it trains on (labels not
    -100) decode to exactly the assistant turns (text, calls, end token) and nothing of the context. One layer, and
    one row a step: Mini SWE rows are thousands of tokens, and the backward passes were most of this test's time;
    the trained-token check below still covers every row of the split, through the trainer's own collator."""
    pytest.importorskip("trl")
    pytest.importorskip("torch")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from trajlake.policies.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=32, layers=1)  # its tokenizer and template matter
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    ds = _load(sft.out, tmp_path / "cache", "dev")
    rows = [{"messages": _drop_nulls(r["messages"]), "tools": r["tools"]} for r in ds]
    torch.manual_seed(0)
    config = SFTConfig(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=1,
                       assistant_only_loss=True, report_to=[], save_strategy="no", logging_steps=1, use_cpu=True,
                       max_length=None, dataloader_num_workers=0, dataset_num_proc=None, learning_rate=1e-3)
    trainer = SFTTrainer(model=model, args=config, train_dataset=ds, processing_class=tok)
    result = trainer.train()
    assert trainer.state.global_step == 2 and result.training_loss == result.training_loss  # ran, loss not NaN
    processed = trainer.train_dataset
    assert len(processed) == len(rows)
    for i, row in enumerate(rows):
        batch = trainer.data_collator([processed[i]])
        ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
        trained = tok.decode([t for t, lab in zip(ids, labels, strict=True) if lab != -100])
        expected = "".join(
            m.get("content", "") + "".join('<tool_call>{"name": ' + json.dumps(c["function"]["name"]) + ', "arguments": '
                                           + c["function"]["arguments"] + "}</tool_call>" for c in m.get("tool_calls", []))
            + "<|im_end|>" for m in row["messages"] if m["role"] == "assistant")
        assert trained == expected
        assert trained.count("<|im_end|>") == sum(m["role"] == "assistant" for m in row["messages"]) > 0
        context = tok.decode([t for t, lab in zip(ids, labels, strict=True) if lab == -100])
        assert all(m["content"] in context for m in row["messages"] if m["role"] in ("tool", "user", "system"))
