"""``trajlake ingest``: one entry point for every input format (the interchange JSONL and the importers)."""

from __future__ import annotations

from pathlib import Path

from trajlake.errors import TrajlakeError
from trajlake.io.importers import FORMATS, check_input_file, import_file
from trajlake.io.jsonl import IngestSummary, ingest_jsonl
from trajlake.record.writer import LakeWriter

INTERCHANGE = "trajlake-jsonl"
INPUT_FORMATS: tuple[str, ...] = (INTERCHANGE, *FORMATS)
"""Every ``--format`` of ``trajlake ingest``."""


def check_options(fmt: str, *, run_id: str | None = None, tokenizer: Path | None = None) -> None:
    """Refuse a format or option combination before anything is read."""
    if fmt not in INPUT_FORMATS:
        raise TrajlakeError(f"--format {fmt!r} is not supported; supported: {', '.join(INPUT_FORMATS)}")
    if fmt == INTERCHANGE and (run_id or tokenizer):
        raise TrajlakeError("--run-id and --tokenizer apply to the importers, not to trajlake-jsonl (which "
                            "carries its own run ids and token ids)")


def ingest_file(writer: LakeWriter, path: Path, fmt: str, *, run_id: str | None = None,
                tokenizer: Path | None = None, skip_invalid: bool = False) -> IngestSummary:
    """Import one file of format ``fmt``: validated whole first, all-or-nothing unless ``skip_invalid``;
    importing the same file again is a no-op."""
    check_options(fmt, run_id=run_id, tokenizer=tokenizer)
    # missing, a directory, empty, binary: one line naming the file, the same rule for every format
    check_input_file(path, fmt)
    if fmt == INTERCHANGE:
        return ingest_jsonl(writer, path, skip_invalid=skip_invalid)
    return import_file(writer, path, fmt, run_id=run_id, tokenizer=tokenizer, skip_invalid=skip_invalid)


__all__ = ["INPUT_FORMATS", "INTERCHANGE", "check_options", "ingest_file"]
