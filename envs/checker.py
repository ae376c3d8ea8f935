"""``check_env``: the behaviour every trajlake environment must show (Gymnasium's env_checker, for our contract)."""

from __future__ import annotations

import re

from trajlake.envs.core import Env, EnvError, EvalDocument, LoggedStep, ReplayLog, StepResult
from trajlake.schemas.vocab import Status

from trajlake.errors import EnvCheckError

_KIND_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")


def _expect(cond: bool, msg: str) -> None:
    if not cond:
        raise EnvCheckError(msg)


def check_env(env: Env, actions: list[str], seed: int = 0) -> None:
    """Check reset determinism, the sandbox kind, evaluation documents, typed step results, invalid actions,
    snapshot/restore and replay.

    ``actions`` is a short valid action sequence for the task ``reset(seed)`` picks (it should not end the
    episode before its last action)."""
    _expect(bool(env.env_id) and bool(env.env_version) and bool(env.image_digest), "env_id, env_version and "
            "image_digest must be set")
    a = env.reset(seed)
    b = env.reset(seed)
    _expect(a.observation == b.observation and a.state_hash == b.state_hash and a.task_id == b.task_id,
            "reset(seed) must be deterministic (observation, state hash, task)")
    _expect(a.episode_id != b.episode_id, "every reset starts a new episode id")
    check_sandbox_kind(env)
    check_evaluation_documents(env, a.task_id)
    bad = env.step("this is not an action \x00 {")
    _expect(isinstance(bad, StepResult) and bad.status == Status.MODEL_INVALID_ACTION,
            "an invalid action must give a typed MODEL_INVALID_ACTION result, not an exception")
    _expect(not (bad.terminated and bad.truncated), "terminated and truncated are never both true")
    r = env.reset(seed)
    snap = env.snapshot()
    first: list[tuple[str, str]] = []
    for i, act in enumerate(actions):
        res = env.step(act, f"check-{i}")
        _expect(isinstance(res, StepResult), "step must return a StepResult")
        first.append((res.observation, res.state_hash))
        if res.done:
            break
    env.restore(snap)
    _expect(env.snapshot().state_hash == snap.state_hash, "restore must return to the snapshot's state hash")
    for i, act in enumerate(actions[: len(first)]):
        res = env.step(act, f"check-{i}")
        _expect((res.observation, res.state_hash) == first[i],
                f"after restore, step {i} must give the same observation and state hash")
        if res.done:
            break
    log = ReplayLog(env.env_id, env.env_version, r.task_id, r.task_version, seed, r.state_hash,
                    [LoggedStep(act, f"check-{i}", h) for i, (act, (_, h)) in enumerate(zip(actions, first, strict=False))])
    rep = env.replay(log)
    _expect(rep.ok, f"replay of a recorded episode must match: {rep.message}")
    wrong = ReplayLog(log.env_id, log.env_version, log.task_id, log.task_version, seed, log.reset_state_hash,
                      [*log.steps[:-1], LoggedStep(log.steps[-1].action, log.steps[-1].idempotency_key, "0" * 64)])
    rep = env.replay(wrong)
    _expect(not rep.ok and rep.first_divergence == len(log.steps) - 1, "replay must report the first divergence")
    try:
        env.restore(snap.__class__("other-env", "0", snap.state_hash, None))
        raise EnvCheckError("restore must refuse another environment's snapshot")
    except EnvError:
        pass



def check_sandbox_kind(env: Env) -> None:
    """After a reset, ``sandbox_kind`` (written to ``episodes.sandbox``) is None or a short lowercase name, one
    of ``SANDBOX_KINDS`` or an environment's own (``docker``)."""
    kind = env.sandbox_kind
    _expect(kind is None or (isinstance(kind, str) and _KIND_NAME.fullmatch(kind) is not None),
            "sandbox_kind must be None or a short lowercase name such as 'bwrap', 'rlimit' or 'none', not "
            f"{kind!r}")


def check_evaluation_documents(env: Env, task_id: str) -> None:
    """``evaluation_documents`` (a class method) gives ``EvalDocument`` records of the tasks asked for only,
    each with a kind and a text, and nothing for a task it does not know."""
    docs = type(env).evaluation_documents([task_id])
    _expect(isinstance(docs, list) and all(isinstance(d, EvalDocument) for d in docs),
            "evaluation_documents must return a list of EvalDocument records")
    _expect(all(d.task_id == task_id and d.kind and isinstance(d.text, str) for d in docs),
            "evaluation_documents must give documents of the tasks asked for, each with a kind and a text")
    _expect(type(env).evaluation_documents(["\x00 not a task id"]) == [],
            "evaluation_documents must give nothing for a task the environment does not know")


__all__ = ["EnvCheckError", "check_env", "check_evaluation_documents", "check_sandbox_kind"]
