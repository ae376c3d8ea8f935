"""Build (and re-check) the Mini SWE task set: ``python -m trajlake.envs.mini_swe.build [--out PATH] [--check]``.

For every candidate ``(library, mutator, seed)`` the library is copied to a temporary folder, the mutation
is applied and the library's full pytest suite is run in the sandbox. A candidate becomes a task when the
clean suite passes entirely, the mutated suite reports every test, at least one test fails
(FAIL_TO_PASS) and at least one still passes (PASS_TO_PASS), and three runs of the mutated suite give
identical outcomes. Seeds are tried in order and at most ``--per-family`` distinct mutations are kept per
template family ``(library, mutator)``.

Families are assigned to splits by a salted hash of the family name (so a family never crosses splits,
and adding families never moves existing ones). ``--check`` rebuilds the stored tasks (all, or a
``--sample``) and exits non-zero naming every task whose fresh build differs.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajlake.envs import taskset

from trajlake.errors import BuildError

from .grading import PASSING, TASKS_PATH, load_tasks
from .library import Library, find_test_functions, function_key, list_libraries, load_library
from .mutate import MUTATORS, Mutation, mutate_library, seeded_rng
from .patching import apply_patch
from .sandbox import Limits, PytestRun, run_pytest
from .statements import describe_target, exception_hints, make_statement

__all__ = [
    "BUDGETS",
    "ENV_ID",
    "GENERATOR",
    "BuildError",
    "build_tasks",
    "check_tasks",
    "difficulty_for",
    "evaluate_candidate",
    "main",
    "split_for_family",
    "stamp_created_at",
    "task_version",
    "write_tasks",
]

ENV_ID = "mini-swe"
GENERATOR = "trajlake.envs.mini_swe.build"
FORMAT = "trajlake/mini-swe-tasks/1"
SPLIT_SALT = "trajlake/mini-swe/split/v1"
SPLIT_WEIGHTS = taskset.SPLIT_WEIGHTS
DEFAULT_SEEDS = 8
DEFAULT_PER_FAMILY = 2
DEFAULT_RUNS = 3
VISIBLE_HOLDOUT = 0.25
RUN_TIMEOUT_S = 30.0
BUILD_LIMITS = Limits(cpu_s=30, memory_bytes=2 * 1024**3, file_bytes=16 * 1024**2)
BUDGETS: dict[str, dict[str, float | int]] = {
    "easy": {"max_steps": 30, "max_tokens": 150_000, "max_cost": 1.0},
    "medium": {"max_steps": 40, "max_tokens": 200_000, "max_cost": 1.5},
    "hard": {"max_steps": 50, "max_tokens": 300_000, "max_cost": 2.0},
}


# ------------------------------------------------------------------------------------- pure helpers
def split_for_family(family: str) -> str:
    """Split of a template family: a salted sha256 bucket, weighted 60/20/20 train/dev/hidden."""
    return taskset.split_for_family(family, SPLIT_SALT, SPLIT_WEIGHTS)


def difficulty_for(n_fail_to_pass: int) -> str:
    """A bug that breaks many tests is easy to localise; one that breaks a single test is hard."""
    if n_fail_to_pass >= 4:
        return "easy"
    if n_fail_to_pass >= 2:
        return "medium"
    return "hard"


#: Keys outside the content hash: the version itself, and the generation date (the same content generated again
#: is the same task version; the date says when it first existed).
UNVERSIONED = ("task_version", "created_at")


def task_version(record: dict[str, Any]) -> str:
    """First 16 hex chars of sha256 over the canonical JSON of the record without ``task_version`` and
    ``created_at``."""
    return taskset.content_version(record, UNVERSIONED, ensure_ascii=False)


# ------------------------------------------------------------------------------------- running suites
def _run_library(library: Library, diff: str | None, timeout_s: float) -> PytestRun:
    """Run the library's full suite, optionally with a mutation diff applied, in a temp copy."""
    with tempfile.TemporaryDirectory(prefix=f"mini-swe-build-{library.name}-") as tmp:
        work = Path(tmp)
        for rel in library.files():
            target = work / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes((library.root / rel).read_bytes())
        if diff is not None:
            apply_patch(work, diff)
        return run_pytest(work, timeout_s=timeout_s, limits=BUILD_LIMITS)


def _run_problem(run: PytestRun) -> str | None:
    if run.timed_out:
        return "timed out"
    if run.collect_errors:
        return "collection error"
    if run.report_error:
        return run.report_error
    if run.exit_code not in (0, 1):
        return f"pytest exit code {run.exit_code}"
    return None


def clean_baseline(library: Library, runs: int = DEFAULT_RUNS, timeout_s: float = RUN_TIMEOUT_S) -> list[str]:
    """Node ids of the library's suite; raises BuildError unless every run passes every test."""
    seen: dict[str, str] | None = None
    for _ in range(runs):
        run = _run_library(library, None, timeout_s)
        problem = _run_problem(run)
        if problem or run.exit_code != 0:
            raise BuildError(f"clean suite of {library.name} fails: {problem or run.output_tail[-2000:]}")
        if any(o != "passed" for o in run.outcomes.values()):
            raise BuildError(f"clean suite of {library.name} has tests that do not pass")
        if seen is not None and run.outcomes != seen:
            raise BuildError(f"clean suite of {library.name} is not deterministic")
        seen = run.outcomes
    assert seen is not None
    if not seen:
        raise BuildError(f"library {library.name} has no tests")
    return sorted(seen)


# ----------------------------------------------------------------------------------------- records
def _visible_tests(library: Library, p2p: Sequence[str], all_tests: Sequence[str],
                   rng: random.Random) -> list[str]:
    """PASS_TO_PASS test functions minus a seeded holdout (a function counts only if all its ids pass)."""
    by_function: dict[str, list[str]] = {}
    for nodeid in all_tests:
        by_function.setdefault(function_key(nodeid), []).append(nodeid)
    passing = set(p2p)
    known: set[str] = set()
    for rel in library.test_files():
        known.update(find_test_functions(library.read(rel), rel))
    candidates = sorted(
        key for key, ids in by_function.items() if key in known and all(i in passing for i in ids)
    )
    holdout = set(rng.sample(candidates, int(len(candidates) * VISIBLE_HOLDOUT)))
    return sorted(i for key in candidates if key not in holdout for i in by_function[key])


def make_record(
    library: Library,
    mutation: Mutation,
    fail_to_pass: Sequence[str],
    pass_to_pass: Sequence[str],
    messages: dict[str, str],
) -> dict[str, Any]:
    """The task record of an accepted candidate (``task_version`` included)."""
    family = f"{library.name}/{mutation.mutator}"
    all_tests = sorted([*fail_to_pass, *pass_to_pass])
    raised, not_raised = exception_hints(messages.get(t, "") for t in fail_to_pass)
    target = describe_target(library.read(mutation.file), mutation.function)
    statement = make_statement(
        library=library.name,
        file=mutation.file,
        target=target,
        detail=mutation.detail,
        raised=raised,
        not_raised=not_raised,
        rng=seeded_rng(library.name, mutation.mutator, mutation.seed, "statement"),
    )
    visible = _visible_tests(
        library, pass_to_pass, all_tests, seeded_rng(library.name, mutation.mutator, mutation.seed, "visible")
    )
    difficulty = difficulty_for(len(fail_to_pass))
    record: dict[str, Any] = {
        "task_id": f"{ENV_ID}/{library.name}/{mutation.mutator}/{mutation.seed}",
        "task_version": "",
        "env_id": ENV_ID,
        "split": split_for_family(family),
        "family": family,
        "difficulty": difficulty,
        "statement": statement,
        "provenance": {
            "generator": GENERATOR,
            "source": library.name,
            "commit": library.commit(),
            "mutator": mutation.mutator,
            "seed": mutation.seed,
            "diff_hash": mutation.diff_hash,
        },
        "has_oracle": True,
        "budget": dict(BUDGETS[difficulty]),
        "library": library.name,
        "file": mutation.file,
        "function": mutation.function,
        "mutation": {"line": mutation.line, "kind": mutation.detail, "description": mutation.description},
        "mutation_diff": mutation.diff,
        "fix_diff": mutation.fix_diff,
        "FAIL_TO_PASS": sorted(fail_to_pass),
        "PASS_TO_PASS": sorted(pass_to_pass),
        "visible_tests": visible,
    }
    record["task_version"] = task_version(record)
    return record


@dataclass(frozen=True)
class Verdict:
    """Result of evaluating one candidate: a record, or the reason it was rejected."""

    record: dict[str, Any] | None
    reason: str
    diff_hash: str | None = None


def evaluate_candidate(
    library: Library,
    mutator: str,
    seed: int,
    baseline: Sequence[str],
    *,
    runs: int = DEFAULT_RUNS,
    timeout_s: float = RUN_TIMEOUT_S,
    mutation: Mutation | None = None,
) -> Verdict:
    """Mutate, run the suite ``runs`` times and turn the candidate into a task record if it qualifies."""
    mutation = mutation or mutate_library(library, mutator, seed)
    if mutation is None:
        return Verdict(None, "no valid mutation site")
    expected = set(baseline)
    first: dict[str, str] | None = None
    messages: dict[str, str] = {}
    for attempt in range(runs):
        run = _run_library(library, mutation.diff, timeout_s)
        problem = _run_problem(run)
        if problem:
            return Verdict(None, f"mutated suite: {problem}", mutation.diff_hash)
        if set(run.outcomes) != expected:
            return Verdict(None, "mutated suite does not report every test", mutation.diff_hash)
        if attempt == 0:
            first = run.outcomes
            messages = run.messages
            f2p = [t for t in baseline if first[t] not in PASSING]
            p2p = [t for t in baseline if first[t] in PASSING]
            if not f2p:
                return Verdict(None, "no FAIL_TO_PASS test (equivalent mutant)", mutation.diff_hash)
            if not p2p:
                return Verdict(None, "no PASS_TO_PASS test", mutation.diff_hash)
        elif run.outcomes != first:
            return Verdict(None, "mutated suite is flaky", mutation.diff_hash)
    return Verdict(make_record(library, mutation, f2p, p2p, messages), "ok", mutation.diff_hash)


# ------------------------------------------------------------------------------------------ building
def _log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build_tasks(
    *,
    libraries: Iterable[str] | None = None,
    mutators: Iterable[str] | None = None,
    seeds: int = DEFAULT_SEEDS,
    per_family: int = DEFAULT_PER_FAMILY,
    runs: int = DEFAULT_RUNS,
    jobs: int = 2,
    log: Callable[[str], None] = _log_to_stderr,
) -> list[dict[str, Any]]:
    """Build the task records (sorted by library, mutator, seed)."""
    libs = [load_library(name) for name in (libraries or list_libraries())]
    mutator_names = list(mutators or MUTATORS)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        baselines = dict(zip([lib.name for lib in libs],
                             pool.map(lambda lib: clean_baseline(lib, runs), libs), strict=True))

        def family(job: tuple[Library, str]) -> list[dict[str, Any]]:
            library, mutator = job
            accepted: list[dict[str, Any]] = []
            seen: set[str] = set()
            for seed in range(seeds):
                mutation = mutate_library(library, mutator, seed)
                if mutation is None:
                    break
                if mutation.diff_hash in seen:
                    continue
                seen.add(mutation.diff_hash)
                verdict = evaluate_candidate(library, mutator, seed, baselines[library.name], runs=runs,
                                             mutation=mutation)
                log(f"{library.name}/{mutator}/{seed}: {verdict.reason}")
                if verdict.record is not None:
                    accepted.append(verdict.record)
                    if len(accepted) >= per_family:
                        break
            return accepted

        jobs_list = [(lib, m) for lib in libs for m in mutator_names]
        results = list(pool.map(family, jobs_list))
    tasks = [record for group in results for record in group]
    order = {name: i for i, name in enumerate(MUTATORS)}
    tasks.sort(key=lambda t: (t["library"], order.get(t["provenance"]["mutator"], 99), t["provenance"]["seed"]))
    return tasks


def _document(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    libraries = sorted({t["library"] for t in tasks})
    return {
        "format": FORMAT,
        "env_id": ENV_ID,
        "generator": GENERATOR,
        "libraries": {name: load_library(name).commit() for name in libraries},
        "mutators": {name: spec.summary for name, spec in MUTATORS.items()},
        "count": len(tasks),
        "tasks": tasks,
    }


def utc_now_iso() -> str:
    """The generation time stamped on a new task (UTC, whole seconds)."""
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def stamp_created_at(tasks: list[dict[str, Any]], previous: Sequence[dict[str, Any]] = (),
                     now: str | None = None) -> list[dict[str, Any]]:
    """Give every task its ``created_at`` (ISO-8601 UTC generation date, provenance for time splits): a task
    whose (task_id, task_version) was already in ``previous`` keeps its date, a new one is stamped ``now``."""
    known = {(t["task_id"], t["task_version"]): t["created_at"] for t in previous if t.get("created_at")}
    stamp = now or utc_now_iso()
    for t in tasks:
        t["created_at"] = known.get((t["task_id"], t["task_version"]), t.get("created_at") or stamp)
    return tasks


def write_tasks(tasks: list[dict[str, Any]], path: str | Path = TASKS_PATH) -> Path:
    """Write the task document (pretty-printed, stable order) and return its path. Tasks without a
    ``created_at`` keep the one stored for the same version in the file being replaced, or are stamped now."""
    out = Path(path)
    previous = load_tasks(out) if out.is_file() else []
    stamp_created_at(tasks, previous)
    out.write_text(json.dumps(_document(tasks), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


def summarize(tasks: Sequence[dict[str, Any]]) -> str:
    """Counts per split, per library and per difficulty."""
    by_split = Counter(t["split"] for t in tasks)
    by_lib = Counter(t["library"] for t in tasks)
    by_diff = Counter(t["difficulty"] for t in tasks)
    families = Counter(t["split"] for t in {t["family"]: t for t in tasks}.values())
    return (
        f"{len(tasks)} tasks; splits {dict(sorted(by_split.items()))} "
        f"(families {dict(sorted(families.items()))}); libraries {dict(sorted(by_lib.items()))}; "
        f"difficulty {dict(sorted(by_diff.items()))}"
    )


# ------------------------------------------------------------------------------------------ checking
def _diff_keys(stored: dict[str, Any], fresh: dict[str, Any]) -> list[str]:
    """Keys whose values differ (the generation date is not rebuilt, so it is not compared)."""
    return sorted(k for k in set(stored) | set(fresh) if k != "created_at" and stored.get(k) != fresh.get(k))


def check_tasks(
    path: str | Path = TASKS_PATH,
    *,
    sample: int | None = None,
    runs: int = DEFAULT_RUNS,
    jobs: int = 2,
    log: Callable[[str], None] = _log_to_stderr,
) -> list[str]:
    """Re-validate stored tasks against a fresh build; return one problem line per bad task (empty: ok)."""
    tasks = load_tasks(path)
    problems: list[str] = []
    ids = Counter(t["task_id"] for t in tasks)
    problems += [f"{tid}: duplicate task_id" for tid, n in ids.items() if n > 1]
    splits: dict[str, set[str]] = {}
    for t in tasks:
        splits.setdefault(t["family"], set()).add(t["split"])
        if t.get("task_version") != task_version(t):
            problems.append(f"{t['task_id']}: stored task_version does not match its content")
    problems += [f"family {f}: spans splits {sorted(s)}" for f, s in splits.items() if len(s) > 1]
    chosen = tasks
    if sample is not None and sample < len(tasks):
        chosen = random.Random(0).sample(tasks, sample)
    libs = {name: load_library(name) for name in sorted({t["library"] for t in chosen})}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        baselines = dict(zip(libs, pool.map(lambda lib: clean_baseline(lib, runs), libs.values()), strict=True))

        def check(task: dict[str, Any]) -> str | None:
            library = libs[task["library"]]
            prov = task["provenance"]
            verdict = evaluate_candidate(library, prov["mutator"], int(prov["seed"]), baselines[library.name],
                                         runs=runs)
            if verdict.record is None:
                return f"{task['task_id']}: no longer a valid task ({verdict.reason})"
            if _diff_keys(task, verdict.record):
                return f"{task['task_id']}: fresh build differs in {', '.join(_diff_keys(task, verdict.record))}"
            return None

        for task, problem in zip(chosen, pool.map(check, chosen), strict=True):
            log(f"{task['task_id']}: {problem or 'ok'}")
            if problem:
                problems.append(problem)
    return problems


# ------------------------------------------------------------------------------------------------ CLI
def main(argv: Sequence[str] | None = None) -> int:
    parser = taskset.build_arguments(GENERATOR, __doc__, TASKS_PATH,
                                     "re-validate the stored tasks instead of building")
    parser.add_argument("--sample", type=int, default=None, help="with --check: only this many tasks")
    parser.add_argument("--libraries", default="", help="comma-separated library names (default: all)")
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="seeds tried per family")
    parser.add_argument("--per-family", type=int, default=DEFAULT_PER_FAMILY, help="tasks kept per family")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="runs of each suite (determinism)")
    parser.add_argument("--jobs", type=int, default=2, help="suites run in parallel")
    parser.add_argument("--quiet", action="store_true", help="only print the summary")
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        if not args.quiet:
            _log_to_stderr(message)

    if args.check:
        return taskset.report_check(args.out, check_tasks(args.out, sample=args.sample, runs=args.runs,
                                                          jobs=args.jobs, log=log))
    names = [n for n in args.libraries.split(",") if n] or None
    tasks = build_tasks(libraries=names, seeds=args.seeds, per_family=args.per_family, runs=args.runs,
                        jobs=args.jobs, log=log)
    return taskset.report_build(tasks, args.out, write_tasks, summarize, SPLIT_WEIGHTS)


if __name__ == "__main__":
    raise SystemExit(main())
