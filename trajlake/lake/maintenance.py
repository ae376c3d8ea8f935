"""verify and compact: integrity checks and table maintenance that are safe while writers run.

``verify`` trusts nothing it can recompute: besides content hashes and file checksums it checks that each
table's ``_delta_log`` is an unbroken chain of readable commits (a missing or unparsable entry silently drops
that commit's rows from every reader) and recomputes the Delta-log statistics (row counts, null counts,
min/max) from the data, since readers and the writer's duplicate check skip files by them.

Plain reads (``trajlake sql``, ``connect``, ``scan``) do not verify file checksums; only ``verify`` and the
lake's own reader (``Lake.read_file``, which checks Parquet page checksums) do.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import io
import json
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import AddAction, RemoveAction

from trajlake.errors import TrajlakeError, one_line
from trajlake.lake.delta_log import (
    DELTA_LOG,
    LogEntryActions,
    checkpoint_version,
    log_entry_name,
    log_entry_version,
)
from trajlake.lake.hashing import episode_hash, hash_rows, row_bytes
from trajlake.lake.store import (
    COMMIT_INTENTS,
    COMMIT_RECORDS,
    DEFAULT_RETENTION_HOURS,
    META_DIR,
    TARGET_FILE_BYTES,
    DataFile,
    Lake,
    checksum_from_name,
    intent_vouches,
)
from trajlake.lake.values import impossible_token_values
from trajlake.schema import TABLES, arrow_schema, table_def

DEFAULT_ORPHAN_GRACE_HOURS = 1.0
_SMALL_FILE_FRACTION = 0.5


@dataclass
class VerifyReport:
    """Result of ``verify``: problems make it fail; notes are informational."""

    versions: dict[str, int]
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    orphan_episodes: list[str] = field(default_factory=list)
    unrecorded_entries: list[str] = field(default_factory=list)
    """Delta log entries (``table/_delta_log/N.json``) trajlake has no commit record of."""

    @property
    def ok(self) -> bool:
        return not self.problems


def _partitions(lake: Lake, versions: dict[str, int]) -> dict[str | None, dict[str, list[DataFile]]]:
    """run partition -> table -> files, for the episode-keyed tables."""
    out: dict[str | None, dict[str, list[DataFile]]] = defaultdict(lambda: defaultdict(list))
    for name in ("episodes", "turns", "gateway_events"):
        for f in lake.files(name, versions[name]):
            out[f.partition_values.get("run_id")][name].append(f)
    return out


def _check_log_chain(lake: Lake, name: str, version: int, report: VerifyReport) -> None:
    """Every commit up to ``version`` must be present (or covered by a checkpoint) and parse."""
    try:
        listing = lake.storage.listdir(name, DELTA_LOG)
    except (OSError, TrajlakeError) as e:
        report.problems.append(f"{name}/_delta_log: cannot list the log: {e}")
        return
    entries = sorted(v for n in listing if (v := log_entry_version(n)) is not None)
    checkpoints = sorted(v for n in listing if (v := checkpoint_version(n)) is not None)
    entries = [v for v in entries if v <= version]
    covered = max((c for c in checkpoints if c <= version), default=-1)
    needed = range(covered + 1, version + 1)
    missing = sorted(set(needed) - set(entries))
    if missing:
        shown = ", ".join(log_entry_name(v) for v in missing[:5])
        report.problems.append(f"{name}/_delta_log: {len(missing)} commit(s) missing from the log chain ({shown}"
                               f"{', ...' if len(missing) > 5 else ''}): their rows are silently dropped by "
                               f"every reader")
    if covered < 0 and 0 not in entries:
        report.problems.append(f"{name}/_delta_log: the first commit ({log_entry_name(0)}) is missing and "
                               f"no checkpoint covers it")
    for v in needed:
        if v not in entries:
            continue
        entry = log_entry_name(v)
        try:
            data = lake.storage.read_bytes(name, DELTA_LOG, entry)
            # read as open(..., encoding="utf-8") would: universal newlines, decode errors as ValueError
            for i, line in enumerate(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"), start=1):
                if line.strip():
                    action = json.loads(line)
                    if not isinstance(action, dict) or len(action) != 1:
                        raise ValueError(f"line {i} is not one Delta action")
        except (OSError, ValueError, TrajlakeError) as e:
            report.problems.append(f"{name}/_delta_log/{entry}: unreadable commit: {e}")


def _newest_log_entry(lake: Lake, name: str) -> int:
    try:
        found = [v for n in lake.storage.listdir(name, DELTA_LOG) if (v := log_entry_version(n)) is not None]
    except (OSError, TrajlakeError):
        return -1
    return max(found, default=-1)


def _check_commit_records(lake: Lake, name: str, version: int, latest: bool, report: VerifyReport) -> None:
    """The log entries trajlake recorded at commit time must still be there, byte for byte."""
    st = lake.storage
    folder = (META_DIR, COMMIT_RECORDS, name)
    try:
        records = sorted((int(n), n) for n in st.listdir(*folder) if n.isdigit())
    except (OSError, TrajlakeError):
        return  # a lake written before commit records existed
    try:
        on_log = set(st.listdir(name, DELTA_LOG))
    except (OSError, TrajlakeError):
        on_log = set()

    def in_log(v: int) -> bool:
        return log_entry_name(v) in on_log

    # a record above the version read whose entry exists now is a commit made while verify runs
    lost = [v for v, _ in records if v > version and not in_log(v)] if latest else []
    if lost:
        report.problems.append(f"{name}/_delta_log: {len(lost)} committed version(s) are gone from the log "
                               f"(newest recorded {lost[-1]}, the log ends at {version}): the newest entries were "
                               f"deleted and their rows are silently dropped")
    intents = lake.commit_intents(name)
    for entry, actions in unrecorded_log_entries(lake, name, version, records=[v for v, _ in records],
                                                 on_log=on_log, intended=True):
        if intent_vouches(intents, actions):
            report.notes.append(f"{name}/_delta_log/{entry}: committed by a trajlake writer that stopped before "
                                f"recording it (its commit intent is still there); the next commit to the table "
                                f"or `trajlake compact` records it")
            continue
        report.unrecorded_entries.append(f"{name}/_delta_log/{entry}")
        report.problems.append(f"{name}/_delta_log/{entry}: no trajlake commit record: trajlake did not write this "
                               f"entry (another tool or a hand edit forged it), or the trajlake writer that did "
                               f"died between its commit and the record; it {actions.describe()}")
    for v, record in records:
        entry = log_entry_name(v)
        if v > version or not in_log(v):
            continue  # a gap is reported by the chain check, a checkpointed entry may be cleaned up
        try:
            recorded = st.read_bytes(*folder, record).decode("ascii").strip()
            actual = hashlib.sha256(st.read_bytes(name, DELTA_LOG, entry)).hexdigest()
        except (OSError, TrajlakeError, UnicodeDecodeError) as e:
            report.problems.append(f"{name}/_delta_log/{entry}: cannot check: {e}")
            continue
        if recorded != actual:
            report.problems.append(f"{name}/_delta_log/{entry}: the log entry changed after it was "
                                   f"committed (sha256 {actual[:12]}, recorded {recorded[:12]})")


def unrecorded_log_entries(lake: Lake, name: str, version: int, *, records: list[int] | None = None,
                           on_log: set[str] | None = None, intended: bool = False) -> list[tuple[str, LogEntryActions]]:
    """Log entries of ``name`` up to ``version`` that trajlake did not record at commit time, each as (entry name,
    what it does). Entries older than the first record (a lake written before commit records existed, and the
    table's creation, version 0) are not judged. Empty when the lake keeps no records. An entry whose writer
    died between its commit and the record (it names a commit intent still on storage and does no more than
    the intent says) is left out, unless ``intended``."""
    st = lake.storage
    if records is None:
        try:
            records = sorted(int(n) for n in st.listdir(META_DIR, COMMIT_RECORDS, name) if n.isdigit())
        except (OSError, TrajlakeError):
            return []
    if not records:
        return []
    if on_log is None:
        try:
            on_log = set(st.listdir(name, DELTA_LOG))
        except (OSError, TrajlakeError):
            return []
    recorded = set(records)
    found = sorted(v for n in on_log if (v := log_entry_version(n)) is not None and records[0] < v <= version
                   and v not in recorded)
    if found:  # a writer records right after its commit: look again once before calling it unrecorded
        time.sleep(0.5)
        with contextlib.suppress(OSError, TrajlakeError):
            recorded = {int(n) for n in st.listdir(META_DIR, COMMIT_RECORDS, name) if n.isdigit()}
        found = [v for v in found if v not in recorded]
    if not found:
        return []
    intents = {} if intended else lake.commit_intents(name)  # with ``intended`` every entry is returned
    out: list[tuple[str, LogEntryActions]] = []
    for v in found:
        entry = lake.log_entry(name, v)
        if intent_vouches(intents, entry):
            continue  # trajlake's: its writer died before the record (the next writer or compact records it)
        out.append((log_entry_name(v), entry))
    return out


def _log_stats(lake: Lake, name: str, version: int) -> dict[str, dict[str, Any]]:
    """path -> the Delta-log statistics of that file (num_records, null_count, min, max) at ``version``."""
    acts = pa.table(lake.delta(name, version).get_add_actions(flatten=False))
    out: dict[str, dict[str, Any]] = {}
    for row in acts.to_pylist():
        out[row["path"]] = {k: row.get(k) for k in ("num_records", "null_count", "min", "max")}
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dt.datetime) and isinstance(b, dt.datetime):
        aware = [x if x.tzinfo else x.replace(tzinfo=dt.UTC) for x in (a, b)]
        return aware[0] == aware[1]
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= 1e-12 * max(abs(a), abs(b))
    return bool(a == b)


def _check_stats(name: str, f: DataFile, t: pa.Table, stats: dict[str, Any] | None,
                 report: VerifyReport) -> None:
    """Compare the Delta-log statistics of ``f`` with the values recomputed from its rows."""
    if stats is None:
        return
    where = f"{name}/{f.path}"
    if stats.get("num_records") is not None and stats["num_records"] != t.num_rows:
        report.problems.append(f"{where}: the Delta log says {stats['num_records']} rows, the file has "
                               f"{t.num_rows}")
    partition = set(f.partition_values)
    wrong: list[str] = []
    for col, n in (stats.get("null_count") or {}).items():
        if n is not None and col in t.column_names and col not in partition and t[col].null_count != n:
            wrong.append(f"nullCount.{col}")
    for kind in ("min", "max"):
        for col, logged in (stats.get(kind) or {}).items():
            if logged is None or col not in t.column_names or col in partition:
                continue
            column = t[col]
            if column.null_count == len(column):
                wrong.append(f"{kind}Values.{col}")
                continue
            actual = pc.min_max(column)[kind].as_py()
            if not _same(logged, actual):
                wrong.append(f"{kind}Values.{col}")
    if wrong:
        report.problems.append(f"{where}: Delta-log statistics do not match the data ({', '.join(wrong[:6])}"
                               f"{', ...' if len(wrong) > 6 else ''}): readers and the duplicate check skip "
                               f"files by them, so rows may be hidden")


def _read(lake: Lake, name: str, f: DataFile, report: VerifyReport,
          stats: dict[str, dict[str, Any]] | None = None) -> pa.Table | None:
    try:
        recorded = checksum_from_name(f.path)
        if recorded is not None:
            actual = lake.file_sha256(name, f.path)[: len(recorded)]
            if actual != recorded:
                report.problems.append(f"{name}/{f.path}: file checksum mismatch (name records {recorded}, "
                                       f"bytes hash to {actual}): the file was modified or corrupted")
                # keep going: the row hashes below can still name the affected episodes
        t = lake.read_file(name, f)
        expected = arrow_schema(name)
        for fld in expected:
            if fld.name not in t.column_names:
                report.problems.append(f"{name}/{f.path}: column {fld.name} is missing")
                return None
            if t.schema.field(fld.name).type != fld.type:
                report.problems.append(f"{name}/{f.path}: column {fld.name} has type {t.schema.field(fld.name).type}, "
                                       f"schema v1 says {fld.type}")
                return None
        extra = set(t.column_names) - set(expected.names)
        if extra:
            report.problems.append(f"{name}/{f.path}: unknown column(s) {', '.join(sorted(extra))}")
        if stats is not None:
            _check_stats(name, f, t, stats.get(f.path), report)
        return t
    except FileNotFoundError:
        report.problems.append(f"{name}/{f.path}: data file listed in the Delta log is missing")
    except TrajlakeError as e:
        report.problems.append(f"{name}/{f.path}: {e}")
    except Exception as e:  # pyarrow raises OSError/ArrowInvalid on corrupt pages, checksums, footers
        report.problems.append(f"{name}/{f.path}: unreadable or corrupt data file: {one_line(e)}")
    return None


def verify(lake: Lake, as_of: str | dict[str, int] | None = None, *, strict: bool = False,
           max_listed: int = 20) -> VerifyReport:
    """Recompute every content hash, check file schema versions, keys and episode completeness.

    Orphan turns/events (written by a writer that died before committing their episode row) are invisible to
    readers and reported as notes; with ``strict`` they are problems. Works one run partition at a time."""
    try:
        versions = lake.resolve_as_of(as_of) or lake.versions()
    except TrajlakeError as broken:  # delta-rs refuses a broken log: name what is broken instead
        report = VerifyReport({})
        for name in TABLES:
            _check_log_chain(lake, name, _newest_log_entry(lake, name), report)
        report.problems.append(one_line(broken))
        return report
    report = VerifyReport(versions)
    counts: dict[str, int] = defaultdict(int)
    for name in TABLES:
        _check_log_chain(lake, name, versions[name], report)
        _check_commit_records(lake, name, versions[name], as_of is None, report)
    stats = {name: _log_stats(lake, name, versions[name]) for name in TABLES}
    for _run, tables in sorted(_partitions(lake, versions).items(), key=lambda kv: str(kv[0])):
        turn_hashes: dict[str, list[tuple[int, str]]] = defaultdict(list)
        event_hashes: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
        tokenizers: dict[str, dict[str, tuple[int, str]]] = defaultdict(dict)
        for f in tables.get("turns", []):
            t = _read(lake, "turns", f, report, stats["turns"])
            if t is None:
                continue
            counts["turns"] += t.num_rows
            _collect_tokenizers(t, f.path, tokenizers)
            for rows, field_name, message in impossible_token_values(t):
                for r in np.flatnonzero(rows)[:max_listed]:
                    report.problems.append(f"turns/{f.path}: episode {t['episode_id'][int(r)]} turn "
                                           f"{t['turn_idx'][int(r)]}: {field_name}: {message}")
            computed = hash_rows(t, "turns")
            for e, i, stored, h in zip(t["episode_id"].to_pylist(), t["turn_idx"].to_pylist(),
                                       t["content_hash"].to_pylist(), computed, strict=True):
                if stored != h:
                    report.problems.append(f"turns/{f.path}: episode {e} turn {i}: content_hash mismatch "
                                           f"(stored {str(stored)[:12]}, recomputed {h[:12]})")
                turn_hashes[e].append((i, h))
        for f in tables.get("gateway_events", []):
            t = _read(lake, "gateway_events", f, report, stats["gateway_events"])
            if t is None:
                continue
            counts["gateway_events"] += t.num_rows
            for e, ti, ei, h in zip(t["episode_id"].to_pylist(), t["turn_idx"].to_pylist(),
                                    t["event_idx"].to_pylist(), hash_rows(t, "gateway_events"), strict=True):
                event_hashes[e].append((ti, ei, h))
        seen: set[str] = set()
        for f in tables.get("episodes", []):
            t = _read(lake, "episodes", f, report, stats["episodes"])
            if t is None:
                continue
            counts["episodes"] += t.num_rows
            for e, n, stored, rb in zip(t["episode_id"].to_pylist(), t["n_turns"].to_pylist(),
                                        t["content_hash"].to_pylist(), row_bytes(t, "episodes"), strict=True):
                if e in seen:
                    report.problems.append(f"episodes/{f.path}: episode {e} appears more than once "
                                           f"(`trajlake compact` removes identical duplicates)")
                    continue
                seen.add(e)
                turns = sorted(turn_hashes.get(e, []))
                idx = [i for i, _ in turns]
                if idx != list(range(n)):
                    report.problems.append(f"episodes/{f.path}: episode {e} is partial: n_turns={n} but the "
                                           f"turns table has turn_idx {idx[:10]}{'...' if len(idx) > 10 else ''}")
                    continue
                events = [h for _, _, h in sorted(event_hashes.get(e, []))]
                h = episode_hash(rb, [x for _, x in turns], events)
                if stored != h:
                    report.problems.append(f"episodes/{f.path}: episode {e}: content_hash mismatch "
                                           f"(stored {str(stored)[:12]}, recomputed {h[:12]})")
        _check_one_tokenizer(tokenizers, report, max_listed)
        orphans = sorted((set(turn_hashes) | set(event_hashes)) - seen)
        report.orphan_episodes += orphans
    for name in ("tasks", "runs"):
        pk = table_def(name).primary_key
        keys: set[tuple[Any, ...]] = set()
        for f in lake.files(name, versions[name]):
            t = _read(lake, name, f, report, stats[name])
            if t is None:
                continue
            counts[name] += t.num_rows
            for k in zip(*(t[c].to_pylist() for c in pk), strict=True):
                if k in keys:
                    report.problems.append(f"{name}/{f.path}: duplicate key {k}")
                keys.add(k)
    report.counts = dict(counts)
    if report.orphan_episodes and report.unrecorded_entries:
        (report.problems if strict else report.notes).append(
            f"{len(report.orphan_episodes)} episode(s) have turns/events but no episode row, and the log holds "
            f"entries trajlake did not write ({', '.join(report.unrecorded_entries[:3])}): their rows are hidden by "
            f"those entries, not lost by a writer; do not compact: {', '.join(report.orphan_episodes[:max_listed])}")
    elif report.orphan_episodes:
        msg = (f"{len(report.orphan_episodes)} uncommitted episode(s) have turns/events but no episode row "
               f"(a writer died mid-commit or is committing now); invisible to readers; `trajlake compact` "
               f"removes them after the grace period: {', '.join(report.orphan_episodes[:max_listed])}")
        (report.problems if strict else report.notes).append(msg)
    if len(report.problems) > 200:
        report.problems = [*report.problems[:200], f"... and {len(report.problems) - 200} more problems"]
    return report


def _collect_tokenizers(t: pa.Table, path: str, seen: dict[str, dict[str, tuple[int, str]]]) -> None:
    """Per episode, each tokenizer id its turns carry with the first turn (and file) that carries it."""
    if "tokenizer_id" not in t.column_names:
        return
    # one row per (episode, tokenizer id) of the file, vectorised: a Python loop over every turn is verify's hot path
    firsts = (t.select(["episode_id", "tokenizer_id", "turn_idx"]).filter(pc.is_valid(t["tokenizer_id"]))
              .group_by(["episode_id", "tokenizer_id"]).aggregate([("turn_idx", "min")]))
    for e, tok, i in zip(firsts["episode_id"].to_pylist(), firsts["tokenizer_id"].to_pylist(),
                         firsts["turn_idx_min"].to_pylist(), strict=True):
        have = seen[e].get(tok)
        if have is None or i < have[0]:
            seen[e][tok] = (i, path)


def _check_one_tokenizer(seen: dict[str, dict[str, tuple[int, str]]], report: VerifyReport, max_listed: int) -> None:
    """One tokenizer per episode: token ids of two tokenizers in one episode do not concatenate to any model's
    context (a trainer would feed one tokenizer's ids to a model of another). Text-only turns (null) are allowed."""
    mixed = sorted(e for e, toks in seen.items() if len(toks) > 1)
    for e in mixed[:max_listed]:
        toks = sorted(seen[e].items(), key=lambda kv: kv[1][0])
        (first, (i0, path)), (other, (i1, _)) = toks[0], toks[1]
        more = f" and {len(toks) - 2} more" if len(toks) > 2 else ""
        report.problems.append(f"turns/{path}: episode {e} mixes tokenizer ids: turn {i0} has {first!r}, turn {i1} "
                               f"has {other!r}{more} (one tokenizer per episode: its turns' token ids must "
                               f"concatenate to one model's context)")
    if len(mixed) > max_listed:
        report.problems.append(f"... and {len(mixed) - max_listed} more episodes that mix tokenizer ids")


@dataclass
class CompactReport:
    """What ``compact`` did."""

    files_before: dict[str, int] = field(default_factory=dict)
    files_after: dict[str, int] = field(default_factory=dict)
    orphan_rows_removed: int = 0
    duplicate_rows_removed: int = 0
    vacuumed_files: int = 0
    versions: dict[str, int] = field(default_factory=dict)


@contextlib.contextmanager
def _exclusive(lake: Lake, what: str) -> Iterator[None]:
    if not lake.is_local:
        # Object storage has no lock: two compactions are still safe (each commit checks that the files it
        # removes are live, and the loser stops with ConcurrentChangeError), only wasted work.
        yield
        return
    path = lake.meta_dir / f"{what}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise TrajlakeError(f"another `trajlake {what}` is running on {lake.location}") from e
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _committed_ids(lake: Lake, run: str | None) -> set[str]:
    ids: set[str] = set()
    flt = [("run_id", "=", run)]
    for _, t in lake.iter_tables("episodes", columns=["episode_id"], partition_filters=flt):
        ids.update(t["episode_id"].to_pylist())
    return ids


def compact(lake: Lake, *, retention_hours: float = DEFAULT_RETENTION_HOURS,
            orphan_grace_hours: float = DEFAULT_ORPHAN_GRACE_HOURS, vacuum: bool = True,
            target_file_bytes: int = TARGET_FILE_BYTES) -> CompactReport:
    """Merge small files per partition, drop orphans older than the grace period and identical duplicate
    episodes, write a checkpoint, and vacuum files removed more than ``retention_hours`` ago.

    Safe while writers run: it only rewrites committed files, commits with conflict checks (a concurrent
    append makes it retry; a concurrent compaction makes it stop), and leaves files younger than the grace
    period that belong to no committed episode alone (a writer may be about to commit their episode)."""
    report = CompactReport()
    now_ms = time.time() * 1000
    grace_ms = orphan_grace_hours * 3_600_000
    with _exclusive(lake, "compact"):
        # Rewriting, checkpointing and vacuuming would make an unrecorded (possibly forged) log entry's removes
        # permanent: the files it hides would be deleted for good. Refuse before touching anything.
        for name in TABLES:
            lake.recover_commit_records(name)  # entries of writers killed between their commit and its record
        for name in TABLES:
            # only entries that remove files: an unrecorded add (a writer killed between its commit and its
            # record) hides nothing that vacuum could delete
            unrecorded = [(e, a) for e, a in unrecorded_log_entries(lake, name, lake.delta(name).version())
                          if a.removes or a.error is not None]
            if unrecorded:
                entry, actions = unrecorded[0]
                raise TrajlakeError(f"{name}/_delta_log/{entry} has no trajlake commit record (it "
                                    f"{actions.describe()}): not "
                                    f"compacting or vacuuming on the strength of it; run `trajlake verify`")
        # episodes first so the committed-id sets used for turns/events are as fresh as possible
        for name in ("episodes", "turns", "gateway_events", "tasks", "runs"):
            files = lake.files(name)
            report.files_before[name] = len(files)
            by_part: dict[str | None, list[DataFile]] = defaultdict(list)
            for f in files:
                by_part[f.partition_values.get("run_id")].append(f)
            for part, pfiles in by_part.items():
                _compact_partition(lake, name, part, pfiles, now_ms, grace_ms, target_file_bytes, report)
        for name in TABLES:
            d = lake.delta(name)
            d.create_checkpoint()
            d.cleanup_metadata()
            _prune_commit_records(lake, name)
            if vacuum:
                before = d.version()
                with lake.commit_intent(name) as props:
                    removed = d.vacuum(retention_hours=int(retention_hours), dry_run=False,
                                       enforce_retention_duration=False, commit_properties=props())
                    report.vacuumed_files += len(removed)
                    d.update_incremental()
                    lake.record_commits(name, before + 1, d.version())  # delta-rs logs VACUUM START / END
            _prune_commit_intents(lake, name, now_ms - grace_ms)
            report.files_after[name] = len(lake.files(name))
        report.versions = lake.versions()
    return report


def _prune_commit_intents(lake: Lake, name: str, before_ms: float) -> None:
    """Drop commit intents written before ``before_ms`` (epoch ms) that no unrecorded entry used: their writer
    was killed before its commit (or after recording it), and an old intent would keep vouching for a forger
    who names it."""
    for nonce, body in lake.commit_intents(name).items():
        at = body.get("at")
        if isinstance(at, (int, float)) and at * 1000 < before_ms:
            with contextlib.suppress(OSError, TrajlakeError):
                lake.storage.remove(META_DIR, COMMIT_INTENTS, name, nonce)


def _prune_commit_records(lake: Lake, name: str) -> None:
    """Drop commit records of log entries cleaned up after a checkpoint (the checkpoint now stands for them)."""
    st = lake.storage
    with contextlib.suppress(OSError, TrajlakeError):
        current = lake.delta(name).version()
        on_log = set(st.listdir(name, DELTA_LOG))
        for n in st.listdir(META_DIR, COMMIT_RECORDS, name):
            if n.isdigit() and log_entry_name(int(n)) not in on_log and int(n) <= current:
                st.remove(META_DIR, COMMIT_RECORDS, name, n)


def _compact_partition(lake: Lake, name: str, part: str | None, files: list[DataFile], now_ms: float,
                       grace_ms: float, target: int, report: CompactReport) -> None:
    committed = _committed_ids(lake, part) if name in ("turns", "gateway_events") else None
    chosen: list[DataFile] = []
    tables: list[pa.Table] = []
    dropped_orphans = 0
    for f in files:
        young = now_ms - f.modification_time < grace_ms
        small = f.size < target * _SMALL_FILE_FRACTION
        if committed is not None:
            t = lake.read_file(name, f)
            is_committed = pc.is_in(t["episode_id"], value_set=pa.array(list(committed), pa.string()))
            n_committed = pc.sum(is_committed.cast(pa.int64())).as_py() or 0
            if n_committed < t.num_rows:
                if young:
                    continue  # its episode may be committing right now
                dropped_orphans += t.num_rows - n_committed
                t = t.filter(is_committed)
            elif not small:
                continue
            chosen.append(f)
            tables.append(t)
        elif small:
            chosen.append(f)
            tables.append(lake.read_file(name, f))
    if not chosen:
        return
    merged = pa.concat_tables(tables) if tables else None
    dups = 0
    if merged is not None and merged.num_rows:
        pk = list(table_def(name).primary_key)
        merged, dups = _dedupe(merged, pk, name)
    if len(chosen) == 1 and dropped_orphans == 0 and dups == 0:
        return
    now = int(time.time() * 1000)
    adds: list[AddAction] = []
    if merged is not None and merged.num_rows:
        adds = lake.write_files(name, merged)
        for a in adds:
            a.data_change = False
    removes = [RemoveAction(f.path, dropped_orphans > 0 or dups > 0, now, f.size, f.partition_values)
               for f in chosen]
    lake.commit_rewritten(name, removes, adds)
    report.orphan_rows_removed += dropped_orphans
    report.duplicate_rows_removed += dups


def _dedupe(t: pa.Table, pk: list[str], name: str) -> tuple[pa.Table, int]:
    """Drop rows whose primary key repeats with identical content; differing content is an error."""
    keys = list(zip(*(t[c].to_pylist() for c in pk), strict=True))
    if len(set(keys)) == len(keys):
        return t, 0
    hashes = t["content_hash"].to_pylist() if "content_hash" in t.column_names else hash_rows(t, name)
    first: dict[tuple[Any, ...], str] = {}
    keep: list[int] = []
    for i, (k, h) in enumerate(zip(keys, hashes, strict=True)):
        if k in first:
            if first[k] != h:
                raise TrajlakeError(f"{name}: key {k} stored twice with different content; resolve by hand")
            continue
        first[k] = h
        keep.append(i)
    return t.take(keep), len(keys) - len(keep)
