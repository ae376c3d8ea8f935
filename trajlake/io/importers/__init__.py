"""Importers of other tools' trajectory logs into schema v1 (documented in docs/importers.md).

``import_file(writer, path, fmt)`` reads one file of format ``fmt`` (one of ``FORMATS``):

- ``openai-chat``: JSONL, one chat-completions conversation (``messages``, optional ``tools``) per line;
- ``swe-agent``: a SWE-agent ``.traj`` file (older ``trajectory`` + ``history`` + ``info`` layout or the newer
  ``history``-only layout);
- ``inspect``: an inspect_ai log, ``.eval`` (zip) or ``.json``: one episode per sample and epoch;
- ``openhands``: an OpenHands evaluation ``output.jsonl``: one episode per line (instance).

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
from trajlake.io.importers._common import Record, Source, episode_id_for, file_sha256
from trajlake.io.importers._tokenize import TurnTokenizer
from trajlake.io.jsonl import IngestSummary
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


def _batches(ctx: ImportContext, src: Source, issues: list[Issue] | None) -> Iterator[_Batch]:
    """Parse the source's records into row batches; record-level problems go to ``issues`` (pass 1) or are
    skipped silently (pass 2, where they were already reported)."""
    cur = _Batch()
    seen: dict[str, str] = {}
    for rec in src.records():
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
    loss masks (1 only on policy turns). A file with no episodes (e.g. an inspect log with zero samples)
    imports nothing and is not an error."""
    path = Path(path)
    if fmt not in FORMATS:
        raise ValidationError([Issue("episodes", None, None, "format", f"unknown import format {fmt!r} "
                                     f"(supported: {', '.join(FORMATS)})", str(path))])
    if not path.is_file():
        raise ValidationError([Issue("episodes", None, None, "*", "no such file", str(path))])
    if run_id is not None and not run_id.strip():
        raise ValidationError([Issue("runs", None, None, "run_id", "--run-id must not be empty", str(path))])
    tok = TurnTokenizer(tokenizer) if tokenizer is not None else None
    try:
        file_hash = file_sha256(path)
        src = _opener(fmt)(path)
    except OSError as e:
        raise ValidationError([Issue("episodes", None, None, "*", f"cannot read the file: {e}", str(path))]) from e
    ctx = ImportContext(fmt=fmt, path=path, file_hash=file_hash, run_id=run_id or default_run_id(fmt, file_hash),
                        format_version=src.format_version, tokenizer=tok)
    summary = IngestSummary()
    # pass 1: parse and validate everything (against the lake too) without writing
    valid: set[str] = set()
    for batch in _batches(ctx, src, summary.rejected):
        res = _write_batch(writer, batch, path, dry_run=True)
        summary.rejected += _locate(res, batch, path)
        valid.update(res.accepted, res.duplicates)
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


__all__ = ["FORMATS", "default_run_id", "import_file"]
