"""``trajlake contamination``: contamination and leakage scans of an evaluation split (docs/contamination.md).

Wire it into the CLI with ``register(app)`` (``trajlake/cli/__init__.py``). Reads the lake of the global
``--lake`` option; bad input raises :class:`trajlake.errors.TrajlakeError` (one line, exit 1).
"""

from __future__ import annotations

import html
import io
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from trajlake.cli.eval_cmd import ReportFormat
from trajlake.cli.options import AsOfOpt, LakeOpt, MemoryOpt, lake_path
from trajlake.cli.output import write_report
from trajlake.errors import TrajlakeError

__all__ = ["ContaminationFormat", "contamination_command", "register", "render_html", "render_markdown"]


#: Output formats of ``trajlake contamination``: the report formats of ``trajlake eval``.
ContaminationFormat = ReportFormat


def _rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for t in report["tasks"]:
        ex = t.get("exact_ngram", {})
        nd = t.get("near_duplicates", [])
        rows.append([t["task_id"], ",".join(t["flags"]) or "-", f"{ex.get('score', 0.0):.3f}",
                     str(ex.get("longest_span_words", 0)), f"{nd[0]['jaccard']:.2f} {nd[0]['source']}" if nd else "-",
                     f"{t.get('trajectory', {}).get('score', 0.0):.2f}",
                     "yes" if t.get("shared_repo_commit") else "-"])
    return rows


HEADER = ["task", "flags", "ngram score", "longest span", "near duplicate", "action overlap", "shared commit"]


def render_markdown(report: dict[str, Any]) -> str:
    from trajlake.evaluators.contamination import summary_lines

    out = [f"# Contamination scan: split {report['eval_split']}", ""]
    out += [f"- {line}" for line in summary_lines(report)]
    out += ["", "| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in _rows(report)]
    spans = [(t["task_id"], sp) for t in report["tasks"] for sp in t.get("exact_ngram", {}).get("spans", [])]
    if spans:
        out += ["", "## Matching spans", ""]
        for tid, sp in spans[:200]:
            src = ", ".join(s["source"] for s in sp["sources"])
            out.append(f"- `{tid}` {sp['document']} words {sp['start_word']}-{sp['end_word']} "
                       f"({sp['n_sources']} source(s): {src}): \"{sp['text'][:300]}\"")
    return "\n".join(out) + "\n"


def render_html(report: dict[str, Any]) -> str:
    from trajlake.evaluators.contamination import summary_lines

    e = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>trajlake contamination</title><style>"
             "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
             "padding:3px 6px;font-size:13px}tr.flag td{background:#fde8e8}code{font-size:12px}</style></head><body>",
             f"<h1>Contamination scan: split {e(str(report['eval_split']))}</h1><ul>"]
    parts += [f"<li>{e(line)}</li>" for line in summary_lines(report)]
    parts.append("</ul><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in HEADER) + "</tr>")
    for r in _rows(report):
        cls = " class='flag'" if r[1] != "-" else ""
        parts.append(f"<tr{cls}>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>")
    parts.append("</table><h2>Matching spans</h2><ul>")
    for t in report["tasks"]:
        for sp in t.get("exact_ngram", {}).get("spans", []):
            src = ", ".join(s["source"] for s in sp["sources"])
            parts.append(f"<li><code>{e(t['task_id'])}</code> {e(sp['document'])} ({sp['n_sources']} source(s): "
                         f"{e(src)}): <q>{e(sp['text'][:500])}</q></li>")
    parts.append("</ul><details><summary>JSON</summary><pre>" + e(json.dumps(report, indent=1, default=str))
                 + "</pre></details></body></html>\n")
    return "".join(parts)


def contamination_command(
    ctx: typer.Context,
    eval_split: Annotated[str, typer.Option("--eval-split", help="Split whose tasks are checked.")],
    train_runs: Annotated[list[str] | None, typer.Option(
        "--train-runs", help="Training runs (repeatable). Default: the episodes on --train-split.")] = None,
    train_split: Annotated[str | None, typer.Option(
        "--train-split", help="Training split (default: train when no --train-runs is given).")] = None,
    corpus: Annotated[list[Path] | None, typer.Option(
        "--corpus", help="Training corpus file (repeatable): JSONL with a 'text' field, Parquet with a 'text' "
        "column, or plain text (one document per line).")] = None,
    ngram: Annotated[int, typer.Option("--ngram", help="Words per n-gram of the exact scan.", min=1)] = 13,
    threshold: Annotated[float, typer.Option(help="Flag a task whose n-gram score (share of a document's n-grams "
                                                  "found in training, max over its documents) is above this.")] = 0.0,
    common_families: Annotated[int, typer.Option(help="An n-gram in the statements of this many template "
                                                      "families is boilerplate and ignored.", min=2)] = 3,
    shingle: Annotated[int, typer.Option(help="Tokens per MinHash shingle.", min=1)] = 5,
    num_perm: Annotated[int, typer.Option(help="MinHash permutations.", min=2)] = 128,
    lsh_threshold: Annotated[float, typer.Option(help="Jaccard threshold of a near duplicate.")] = 0.7,
    near_dup_roles: Annotated[str, typer.Option(help="Roles of training turns compared for near duplicates "
                                                     "(comma-separated; corpus documents always are).")
                              ] = "user,system",
    near_dup_min_tokens: Annotated[int, typer.Option(help="Texts with fewer tokens are not compared for near "
                                                          "duplicates.", min=1)] = 20,
    action_ngram: Annotated[int, typer.Option(help="Tool calls per action n-gram (trajectory leakage).", min=1)] = 3,
    action_threshold: Annotated[float, typer.Option(help="Flag a task when this share of its action n-grams "
                                                         "occurs in training.")] = 0.5,
    data_cutoff: Annotated[str | None, typer.Option(help="Policy data cutoff (ISO-8601) for every evaluated run, "
                                                         "overriding data_cutoff in the run configs.")] = None,
    eval_runs: Annotated[list[str] | None, typer.Option(
        "--eval-runs", help="Only these runs' eval-split episodes (time split, trajectory leakage).")] = None,
    flag_shared_commits: Annotated[bool, typer.Option(help="Flag (not only list) eval tasks sharing a source "
                                                           "commit with training tasks.")] = False,
    engine: Annotated[str, typer.Option(help="n-gram hashing of the exact scan: numpy (vectorised, default) or "
                                             "duckdb (list slices in SQL); same results.")] = "numpy",
    checks: Annotated[str | None, typer.Option(help="Only these checks (comma-separated): exact_ngram, "
                                                    "near_duplicate, family, time_split, repo_commit, trajectory."
                                               )] = None,
    fail_on_flags: Annotated[bool, typer.Option(help="Exit 2 when any task is flagged.")] = False,
    as_of: AsOfOpt = None,
    fmt: Annotated[ContaminationFormat, typer.Option("--format", "-f", help="table, json, markdown or html.")
                   ] = ContaminationFormat.table,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the report to this file.")] = None,
    memory_limit: MemoryOpt = None,
    threads: Annotated[int | None, typer.Option(help="DuckDB threads.", min=1)] = None,
    lake: LakeOpt = None,
) -> None:
    """Scan an evaluation split for contamination and leakage: exact n-gram overlap with training turns and
    corpus files, MinHash near duplicates, the family rule, the time split, repository-commit isolation and
    trajectory (tool-call) leakage. The JSON report lists flagged task ids under ``flagged_tasks``."""
    from trajlake.evaluators.contamination import ScanSettings, scan, summary_lines

    if not 0.0 < lsh_threshold <= 1.0:
        raise TrajlakeError(f"--lsh-threshold must be in (0, 1], not {lsh_threshold}")
    settings = ScanSettings(ngram=ngram, threshold=threshold, common_families=common_families, shingle=shingle,
                            num_perm=num_perm, lsh_threshold=lsh_threshold,
                            near_dup_roles=tuple(r.strip() for r in near_dup_roles.split(",") if r.strip()),
                            near_dup_min_tokens=near_dup_min_tokens,
                            action_ngram=action_ngram, action_threshold=action_threshold,
                            flag_shared_commits=flag_shared_commits, engine=engine)
    report = scan(lake_path(ctx, lake), eval_split=eval_split, train_runs=train_runs, train_split=train_split,
                  corpus=corpus or (), eval_runs=eval_runs, data_cutoff=data_cutoff, settings=settings,
                  as_of=as_of, memory_limit=memory_limit, threads=threads,
                  checks=[c.strip() for c in checks.split(",") if c.strip()] if checks else None)
    if fmt == ContaminationFormat.json:
        text = json.dumps(report, indent=1, default=str, sort_keys=False)
    elif fmt == ContaminationFormat.markdown:
        text = render_markdown(report)
    elif fmt == ContaminationFormat.html:
        text = render_html(report)
    else:
        from rich.console import Console
        from rich.table import Table

        buf = io.StringIO()
        console = Console(file=buf, width=200, color_system=None)
        for line in summary_lines(report):
            console.print(line)
        table = Table(*HEADER, title=f"contamination of split {report['eval_split']}")
        for r in _rows(report):
            table.add_row(*r)
        console.print(table)
        text = buf.getvalue()
    write_report(text, out, "the contamination report")
    if fail_on_flags and report["flagged_tasks"]:
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    """Add the ``contamination`` command to ``app`` (idempotent)."""
    if "contamination" not in {c.name for c in app.registered_commands}:
        app.command("contamination")(contamination_command)
