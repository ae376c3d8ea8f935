"""Importers of other tools' trajectory logs into schema v1 (documented in docs/importers.md).

``import_file(writer, path, fmt)`` reads one file of format ``fmt`` (one of ``FORMATS``):

- ``openai-chat``: JSONL, one chat-completions conversation (``messages``, optional ``tools``) per line;
- ``swe-agent``: a SWE-agent ``.traj`` file (older ``trajectory`` + ``history`` + ``info`` layout or the newer
  ``history``-only layout);
- ``inspect``: an inspect_ai log, ``.eval`` (zip) or ``.json``: one episode per sample and epoch;
- ``openhands``: an OpenHands evaluation ``output.jsonl``: one episode per line (instance).

``check_input_file(path, fmt)`` holds the file-level checks (missing, a directory, empty, binary) that are
the same for every ``--format`` of ``trajlake ingest``, each failing with one line naming the file;
``trajlake.io.ingest.ingest_file`` applies them to ``trajlake-jsonl`` too.

Like ``trajlake-jsonl`` ingestion, the whole file is parsed and validated first (a dry run against the lake)
and nothing is written unless everything is valid (or ``skip_invalid``). Episode ids are derived from the
format, the file's sha256, the run id and the record's position, so importing the same file again is a no-op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trajlake.errors import ConflictError, Issue, TrajlakeError, ValidationError
from trajlake.io.importers import _common
from trajlake.io.importers._build import ImportContext, build_rows, run_row
from trajlake.io.importers._common import Record, Source, episode_id_for
from trajlake.io.importers._tokenize import TurnTokenizer
from trajlake.io.jsonl import IngestSummary
from trajlake.lake.store import file_sha256
from trajlake.record.writer import LakeWriter, WriteResult

FORMATS: tuple[str, ...] = ("openai-chat", "swe-agent", "inspect", "openhands")
"""Formats ``import_file`` reads (the ``--format`` names of ``trajlake ingest``)."""

CHUNK_EPISODES = 200


def _opener(fmt: str) -> Callable[[Path], Source]:
    if fmt == "openai-chat":
        from trajlake.io.importers import openai_chat
        return openai_chat.open_source
    if fmt == "swe-agent":
        from trajlake.io.importers import swe_agent
        return swe_agent.open_source
    if fmt == "inspect":
        from trajlake.io.importers import inspect_log
        return inspect_log.open_source
    from trajlake.io.importers import openhands
    return openhands.open_source


# What "no episodes" means for each format (the file is not empty, yet nothing in it is an episode).
_NO_RECORDS = {
    "openai-chat": "the file has no JSON lines",
    "openhands": "the file has no JSON lines",
    "swe-agent": "the file has no trajectory",
    "inspect": "the log has no samples",
}
_TEXT_SNIFF_BYTES = 1 << 16
_TEXT_KIND = {"trajlake-jsonl": "JSONL", "openai-chat": "JSONL", "openhands": "JSONL", "swe-agent": "JSON",
              "inspect": "JSON or an .eval zip"}


def _file_error(path: Path, message: str) -> ValidationError:
    return ValidationError([Issue("episodes", None, None, "*", message, str(path))])


def check_input_file(path: Path, fmt: str) -> None:
    """File-level checks shared by every format, each failing with one ``ValidationError`` line that names
    the file: it exists, is a regular readable file (a directory says so), is not empty (an empty file has no
    episodes: an error for every format), and is text where the format is text (binary data, e.g. an
    inspect ``.eval`` zip given to a JSONL format, is one message rather than one error per line)."""
    path = Path(path)
    if not path.exists():
        raise _file_error(path, "no such file")
    if path.is_dir():
        raise _file_error(path, "is a directory, not a file (pass the files inside it)")
    if not path.is_file():
        raise _file_error(path, "not a regular file")
    try:
        with open(path, "rb") as fh:
            head = fh.read(_TEXT_SNIFF_BYTES)
            blank = not head.strip()
            while blank:  # only whitespace so far: read on until something else (or the end)
                block = fh.read(1 << 20)
                if not block:
                    break
                blank = not block.strip()
    except OSError as e:
        raise _file_error(path, f"cannot read the file: {e.strerror or e}") from e
    if blank:
        raise _file_error(path, "empty file: no episodes")
    kind = _TEXT_KIND.get(fmt, "text")
    if head.startswith(b"PK\x03\x04"):
        if fmt == "inspect":
            return
        raise _file_error(path, f"is a zip archive (an inspect .eval log? use --format inspect), not the {kind} "
                                f"that --format {fmt} reads")
    bad = _binary_at(head, truncated=len(head) == _TEXT_SNIFF_BYTES)
    if bad is not None:
        raise _file_error(path, f"not UTF-8 text (binary data at byte {bad}): --format {fmt} reads {kind}")


def _binary_at(head: bytes, truncated: bool) -> int | None:
    """Offset of the first byte that makes ``head`` binary (a NUL, or invalid UTF-8), else None. A multi-byte
    character cut by the end of a truncated read is not an error."""
    nul = head.find(b"\x00")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if not (truncated and e.reason == "unexpected end of data"):
            return e.start if nul < 0 else min(nul, e.start)
    return None if nul < 0 else nul


def default_run_id(fmt: str, file_hash: str) -> str:
    """The run id of an import without ``--run-id``: derived from the format and the file's sha256."""
    return f"import-{fmt}-{file_hash[:16]}"


class _Batch:
    def __init__(self) -> None:
        self.episodes: list[dict[str, Any]] = []
        self.turns: list[dict[str, Any]] = []
        self.tasks: dict[tuple[str, str], dict[str, Any]] = {}
        self.task_of: dict[str, tuple[str, str]] = {}
        self.where: dict[str, str] = {}


def _parse(rec: Record) -> _common.EpisodeSpec:
    if not _common.SAFETY_NET:
        return rec.parse()
    try:
        return rec.parse()
    except (TrajlakeError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as e:  # a shape the checked accessors did not foresee: still name the record
        raise ValidationError([Issue("episodes", None, None, "*",
                                     f"malformed record ({type(e).__name__}: {str(e)[:200]})", rec.where)]) from e


def _batches(ctx: ImportContext, src: Source, issues: list[Issue] | None,
             n_records: list[int] | None = None) -> Iterator[_Batch]:
    """Parse the source's records into row batches; record-level problems go to ``issues`` (pass 1) or are
    skipped silently (pass 2, where they were already reported). ``n_records[0]`` counts the records read,
    valid or not."""
    cur = _Batch()
    seen: dict[str, str] = {}
    for rec in src.records():
        if n_records is not None:
            n_records[0] += 1
        try:
            spec = _parse(rec)
            ep_id = episode_id_for(ctx.fmt, ctx.file_hash, ctx.run_id, spec.key)
            if ep_id in seen:
                raise ValidationError([Issue("episodes", ep_id, None, "*", f"record repeats {seen[ep_id]} "
                                             "(same sample/epoch)", rec.where)])
            seen[ep_id] = rec.where
            ep, turns, task = build_rows(spec, ctx, ep_id, rec.where)
        except ValidationError as e:
            if issues is not None:
                issues.extend(e.issues)
            continue
        cur.episodes.append(ep)
        cur.turns += turns
        cur.where[ep_id] = rec.where
        if task is not None:
            key = (task["task_id"], task["task_version"])
            cur.tasks.setdefault(key, task)
            cur.task_of[ep_id] = key
        if len(cur.episodes) >= CHUNK_EPISODES:
            yield cur
            cur = _Batch()
    if cur.episodes:
        yield cur


def _locate(res: WriteResult, batch: _Batch, path: Path) -> list[Issue]:
    out = []
    for e, errs in res.rejected.items():
        src = batch.where.get(e, str(path))
        out += [Issue(i.table, i.episode_id, i.turn_idx, i.field, i.message, src) for i in errs]
    return out


def _write_batch(writer: LakeWriter, batch: _Batch, path: Path, dry_run: bool) -> WriteResult:
    try:
        return writer.write_batch(batch.episodes, batch.turns, None, source=str(path), dry_run=dry_run)
    except ValidationError as e:  # structural problems (values that do not convert): name the file
        raise ValidationError([Issue(i.table, i.episode_id, i.turn_idx, i.field, i.message, i.source or str(path))
                               for i in e.issues]) from None


def import_file(writer: LakeWriter, path: Path, fmt: str, *, run_id: str | None = None,
                tokenizer: Path | None = None, skip_invalid: bool = False) -> IngestSummary:
    """Import one file of format ``fmt`` into the lake of ``writer``.

    The whole file is parsed and checked first; unless ``skip_invalid``, any invalid record raises
    ``ValidationError`` (issues name ``file:line`` or ``file:sample ...``, the episode, turn and field) and
    nothing is written. With ``skip_invalid`` the valid episodes are written and the invalid ones listed in
    ``rejected``. ``run_id`` defaults to ``import-<format>-<sha256 of the file>[:16]``; a ``runs`` row is
    written for it (an existing run with that id is kept as is) and ``tasks`` rows for the tasks of the
    imported episodes. ``tokenizer`` is a local Hugging Face ``tokenizer.json``: turns then get token ids and
    loss masks (1 only on policy turns). A file with no episodes (empty, or an inspect log with zero samples)
    is an error (``check_input_file`` lists the file-level checks)."""
    path = Path(path)
    if fmt not in FORMATS:
        raise ValidationError([Issue("episodes", None, None, "format", f"unknown import format {fmt!r} "
                                     f"(supported: {', '.join(FORMATS)})", str(path))])
    check_input_file(path, fmt)
    if run_id is not None and not run_id.strip():
        raise ValidationError([Issue("runs", None, None, "run_id", "--run-id must not be empty", str(path))])
    tok = TurnTokenizer(tokenizer) if tokenizer is not None else None
    try:
        file_hash = file_sha256(str(path))
        src = _opener(fmt)(path)
    except OSError as e:
        raise ValidationError([Issue("episodes", None, None, "*", f"cannot read the file: {e}", str(path))]) from e
    ctx = ImportContext(fmt=fmt, path=path, file_hash=file_hash, run_id=run_id or default_run_id(fmt, file_hash),
                        format_version=src.format_version, tokenizer=tok)
    summary = IngestSummary()
    # pass 1: parse and validate everything (against the lake too) without writing
    valid: set[str] = set()
    seen = [0]
    for batch in _batches(ctx, src, summary.rejected, seen):
        res = _write_batch(writer, batch, path, dry_run=True)
        summary.rejected += _locate(res, batch, path)
        valid.update(res.accepted, res.duplicates)
    if not seen[0]:  # the same rule as an empty file, for every format
        raise _file_error(path, f"no episodes: {_NO_RECORDS.get(fmt, 'the file holds no record')}")
    if summary.rejected and not skip_invalid:
        raise ValidationError(summary.rejected)
    if not valid:
        return summary
    # pass 2: write the run, then tasks and episodes batch by batch
    # a run that exists with another definition (e.g. from an earlier import into --run-id) is kept as is
    with contextlib.suppress(ConflictError):
        summary.runs_written += writer.write_runs([run_row(ctx, src.run, explicit=run_id is not None)])
    for batch in _batches(ctx, src, None):
        tasks = {batch.task_of[e] for e in batch.where if e in valid and e in batch.task_of}
        if tasks:
            summary.tasks_written += writer.write_tasks([batch.tasks[k] for k in sorted(tasks)])
        res = _write_batch(writer, batch, path, dry_run=False)
        summary.episodes_written += len(res.accepted)
        summary.duplicates += len(res.duplicates)
        known = {(i.episode_id, i.field, i.message) for i in summary.rejected}
        summary.rejected += [i for i in _locate(res, batch, path) if (i.episode_id, i.field, i.message) not in known]
    writer.flush()
    return summary


__all__ = ["FORMATS", "check_input_file", "default_run_id", "import_file"]
