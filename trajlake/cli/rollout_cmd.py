"""``trajlake rollout``, ``replay``, ``quickstart`` and ``doctor``: playing policies in environments into the lake,
and what that needs on this machine.

Wire them into the CLI with ``register(app)`` (``trajlake/cli/__init__.py``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from trajlake.cli.options import (
    AllowUnisolatedOpt,
    AsOfOpt,
    FormatOpt,
    LakeOpt,
    add_commands,
    lake_path,
    open_lake_of,
)
from trajlake.cli.output import Format, emit
from trajlake.errors import TrajlakeError

__all__ = ["doctor", "quickstart", "register", "replay", "rollout"]


def _parse_env_args(values: list[str] | None, allow_unisolated: bool = False) -> dict[str, Any]:
    """``--env-arg KEY=VALUE`` (VALUE as JSON when it parses, else text), plus the unisolated opt-in (recorded
    in the run's config with the other environment settings)."""
    out: dict[str, Any] = {"allow_unisolated": True} if allow_unisolated else {}
    for item in values or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise TrajlakeError(f"--env-arg {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out


def _iso_date(value: str | None) -> str | None:
    """An ISO-8601 date or time, as given (checked), or None."""
    if value is None:
        return None
    import datetime as dt

    try:
        dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise TrajlakeError(f"--data-cutoff {value!r} is not an ISO-8601 date or time (e.g. 2026-06-30)") from e
    return value


def _print_checks(reqs: list[Any], env: str) -> None:
    for r in reqs:
        status = "ok" if r.ok else ("MISSING" if r.required else "absent (optional)")
        typer.echo(f"check {env}: {r.name}: {status}: {r.detail}", err=True)




def rollout(
    ctx: typer.Context,
    env: Annotated[str, typer.Option(help="Environment (a registered name, e.g. mini-swe).")] = "mini-swe",
    policy: Annotated[str, typer.Option(help="Policy: a built-in one of the environment (oracle, random, "
                                             "heuristic), hf:PATH (a local model folder), openai:MODEL (with "
                                             "--base-url) or single-turn:SPEC (baseline B0); docs/policies.md."
                                        )] = "heuristic",
    split: Annotated[str, typer.Option(help="Task split: train, dev or hidden.")] = "dev",
    seeds: Annotated[str, typer.Option(help="Seeds: 0,1,2 or an inclusive range 0-4.")] = "0",
    workers: Annotated[int, typer.Option(help="Parallel workers (processes, or Ray actors).", min=1)] = 1,
    run_id: Annotated[str | None, typer.Option(help="Run id (default: <policy>-<split>).")] = None,
    fault_rate: Annotated[float, typer.Option(help="Probability of an injected transient fault per step.")] = 0.0,
    fault_seed: Annotated[int, typer.Option(help="Seed of the fault injector.")] = 0,
    fault_kinds: Annotated[str | None, typer.Option(
        help="Fault kinds to inject (comma-separated; default transient,timeout): transient, timeout, http_5xx, "
             "slow_response, truncated_result, and the environment's own (Mini Web: stale_element_ids; Mini SWE: "
             "flaky_test_run).")] = None,
    held_out_fault_kind: Annotated[str | None, typer.Option(
        help="A fault kind never injected in this run (kept for a held-out evaluation run that injects only it, "
             "with --fault-kinds K).")] = None,
    policy_version: Annotated[str | None, typer.Option(help="Pin the policy version (default: latest "
                                                             "published).")] = None,
    max_policy_lag: Annotated[int | None, typer.Option(help="Most versions a worker may lag the latest "
                                                           "published one before it moves up (between episodes).",
                                                      min=0)] = None,
    engine: Annotated[str, typer.Option(help="local (processes) or ray.")] = "local",
    ray_address: Annotated[str | None, typer.Option(
        help="--engine ray: the Ray cluster to attach to (host:port of its head, ray://host:port, or auto for the "
             "one `ray start` started on this machine; default: $RAY_ADDRESS). Without it a new local cluster with "
             "--workers CPUs is started.")] = None,
    commit_every: Annotated[float, typer.Option(help="Seconds between a worker's commits (0: after every "
                                                     "episode); a crash loses at most that much work.", min=0)] = 30.0,
    max_pending_episodes: Annotated[int, typer.Option(
        help="Most finished episodes a worker holds before handing them to its writer (a slow writer then "
             "slows the players instead of growing their memory).", min=1)] = 256,
    price_in: Annotated[float, typer.Option(help="USD per million input tokens of the policy.", min=0)] = 0.0,
    price_out: Annotated[float, typer.Option(help="USD per million output tokens of the policy.", min=0)] = 0.0,
    price_tool_second: Annotated[float | None, typer.Option(
        help="USD per second of tool time (default: one cloud vCPU-second, see docs/eval.md).", min=0)] = None,
    env_arg: Annotated[list[str] | None, typer.Option(help="Environment setting KEY=VALUE (repeatable).")] = None,
    preflight: Annotated[bool, typer.Option(help="Check the environment (sandbox, grader, one oracle "
                                                 "solution graded end to end) before playing.")] = True,
    allow_unisolated: AllowUnisolatedOpt = False,
    attempts: Annotated[int, typer.Option(help="Attempts per task and seed (attempt 0..N-1, one group_id, "
                                               "distinct sampling seeds).", min=1)] = 1,
    policy_arg: Annotated[list[str] | None, typer.Option(
        "--policy-arg", help="KEY=VALUE setting of a language-model policy (repeatable): temperature, top_p, "
        "max_new_tokens, seed, price_in, price_out, ... (docs/policies.md).")] = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible server of an openai: policy.")] = None,
    tasks: Annotated[str | None, typer.Option(help="Only these task ids of the split (comma-separated).")] = None,
    config: Annotated[Path | None, typer.Option(help="TOML file of rollout options (keys as the option names, "
                                                     "[policy_args] table); options given here win.")] = None,
    data_cutoff: Annotated[str | None, typer.Option(help="The policy's training-data cutoff (ISO-8601 date), "
                                                         "recorded for the contamination scan's time split.")] = None,
    injection: Annotated[str | None, typer.Option(
        help="Play the attacked variants of the tasks under this prompt-injection attack (Mini Web: "
             "important_instructions, tool_knowledge) instead of the benign set; the same as --env-arg "
             "injection=NAME.")] = None,
    lake: LakeOpt = None,
) -> None:
    """Play a policy on an environment's split and write the episodes, tasks and run to the lake.

    Resumable: episodes already committed for the run are skipped, never duplicated."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from trajlake.policies import check_policy_spec, parse_policy_args
    from trajlake.record.episode import CostModel
    from trajlake.rollout.faults import DEFAULT_FAULT_KINDS, parse_fault_kinds
    from trajlake.rollout.preflight import preflight as check_env
    from trajlake.rollout.runner import RolloutConfig, parse_seeds, run_rollout

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
    check_policy_spec(env, policy, args)  # fail fast on unknown env/policy names and bad settings
    if engine not in ("local", "ray"):
        raise TrajlakeError(f"--engine must be local or ray, not {engine!r}")
    if ray_address and engine != "ray":
        raise TrajlakeError("--ray-address needs --engine ray")
    if not 0.0 <= fault_rate <= 1.0:
        raise TrajlakeError("--fault-rate must be between 0 and 1")
    # --policy-arg price_in / price_out are the run's prices too (the cost model prices the reported usage).
    cost = CostModel.for_run(args, price_in, price_out, price_tool_second)
    env_kwargs = _parse_env_args(env_arg, allow_unisolated)
    injection = injection or file_cfg.get("injection")
    if injection:
        if env_kwargs.get("injection") not in (None, injection):
            raise TrajlakeError(f"--injection {injection} and --env-arg injection={env_kwargs['injection']} differ")
        from trajlake.envs import check_injection

        check_injection(env, str(injection))
        env_kwargs["injection"] = str(injection)
    cfg = RolloutConfig(lake=str(lake_path(ctx, lake)), run_id=run_id or f"{policy.replace('/', '_')}-{split}",
                        env=env,
                        policy=policy, split=split, seeds=parse_seeds(seeds), workers=workers,
                        fault_rate=fault_rate, fault_seed=fault_seed, policy_version=policy_version,
                        fault_kinds=parse_fault_kinds(fault_kinds) if fault_kinds else DEFAULT_FAULT_KINDS,
                        held_out_fault_kind=held_out_fault_kind,
                        max_policy_lag=max_policy_lag, commit_every_s=commit_every,
                        max_pending_episodes=max_pending_episodes,
                        env_kwargs=env_kwargs, cost_model=cost, engine=engine,
                        attempts=attempts, policy_args=args,
                        task_ids=tuple(t.strip() for t in tasks.split(",") if t.strip()) if tasks else (),
                        data_cutoff=_iso_date(data_cutoff), ray_address=ray_address)
    if preflight:
        _print_checks(check_env(env, split, **cfg.env_kwargs), env)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=False, disable=not sys.stderr.isatty()) as bar:
        job = bar.add_task(f"rollout {cfg.run_id}", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(job, completed=done, total=total)

        s = run_rollout(cfg, progress=progress)
    typer.echo(f"run {cfg.run_id}: {s.written} episode(s) written ({s.successes} successful), "
               f"{s.skipped_existing} already in the lake, {len(s.failed_items)} failed, of {s.planned} planned")
    if engine == "ray":
        typer.echo(f"ray cluster {s.ray_cluster or '?'}: {len(s.worker_stats)} worker(s) finished on node(s) "
                   f"{', '.join(s.ray_nodes) or '-'}")
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
    known = {"policy", "split", "seeds", "attempts", "workers", "run_id", "tasks", "policy_args", "injection"}
    unknown = set(data) - known - {"select"}
    if unknown:
        raise TrajlakeError(f"--config {path}: unknown key(s) {', '.join(sorted(unknown))}; keys: "
                            f"{', '.join(sorted(known))}")
    return dict(data)


def replay(ctx: typer.Context, episode: Annotated[str, typer.Option("--episode", help="Episode id.")],
           as_of: AsOfOpt = None, allow_unisolated: AllowUnisolatedOpt = False, lake: LakeOpt = None) -> None:
    """Re-run a stored episode under its pinned versions; exit 0 only if every state hash matches."""
    from trajlake.rollout.replay import replay_episode

    if allow_unisolated:
        os.environ["TRAJLAKE_ALLOW_UNISOLATED"] = "1"

    outcome = replay_episode(open_lake_of(ctx, lake), episode, as_of)
    if not outcome.digest_matches:
        typer.echo(f"note: environment digest differs from the recorded one ({outcome.recorded_digest})", err=True)
    typer.echo(outcome.message(), err=not outcome.ok)
    if not outcome.ok:
        raise typer.Exit(1)


def quickstart(
    ctx: typer.Context,
    seeds: Annotated[str, typer.Option(help="Seeds per task: 0,1 or an inclusive range 0-1.")] = "0-1",
    workers: Annotated[int, typer.Option(help="Parallel rollout workers.", min=1)] = 2,
    out: Annotated[Path, typer.Option(help="Where to write the HTML report.")] = Path("trajlake-report.html"),
    resamples: Annotated[int, typer.Option(help="Bootstrap resamples of the report.", min=1)] = 2000,
    env: Annotated[str, typer.Option(help="Environment (a registered name).")] = "mini-swe",
    split: Annotated[str, typer.Option(help="Task split to play.")] = "dev",
    preflight: Annotated[bool, typer.Option(help="Check the environment before playing.")] = True,
    allow_unisolated: AllowUnisolatedOpt = False,
    lake: LakeOpt = None,
) -> None:
    """The main job on the embedded default: roll out the oracle, heuristic and random policies on Mini SWE's
    dev split into the lake, print the paired report of heuristic vs random, and write the HTML report.
    Exits 1 when the oracle fails any task it played (the environment is broken on this machine)."""
    from trajlake.evaluators import render
    from trajlake.rollout.preflight import preflight as check_env
    from trajlake.rollout.quickstart import run_quickstart
    from trajlake.rollout.runner import parse_seeds

    seed_list = parse_seeds(seeds)
    if allow_unisolated:  # the quickstart's workers inherit the opt-in
        os.environ["TRAJLAKE_ALLOW_UNISOLATED"] = "1"
    if preflight:
        _print_checks(check_env(env, split), env)
    res = run_quickstart(lake_path(ctx, lake), env=env, split=split, seeds=seed_list, workers=workers,
                         resamples=resamples, echo=typer.echo)
    typer.echo(f"oracle: solved {res.oracle_solved} of {res.oracle_played} task episode(s)")
    render.print_report(res.report)
    try:
        out.write_text(render.render_html(res.report), encoding="utf-8")
    except OSError as e:
        raise TrajlakeError(f"cannot write {out}: {e.strerror or e}") from e
    typer.echo(f"wrote the HTML report to {out}")


def doctor(
    fmt: FormatOpt = Format.table,
    oracle: Annotated[bool, typer.Option(help="Also grade one oracle solution per environment end to end.")
                      ] = True,
) -> None:
    """What the lake and the environments need (sandbox, pytest, DuckDB's delta extension, chromium,
    torch/CUDA, versions) and whether each is there. Exits 1 when something required is broken."""
    from trajlake.rollout.preflight import doctor_checks

    checks = doctor_checks(oracle=oracle)
    rows = [[c.component, c.requirement.name, "ok" if c.requirement.ok else
             ("MISSING" if c.requirement.required else "absent (optional)"), c.requirement.detail,
             "" if c.requirement.ok else c.requirement.fix] for c in checks]
    emit(["component", "check", "status", "detail", "fix"], rows, fmt)
    broken = [c for c in checks if c.requirement.required and not c.requirement.ok]
    if broken:
        if fmt == Format.table:
            typer.echo(f"{len(broken)} required check(s) failed", err=True)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``rollout``, ``replay``, ``quickstart`` and ``doctor`` to ``app`` (idempotent)."""
    add_commands(app, rollout, replay, quickstart, doctor)
