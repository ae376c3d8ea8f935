"""``trajlake export hf``: Hub dataset layout, card, splits, hidden filter, as-of pins, push (faked), CLI.

Everything runs offline: the lake is built with ``write_demo``, ``datasets`` reads the local folder with
``HF_DATASETS_OFFLINE=1``/``HF_HUB_OFFLINE=1`` and a private cache, and the push goes to a fake ``HfApi``.
Tests that load with ``datasets`` (or patch ``huggingface_hub``) are skipped when the ``hf`` extra is missing.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, ClassVar

# datasets and huggingface_hub read these when imported: set them before anything imports them.
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from trajlake import Lake, LakeWriter, connect, open_lake
from trajlake.cli.export_cmd import register
from trajlake.demo import write_demo
from trajlake.errors import TrajlakeError
from trajlake.io import hf as hfmod
from trajlake.io.hf import ExportSummary, export_hf
from trajlake.schema import TABLES

SHARD_ROWS = 250
_SHARD_RE = re.compile(r"^(\w+)-(\d{5})-of-(\d{5})\.parquet$")


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the Hub libraries offline even if another test imported them before the variables were set."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    import sys

    if "huggingface_hub" in sys.modules:
        monkeypatch.setattr(sys.modules["huggingface_hub"].constants, "HF_HUB_OFFLINE", True)
    if "datasets" in sys.modules:
        monkeypatch.setattr(sys.modules["datasets"].config, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(sys.modules["datasets"].config, "HF_DATASETS_OFFLINE", True, raising=False)


@pytest.fixture(scope="module")
def lake_v(tmp_path_factory: pytest.TempPathFactory) -> tuple[Lake, dict[str, int]]:
    """A demo lake written twice: (lake, the table versions after the first write).

    16 tasks: tasks 15 (and 16..19 in the second write) are in the hidden split; the second write adds tasks
    16..23 (their episodes only add, since demo episodes do not depend on the number of tasks)."""
    lk = open_lake(tmp_path_factory.mktemp("hf") / "lake", create=True)
    with LakeWriter(lk) as w:
        write_demo(w, seeds=1, n_tasks=16)
    first = lk.versions()
    with LakeWriter(lk) as w:
        write_demo(w, seeds=1, n_tasks=24)
    assert lk.versions() != first
    return lk, first


@pytest.fixture(scope="module")
def lake(lake_v: tuple[Lake, dict[str, int]]) -> Lake:
    return lake_v[0]


@pytest.fixture(scope="module")
def exported(lake: Lake, tmp_path_factory: pytest.TempPathFactory) -> ExportSummary:
    """The default export (all tables, hidden excluded), with small shards so that splits have several."""
    return export_hf(lake, tmp_path_factory.mktemp("hf") / "out", shard_rows=SHARD_ROWS, license="cc-by-4.0")


def _expected_counts(lake: Lake, include_hidden: bool, as_of: Any = None) -> dict[str, dict[str, int]]:
    """Rows per table and split straight from DuckDB on the lake (independent of the exporter's SQL)."""
    con = connect(lake, as_of)
    hidden_tasks = {r[0] for r in con.execute("select task_id from tasks where split = 'hidden'").fetchall()}
    ep_split = {}
    for eid, split, task in con.execute("select episode_id, split, task_id from episodes").fetchall():
        if include_hidden or (split != "hidden" and task not in hidden_tasks):
            ep_split[eid] = split
    out: dict[str, dict[str, int]] = {t: {} for t in TABLES}

    def add(t: str, split: str) -> None:
        out[t][split] = out[t].get(split, 0) + 1

    for s in ep_split.values():
        add("episodes", s)
    for t in ("turns", "gateway_events"):
        for (eid,) in con.execute(f"select episode_id from {t}").fetchall():
            if eid in ep_split:
                add(t, ep_split[eid])
    for (s,) in con.execute("select split from tasks").fetchall():
        if include_hidden or s != "hidden":
            add("tasks", s)
    (n_runs,) = con.execute("select count(*) from runs").fetchone()  # type: ignore[misc]
    if n_runs:
        out["runs"]["train"] = n_runs
    return out


def _summary_counts(s: ExportSummary) -> dict[str, dict[str, int]]:
    return {t: {sp.split: sp.rows for sp in te.splits if sp.rows} for t, te in s.tables.items()}


def _load(out: Path, config: str, cache: Path) -> Any:
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    return datasets.load_dataset(str(out), config, cache_dir=str(cache))


def _front_matter(text: str) -> dict[str, Any]:
    assert text.startswith("---\n")
    fm = text[4:text.index("\n---\n", 4)]
    try:
        import yaml
    except ImportError:
        return _mini_yaml(fm)
    return yaml.safe_load(fm)  # type: ignore[no-any-return,unused-ignore]


def _mini_yaml(text: str) -> dict[str, Any]:
    """Enough YAML for the card's front matter (block maps and lists, JSON-quoted scalars, booleans)."""
    lines = [(len(x) - len(x.lstrip(" ")), x.strip()) for x in text.splitlines() if x.strip()]
    pos = 0

    def scalar(s: str) -> Any:
        if s in ("true", "false"):
            return s == "true"
        return json.loads(s) if s.startswith('"') else s

    def is_item(i: int, indent: int) -> bool:
        return i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- ")

    def seq(indent: int) -> list[Any]:
        nonlocal pos
        out: list[Any] = []
        while is_item(pos, indent):
            rest = lines[pos][1][2:]
            if ":" in rest and not rest.startswith('"'):
                lines[pos] = (indent + 2, rest)
                out.append(mapping(indent + 2))
            else:
                pos += 1
                out.append(scalar(rest))
        return out

    def mapping(indent: int) -> dict[str, Any]:
        nonlocal pos
        out: dict[str, Any] = {}
        while pos < len(lines) and lines[pos][0] == indent and not lines[pos][1].startswith("- "):
            key, _, val = lines[pos][1].partition(":")
            pos += 1
            if val.strip():
                out[key] = scalar(val.strip())
            elif is_item(pos, indent) or (pos < len(lines) and lines[pos][0] > indent):
                ind = lines[pos][0]
                out[key] = seq(ind) if lines[pos][1].startswith("- ") else mapping(ind)
            else:
                out[key] = None
        return out

    return mapping(0)


# ------------------------------------------------------------------------------------------------ layout
def test_layout_shards_and_counts(lake: Lake, exported: ExportSummary) -> None:
    out = exported.out
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "data"]  # no staging left behind
    assert exported.tables.keys() == set(TABLES)
    assert _summary_counts(exported) == _expected_counts(lake, include_hidden=False)
    for t, te in exported.tables.items():
        assert sorted(p.name for p in (out / "data").iterdir()) == sorted(TABLES)
        on_disk = sorted(p.name for p in (out / "data" / t).iterdir())
        assert on_disk == sorted(Path(f).name for s in te.splits for f in s.files), t
        for s in te.splits:
            n = len(s.files)
            rows = 0
            for i, f in enumerate(s.files):
                m = _SHARD_RE.match(Path(f).name)
                assert m and m.groups() == (s.split, f"{i:05d}", f"{n:05d}") and f.startswith(f"data/{t}/"), f
                pf = pq.ParquetFile(out / f)
                assert 0 < pf.metadata.num_rows <= SHARD_ROWS
                rows += pf.metadata.num_rows
                meta = pf.schema_arrow.metadata
                assert meta[b"trajlake.table"] == t.encode() and meta[b"trajlake.as_of"] == exported.as_of.encode()
            assert rows == s.rows
    # small shards: the bigger splits really are cut into several, and turns of the big split too
    assert len(exported.tables["turns"].split("train").files) > 1  # type: ignore[union-attr]
    assert exported.tables["episodes"].excluded_hidden > 0 and exported.tables["runs"].excluded_hidden == 0
    assert exported.as_of == ",".join(f"{t}={v}" for t, v in lake.versions().items())


def test_rows_ordered_by_key_and_values_match_lake(lake: Lake, exported: ExportSummary) -> None:
    shards = exported.tables["turns"].split("train").files  # type: ignore[union-attr]
    t = pa.concat_tables([pq.read_table(exported.out / f) for f in shards])
    keys = list(zip(t["episode_id"].to_pylist(), t["turn_idx"].to_pylist(), strict=True))
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    con = connect(lake)
    eid = keys[len(keys) // 2][0]
    want = con.execute("select turn_idx, token_ids, loss_mask, behavior_logprobs, started_at, reward_components "
                       "from turns where episode_id = ? order by turn_idx", [eid]).fetchall()
    got = t.filter(pa.compute.equal(t["episode_id"], eid)).to_pylist()
    assert [g["turn_idx"] for g in got] == [w[0] for w in want]
    for g, w in zip(got, want, strict=True):
        assert g["token_ids"] == w[1] and g["loss_mask"] == w[2] and g["behavior_logprobs"] == w[3]
        assert g["started_at"] == w[4]


def test_deterministic_for_the_same_pins(lake: Lake, exported: ExportSummary, tmp_path: Path) -> None:
    again = export_hf(lake, tmp_path / "again", as_of=exported.as_of, tables="turns", shard_rows=SHARD_ROWS)
    assert again.tables["turns"] == exported.tables["turns"]
    for s in again.tables["turns"].splits:
        for f in s.files:
            assert pq.read_table(tmp_path / "again" / f).equals(pq.read_table(exported.out / f))


# ------------------------------------------------------------------------------------------------ datasets
def test_load_dataset_every_config(lake: Lake, exported: ExportSummary, tmp_path: Path) -> None:
    expected = _expected_counts(lake, include_hidden=False)
    for t in TABLES:
        dd = _load(exported.out, t, tmp_path / "cache")
        assert {k: v.num_rows for k, v in dd.items()} == expected[t], t
        assert "hidden" not in dd


def test_load_dataset_features_and_values(lake: Lake, exported: ExportSummary, tmp_path: Path) -> None:
    turns = _load(exported.out, "turns", tmp_path / "cache")["train"]
    sch = turns.features.arrow_schema
    assert sch.field("token_ids").type == pa.list_(pa.int32())
    assert sch.field("loss_mask").type == pa.list_(pa.int8())
    assert sch.field("behavior_logprobs").type == pa.list_(pa.float32())
    assert sch.field("started_at").type == pa.timestamp("us", tz="UTC")
    assert sch.field("turn_idx").type == pa.int32() and sch.field("latency_ms").type == pa.float64()
    kv = sch.field("reward_components").type
    assert pa.types.is_list(kv) and {f.name: f.type for f in kv.value_type} == {"key": pa.string(),
                                                                                  "value": pa.float64()}
    assert turns.features["started_at"].dtype == "timestamp[us, tz=UTC]"
    assert turns.features["turn_idx"].dtype == "int32"

    con = connect(lake)
    row = turns[7]
    want = con.execute("select token_ids, loss_mask, behavior_logprobs, raw_content, started_at from turns "
                       "where episode_id = ? and turn_idx = ?", [row["episode_id"], row["turn_idx"]]).fetchone()
    assert want is not None
    assert row["token_ids"] == want[0] and row["loss_mask"] == want[1] and row["raw_content"] == want[3]
    assert row["behavior_logprobs"] == pytest.approx(want[2]) if want[2] is not None else row["behavior_logprobs"] is None
    assert row["started_at"] == want[4]

    eps = _load(exported.out, "episodes", tmp_path / "cache")["dev"]
    e = eps[0]
    (rc, split, success) = con.execute("select reward_components, split, success from episodes "
                                       "where episode_id = ?", [e["episode_id"]]).fetchone()  # type: ignore[misc]
    assert {kv["key"]: kv["value"] for kv in e["reward_components"]} == dict(rc)
    assert split == "dev" and e["success"] == success
    assert eps.features.arrow_schema.field("env_seed").type == pa.int64()
    assert eps.features.arrow_schema.field("success").type == pa.bool_()

    tasks = _load(exported.out, "tasks", tmp_path / "cache")["train"]
    tsch = tasks.features.arrow_schema
    assert pa.types.is_struct(tsch.field("budget").type)
    assert tsch.field("budget").type.field("max_steps").type == pa.int32()
    assert tasks[0]["provenance"]["generator"] == "trajlake.demo"
    gw = _load(exported.out, "gateway_events", tmp_path / "cache")["train"]
    assert gw.features.arrow_schema.field("taint").type == pa.list_(pa.string())


# ------------------------------------------------------------------------------------------------ card
def test_card_front_matter_and_body(lake: Lake, exported: ExportSummary) -> None:
    text = exported.card.read_text()
    fm = _front_matter(text)
    assert fm["license"] == "cc-by-4.0"
    configs = {c["config_name"]: c for c in fm["configs"]}
    assert list(configs) == list(TABLES) and configs["episodes"].get("default") is True
    for t, te in exported.tables.items():
        files = {d["split"]: d["path"] for d in configs[t]["data_files"]}
        assert set(files) == {s.split for s in te.splits}
        for s in te.splits:
            matched = sorted(str(p.relative_to(exported.out)) for p in exported.out.glob(files[s.split]))
            assert matched == sorted(s.files)
    body = text[text.index("\n---\n", 4):]
    assert exported.as_of in body and "--as-of " + exported.as_of in body
    for t, v in exported.versions.items():
        assert f"| `{t}` | {v} |" in body
    for t, te in exported.tables.items():
        for s in te.splits:
            assert f"| `{t}` | `{s.split}` | {s.rows} | {len(s.files)} |" in body
    assert "hidden` split are **excluded**" in body and "--include-hidden" in body
    assert "## Not checked" in body and "PII" in body and "license" in body.lower()
    # schema from schemas/: columns, exported types and descriptions
    assert "| `token_ids` | `list<int32>` | yes |  | Token ids of the turn; null for text-only imports. |" in body
    assert "`list<struct<key: string, value: float64>>` (lake: `map<string, float64>`)" in body


def test_mini_yaml_parser_matches_yaml(exported: ExportSummary) -> None:
    yaml = pytest.importorskip("yaml")
    text = exported.card.read_text()
    fm = text[4:text.index("\n---\n", 4)]
    assert _mini_yaml(fm) == yaml.safe_load(fm)


# ------------------------------------------------------------------------------------------------ hidden, as-of
def test_hidden_only_with_flag(lake: Lake, tmp_path: Path) -> None:
    s = export_hf(lake, tmp_path / "out", tables=["episodes", "turns", "tasks"], include_hidden=True)
    expected = _expected_counts(lake, include_hidden=True)
    assert _summary_counts(s) == {t: expected[t] for t in ("episodes", "turns", "tasks")}
    assert s.rows("episodes", "hidden") > 0 and s.rows("tasks", "hidden") > 0 and s.rows("turns", "hidden") > 0
    assert all(te.excluded_hidden == 0 for te in s.tables.values())
    text = s.card.read_text()
    assert "WARNING: this export includes the `hidden` split" in text and "**are included**" in text
    assert {c["config_name"] for c in _front_matter(text)["configs"]} == {"episodes", "turns", "tasks"}
    dd = _load(s.out, "episodes", tmp_path / "cache")
    assert dd["hidden"].num_rows == s.rows("episodes", "hidden")
    assert set(dd["hidden"]["split"]) == {"hidden"}


def test_as_of_reproduces_older_version(lake_v: tuple[Lake, dict[str, int]], tmp_path: Path) -> None:
    lk, first = lake_v
    pins = ",".join(f"{t}={v}" for t, v in first.items())
    s = export_hf(lk, tmp_path / "old", as_of=pins)
    assert s.versions == first and s.as_of == pins
    old = _expected_counts(lk, include_hidden=False, as_of=pins)
    assert _summary_counts(s) == old
    assert old != _expected_counts(lk, include_hidden=False)  # the pins really select an older state
    assert f"--as-of {pins}" in s.card.read_text()
    assert {k: v.num_rows for k, v in _load(s.out, "episodes", tmp_path / "cache").items()} == old["episodes"]


def test_empty_tables_get_no_config(lake: Lake, tmp_path: Path) -> None:
    # datasets cannot load a split without rows, so a table without rows gets no files and no config
    pins = ",".join(f"{t}=0" if t == "turns" else f"{t}={v}" for t, v in lake.versions().items())
    s = export_hf(lake, tmp_path / "empty", as_of=pins, tables="turns,runs")
    assert s.tables["turns"].splits == () and s.rows("turns") == 0 and s.rows("runs", "train") == 3
    assert sorted(p.name for p in (s.out / "data").iterdir()) == ["runs"]
    text = s.card.read_text()
    assert [c["config_name"] for c in _front_matter(text)["configs"]] == ["runs"]
    assert "| `turns` | - | 0 | 0 |" in text and "no config" in text
    assert _load(s.out, "runs", tmp_path / "cache")["train"].num_rows == 3
    with pytest.raises(TrajlakeError) as e:  # nothing at all to export: an error, and nothing written
        export_hf(lake, tmp_path / "none", as_of=",".join(f"{t}=0" for t in TABLES))
    assert "nothing to export" in _one_line(e) and not (tmp_path / "none").exists()


def test_streams_in_batches_across_splits_and_byte_cap(lake: Lake, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Tiny record batches (so batches straddle split boundaries) and a 1-byte cap: one row group per shard.
    monkeypatch.setattr(hfmod, "ROW_GROUP_ROWS", 64)
    s = export_hf(lake, tmp_path / "out", tables="turns", max_shard_bytes=1)
    assert _summary_counts(s)["turns"] == _expected_counts(lake, include_hidden=False)["turns"]
    for sp in s.tables["turns"].splits:
        assert len(sp.files) >= sp.rows // 64
        for f in sp.files:
            md = pq.ParquetFile(s.out / f).metadata
            assert md.num_row_groups == 1 and md.num_rows <= 64


# ------------------------------------------------------------------------------------------------ errors
def _one_line(e: pytest.ExceptionInfo[TrajlakeError]) -> str:
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


def test_errors_are_one_line(lake: Lake, exported: ExportSummary, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(TrajlakeError) as e:
        export_hf(lake, out, tables="episodes,trajectories")
    assert "trajectories" in _one_line(e) and "episodes, turns" in _one_line(e)
    with pytest.raises(TrajlakeError) as e:
        export_hf(lake, exported.out)
    assert "--overwrite" in _one_line(e)
    for bad in ("yesterday-ish", "episodes=999", "widgets=1", "episodes=x"):
        with pytest.raises(TrajlakeError) as e:
            export_hf(lake, out, as_of=bad)
        assert "--as-of" in _one_line(e), bad
    with pytest.raises(TrajlakeError) as e:
        export_hf(lake, out, license="my license\n")
    _one_line(e)
    with pytest.raises(TrajlakeError) as e:
        export_hf(lake, out, shard_rows=0)
    _one_line(e)
    with pytest.raises(TrajlakeError) as e:
        export_hf(lake, lake.root / "export")
    assert "inside the lake" in _one_line(e)
    (tmp_path / "file").write_text("x")
    with pytest.raises(TrajlakeError) as e:
        export_hf(lake, tmp_path / "file")
    _one_line(e)
    assert not out.exists()  # nothing written by a failed export


def test_overwrite_replaces_only_card_and_data(lake: Lake, tmp_path: Path) -> None:
    out = tmp_path / "repo"
    (out / ".git").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref")
    (out / "notes.txt").write_text("keep me")
    (out / "data" / "turns").mkdir(parents=True)
    (out / "data" / "turns" / "train-00000-of-00009.parquet").write_text("stale")
    (out / "README.md").write_text("old card")
    s = export_hf(lake, out, tables="episodes", overwrite=True)
    assert (out / ".git" / "HEAD").read_text() == "ref" and (out / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in (out / "data").iterdir()) == ["episodes"]
    assert s.card.read_text().startswith("---\n") and not list(out.glob(".trajlake-export-*"))


# ------------------------------------------------------------------------------------------------ push
class FakeApi:
    """Records what ``export_hf`` asks of ``huggingface_hub.HfApi``; never touches the network."""

    instances: ClassVar[list[FakeApi]] = []

    def __init__(self, token: str | None = None, fail: bool = False) -> None:
        self.token, self.fail = token, fail
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.uploaded: list[str] = []
        FakeApi.instances.append(self)

    def create_repo(self, repo_id: str, **kw: Any) -> str:
        self.calls.append(("create_repo", {"repo_id": repo_id, **kw}))
        return f"https://huggingface.co/datasets/{repo_id}"

    def upload_folder(self, **kw: Any) -> Any:
        self.calls.append(("upload_folder", kw))
        if self.fail:
            raise RuntimeError("403 Forbidden: token has no write access\n(details on a second line)")
        from fnmatch import fnmatch

        root = Path(kw["folder_path"])
        for p in sorted(root.rglob("*")):
            rel = str(p.relative_to(root))
            if p.is_file() and any(fnmatch(rel, pat) for pat in kw["allow_patterns"]):
                self.uploaded.append(rel)

        class Info:
            commit_url = f"https://huggingface.co/datasets/{kw['repo_id']}/commit/abc123"

        return Info()


def test_push_with_fake_api(lake: Lake, tmp_path: Path) -> None:
    api = FakeApi()
    s = export_hf(lake, tmp_path / "out", tables="episodes,runs", push="me/trajs", api=api)
    assert s.pushed_to == "https://huggingface.co/datasets/me/trajs" and s.commit_url and "abc123" in s.commit_url
    (name1, create), (name2, upload) = api.calls
    assert name1 == "create_repo" and create["repo_type"] == "dataset" and create["private"] is True
    assert create["exist_ok"] is True
    assert name2 == "upload_folder" and upload["repo_id"] == "me/trajs" and upload["repo_type"] == "dataset"
    assert Path(upload["folder_path"]) == tmp_path / "out" and "data/**" in upload["delete_patterns"]
    assert sorted(api.uploaded) == sorted(["README.md", *[f for te in s.tables.values() for sp in te.splits
                                                          for f in sp.files]])
    assert s.as_of in upload["commit_message"]


def test_push_without_token_fails_before_writing(lake: Lake, tmp_path: Path) -> None:
    with pytest.raises(TrajlakeError) as e:
        export_hf(lake, tmp_path / "out", push="me/trajs")
    assert "HF_TOKEN" in _one_line(e)
    assert not (tmp_path / "out").exists()
    with pytest.raises(TrajlakeError) as e:
        export_hf(lake, tmp_path / "out", push="not a repo id", api=FakeApi())
    assert "repo id" in _one_line(e)


def test_push_error_is_one_line(lake: Lake, tmp_path: Path) -> None:
    with pytest.raises(TrajlakeError) as e:
        export_hf(lake, tmp_path / "out", tables="runs", push="me/trajs", api=FakeApi(fail=True))
    assert "403 Forbidden" in _one_line(e) and "me/trajs" in _one_line(e)
    assert (tmp_path / "out" / "README.md").exists()  # the local export stays; the push can be retried


# ------------------------------------------------------------------------------------------------ CLI
@pytest.fixture
def cli(lake: Lake, monkeypatch: pytest.MonkeyPatch) -> typer.Typer:
    monkeypatch.setenv("TRAJLAKE_LAKE", str(lake.root))  # the lake a command uses without --lake
    app = typer.Typer()
    register(app)
    return app


def test_cli_export_and_push(cli: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = pytest.importorskip("huggingface_hub")
    FakeApi.instances.clear()
    monkeypatch.setattr(hub, "HfApi", FakeApi)
    monkeypatch.setenv("HF_TOKEN", "hf_fake_token")
    r = CliRunner().invoke(cli, ["export", "hf", "--out", str(tmp_path / "out"), "--tables", "episodes,turns",
                                 "--license", "apache-2.0", "--shard-rows", "300", "--push", "me/trajs", "--public"])
    assert r.exit_code == 0, r.output
    assert "episodes:" in r.output and "turns:" in r.output and "hidden row(s) left out" in r.output
    assert "pushed to https://huggingface.co/datasets/me/trajs" in r.output
    (api,) = FakeApi.instances
    assert api.token == "hf_fake_token" and api.calls[0][1]["private"] is False
    assert _front_matter((tmp_path / "out" / "README.md").read_text())["license"] == "apache-2.0"


def test_cli_errors(cli: typer.Typer, tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(cli, ["export", "hf", "--out", str(tmp_path / "o"), "--tables", "nope"])
    assert r.exit_code != 0 and isinstance(r.exception, TrajlakeError) and "nope" in str(r.exception)
    r = runner.invoke(cli, ["export", "hf", "--out", str(tmp_path / "o"), "--as-of", "not-a-time"])
    assert isinstance(r.exception, TrajlakeError) and "\n" not in str(r.exception)
    r = runner.invoke(cli, ["export", "hf", "--out", str(tmp_path / "o"), "--push", "me/x"])
    assert isinstance(r.exception, TrajlakeError) and "HF_TOKEN" in str(r.exception)
    r = runner.invoke(cli, ["export", "hf", "--help"])
    assert r.exit_code == 0 and "--include-hidden" in r.output and "--push" in r.output
