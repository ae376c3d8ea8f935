"""Checks before anything is played: what an environment needs (``Env.requirements``), one oracle solution
graded end to end, and ``trajlake doctor``'s view of the whole machine.

A rollout whose grader cannot run would write episodes that all look like failures (every grading run
crashing reads as "not resolved"); the preflight stops it first, with one line naming what is missing and how
to fix it.
"""

from __future__ import annotations

import importlib
import json
import platform
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trajlake.envs.core import Requirement
from trajlake.envs.registry import make, names, spec
from trajlake.errors import PreflightError
from trajlake.render.toolcall import format_call
from trajlake.rollout.runner import play_episode


@dataclass(frozen=True)
class Check:
    """One line of ``trajlake doctor``: a requirement of a component."""

    component: str
    """What needs it: ``lake``, ``python`` or an environment name."""
    requirement: Requirement


SCRIPTED_FALLBACK_WARNING = (
    "WARNING: bubblewrap is not available here: the built-in scripted policies (trusted code shipped with "
    "trajlake) run under the rlimit fallback, which limits resources only: the code they run could read the "
    "hidden tests, the lake and $HOME and reach the network. Model policies (hf:, openai:, imported) refuse "
    "without bubblewrap unless --allow-unisolated. Install it: apt-get install bubblewrap.")


def scripted_policies_need_fallback(env_name: str) -> bool:
    """Whether ``env_name`` runs agent code in a sandbox that would be the unisolated rlimit fallback here. The
    environment's own scripted policies (oracle, heuristic, random, ...) are trusted code: they may run there
    with :data:`SCRIPTED_FALLBACK_WARNING` said once (a first run on a machine without bubblewrap, such as macOS,
    works); a model's actions may not."""
    if env_name != "mini-swe":
        return False
    from trajlake.envs.mini_swe.sandbox import resolve_sandbox

    try:
        return resolve_sandbox("auto") != "bwrap"
    except Exception:  # any failure to set bubblewrap up means there is no sandbox
        return True


def is_scripted_policy(env_name: str, policy: str) -> bool:
    """``policy`` names one of ``env_name``'s own scripted policies (not ``hf:``, ``openai:`` or a module)."""
    if ":" in policy:
        return False
    return policy in spec(env_name).load().policies()


def oracle_call_tokens(env_name: str, split: str, count_tokens: Callable[[str], int], n_tasks: int = 3,
                       task_ids: Sequence[str] = (), **env_kwargs: Any) -> tuple[int, str]:
    """The most tokens one of the oracle's tool calls takes, written as a language-model policy writes it
    (``format_call``) and counted by ``count_tokens``, over its episodes on the first ``n_tasks`` tasks of
    ``split`` (of ``task_ids`` when given); with where it was (tool and task). (0, "no oracle") when the
    environment has none."""
    cls = spec(env_name).env_class()
    oracle = next((p for p in (cls.policies() if cls is not None else {}).values()
                   if getattr(p, "needs_oracle", False)), None)
    if oracle is None:
        return 0, "no oracle"
    best, where = 0, "no call"
    env = make(env_name, split=split, **env_kwargs)
    try:
        tasks = [t for t in env.list_tasks() if not task_ids or t["task_id"] in task_ids]
        for task in tasks[:n_tasks]:
            rec = play_episode(env, oracle("preflight"), run_id="preflight", task_id=task["task_id"],
                               task_version=task["task_version"], seed=0)
            for turn in rec.turns:
                if turn["actor"] != "policy":
                    continue
                call = json.loads(turn["raw_content"])
                n = count_tokens(format_call(call["tool"], call.get("args", {})))
                if n > best:
                    best, where = n, f"{call['tool']} on {task['task_id']}"
    finally:
        env.close()
    return best, where


def oracle_check(env_name: str, split: str | None = None, **env_kwargs: Any) -> Requirement:
    """Play the environment's oracle on its first task of ``split`` and require success: the whole chain
    (reset, tools, sandbox, grader) works on this machine."""
    cls = spec(env_name).env_class()
    policies = cls.policies() if cls is not None else {}
    oracle = next((p for p in policies.values() if getattr(p, "needs_oracle", False)), None)
    if oracle is None:
        return Requirement("oracle", True, f"{env_name} has no oracle policy: end-to-end grading not checked",
                           required=False)
    # The check is whether the chain works on this machine, not whether the user's budget lets the oracle finish:
    # `--env-arg budget={"max_steps": 4}` is a setting of the run (Mini Web's oracle needs more steps than that).
    env = make(env_name, split=split, **{k: v for k, v in env_kwargs.items() if k != "budget"})
    try:
        tasks = env.list_tasks()
        if not tasks:
            return Requirement("oracle", False, f"{env_name} has no tasks in split {split!r}",
                               "choose another --split")
        task = tasks[0]
        rec = play_episode(env, oracle("preflight"), run_id="preflight", task_id=task["task_id"],
                           task_version=task["task_version"], seed=0)
    except Exception as e:  # whatever broke, the user needs its one line
        return Requirement("oracle", False, f"the oracle's episode on {env_name} crashed: {type(e).__name__}: {e}",
                           "run `trajlake doctor` to see what the environment needs")
    finally:
        env.close()
    ep = rec.episode
    if ep["success"]:
        return Requirement("oracle", True, f"the oracle solved {task['task_id']} (graded end to end)")
    last_obs = next((t["raw_content"] for t in reversed(rec.turns) if t["actor"] == "env"), "") or ""
    detail = last_obs.strip().splitlines()[-1][:200] if last_obs.strip() else "no observation"
    return Requirement("oracle", False, f"the oracle's known solution of {task['task_id']} was not graded as "
                       f"solved ({ep['termination_reason']}): {detail}",
                       "run `trajlake doctor` to see what the environment needs")


def preflight(env_name: str, split: str | None = None, *, oracle: bool = True, **env_kwargs: Any) -> list[Requirement]:
    """Check an environment before a rollout; raises ``PreflightError`` naming the first broken requirement.
    Returns the checks (for printing)."""
    env = make(env_name, split=split, **env_kwargs)
    try:
        reqs = list(env.requirements())
    finally:
        env.close()
    _raise_first(env_name, reqs)
    if oracle:
        reqs.append(oracle_check(env_name, split, **env_kwargs))
        _raise_first(env_name, reqs)
    return reqs


def _raise_first(env_name: str, reqs: list[Requirement]) -> None:
    for r in reqs:
        if r.required and not r.ok:
            fix = f"; fix: {r.fix}" if r.fix else ""
            raise PreflightError(f"{env_name} cannot run here: {r.name}: {r.detail}{fix} (nothing was written)")


def _version(module: str) -> str | None:
    try:
        mod = importlib.import_module(module)
    except Exception:
        return None
    return str(getattr(mod, "__version__", "installed"))


def _delta_extension() -> Requirement:
    import duckdb

    try:
        con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False})
        from trajlake.query import _load_delta

        _load_delta(con)
        return Requirement("duckdb delta extension", True, f"duckdb {duckdb.__version__}, delta loaded")
    except Exception as e:
        return Requirement("duckdb delta extension", False, f"{type(e).__name__}: {e}",
                           "pip install duckdb and duckdb-extension-delta of the same version")


def doctor_checks(*, oracle: bool = True) -> list[Check]:
    """What the lake and every registered environment need, and whether each is there."""
    from trajlake._version import __version__
    from trajlake.provenance import code_version

    out = [
        Check("python", Requirement("python", sys.version_info >= (3, 11), f"{platform.python_version()} "
                                    f"({sys.executable})", "use Python 3.11 or newer")),
        Check("trajlake", Requirement("trajlake", True, f"{__version__} ({code_version()})")),
    ]
    for module in ("pyarrow", "deltalake", "polars"):
        v = _version(module)
        out.append(Check("lake", Requirement(module, v is not None, v or "missing", f"pip install {module}")))
    out.append(Check("lake", _delta_extension()))
    for name in names():
        try:
            env = make(name, split=None)
            try:
                reqs = list(env.requirements())
            finally:
                env.close()
        except Exception as e:
            reqs = [Requirement("load", False, f"{type(e).__name__}: {e}", "reinstall the package providing it")]
        if oracle and all(r.ok or not r.required for r in reqs):
            reqs.append(oracle_check(name))
        out += [Check(name, r) for r in reqs]
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    out.append(Check("browser", Requirement("chromium", chromium is not None, chromium or "not found (browser "
                                            "tests and --browser chromium need it)", "apt-get install chromium",
                                            required=False)))
    torch_v = _version("torch")
    if torch_v is None:
        out.append(Check("train", Requirement("torch", False, "not installed (the trainer and hf: policies need it)",
                                              "pip install 'trajlake[train]'", required=False)))
    else:
        import torch

        cuda = torch.cuda.is_available()
        detail = f"{torch_v}; CUDA " + (f"available ({torch.cuda.get_device_name(0)})" if cuda else "not available")
        out.append(Check("train", Requirement("torch", True, detail, required=False)))
    return out


__all__ = ["Check", "PreflightError", "doctor_checks", "oracle_call_tokens", "oracle_check", "preflight"]
