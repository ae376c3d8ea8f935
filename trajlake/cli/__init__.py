"""The ``trajlake`` command line (Typer). Every error prints one clear line and exits non-zero."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from trajlake.cli.output import Format, emit
from trajlake.errors import TrajlakeError, ValidationError

app = typer.Typer(
    name="trajlake",
    help="trajlake: a trajectory data lake and evaluation toolkit for agentic, multi-turn RL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="Output format: table, json or csv.")]
AsOfOpt = Annotated[str | None, typer.Option(
    "--as-of", help="Pin table versions: 'episodes=3,turns=5,...' (as printed by `trajlake info`) or an "
    "ISO-8601 timestamp.")]


class _State:
    lake_path: Path = Path("lake")


state = _State()


@app.callback()
def _main(lake: Annotated[Path | None, typer.Option(
        "--lake", help="Lake directory (default: $TRAJLAKE_LAKE or ./lake).", show_default=False)] = None) -> None:
    state.lake_path = lake or Path(os.environ.get("TRAJLAKE_LAKE") or "lake")


def _lake() -> Any:
    from trajlake.lake.store import Lake

    return Lake.open(state.lake_path)


@app.command()
def init() -> None:
    """Create an empty lake (idempotent)."""
    from trajlake.lake.store import Lake

    lk = Lake.init(state.lake_path)
    typer.echo(f"initialised lake at {lk.root}")


def _info_rows(lk: Any) -> tuple[list[str], list[list[Any]]]:
    from trajlake.query import connect
    from trajlake.schema import SCHEMA_VERSION, TABLES

    versions = lk.versions()
    con = connect(lk, versions)
    rows = []
    for name in TABLES:
        files = lk.files(name, versions[name])
        (count,) = con.execute(f"SELECT count(*) FROM {name}").fetchone()  # type: ignore[misc]
        rows.append([name, count, versions[name], len(files), sum(f.size for f in files), SCHEMA_VERSION])
    return ["table", "rows", "version", "files", "bytes", "schema_version"], rows


@app.command()
def info(fmt: FormatOpt = Format.table) -> None:
    """Tables with committed row counts, Delta versions, files, size and schema version."""
    lk = _lake()
    cols, rows = _info_rows(lk)
    emit(cols, rows, fmt, title=f"lake {lk.root}")
    if fmt == Format.table:
        pins = ",".join(f"{r[0]}={r[2]}" for r in rows)
        typer.echo(f"pin these versions with: --as-of {pins}")


@app.command()
def sql(query: Annotated[str, typer.Argument(help="SQL over the views episodes, turns, tasks, runs, "
                                               "gateway_events (DuckDB dialect).")],
        as_of: AsOfOpt = None, fmt: FormatOpt = Format.table,
        memory_limit: Annotated[str | None, typer.Option(help="DuckDB memory limit, e.g. 4GB.")] = None) -> None:
    """Run a SQL query against the lake."""
    import duckdb

    from trajlake.errors import QueryError
    from trajlake.query import connect

    con = connect(_lake(), as_of, memory_limit=memory_limit)
    try:
        rel = con.execute(query)
        cols = [d[0] for d in rel.description] if rel.description else []
        rows = rel.fetchall() if cols else []
    except duckdb.Error as e:
        raise QueryError(str(e).splitlines()[0]) from e
    emit(cols, rows, fmt)


@app.command()
def verify(as_of: AsOfOpt = None,
           strict: Annotated[bool, typer.Option(help="Treat uncommitted (orphan) turns as a failure.")] = False,
           fmt: FormatOpt = Format.table) -> None:
    """Recompute every hash and check schema versions, keys, episode completeness and orphans.

    Exits 1 and names the file or episode on any problem."""
    from trajlake.lake.maintenance import verify as run_verify

    rep = run_verify(_lake(), as_of, strict=strict)
    rows = [["problem", p] for p in rep.problems] + [["note", n] for n in rep.notes]
    if fmt == Format.table:
        for kind, msg in rows:
            typer.echo(f"{kind}: {msg}", err=kind == "problem")
        counts = ", ".join(f"{k}={v}" for k, v in sorted(rep.counts.items()))
        typer.echo(("OK" if rep.ok else f"FAILED ({len(rep.problems)} problem(s))") + f": checked {counts}")
    else:
        emit(["kind", "message"], rows, fmt)
    if not rep.ok:
        raise typer.Exit(1)


@app.command()
def compact(
    retention_hours: Annotated[float, typer.Option(help="Vacuum keeps removed files this long, so pinned "
                                                       "versions stay readable.")] = 168.0,
    orphan_grace_hours: Annotated[float, typer.Option(help="Uncommitted turns younger than this are left alone "
                                                          "(their writer may still be committing).")] = 1.0,
    vacuum: Annotated[bool, typer.Option(help="Delete files removed longer ago than the retention.")] = True,
    fmt: FormatOpt = Format.table,
) -> None:
    """Merge small files, drop old orphans and identical duplicates, checkpoint, vacuum. Safe with writers."""
    from trajlake.lake.maintenance import compact as run_compact

    rep = run_compact(_lake(), retention_hours=retention_hours, orphan_grace_hours=orphan_grace_hours,
                      vacuum=vacuum)
    rows = [[t, rep.files_before.get(t, 0), rep.files_after.get(t, 0), rep.versions.get(t)]
            for t in rep.files_after]
    emit(["table", "files_before", "files_after", "version"], rows, fmt)
    if fmt == Format.table:
        typer.echo(f"orphan rows removed: {rep.orphan_rows_removed}; duplicate rows removed: "
                   f"{rep.duplicate_rows_removed}; files vacuumed: {rep.vacuumed_files}")


@app.command()
def ingest(
    files: Annotated[list[Path], typer.Argument(help="Input files.", exists=False)],
    input_format: Annotated[str, typer.Option("--format", help="Input format: trajlake-jsonl, openai-chat, "
                                                              "swe-agent, inspect or openhands.")] = "trajlake-jsonl",
    run_id: Annotated[str | None, typer.Option(help="Run id of imported episodes (default: derived from the "
                                                    "file).")] = None,
    tokenizer: Annotated[Path | None, typer.Option(help="A local tokenizer.json: fill token ids and loss masks "
                                                        "of imported text.")] = None,
    skip_invalid: Annotated[bool, typer.Option(help="Write the valid episodes of a file that has invalid "
                                                    "ones (still exits 1).")] = False,
) -> None:
    """Import episodes. The whole file is validated first; by default any invalid episode means nothing of
    that file is written. Re-importing the same file is a no-op."""
    from trajlake.io.importers import FORMATS, import_file
    from trajlake.io.jsonl import ingest_jsonl
    from trajlake.record.writer import LakeWriter

    if input_format != "trajlake-jsonl" and input_format not in FORMATS:
        raise TrajlakeError(f"--format {input_format!r} is not supported; supported: trajlake-jsonl, "
                            f"{', '.join(FORMATS)}")
    if input_format == "trajlake-jsonl" and (run_id or tokenizer):
        raise TrajlakeError("--run-id and --tokenizer apply to the importers, not to trajlake-jsonl (which "
                            "carries its own run ids and token ids)")
    lk = _lake()
    failed = False
    with LakeWriter(lk) as w:
        for f in files:
            if not f.is_file():
                raise TrajlakeError(f"{f}: no such file")
            if input_format == "trajlake-jsonl":
                s = ingest_jsonl(w, f, skip_invalid=skip_invalid)
            else:
                s = import_file(w, f, input_format, run_id=run_id, tokenizer=tokenizer, skip_invalid=skip_invalid)
            typer.echo(f"{f}: {s.episodes_written} episode(s) written, {s.duplicates} already present, "
                       f"{len({i.episode_id for i in s.rejected})} rejected; {s.tasks_written} task(s), {s.runs_written} run(s)")
            for issue in s.rejected[:20]:
                typer.echo(f"  rejected: {issue}", err=True)
            failed = failed or bool(s.rejected)
    if failed:
        raise typer.Exit(1)


@app.command()
def schema(
    table: Annotated[str | None, typer.Option(help="Only this table.")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, json, csv or markdown.")] = "table",
) -> None:
    """Print the tables and columns of schema v1 (from schemas/*.json)."""
    from trajlake.schema import TABLES, schema_markdown, table_def

    if fmt == "markdown":
        typer.echo(schema_markdown(), nl=False)
        return
    try:
        f = Format(fmt)
    except ValueError as e:
        raise TrajlakeError(f"--format must be table, json, csv or markdown, not {fmt!r}") from e
    names = [table] if table else list(TABLES)
    rows = []
    for n in names:
        td = table_def(n)
        for c in td.columns:
            rows.append([n, c.name, c.type_str(), c.nullable, list(c.enum) if c.enum else None, c.description])
    emit(["table", "column", "type", "nullable", "enum", "description"], rows, f)


@app.command()
def demo(
    seeds: Annotated[int, typer.Option(help="Seeds per task.")] = 3,
    tasks: Annotated[int, typer.Option(help="Number of synthetic tasks.")] = 40,
    fmt: FormatOpt = Format.table,
) -> None:
    """Write realistic synthetic episodes (3 runs x tasks x seeds) into the lake and print `trajlake info`."""
    from trajlake.demo import write_demo
    from trajlake.lake.store import Lake
    from trajlake.record.writer import LakeWriter

    lk = Lake.init(state.lake_path)
    with LakeWriter(lk) as w:
        n = write_demo(w, seeds=seeds, n_tasks=tasks)
    if fmt == Format.table:
        typer.echo(f"demo: {n} new episode(s) written to {lk.root}")
    cols, rows = _info_rows(lk)
    emit(cols, rows, fmt, title=f"lake {lk.root}")


def _parse_seeds(text: str) -> tuple[int, ...]:
    """'0,1,2' or '0-4' (inclusive) or a mix: '0-2,7'."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                lo, hi = part.split("-", 1) if not part.startswith("-") else ("-" + part[1:].split("-", 1)[0],
                                                                              part[1:].split("-", 1)[1])
                a, b = int(lo), int(hi)
                if b < a:
                    raise ValueError
                out += range(a, b + 1)
            else:
                out.append(int(part))
        except ValueError as e:
            raise TrajlakeError(f"--seeds: {part!r} is not a seed or an inclusive range like 0-4") from e
    return tuple(dict.fromkeys(out))


@app.command()
def rollout(
    env: Annotated[str, typer.Option(help="Environment: mini-swe.")] = "mini-swe",
    policy: Annotated[str, typer.Option(help="Policy: oracle, random, heuristic, hf:PATH (local model folder), "
                                             "openai:MODEL (with --base-url) or single-turn:SPEC (baseline B0).")
                      ] = "heuristic",
    split: Annotated[str, typer.Option(help="Task split: train, dev or hidden.")] = "dev",
    seeds: Annotated[str, typer.Option(help="Seeds: 0,1,2 or an inclusive range 0-4.")] = "0",
    workers: Annotated[int, typer.Option(help="Parallel workers (processes, or Ray actors).")] = 1,
    run_id: Annotated[str | None, typer.Option(help="Run id (default: <policy>-<split>).")] = None,
    fault_rate: Annotated[float, typer.Option(help="Probability of an injected transient fault per step.")] = 0.0,
    fault_seed: Annotated[int, typer.Option(help="Seed of the fault injector.")] = 0,
    policy_version: Annotated[str | None, typer.Option(help="Pin the policy version (default: latest "
                                                             "published).")] = None,
    max_policy_lag: Annotated[int | None, typer.Option(help="Most versions a worker may lag the latest "
                                                           "published one before it moves up (between episodes).")] = None,
    engine: Annotated[str, typer.Option(help="local (processes) or ray.")] = "local",
    commit_every: Annotated[float, typer.Option(help="Seconds between a worker's commits (0: after every "
                                                     "episode); a crash loses at most that much work.")] = 30.0,
    attempts: Annotated[int, typer.Option(help="Attempts per task and seed (attempt 0..N-1, one group_id, "
                                               "distinct sampling seeds).")] = 1,
    policy_arg: Annotated[list[str] | None, typer.Option(
        "--policy-arg", help="KEY=VALUE setting of a language-model policy (repeatable): temperature, top_p, "
        "max_new_tokens, seed, price_in, price_out, ... (docs/policies.md).")] = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible server of an openai: policy.")] = None,
    tasks: Annotated[str | None, typer.Option(help="Only these task ids of the split (comma-separated).")] = None,
    config: Annotated[Path | None, typer.Option(help="TOML file of rollout options (keys as the option names, "
                                                     "[policy_args] table); options given here win.")] = None,
) -> None:
    """Play a policy on an environment's split and write the episodes, tasks and run to the lake.

    Resumable: episodes already committed for the run are skipped, never duplicated."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from trajlake.policies import check_policy_spec, parse_policy_args
    from trajlake.rollout.runner import RolloutConfig, run_rollout

    file_cfg = _rollout_config_file(config) if config else {}
    policy = policy if policy != "heuristic" else str(file_cfg.get("policy", policy))
    split = split if split != "dev" else str(file_cfg.get("split", split))
    seeds = seeds if seeds != "0" else str(file_cfg.get("seeds", seeds))
    attempts = attempts if attempts != 1 else int(file_cfg.get("attempts", attempts))
    workers = workers if workers != 1 else int(file_cfg.get("workers", workers))
    run_id = run_id or file_cfg.get("run_id")
    file_tasks = file_cfg.get("tasks")
    tasks = tasks or (",".join(map(str, file_tasks)) if isinstance(file_tasks, list) else file_tasks)
    args = {str(k): str(v) for k, v in (file_cfg.get("policy_args") or {}).items()}
    args.update(parse_policy_args(policy_arg or []))
    if base_url:
        args["base_url"] = base_url
    if attempts < 1:
        raise TrajlakeError("--attempts must be at least 1")
    if engine not in ("local", "ray"):
        raise TrajlakeError(f"--engine must be local or ray, not {engine!r}")
    if not 0.0 <= fault_rate <= 1.0:
        raise TrajlakeError("--fault-rate must be between 0 and 1")
    cfg = RolloutConfig(lake=str(state.lake_path), run_id=run_id or f"{policy.replace('/', '_')}-{split}", env=env,
                        policy=policy,
                        split=split, seeds=_parse_seeds(seeds), workers=max(1, workers), fault_rate=fault_rate,
                        fault_seed=fault_seed, policy_version=policy_version, max_policy_lag=max_policy_lag,
                        commit_every_s=commit_every, attempts=attempts, policy_args=args,
                        task_ids=tuple(t.strip() for t in tasks.split(",") if t.strip()) if tasks else ())
    check_policy_spec(env, policy, args)  # fail fast on unknown env/policy names and bad settings
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=False, disable=not sys.stderr.isatty()) as bar:
        job = bar.add_task(f"rollout {cfg.run_id}", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(job, completed=done, total=total)

        s = run_rollout(cfg, engine=engine, progress=progress)
    typer.echo(f"run {cfg.run_id}: {s.written} episode(s) written ({s.successes} successful), "
               f"{s.skipped_existing} already in the lake, {len(s.failed_items)} failed, of {s.planned} planned")
    for f in s.failed_items[:10]:
        typer.echo(f"  failed: {f}", err=True)
    if s.failed_items:
        raise typer.Exit(1)


def _rollout_config_file(path: Path) -> dict[str, Any]:
    import tomllib

    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise TrajlakeError(f"--config {path}: {e}") from e
    data = data.get("rollout", data)
    known = {"policy", "split", "seeds", "attempts", "workers", "run_id", "tasks", "policy_args"}
    unknown = set(data) - known - {"select"}
    if unknown:
        raise TrajlakeError(f"--config {path}: unknown key(s) {', '.join(sorted(unknown))}; keys: "
                            f"{', '.join(sorted(known))}")
    return dict(data)


@app.command()
def replay(episode: Annotated[str, typer.Option("--episode", help="Episode id.")], as_of: AsOfOpt = None) -> None:
    """Re-run a stored episode under its pinned versions; exit 0 only if every state hash matches."""
    from trajlake.envs import make_env
    from trajlake.query import connect
    from trajlake.rollout.runner import replay_log_from_rows

    con = connect(_lake(), as_of)
    rel = con.execute("select * from episodes where episode_id = ?", [episode])
    cols = [d[0] for d in rel.description]
    rows = rel.fetchall()
    if not rows:
        raise TrajlakeError(f"episode {episode!r} is not in the lake")
    ep = dict(zip(cols, rows[0], strict=True))
    rel = con.execute("select * from turns where episode_id = ? order by turn_idx", [episode])
    tcols = [d[0] for d in rel.description]
    turns = [dict(zip(tcols, r, strict=True)) for r in rel.fetchall()]
    log, turn_of_step = replay_log_from_rows(ep, turns)
    env = make_env(ep["env_id"], split=None)
    if env.image_digest != ep["env_image_digest"]:
        typer.echo(f"note: environment digest differs from the recorded one ({ep['env_image_digest']})", err=True)
    try:
        report = env.replay(log)
    finally:
        env.close()
    if report.ok:
        typer.echo(f"episode {episode}: replayed {report.steps_replayed} step(s); every state hash matches")
        return
    where = "the state after reset" if report.first_divergence in (None, -1) else \
        f"turn {turn_of_step[report.first_divergence]} (step {report.first_divergence})" \
        if report.first_divergence < len(turn_of_step) else f"step {report.first_divergence}"
    typer.echo(f"episode {episode}: diverges at {where}: {report.message} "
               f"(expected {str(report.expected_hash)[:12]}, got {str(report.actual_hash)[:12]})", err=True)
    raise typer.Exit(1)


@app.command()
def quickstart(
    seeds: Annotated[str, typer.Option(help="Seeds per task: 0,1 or an inclusive range 0-1.")] = "0-1",
    workers: Annotated[int, typer.Option(help="Parallel rollout workers.")] = 2,
    out: Annotated[Path, typer.Option(help="Where to write the HTML report.")] = Path("trajlake-report.html"),
    resamples: Annotated[int, typer.Option(help="Bootstrap resamples of the report.")] = 2000,
) -> None:
    """The main job on the embedded default: roll out the oracle, heuristic and random policies on Mini SWE's
    dev split into the lake, print the paired report of heuristic vs random, and write the HTML report."""
    from trajlake.evaluators import render
    from trajlake.evaluators.metrics import Settings
    from trajlake.evaluators.report import build_report
    from trajlake.rollout.runner import RolloutConfig, run_rollout

    seed_list = _parse_seeds(seeds)
    runs = {}
    for policy in ("oracle", "heuristic", "random"):
        run_id = f"quickstart-{policy}"
        cfg = RolloutConfig(lake=str(state.lake_path), run_id=run_id, env="mini-swe", policy=policy, split="dev",
                            seeds=seed_list, workers=max(1, workers))
        s = run_rollout(cfg)
        typer.echo(f"{run_id}: {s.written} new episode(s), {s.skipped_existing} already in the lake, "
                   f"{s.successes} of the new ones successful")
        if s.failed_items:
            raise TrajlakeError(f"{run_id}: {len(s.failed_items)} episode(s) failed: {s.failed_items[0]}")
        runs[policy] = run_id
    report = build_report(state.lake_path, runs=list(runs.values()), baseline=runs["random"],
                          candidate=runs["heuristic"], settings=Settings(resamples=resamples, seed=0))
    render.print_report(report)
    out.write_text(render.render_html(report), encoding="utf-8")
    typer.echo(f"wrote the HTML report to {out}")


def _register_command_groups() -> None:
    from trajlake.cli.best_of_cmd import register as register_best_of
    from trajlake.cli.browse_cmd import register as register_browse
    from trajlake.cli.eval_cmd import register as register_eval
    from trajlake.cli.export_cmd import register as register_export

    register_eval(app)
    register_export(app)
    register_browse(app)
    register_best_of(app)


_register_command_groups()


def main() -> None:
    """Console entry point: one clear error line and a non-zero exit instead of a traceback."""
    try:
        # Without standalone mode click returns typer.Exit codes instead of raising them.
        rc = app(standalone_mode=False)
        sys.exit(rc if isinstance(rc, int) else 0)
    except ValidationError as e:
        typer.echo(f"error: {e.issues[0] if e.issues else e}", err=True)
        for issue in e.issues[1:20]:
            typer.echo(f"error: {issue}", err=True)
        if len(e.issues) > 20:
            typer.echo(f"error: ... and {len(e.issues) - 20} more", err=True)
        sys.exit(1)
    except TrajlakeError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(1)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except Exception as e:  # click usage errors and anything unexpected: still one line
        import click

        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(e.exit_code)
        typer.echo(f"error: {type(e).__name__}: {e}", err=True)
        sys.exit(1)


__all__ = ["app", "main"]
