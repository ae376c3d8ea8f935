"""``trajlake rollout``, ``replay``, ``quickstart`` and ``doctor``: playing policies in environments into the lake,
and what that needs on this machine.

``rollout`` builds its configuration once: the command's options merged with ``--config FILE``
(:func:`trajlake.cli.config_file.options_from`) into :class:`RolloutOptions`, then checked and turned into the
runner's :class:`~trajlake.rollout.runner.RolloutConfig` by :func:`rollout_config`. Wire the commands into the CLI
with ``register(app)`` (``trajlake/cli/__init__.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from trajlake.cli.config_file import options_from
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

if TYPE_CHECKING:
    from trajlake.lake.store import Lake
    from trajlake.rollout.runner import RolloutConfig

__all__ = ["RolloutOptions", "doctor", "quickstart", "register", "replay", "rollout", "rollout_config"]


@dataclass(frozen=True, kw_only=True)
class RolloutOptions:
    """``trajlake rollout``'s options after merging ``--config FILE``: one field per option (the defaults are the
    options'), and the file-only ``policy_args`` table. A field's type is what the file may give too: a list
    stands for a comma-separated option, a TOML date for ``data_cutoff``."""

    env: str
    policy: str
    split: str
    seeds: str | list[int]
    workers: int
    run_id: str | None
    fault_rate: float
    fault_seed: int
    fault_kinds: str | list[str] | None
    held_out_fault_kind: str | None
    policy_version: str | None
    max_policy_lag: int | None
    engine: str
    ray_address: str | None
    commit_every: float
    max_pending_episodes: int
    price_in: float
    price_out: float
    price_tool_second: float | None
    env_arg: list[str] | None
    preflight: bool
    allow_unisolated: bool
    attempts: int
    policy_arg: list[str] | None
    base_url: str | None
    tasks: str | list[str] | None
    data_cutoff: str | None
    injection: str | None
    lake: str
    """The lake, resolved (``options.lake_path``; the file's ``lake`` comes after ``$TRAJLAKE_LAKE``)."""
    policy_args: dict[str, Any] = field(default_factory=dict)
    """The file's ``[policy_args]`` table; ``--policy-arg`` settings win key by key."""


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
    config: Annotated[Path | None, typer.Option(
        help="TOML file of rollout options: keys named as the options (run_id or run-id) in its rollout table or "
             "at its top level, and a rollout.policy_args table; options given on the command line win.")
    ] = None,
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
    from trajlake.rollout.preflight import preflight as check_env

    # The options arrive through ctx.params merged with --config FILE, not through the parameters above.
    options, explicit = options_from(ctx, RolloutOptions, config, table="rollout", ignored=("select",),
                                     appended=("env_arg", "policy_arg"),
                                     command_line_only={"allow_unisolated": "it switches off the sandbox"})
    cfg = rollout_config(options, explicit)
    if options.preflight:
        _print_checks(check_env(cfg.env, cfg.split, **cfg.env_kwargs), cfg.env)
    _play(cfg)


def rollout_config(options: RolloutOptions, explicit: frozenset[str] = frozenset()) -> RolloutConfig:
    """The runner's configuration of ``options``, every option checked (one clear error on bad input).
    ``explicit``: the options set on the command line or in the file, not left at their defaults."""
    from trajlake.policies import check_policy_spec, parse_policy_args
    from trajlake.record.episode import CostModel
    from trajlake.rollout.faults import DEFAULT_FAULT_KINDS, parse_fault_kinds
    from trajlake.rollout.runner import RolloutConfig, parse_seeds

    args = {str(k): str(v) for k, v in options.policy_args.items()}
    args.update(parse_policy_args(options.policy_arg or []))
    if options.base_url:
        args["base_url"] = options.base_url
    check_policy_spec(options.env, options.policy, args)  # fail fast on unknown env/policy names and bad settings
    if options.engine not in ("local", "ray"):
        raise TrajlakeError(f"--engine must be local or ray, not {options.engine!r}")
    if options.ray_address and options.engine != "ray":
        raise TrajlakeError("--ray-address needs --engine ray")
    if not 0.0 <= options.fault_rate <= 1.0:
        raise TrajlakeError("--fault-rate must be between 0 and 1")
    # The policy's price_in / price_out settings are the run's prices too, unless --price-in / --price-out are
    # set (even to 0): the cost model prices the reported usage.
    policy_prices = {k: v for k, v in args.items() if k not in explicit & {"price_in", "price_out"}}
    cost = CostModel.for_run(policy_prices, options.price_in, options.price_out, options.price_tool_second)
    env_kwargs = _parse_env_args(options.env_arg, options.allow_unisolated)
    if options.injection:
        if env_kwargs.get("injection") not in (None, options.injection):
            raise TrajlakeError(f"--injection {options.injection} and --env-arg injection="
                                f"{env_kwargs['injection']} differ")
        from trajlake.envs import check_injection

        check_injection(options.env, options.injection)
        env_kwargs["injection"] = options.injection
    seeds = options.seeds if isinstance(options.seeds, str) else ",".join(map(str, options.seeds))
    cfg = RolloutConfig(
        lake=options.lake, run_id=options.run_id or f"{options.policy.replace('/', '_')}-{options.split}",
        env=options.env, policy=options.policy, split=options.split,
        seeds=parse_seeds(seeds), workers=options.workers,
        fault_rate=options.fault_rate, fault_seed=options.fault_seed, policy_version=options.policy_version,
        fault_kinds=parse_fault_kinds(options.fault_kinds) if options.fault_kinds else DEFAULT_FAULT_KINDS,
        held_out_fault_kind=options.held_out_fault_kind, max_policy_lag=options.max_policy_lag,
        commit_every_s=options.commit_every, max_pending_episodes=options.max_pending_episodes,
        env_kwargs=env_kwargs, cost_model=cost, engine=options.engine, attempts=options.attempts, policy_args=args,
        task_ids=_comma_separated(options.tasks), data_cutoff=_iso_date(options.data_cutoff),
        ray_address=options.ray_address)
    if not options.allow_unisolated and "sandbox" not in env_kwargs:  # (after every option parsed)
        from trajlake.rollout.preflight import (
            SCRIPTED_FALLBACK_WARNING,
            is_scripted_policy,
            scripted_policies_need_fallback,
        )

        if is_scripted_policy(options.env, options.policy) and scripted_policies_need_fallback(options.env):
            typer.echo(SCRIPTED_FALLBACK_WARNING, err=True)
            env_kwargs["allow_unisolated"] = True  # recorded in the run's config with the other env args
            cfg = dataclasses.replace(cfg, env_kwargs=env_kwargs)
    return cfg


def _comma_separated(value: str | list[str] | None) -> tuple[str, ...]:
    """The items of a comma-separated option, or of the list a file gives for it (blanks dropped)."""
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value or []]
    return tuple(item.strip() for item in items if item.strip())


def _parse_env_args(values: list[str] | None, allow_unisolated: bool = False) -> dict[str, Any]:
    """``--env-arg KEY=VALUE`` (VALUE as JSON when it parses, else text), plus the unisolated opt-in (recorded
    in the run's config with the other environment settings)."""
    out: dict[str, Any] = {"allow_unisolated": True} if allow_unisolated else {}
    for item in values or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise TrajlakeError(f"--env-arg {item!r}: expected KEY=VALUE")
        if key.strip() == "allow_unisolated":  # the opt-in has one spelling, which a config file cannot give
            raise TrajlakeError(f"--env-arg {item!r}: use --allow-unisolated")
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


def _play(cfg: RolloutConfig) -> None:
    """Run the rollout with a progress bar (on a terminal), print its summary; exit 1 when an item failed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from trajlake.rollout.runner import run_rollout

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=False, disable=not sys.stderr.isatty()) as bar:
        job = bar.add_task(f"rollout {cfg.run_id}", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(job, completed=done, total=total)

        s = run_rollout(cfg, progress=progress)
    typer.echo(f"run {cfg.run_id}: {s.written} episode(s) written ({s.successes} successful), "
               f"{s.skipped_existing} already in the lake, {len(s.failed_items)} failed, of {s.planned} planned")
    if cfg.engine == "ray":
        typer.echo(f"ray cluster {s.ray_cluster or '?'}: {len(s.worker_stats)} worker(s) finished on node(s) "
                   f"{', '.join(s.ray_nodes) or '-'}")
    for f in s.failed_items[:10]:
        typer.echo(f"  failed: {f}", err=True)
    if s.failed_items:
        raise typer.Exit(1)


DRIFT_EXIT = 2
"""``trajlake replay``'s exit status when an episode drifted (1 is bad input: one line naming what is wrong)."""


def replay(ctx: typer.Context,
           episode: Annotated[str | None, typer.Option("--episode", help="Episode id.")] = None,
           run: Annotated[str | None, typer.Option("--run", help="Replay every episode of this run.")] = None,
           from_dir: Annotated[Path | None, typer.Option(
               "--from", help="Replay every episode of an exported bundle (`trajlake export hf`, trajectories "
                              "layout, with the episodes and turns tables).")] = None,
           suite: Annotated[str | None, typer.Option(
               "--suite", help="Replay the pinned replay suite NAME (stored in the lake) against the current "
                               "environment code, comparing every recorded answer turn by turn.")] = None,
           pin_suite: Annotated[str | None, typer.Option(
               "--pin-suite", help="With --run: replay the run's episodes as a suite would and, when every one "
                                   "matched, pin them as the replay suite NAME (ids, lake versions, env versions "
                                   "and content hashes, stored in the lake).")] = None,
           episodes: Annotated[str | None, typer.Option(
               "--episodes", help="With --pin-suite: pin only these episodes of the run (comma-separated ids).")
                               ] = None,
           fmt: Annotated[Format | None, typer.Option(
               "--format", "-f", help="With --run/--from/--suite: table (default), json or csv, one row per "
                                        "episode.")] = None,
           as_of: AsOfOpt = None, allow_unisolated: AllowUnisolatedOpt = False, lake: LakeOpt = None) -> None:
    """Re-run stored episodes and compare; exit 0 only if every episode matched, 2 when one drifted, 1 on bad
    input. One of --episode, --run, --from, --suite. --run/--from/--episode insist on the recorded environment
    version and compare state hashes; --suite (and --pin-suite) replay on the current environment code and
    compare status, observation, rewards, state hash and ending turn by turn."""
    from trajlake.query import connect
    from trajlake.rollout.replay import (
        bundle_env_kwargs,
        bundle_episodes,
        replay_episode,
        replay_rows,
        run_env_kwargs,
        run_episodes,
    )

    if sum(x is not None for x in (episode, run, from_dir, suite)) != 1:
        raise TrajlakeError("replay: give exactly one of --episode ID, --run ID, --from DIR, --suite NAME")
    if pin_suite is not None and run is None:
        raise TrajlakeError("replay: --pin-suite pins the episodes of --run ID")
    if episodes is not None and pin_suite is None:
        raise TrajlakeError("replay: --episodes chooses the episodes --pin-suite pins")
    if allow_unisolated:
        os.environ["TRAJLAKE_ALLOW_UNISOLATED"] = "1"
    if episode is not None:
        if fmt is not None:
            raise TrajlakeError("replay: --format applies to --run, --from and --suite")
        outcome = replay_episode(open_lake_of(ctx, lake), episode, as_of)
        if not outcome.digest_matches:
            typer.echo(f"note: environment digest differs from the recorded one ({outcome.recorded_digest})",
                       err=True)
        typer.echo(outcome.message(), err=not outcome.ok)
        if not outcome.ok:
            raise typer.Exit(DRIFT_EXIT)
        return
    if from_dir is not None and as_of is not None:
        raise TrajlakeError("replay: --as-of applies to the lake; an exported bundle is pinned by its card")
    if suite is not None or pin_suite is not None:
        _replay_suite(open_lake_of(ctx, lake), suite, run, pin_suite, episodes, as_of, fmt)
        return
    kwargs: dict[str, dict[str, Any]] = {}
    if from_dir is not None:
        pairs = bundle_episodes(from_dir)
        kwargs = bundle_env_kwargs(from_dir)  # the runs' environment arguments, where the bundle has its runs
    else:
        the_lake = open_lake_of(ctx, lake)
        pairs = run_episodes(the_lake, str(run), as_of)
        kwargs = run_env_kwargs(connect(the_lake, as_of), [str(run)])
    rows: list[list[Any]] = []
    for o in replay_rows(pairs, kwargs):
        rows.append([o.episode_id, "matched" if o.ok else "drifted", o.report.steps_replayed, o.where or None,
                     o.digest_matches, None if o.ok else o.report.message, o.recorded_env_version,
                     o.env_version_now])
        if fmt is None or fmt == Format.table:
            typer.echo(o.message(), err=not o.ok)  # progress, episode by episode
    drifted = sum(1 for r in rows if r[1] == "drifted")
    if fmt is not None and fmt != Format.table:
        emit(["episode_id", "result", "steps", "where", "digest_matches", "message", "env_version",
              "env_version_now"], rows, fmt)
    differing = sum(1 for r in rows if not r[4])
    note = f"; the environment digest differs from the recorded one for {differing}" if differing else ""
    typer.echo(f"replayed {len(rows)} episode(s): {len(rows) - drifted} matched, {drifted} drifted{note}",
               err=True)
    if drifted:
        raise typer.Exit(DRIFT_EXIT)


def _replay_suite(lk: Lake, suite: str | None, run: str | None, pin: str | None, episodes: str | None,
                  as_of: str | None, fmt: Format | None) -> None:
    """``replay --suite NAME`` (replay a pinned suite) or ``replay --run ID --pin-suite NAME`` (replay the run as
    a suite would and pin it when nothing drifted)."""
    from trajlake.rollout.suites import (
        ROW_COLUMNS,
        check_suite_name,
        compare_rows,
        episodes_env_kwargs,
        load_suite,
        pin_suite,
        read_suite,
        run_for_pinning,
        suite_exists,
    )

    if suite is not None:
        if as_of is not None:
            raise TrajlakeError("replay: a replay suite is read at the lake versions it pinned; drop --as-of")
        read = read_suite(lk, load_suite(lk, suite))
        s = read.suite
        typer.echo(f"replay suite {s.name}: {len(s.episodes)} episode(s) of {s.source}, pinned {s.created_at} at "
                   f"{s.as_of}, read at the {read.read_at}", err=True)
        triples = read.episodes
    else:
        if as_of is not None:
            raise TrajlakeError("replay: --pin-suite pins the lake's current versions; drop --as-of")
        check_suite_name(str(pin))
        if suite_exists(lk, str(pin)):  # before replaying anything
            raise TrajlakeError(f"replay suite {pin!r} exists already; pin the new set under another name")
        ids = [i.strip() for i in episodes.split(",") if i.strip()] if episodes is not None else None
        if ids is not None and not ids:
            raise TrajlakeError("replay: --episodes is empty")
        versions, triples = run_for_pinning(lk, str(run), ids)
    outcomes = []
    for o in compare_rows(triples, episodes_env_kwargs(lk, triples)):
        outcomes.append(o)
        if fmt is None or fmt == Format.table:
            typer.echo(o.message(), err=not o.ok)  # progress, episode by episode
    if fmt is not None and fmt != Format.table:
        emit(ROW_COLUMNS, [[o.row()[c] for c in ROW_COLUMNS] for o in outcomes], fmt)
    drifted = sum(1 for o in outcomes if not o.ok)
    changed = sorted({f"{o.episode.env_id} {o.episode.env_version} -> {o.env_version_now}" for o in outcomes
                      if o.episode.env_version != o.env_version_now})
    note = f"; environment versions since: {', '.join(changed)}" if changed else ""
    typer.echo(f"replayed {len(outcomes)} episode(s): {len(outcomes) - drifted} matched, {drifted} drifted{note}",
               err=True)
    if drifted:
        if pin is not None:
            typer.echo(f"replay suite {pin} not pinned: pin episodes that replay on the current code (--episodes)",
                       err=True)
        raise typer.Exit(DRIFT_EXIT)
    if pin is not None:
        pinned = pin_suite(lk, pin, versions, outcomes, f"run {run}")
        typer.echo(f"pinned replay suite {pinned.name}: {len(pinned.episodes)} episode(s) at {pinned.as_of}",
                   err=True)


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
    from trajlake.rollout.preflight import SCRIPTED_FALLBACK_WARNING, scripted_policies_need_fallback
    from trajlake.rollout.preflight import preflight as check_env
    from trajlake.rollout.quickstart import run_quickstart
    from trajlake.rollout.runner import parse_seeds

    seed_list = parse_seeds(seeds)
    if not allow_unisolated and scripted_policies_need_fallback(env):
        # the quickstart plays only the environment's scripted policies: trusted code, so a first run on a
        # machine without bubblewrap works, saying once what the fallback does not promise
        typer.echo(SCRIPTED_FALLBACK_WARNING, err=True)
        allow_unisolated = True
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
