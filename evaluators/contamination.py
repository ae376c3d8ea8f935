"""``trajlake contamination``: contamination and leakage scans of an evaluation split against training data.

Six checks, each answered per evaluation task (``docs/contamination.md``):

- ``exact_ngram``    word n-grams (default 13, GPT-3 style normalisation: lowercase, runs of anything but
                     ``[a-z0-9]`` become one space) of the task's documents (statement, gold patch, hidden test
                     names and bodies, page text where the environment provides them) that occur in the
                     training side (turn contents of the training episodes, corpus files). 64-bit n-gram hashes:
                     DuckDB normalises and hashes the words of the streamed training side, the n-gram hashes are
                     semi-joined with the (small) evaluation hash set (engine ``numpy``: vectorised per record
                     batch; engine ``duckdb``: list slices and a DuckDB SEMI JOIN), and DuckDB joins the hits back
                     to evaluation positions; memory holds the evaluation side, never the training side. Score =
                     share of a document's n-grams found in training (max over the task's documents); n-grams
                     that occur in the statements of ``common_families`` or more template families are the harness's
                     boilerplate and are ignored.
- ``near_duplicate`` MinHash LSH (``datasketch``) over identifier-normalised shingles: every eval task against
                     the tasks of other splits, the corpus documents and the training turns of the roles in
                     ``near_dup_roles``. Identifiers (code names, backticked names) are renamed by order of first
                     appearance, so a copy with renamed identifiers is still a near duplicate.
- ``family``         the family rule: no template family in two splits (or played by training episodes).
- ``time_split``     tasks created before the ``data_cutoff`` of a run that evaluated them (run config JSON key
                     ``data_cutoff``, ISO-8601, or ``--data-cutoff``).
- ``repo_commit``    eval tasks sharing a source repository commit (``provenance.source``/``commit``) with
                     training tasks. Listed; flagged only with ``flag_shared_commits``, because environments that
                     mutate one repository into many tasks share commits by design.
- ``trajectory``     the eval task's normalised action sequences (tool-call n-grams of its eval-split episodes)
                     appearing in training episodes.

``flagged_tasks`` (top level of the JSON report) is the sorted union of the tasks flagged by the checks.
"""

from __future__ import annotations

import builtins
import datetime as dt
import json
import keyword
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt
import pyarrow as pa
from trajlake.envs.core import EvalDocument
from trajlake.envs.registry import UnknownEnvironmentError, spec
from trajlake.schemas.vocab import Role

from trajlake.errors import TrajlakeError
from trajlake.lake.store import LakeArg, lake_location
from trajlake.query import connect, lake_versions

__all__ = [
    "CHECKS",
    "EvalDocument",
    "ScanSettings",
    "code_tokens",
    "environment_documents",
    "normalise_words",
    "scan",
    "shingles",
]

CONTRACT_VERSION = "1"
CHECKS: tuple[str, ...] = ("exact_ngram", "near_duplicate", "family", "time_split", "repo_commit", "trajectory")

# A read_file observation prefixes each line with "  12| "; the numbers would break every multi-line n-gram.
_GUTTER_SQL = r"(?m)^\s*\d+\| ?"
_GUTTER = re.compile(_GUTTER_SQL)
_NON_WORD = re.compile(r"[^a-z0-9]+")
# the gutter regex only runs on texts with a "|" (most have none): one regex pass less per training turn
_NORM_SQL = ("string_split(trim(regexp_replace(lower(CASE WHEN contains({col}, '|') THEN regexp_replace({col}, '"
             + _GUTTER_SQL.replace("'", "''") + "', '', 'g') ELSE {col} END), '[^a-z0-9]+', ' ', 'g')), ' ')")


@dataclass(frozen=True)
class ScanSettings:
    """Every knob of a scan (reported in the JSON, so a report can be reproduced)."""

    ngram: int = 13
    threshold: float = 0.0            # exact_ngram flags a task whose score is above this
    common_families: int = 3          # an n-gram in tasks of this many families is boilerplate
    shingle: int = 5
    num_perm: int = 128
    lsh_threshold: float = 0.7
    minhash_seed: int = 1
    near_dup_roles: tuple[str, ...] = (Role.USER.value, Role.SYSTEM.value)
    near_dup_min_tokens: int = 20     # shorter texts (a one-line fix: `if not v0:`) match too much to mean anything
    action_ngram: int = 3
    action_threshold: float = 0.5     # trajectory flags a task when this share of its action n-grams is seen
    flag_shared_commits: bool = False
    max_sources: int = 5
    engine: str = "numpy"             # n-gram hashing: numpy (vectorised) or duckdb (list slices in SQL)


# ------------------------------------------------------------------------------------ normalisation
def normalise_words(text: str) -> list[str]:
    """The words the exact scan compares (the Python twin of the SQL normalisation)."""
    return _NON_WORD.sub(" ", _GUTTER.sub("", text).lower()).split()


_TOKEN = re.compile(r"`[^`\n]+`|[A-Za-z_][A-Za-z0-9_]*|\d+")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# keywords and builtins keep their names: they are the language, not the task's identifiers
_KEEP = frozenset(keyword.kwlist) | frozenset(dir(builtins)) | frozenset({"self", "cls", "none", "true", "false"})


def _looks_like_code(word: str) -> bool:
    return "_" in word or any(c.isupper() for c in word[1:]) or any(c.isdigit() for c in word)


def code_tokens(text: str, *, code: bool = False) -> list[str]:
    """Tokens for near-duplicate shingles with identifiers renamed by order of first appearance.

    In code (``code=True``) every name that is not a keyword or builtin is an identifier; in prose, backticked
    names and words that look like code (underscores, inner capitals, digits) are. Renaming ``parse_duration`` to
    ``parse_span`` throughout therefore gives the same tokens ("renaming variables does not make a new task")."""
    names: dict[str, str] = {}
    out: list[str] = []

    def rename(name: str) -> str:
        if name not in names:
            names[name] = f"\x00v{len(names)}"
        return names[name]

    for m in _TOKEN.finditer(_GUTTER.sub("", text)):
        tok = m.group(0)
        if tok.startswith("`"):
            inner = _IDENT.findall(tok)
            out += [rename(t) if t not in _KEEP else t for t in inner]
        elif tok[0].isdigit():
            out.append(tok)
        elif tok in _KEEP or tok.lower() in _KEEP:
            out.append(tok.lower())
        elif code or _looks_like_code(tok):
            out.append(rename(tok))
        else:
            out.append(tok.lower())
    return out


def shingles(tokens: Sequence[str], k: int) -> list[bytes]:
    """Distinct k-token shingles (the whole sequence when shorter than k)."""
    if not tokens:
        return []
    if len(tokens) <= k:
        return ["\x01".join(tokens).encode()]
    return list({"\x01".join(tokens[i:i + k]).encode() for i in range(len(tokens) - k + 1)})


# ---------------------------------------------------------------------------- evaluation documents
def environment_documents(env_id: str, task_ids: Sequence[str]) -> list[EvalDocument]:
    """The documents an environment gives for its tasks beyond their statements (``Env.evaluation_documents``,
    found through the registry, entry-point environments included). Tasks of an environment that is not
    registered here (an imported benchmark's), or that is registered by a factory rather than a class, have
    their statements only."""
    try:
        cls = spec(env_id).env_class()
    except UnknownEnvironmentError:
        return []
    return cls.evaluation_documents(task_ids) if cls is not None else []


# ------------------------------------------------------------------------------------------ corpus
def _register_corpus(con: duckdb.DuckDBPyConnection, files: Sequence[Path]) -> None:
    """Table ``corpus_docs(source, text)``: JSONL (``text`` field), Parquet (``text`` column) or plain text
    (one document per line). Sources are ``file:line`` (``file:row`` for Parquet)."""
    con.execute("CREATE OR REPLACE TEMP TABLE corpus_docs (source VARCHAR, text VARCHAR)")
    for f in files:
        if not f.is_file():
            raise TrajlakeError(f"--corpus {f}: no such file")
        lit = "'" + str(f).replace("'", "''") + "'"
        name = str(f).replace("'", "''")
        suffix = f.suffix.lower()
        try:
            if suffix in (".jsonl", ".ndjson", ".json"):
                cols = {d[0] for d in con.execute(
                    f"SELECT * FROM read_json({lit}, format='newline_delimited', sample_size=-1) LIMIT 0"
                ).description}
                if "text" not in cols:
                    raise TrajlakeError(f"--corpus {f}: JSONL records have no 'text' field "
                                        f"(fields: {', '.join(sorted(cols)) or 'none'})")
                con.execute(f"INSERT INTO corpus_docs SELECT '{name}:' || row_number() OVER (), text::VARCHAR "
                            f"FROM read_json({lit}, format='newline_delimited', sample_size=-1) "
                            f"WHERE text IS NOT NULL")
            elif suffix == ".parquet":
                cols = {d[0] for d in con.execute(f"SELECT * FROM read_parquet({lit}) LIMIT 0").description}
                if "text" not in cols:
                    raise TrajlakeError(f"--corpus {f}: Parquet file has no 'text' column "
                                        f"(columns: {', '.join(sorted(cols))})")
                con.execute(f"INSERT INTO corpus_docs SELECT '{name}:' || (file_row_number + 1), text::VARCHAR "
                            f"FROM read_parquet({lit}, file_row_number=true) WHERE text IS NOT NULL")
            else:
                con.execute(f"INSERT INTO corpus_docs SELECT '{name}:' || row_number() OVER (), line "
                            f"FROM read_csv({lit}, columns={{'line': 'VARCHAR'}}, delim=E'\\x01', quote='', "
                            f"escape='', header=false, auto_detect=false) WHERE line IS NOT NULL")
        except duckdb.Error as e:
            raise TrajlakeError(f"--corpus {f}: cannot read it: {str(e).splitlines()[0]}") from e


# ------------------------------------------------------------------------------------------- scan
@dataclass
class _Task:
    task_id: str
    env_id: str
    split: str
    family: str | None
    created_at: dt.datetime | None
    statement: str
    source: str | None
    commit: str | None
    detail: dict[str, Any] = field(default_factory=dict)


def _fetch_dicts(con: duckdb.DuckDBPyConnection, query: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    rel = con.execute(query, list(params))
    cols = [d[0] for d in rel.description]
    return [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]


def _tasks(con: duckdb.DuckDBPyConnection) -> list[_Task]:
    rows = _fetch_dicts(con, """
        SELECT task_id, arg_max(env_id, written_at) AS env_id, arg_max(split, written_at) AS split,
               arg_max("family", written_at) AS "family", arg_max(created_at, written_at) AS created_at,
               arg_max("statement", written_at) AS "statement",
               arg_max(provenance."source", written_at) AS "source",
               arg_max(provenance."commit", written_at) AS "commit"
        FROM tasks GROUP BY task_id ORDER BY task_id""")
    return [_Task(r["task_id"], r["env_id"], r["split"], r["family"], r["created_at"], r["statement"] or "",
                  r["source"], r["commit"]) for r in rows]


def _parse_cutoff(value: str, where: str) -> dt.datetime:
    try:
        t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise TrajlakeError(f"{where}: data_cutoff {value!r} is not an ISO-8601 date or time") from e
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def scan(
    lake: LakeArg | None,
    *,
    eval_split: str | Sequence[str],
    train_runs: Sequence[str] | None = None,
    train_split: str | None = None,
    corpus: Sequence[str | os.PathLike[str]] = (),
    eval_runs: Sequence[str] | None = None,
    eval_task_ids: Sequence[str] | None = None,
    data_cutoff: str | None = None,
    settings: ScanSettings | None = None,
    as_of: str | dict[str, int] | None = None,
    memory_limit: str | None = None,
    threads: int | None = None,
    con: duckdb.DuckDBPyConnection | None = None,
    checks: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run every check; returns the JSON-able report (``flagged_tasks``, ``checks``, ``tasks``).

    The training side is the episodes of ``train_runs`` plus those on ``train_split`` (default ``train`` when
    no run is named), never an episode on an evaluation split, plus the ``corpus`` files. ``con`` reuses an
    open :func:`trajlake.connect` connection (the scan adds temporary tables to it)."""
    s = settings or ScanSettings()
    wanted = list(checks) if checks is not None else list(CHECKS)
    unknown = [c for c in wanted if c not in CHECKS]
    if unknown:
        raise TrajlakeError(f"unknown check(s) {', '.join(unknown)}; checks are {', '.join(CHECKS)}")
    if s.ngram < 1 or s.shingle < 1 or s.action_ngram < 1:
        raise TrajlakeError("--ngram, --shingle and --action-ngram must be at least 1")
    if s.engine not in ("numpy", "duckdb"):
        raise TrajlakeError(f"--engine must be numpy or duckdb, not {s.engine!r}")
    if s.num_perm < 2:
        raise TrajlakeError("--num-perm must be at least 2")
    if not 0.0 < s.lsh_threshold <= 1.0:
        raise TrajlakeError(f"--lsh-threshold must be in (0, 1], not {s.lsh_threshold}")
    eval_splits = [eval_split] if isinstance(eval_split, str) else list(eval_split)
    if train_split is None and not train_runs:
        train_split = "train"
    own = con is None
    if con is None:
        if lake is None:
            raise TrajlakeError("scan needs a lake or an open connection")
        con = connect(lake, as_of, memory_limit=memory_limit, threads=threads)
    try:
        return _scan(con, s, eval_splits, list(train_runs or ()), train_split, [Path(c) for c in corpus],
                     list(eval_runs) if eval_runs else None, eval_task_ids, data_cutoff, lake, wanted)
    finally:
        if own:
            con.close()


def _scan(con: duckdb.DuckDBPyConnection, s: ScanSettings, eval_splits: list[str], train_runs: list[str],
          train_split: str | None, corpus: list[Path], eval_runs: list[str] | None,
          eval_task_ids: Sequence[str] | None, data_cutoff: str | None, lake: Any,
          wanted: list[str]) -> dict[str, Any]:
    known_runs = {r for (r,) in con.execute("SELECT run_id FROM runs").fetchall()} | {
        r for (r,) in con.execute("SELECT DISTINCT run_id FROM episodes").fetchall()}
    for r in [*train_runs, *(eval_runs or ())]:
        if r not in known_runs:
            raise TrajlakeError(f"run {r!r} is not in the lake")
    all_tasks = _tasks(con)
    by_id = {t.task_id: t for t in all_tasks}
    evals = [t for t in all_tasks if t.split in eval_splits]
    if eval_task_ids is not None:
        chosen = set(eval_task_ids)
        evals = [t for t in evals if t.task_id in chosen]
    if not evals:
        raise TrajlakeError(f"no tasks on split {', '.join(eval_splits)} in the lake's tasks table")

    # training episodes: selected runs or split, never an episode on an evaluation split
    con.execute("CREATE OR REPLACE TEMP TABLE _train_eps AS SELECT episode_id, run_id, task_id FROM episodes "
                "WHERE (run_id IN (SELECT unnest(?::VARCHAR[])) OR split = ?) "
                "AND split NOT IN (SELECT unnest(?::VARCHAR[]))", [train_runs, train_split or "\x00", eval_splits])
    (n_train_eps,) = con.execute("SELECT count(*) FROM _train_eps").fetchone()  # type: ignore[misc]
    _register_corpus(con, corpus)
    (n_corpus,) = con.execute("SELECT count(*) FROM corpus_docs").fetchone()  # type: ignore[misc]
    con.execute("""CREATE OR REPLACE TEMP VIEW _train_docs AS
        SELECT 'turn' AS kind, t.episode_id || '#' || t.turn_idx AS source, t.role, t.raw_content AS text
        FROM turns t JOIN _train_eps e USING (episode_id) WHERE t.raw_content IS NOT NULL
        UNION ALL SELECT 'corpus', source, NULL, text FROM corpus_docs""")

    # evaluation documents
    docs: list[EvalDocument] = [EvalDocument(t.task_id, "statement", t.statement) for t in evals if t.statement]
    by_env: dict[str, list[str]] = {}
    for t in evals:
        by_env.setdefault(t.env_id, []).append(t.task_id)
    for env_id, ids in by_env.items():
        docs += environment_documents(env_id, ids)
    for t in evals:
        t.detail = {"task_id": t.task_id, "split": t.split, "family": t.family,
                    "created_at": t.created_at.isoformat() if t.created_at else None,
                    "documents": sorted({d.kind for d in docs if d.task_id == t.task_id}), "flags": []}

    train_task_ids = {r for (r,) in con.execute("SELECT DISTINCT task_id FROM _train_eps").fetchall()}
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "exact_ngram": lambda: _exact(con, s, docs, evals, all_tasks),
        "near_duplicate": lambda: _near_duplicates(con, s, docs, evals, all_tasks, eval_splits),
        "family": lambda: _family(evals, all_tasks, by_id, train_task_ids, eval_splits),
        "time_split": lambda: _time_split(con, s, evals, eval_splits, eval_runs, data_cutoff),
        "repo_commit": lambda: _repo_commit(s, evals, all_tasks, by_id, train_task_ids, train_split),
        "trajectory": lambda: _trajectory(con, s, evals, eval_splits, eval_runs),
    }
    checks = {name: runners[name]() if name in wanted else {"status": "skipped", "flagged": []} for name in CHECKS}
    if "repo_commit" not in wanted:
        checks["repo_commit"]["shared"] = []
    for name, chk in checks.items():
        for tid in chk.get("flagged", ()):
            next(t for t in evals if t.task_id == tid).detail["flags"].append(name)
    flagged = sorted(t.task_id for t in evals if t.detail["flags"])
    return {
        "report": "trajlake.contamination", "contract_version": CONTRACT_VERSION,
        "lake": lake_location(lake) if lake is not None else None, "lake_versions": dict(sorted(lake_versions(con).items())),
        "settings": {**asdict(s), "near_dup_roles": list(s.near_dup_roles)},
        "eval_split": eval_splits[0] if len(eval_splits) == 1 else eval_splits,
        "train_side": {"runs": train_runs, "split": train_split, "episodes": int(n_train_eps),
                       "corpus_files": [str(c) for c in corpus], "corpus_documents": int(n_corpus)},
        "n_eval_tasks": len(evals), "n_eval_documents": len(docs),
        "flagged_tasks": flagged,
        "checks": checks,
        "tasks": [t.detail for t in evals],
    }


# ------------------------------------------------------------------------------------- exact n-gram
def _ngram_sql(source: str, id_cols: str, n: int) -> str:
    """n-gram hashes ``(id_cols..., pos, h)`` of the ``text`` column of ``source`` (pos is 1-based)."""
    norm = _NORM_SQL.format(col="text")
    return (f"SELECT {id_cols}, i AS pos, hash(wh[i:i + {n - 1}]) AS h FROM ("
            f"SELECT {id_cols}, wh, unnest(range(1, len(wh) - {n - 2})) AS i FROM ("
            f"SELECT {id_cols}, list_transform(list_filter({norm}, w -> w <> ''), w -> hash(w)) AS wh "
            f"FROM {source}) WHERE len(wh) >= {n})")


def _multipliers(n: int) -> npt.NDArray[np.uint64]:
    """Odd 64-bit constants (splitmix64 of 1..n): the n-gram hash is sum(word_hash[i + j] * c[j]) mod 2**64."""
    out = []
    for j in range(1, n + 1):
        z = (j * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        out.append((z ^ (z >> 31)) | 1)
    return np.array(out, dtype=np.uint64)


def _word_hash_batches(con: duckdb.DuckDBPyConnection, source: str, id_cols: str,
                       batch_rows: int = 65_536) -> Iterable[pa.RecordBatch]:
    """Record batches ``(id_cols..., wh)``: DuckDB normalises and hashes the words of each text (``wh``)."""
    norm = _NORM_SQL.format(col="text")
    rel = con.execute(f"SELECT {id_cols}, list_transform(list_filter({norm}, w -> w <> ''), w -> hash(w)) AS wh "
                      f"FROM {source}")
    yield from rel.to_arrow_reader(batch_rows)


def _np_ngrams(wh: pa.ListArray | pa.ChunkedArray, n: int
               ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint64]]:
    """(row in the batch, 1-based word position, hash) of every n-gram of a column of word-hash lists."""
    arr = wh.combine_chunks() if isinstance(wh, pa.ChunkedArray) else wh
    offs = np.asarray(arr.offsets, dtype=np.int64)
    offs = offs - offs[0]
    vals = np.asarray(arr.flatten().fill_null(0), dtype=np.uint64)
    m = len(vals) - n + 1
    if m <= 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0, dtype=np.uint64)
    mult = _multipliers(n)
    h = vals[:m] * mult[0]
    for j in range(1, n):  # wraps mod 2**64 by design
        h += vals[j:j + m] * mult[j]
    doc_of = np.repeat(np.arange(len(offs) - 1, dtype=np.int64), np.diff(offs))
    starts = np.nonzero(doc_of[:m] == doc_of[n - 1:])[0]
    rows = doc_of[starts]
    return rows, starts - offs[rows] + 1, h[starts]


def _np_ngram_table(con: duckdb.DuckDBPyConnection, source: str, id_col: str, n: int) -> pa.Table:
    """``(id_col, pos, h)`` of every n-gram of a small source (evaluation documents, statements)."""
    parts = []
    for b in _word_hash_batches(con, source, id_col):
        rows, pos, h = _np_ngrams(b.column(1), n)
        parts.append(pa.table({id_col: b.column(0).take(pa.array(rows)), "pos": pa.array(pos, pa.int64()),
                               "h": pa.array(h, pa.uint64())}))
    return pa.concat_tables(parts) if parts else pa.table({id_col: pa.array([], pa.int64()),
                                                           "pos": pa.array([], pa.int64()),
                                                           "h": pa.array([], pa.uint64())})


def _np_train_hits(con: duckdb.DuckDBPyConnection, eval_h: npt.NDArray[np.uint64], n: int
                   ) -> tuple[pa.Table, int]:
    """(``(kind, source, h)`` of the training n-grams whose hash is an evaluation hash, training documents read):
    one streaming pass, the semi join done as a sorted-array lookup per batch; memory holds the eval hashes, one
    batch and the hits."""
    parts = []
    n_docs = 0
    for b in _word_hash_batches(con, "_train_docs", "kind, source"):
        n_docs += b.num_rows
        rows, _, h = _np_ngrams(b.column(2), n)
        if not eval_h.shape[0] or not h.shape[0]:
            continue
        idx = np.minimum(np.searchsorted(eval_h, h), eval_h.shape[0] - 1)
        hit = eval_h[idx] == h
        if hit.any():
            take = pa.array(rows[hit])
            parts.append(pa.table({"kind": b.column(0).take(take), "source": b.column(1).take(take),
                                   "h": pa.array(h[hit], pa.uint64())}))
    if not parts:
        return pa.table({"kind": pa.array([], pa.string()), "source": pa.array([], pa.string()),
                         "h": pa.array([], pa.uint64())}), n_docs
    return pa.concat_tables(parts), n_docs


def _exact(con: duckdb.DuckDBPyConnection, s: ScanSettings, docs: list[EvalDocument], evals: list[_Task],
           all_tasks: list[_Task]) -> dict[str, Any]:
    n = s.ngram
    con.register("_eval_docs_arrow", pa.table({
        "doc_no": list(range(len(docs))), "task_id": [d.task_id for d in docs], "kind": [d.kind for d in docs],
        "text": [d.text for d in docs]}))
    con.register("_fam_docs_arrow", pa.table({"family": [t.family or t.task_id for t in all_tasks],
                                              "text": [t.statement for t in all_tasks]}))
    if s.engine == "duckdb":
        con.execute(f"CREATE OR REPLACE TEMP TABLE _eval_ng AS {_ngram_sql('_eval_docs_arrow', 'doc_no', n)}")
        fam_ng = f"({_ngram_sql('_fam_docs_arrow', 'family', n)})"
    else:
        con.register("_eval_ng_arrow", _np_ngram_table(con, "_eval_docs_arrow", "doc_no", n))
        con.execute("CREATE OR REPLACE TEMP TABLE _eval_ng AS SELECT * FROM _eval_ng_arrow")
        con.register("_fam_ng_arrow", _np_ngram_table(con, "_fam_docs_arrow", "family", n))
        fam_ng = "_fam_ng_arrow"
    # boilerplate: n-grams of the statement template, i.e. shared by the statements of many template families
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _boiler AS SELECT h FROM {fam_ng}
                    GROUP BY h HAVING count(DISTINCT family) >= {int(s.common_families)}""")
    con.execute("DELETE FROM _eval_ng WHERE h IN (SELECT h FROM _boiler)")
    (n_boiler,) = con.execute("SELECT count(*) FROM _boiler").fetchone()  # type: ignore[misc]
    con.execute("CREATE OR REPLACE TEMP TABLE _eval_h AS SELECT DISTINCT h FROM _eval_ng")
    # the one pass over the training side: its n-gram hashes semi-joined with the evaluation hashes
    if s.engine == "duckdb":
        con.execute(f"""CREATE OR REPLACE TEMP TABLE _hits AS
            SELECT g.kind, g.source, g.h FROM ({_ngram_sql('_train_docs', 'kind, source', n)}) g
            SEMI JOIN _eval_h USING (h)""")
    else:
        eval_h = np.sort(con.execute("SELECT h FROM _eval_h").fetchnumpy()["h"].astype(np.uint64))
        hits, n_train = _np_train_hits(con, eval_h, n)
        con.register("_hits_arrow", hits)
        con.execute("CREATE OR REPLACE TEMP TABLE _hits AS SELECT * FROM _hits_arrow")
    con.execute("""CREATE OR REPLACE TEMP TABLE _matches AS
        SELECT e.doc_no, e.pos, h.kind, h.source FROM (SELECT DISTINCT kind, source, h FROM _hits) h
        JOIN _eval_ng e USING (h)""")
    pos_rows = con.execute("SELECT DISTINCT doc_no, pos FROM _matches ORDER BY doc_no, pos").fetchall()
    words = {int(d): normalise_words(docs[int(d)].text) for d in {r[0] for r in pos_rows}}
    spans: list[tuple[int, int, int]] = []        # (doc_no, first word, last word), 0-based inclusive
    for doc_no, pos in pos_rows:
        lo, hi = int(pos) - 1, int(pos) - 2 + n
        if spans and spans[-1][0] == doc_no and lo <= spans[-1][2] + 1:
            spans[-1] = (doc_no, spans[-1][1], max(spans[-1][2], hi))
        else:
            spans.append((int(doc_no), lo, hi))
    con.register("_spans_arrow", pa.table({"span_no": list(range(len(spans))), "doc_no": [x[0] for x in spans],
                                           "lo": [x[1] + 1 for x in spans], "hi": [x[2] + 2 - n for x in spans]}))
    src_rows = con.execute(f"""
        WITH c AS (SELECT sp.span_no, m.kind, m.source, count(*) AS ngrams
                   FROM _matches m JOIN _spans_arrow sp ON m.doc_no = sp.doc_no AND m.pos BETWEEN sp.lo AND sp.hi
                   GROUP BY ALL)
        SELECT span_no, kind, source, ngrams, count(*) OVER (PARTITION BY span_no) AS n_sources FROM c
        QUALIFY row_number() OVER (PARTITION BY span_no ORDER BY ngrams DESC, source) <= {int(s.max_sources)}
        ORDER BY span_no, ngrams DESC, source""").fetchall()
    sources: dict[int, list[dict[str, Any]]] = {}
    n_sources: dict[int, int] = {}
    for span_no, kind, source, ngrams, total in src_rows:
        sources.setdefault(int(span_no), []).append({"kind": kind, "source": source, "ngrams": int(ngrams)})
        n_sources[int(span_no)] = int(total)
    # score: share of a document's (non-boilerplate) n-grams found in training; max over the task's documents
    doc_ngrams = dict(con.execute("SELECT doc_no, count(*) FROM _eval_ng GROUP BY 1").fetchall())
    matched: dict[int, int] = {}
    for doc_no, _ in pos_rows:
        matched[int(doc_no)] = matched.get(int(doc_no), 0) + 1
    per_task: dict[str, dict[str, Any]] = {t.task_id: {"score": 0.0, "longest_span_words": 0, "spans": [],
                                                       "documents": {}} for t in evals}
    for span_no, (doc_no, lo, hi) in enumerate(spans):
        d = docs[doc_no]
        rec = per_task[d.task_id]
        rec["spans"].append({"document": d.kind, "start_word": lo, "end_word": hi, "words": hi - lo + 1,
                             "text": " ".join(words[doc_no][lo:hi + 1]), "n_sources": n_sources.get(span_no, 0),
                             "sources": sources.get(span_no, [])})
        rec["longest_span_words"] = max(rec["longest_span_words"], hi - lo + 1)
    for doc_no, c in matched.items():
        d = docs[doc_no]
        share = round(c / doc_ngrams[doc_no], 6)
        rec = per_task[d.task_id]
        rec["documents"][d.kind] = share
        rec["score"] = max(rec["score"], share)
    flagged = sorted(tid for tid, r in per_task.items() if r["spans"] and r["score"] > s.threshold)
    for t in evals:
        t.detail["exact_ngram"] = per_task[t.task_id]
    (n_hits,) = con.execute("SELECT count(*) FROM _hits").fetchone()  # type: ignore[misc]
    if s.engine == "duckdb":
        (n_train,) = con.execute("SELECT count(*) FROM _train_docs").fetchone()  # type: ignore[misc]
    (n_eval_ng,) = con.execute("SELECT count(*) FROM _eval_ng").fetchone()  # type: ignore[misc]
    return {"status": "checked", "n": n, "eval_ngrams": int(n_eval_ng), "boilerplate_ngrams": int(n_boiler),
            "training_documents": int(n_train), "training_ngram_hits": int(n_hits), "threshold": s.threshold,
            "flagged": flagged}


# ---------------------------------------------------------------------------------- near duplicates
def _minhash(tokens: list[str], s: ScanSettings) -> Any:
    from datasketch import MinHash

    m = MinHash(num_perm=s.num_perm, seed=s.minhash_seed)
    sh = shingles(tokens, s.shingle)
    if sh:
        m.update_batch(sh)
    return m


_CODE_LINE = re.compile(r"^\s*(def |class |import |from \S+ import |return\b|@\w)", re.MULTILINE)


def looks_like_code(text: str) -> bool:
    """Training documents carry no type: a text with Python definitions or returns is shingled as code."""
    return _CODE_LINE.search(text) is not None


def _doc_tokens(doc: EvalDocument) -> list[str]:
    return code_tokens(doc.text, code=doc.code)


def _near_duplicates(con: duckdb.DuckDBPyConnection, s: ScanSettings, docs: list[EvalDocument],
                     evals: list[_Task], all_tasks: list[_Task], eval_splits: list[str]) -> dict[str, Any]:
    from datasketch import MinHashLSH

    others = [t for t in all_tasks if t.split not in eval_splits]
    other_docs: dict[str, list[EvalDocument]] = {}
    for env_id in sorted({t.env_id for t in others}):
        for d in environment_documents(env_id, [t.task_id for t in others if t.env_id == env_id]):
            other_docs.setdefault(d.task_id, []).append(d)
    eval_docs: dict[str, list[EvalDocument]] = {}
    for d in docs:
        eval_docs.setdefault(d.task_id, []).append(d)

    lsh = MinHashLSH(threshold=s.lsh_threshold, num_perm=s.num_perm)
    sketches: dict[str, Any] = {}
    meta: dict[str, dict[str, Any]] = {}
    # other splits' tasks: their statements and gold patches, one sketch each
    for t in others:
        own = [EvalDocument(t.task_id, "statement", t.statement)] + [
            d for d in other_docs.get(t.task_id, ()) if d.kind == "gold_patch"]
        for d in own:
            toks = _doc_tokens(d)
            if len(toks) < s.near_dup_min_tokens:
                continue
            key = f"task:{t.task_id}:{d.kind}"
            sketches[key] = _minhash(toks, s)
            meta[key] = {"kind": "task", "source": t.task_id, "document": d.kind, "split": t.split,
                         "family": t.family}
            lsh.insert(key, sketches[key])
    roles = list(s.near_dup_roles)
    n_train_docs = 0
    rel = con.execute("SELECT kind, source, text FROM _train_docs WHERE kind = 'corpus' OR role IN "
                      "(SELECT unnest(?::VARCHAR[]))", [roles])
    while batch := rel.fetchmany(4096):
        for kind, source, text in batch:
            key = f"{kind}:{source}"
            if key in sketches:
                continue
            toks = code_tokens(text or "", code=looks_like_code(text or ""))
            if len(toks) < s.near_dup_min_tokens:
                continue
            sketches[key] = _minhash(toks, s)
            meta[key] = {"kind": kind, "source": source}
            lsh.insert(key, sketches[key])
            n_train_docs += 1
    flagged: list[str] = []
    for t in evals:
        hits: dict[str, dict[str, Any]] = {}
        for d in eval_docs.get(t.task_id, ()):
            toks = _doc_tokens(d)
            if len(toks) < s.near_dup_min_tokens:
                continue
            m = _minhash(toks, s)
            for key in lsh.query(m):
                j = round(float(m.jaccard(sketches[key])), 4)
                if j >= s.lsh_threshold and j > hits.get(key, {}).get("jaccard", -1.0):
                    hits[key] = {**meta[key], "eval_document": d.kind, "jaccard": j}
        found = sorted(hits.values(), key=lambda h: (-h["jaccard"], h["source"]))
        t.detail["near_duplicates"] = found[:max(s.max_sources, 1) * 4]
        if found:
            flagged.append(t.task_id)
    return {"status": "checked", "shingle": s.shingle, "num_perm": s.num_perm, "threshold": s.lsh_threshold,
            "min_tokens": s.near_dup_min_tokens,
            "seed": s.minhash_seed, "other_split_tasks": len(others), "training_documents": n_train_docs,
            "flagged": sorted(flagged)}


# ---------------------------------------------------------------------------------------- family
def _family(evals: list[_Task], all_tasks: list[_Task], by_id: dict[str, _Task], train_task_ids: set[str],
            eval_splits: list[str]) -> dict[str, Any]:
    splits_of: dict[str, set[str]] = {}
    for t in all_tasks:
        if t.family:
            splits_of.setdefault(t.family, set()).add(t.split)
    trained = {by_id[i].family for i in train_task_ids if i in by_id and by_id[i].family}
    flagged = []
    for t in evals:
        other = sorted(x for x in splits_of.get(t.family or "", set()) if x not in eval_splits) if t.family else []
        in_training = bool(t.family and t.family in trained)
        t.detail["family_conflict"] = {"other_splits": other, "family_in_training_episodes": in_training}
        if other or in_training:
            flagged.append(t.task_id)
    bad = sorted(f for f, sp in splits_of.items() if len(sp) > 1)
    return {"status": "checked", "families_in_several_splits": bad, "flagged": sorted(flagged)}


# ------------------------------------------------------------------------------------- time split
def _time_split(con: duckdb.DuckDBPyConnection, s: ScanSettings, evals: list[_Task], eval_splits: list[str],
                eval_runs: list[str] | None, data_cutoff: str | None) -> dict[str, Any]:
    rows = con.execute("""
        SELECT e.run_id, list(DISTINCT e.task_id) AS tasks, any_value(r.config) AS config
        FROM episodes e LEFT JOIN runs r USING (run_id)
        WHERE e.split IN (SELECT unnest(?::VARCHAR[])) GROUP BY e.run_id ORDER BY e.run_id""",
                       [eval_splits]).fetchall()
    override = _parse_cutoff(data_cutoff, "--data-cutoff") if data_cutoff else None
    runs: list[dict[str, Any]] = []
    no_cutoff: list[str] = []
    flagged: set[str] = set()
    by_id = {t.task_id: t for t in evals}
    for run_id, tasks, config in rows:
        if eval_runs is not None and run_id not in eval_runs:
            continue
        cutoff = override
        if cutoff is None and config:
            try:
                value = json.loads(config).get("data_cutoff")
            except (ValueError, AttributeError):
                value = None
            if value:
                cutoff = _parse_cutoff(str(value), f"run {run_id} config")
        if cutoff is None:
            no_cutoff.append(run_id)
            continue
        created = {tid: by_id[tid].created_at for tid in tasks if tid in by_id}
        before = sorted(tid for tid, c in created.items() if c is not None and _aware(c) < cutoff)
        undated = sorted(tid for tid in tasks if tid in by_id and by_id[tid].created_at is None)
        runs.append({"run_id": run_id, "data_cutoff": cutoff.isoformat(), "tasks": len(tasks),
                     "created_before_cutoff": len(before), "undated": len(undated)})
        for tid in before:
            by_id[tid].detail.setdefault("created_before_cutoff", []).append(
                {"run_id": run_id, "data_cutoff": cutoff.isoformat()})
            flagged.add(tid)
    status = "checked" if runs else "not_checkable"
    out: dict[str, Any] = {"status": status, "runs": runs, "runs_without_cutoff": no_cutoff,
                           "flagged": sorted(flagged)}
    if not runs:
        out["reason"] = ("no run on the evaluation split has a data_cutoff in its config (or pass --data-cutoff)"
                         if rows else "no episodes on the evaluation split")
    return out


def _aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


# --------------------------------------------------------------------------------- repo commit
def _repo_commit(s: ScanSettings, evals: list[_Task], all_tasks: list[_Task], by_id: dict[str, _Task],
                 train_task_ids: set[str], train_split: str | None) -> dict[str, Any]:
    train_tasks = {i for i in train_task_ids if i in by_id} | {t.task_id for t in all_tasks
                                                               if train_split and t.split == train_split}
    commits: dict[tuple[str, str], int] = {}
    for tid in train_tasks:
        t = by_id[tid]
        if t.commit:
            key = (t.source or "", t.commit)
            commits[key] = commits.get(key, 0) + 1
    shared = []
    for t in evals:
        n = commits.get((t.source or "", t.commit), 0) if t.commit else 0
        if n:
            t.detail["shared_repo_commit"] = {"source": t.source, "commit": t.commit, "training_tasks": n}
            shared.append(t.task_id)
    return {"status": "checked", "shared": sorted(shared),
            "commits": sorted({f"{t.source}@{t.commit}" for t in evals if t.task_id in shared}),
            "flagged": sorted(shared) if s.flag_shared_commits else []}


# ----------------------------------------------------------------------------------- trajectory
_ACTION_SQL = ("hash(coalesce(action_schema, '') || ' ' || "
               "coalesce(regexp_replace(trim(tool_args), '\\s+', ' ', 'g'), ''))")


def _action_grams_sql(episodes: str, k: int) -> str:
    """Tool-call k-grams ``(episode_id, task_id, h)`` of the episodes in ``episodes`` (a sequence shorter than k is
    one gram)."""
    return f"""SELECT episode_id, task_id, hash(seq[i:i + least({k}, len(seq)) - 1]) AS h FROM (
        SELECT episode_id, task_id, seq, unnest(range(1, greatest(len(seq) - {k} + 2, 2))) AS i FROM (
            SELECT t.episode_id, any_value(e.task_id) AS task_id, list({_ACTION_SQL} ORDER BY t.turn_idx) AS seq
            FROM turns t JOIN {episodes} e USING (episode_id)
            WHERE t.actor = 'policy' AND t.action_schema IS NOT NULL GROUP BY t.episode_id))"""


def _trajectory(con: duckdb.DuckDBPyConnection, s: ScanSettings, evals: list[_Task], eval_splits: list[str],
                eval_runs: list[str] | None) -> dict[str, Any]:
    k = s.action_ngram
    ids = [t.task_id for t in evals]
    con.execute("CREATE OR REPLACE TEMP TABLE _eval_eps AS SELECT episode_id, task_id FROM episodes "
                "WHERE split IN (SELECT unnest(?::VARCHAR[])) AND task_id IN (SELECT unnest(?::VARCHAR[])) "
                "AND (? OR run_id IN (SELECT unnest(?::VARCHAR[])))",
                [eval_splits, ids, eval_runs is None, eval_runs or []])
    con.execute(f"CREATE OR REPLACE TEMP TABLE _eval_ag AS SELECT DISTINCT task_id, h FROM "
                f"({_action_grams_sql('_eval_eps', k)})")
    # action n-grams that tasks of many families share (run the tests, submit) say nothing about one task
    con.execute(f"""DELETE FROM _eval_ag WHERE h IN (SELECT a.h FROM _eval_ag a JOIN (
                        SELECT task_id, family FROM tasks GROUP BY ALL) f USING (task_id)
                    GROUP BY a.h HAVING count(DISTINCT coalesce(f.family, a.task_id)) >= {int(s.common_families)})""")
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _traj_hits AS
        SELECT a.task_id, a.h, g.episode_id FROM ({_action_grams_sql('_train_eps', k)}) g
        JOIN _eval_ag a USING (h)""")
    totals = dict(con.execute("SELECT task_id, count(*) FROM _eval_ag GROUP BY 1").fetchall())
    seen = dict(con.execute("SELECT task_id, count(DISTINCT h) FROM _traj_hits GROUP BY 1").fetchall())
    srcs: dict[str, list[dict[str, Any]]] = {}
    for tid, ep, n in con.execute(f"""SELECT task_id, episode_id, count(DISTINCT h) n FROM _traj_hits GROUP BY task_id, episode_id
                                      QUALIFY row_number() OVER (PARTITION BY task_id ORDER BY n DESC, episode_id)
                                      <= {int(s.max_sources)} ORDER BY task_id, n DESC, episode_id""").fetchall():
        srcs.setdefault(tid, []).append({"episode_id": ep, "action_ngrams": int(n)})
    (n_eval_eps,) = con.execute("SELECT count(*) FROM _eval_eps").fetchone()  # type: ignore[misc]
    flagged = []
    for t in evals:
        total = int(totals.get(t.task_id, 0))
        hit = int(seen.get(t.task_id, 0))
        share = hit / total if total else 0.0
        t.detail["trajectory"] = {"action_ngrams": total, "seen_in_training": hit, "score": round(share, 6),
                                  "sources": srcs.get(t.task_id, [])}
        if total and share >= s.action_threshold:
            flagged.append(t.task_id)
    status = "checked" if n_eval_eps else "not_checkable"
    out: dict[str, Any] = {"status": status, "k": k, "threshold": s.action_threshold,
                           "eval_episodes": int(n_eval_eps), "flagged": sorted(flagged)}
    if not n_eval_eps:
        out["reason"] = "no episodes on the evaluation split carry the eval tasks' actions"
    return out


def summary_lines(report: dict[str, Any]) -> list[str]:
    """One line per check plus the verdict (terminal and diagnose evidence)."""
    lines = []
    for name in CHECKS:
        c = report["checks"][name]
        extra = f" ({c['reason']})" if c.get("reason") else ""
        if c["status"] == "skipped":
            lines.append(f"{name}: skipped")
        elif name == "repo_commit":
            lines.append(f"{name}: {len(c['shared'])} task(s) share a source commit with training tasks"
                         f"{' (flagged)' if c['flagged'] else ' (listed, not flagged)'}")
        else:
            lines.append(f"{name}: {c['status']}, {len(c['flagged'])} task(s) flagged{extra}")
    lines.append(f"flagged: {len(report['flagged_tasks'])} of {report['n_eval_tasks']} task(s)")
    return lines


