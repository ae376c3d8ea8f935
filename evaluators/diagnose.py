"""``trajlake diagnose``: walk a decision tree that explains a success drop from a baseline to a candidate run.

Each node asks one question and answers it with a test (task-clustered, as everywhere in the evaluators); the
walk stops at the first node answered "yes", which is the diagnosis. The nodes, in order:

0. ``success_drop``       did paired success drop? (McNemar exact, task-collapsed with several seeds per task).
                          No: nothing to diagnose.
1. ``oracle_suite``       did the fixed replay/oracle suite drop too between the two runs' environment versions?
                          With a replay suite (``trajlake diagnose --suite NAME``: pinned episodes replayed
                          against the current environment code first), any drifted episode answers yes whatever
                          the versions say. Runs whose ``policy_name`` is ``oracle`` on both versions are paired on
                          (task, seed, attempt). Not applicable when both runs used the same environment versions
                          (and no suite drifted); not checkable without oracle runs on both versions (or a suite).
                          Yes: environment or grader regression.
2. ``distribution``       did the environment or the task distribution change (``env_version``,
                          ``env_image_digest`` or ``task_version`` of the matched tasks differ)? Yes: the runs
                          are not comparable as they stand.
3. ``env_failures``       did episodes with ENV_TRANSIENT or ENV_BUG become more frequent? (paired, Holm over the
                          two tests). Yes: infrastructure, not the policy.
4. ``model_errors``       did schema errors (MODEL_INVALID_ACTION) or safety blocks (SAFETY_BLOCK turns or error
                          class, gateway denials) become more frequent? Yes: policy regression in action validity.
5. ``trimming``           did more episodes fail because they forgot (``forgot``: a failing episode re-requested
                          an answer context trimming had dropped, :mod:`trajlake.evaluators.forgetting`)? Paired
                          rate, over all matched pairs. The spec's tree checks "trimming and summaries" under the
                          next node's yes (loops, memory loss, failed recovery); asked first, the more specific
                          cause is named, and a drop from forgetting without more steps is caught too. Yes: memory
                          loss (a smaller window, a worse summariser, a policy that no longer copes with trimming).
6. ``behaviour``          did steps, the duplicate-action rate or P99 episode/tool latency rise? (Holm over the
                          four). Yes: the policy loops, dawdles or waits on slower tools.
7. ``version_switch``     did more episodes change policy version mid-episode (policy_version_start != end)?
                          Yes: stale or mixed-policy rollouts. (Formerly ``policy_lag``; its path entry keeps
                          that name in ``formerly``, docs/names.md.)
8. ``reward_drift``       did the reward definition drift: different component names, or a component's mean
                          among successful (or among failed) episodes shifted (clustered two-sample z, Holm)?
                          Conditioning on the outcome separates a changed reward from a changed success rate.
9. ``contamination``      are the matched tasks contaminated? The contamination scan
                          (:mod:`trajlake.evaluators.contamination`, defaults: training side = the ``train`` split
                          episodes) over the tasks of the pairs, on the candidate's splits. Yes: some tasks are
                          flagged (exact n-gram overlap, near duplicates, family, time split, trajectory leakage),
                          so scores on them measure memory as well as skill. Not checkable when the lake has no
                          task rows for them.

When no node says yes the diagnosis is ``unexplained``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy import stats as sps
from trajlake.evaluators import sql
from trajlake.evaluators.data import EvalData, load
from trajlake.evaluators.metrics import Settings, _success_p, compare
from trajlake.evaluators.report import CONTRACT_VERSION, pairs
from trajlake.evaluators.stats import clustered_mean, holm_bonferroni, paired_difference

from trajlake.errors import TrajlakeError
from trajlake.lake.store import LakeArg, lake_location

__all__ = ["DIAGNOSES", "NODES", "RENAMED_NODES", "diagnose", "diagnose_data"]

#: node id -> question
NODES: dict[str, str] = {
    "success_drop": "Did success drop significantly (candidate - baseline over matched pairs)?",
    "oracle_suite": "Did the fixed replay/oracle suite drop too between the environment versions?",
    "distribution": "Did the environment or the task distribution change between the runs?",
    "env_failures": "Did ENV_TRANSIENT / ENV_BUG episodes become more frequent?",
    "model_errors": "Did schema errors (MODEL_INVALID_ACTION) or safety blocks become more frequent?",
    "trimming": "Did more failing episodes forget an answer that context trimming (or its summary) dropped?",
    "behaviour": "Did steps, duplicate actions or P99 latency rise?",
    "version_switch": "Did more episodes run with a policy version that changed mid-episode?",
    "reward_drift": "Did the reward definition drift (component names, or component means given the outcome)?",
    "contamination": "Are candidate tasks contaminated (seen in training)?",
}

#: Renamed nodes (their diagnosis ids too): new name -> the deprecated one, which the node's path entry carries
#: as ``formerly`` (docs/names.md).
RENAMED_NODES: dict[str, str] = {"version_switch": "policy_lag"}

#: node id answered "yes" -> diagnosis id and sentence
DIAGNOSES: dict[str, tuple[str, str]] = {
    "success_drop": ("no_drop", "no significant success drop: nothing to diagnose"),
    "oracle_suite": ("environment_regression",
                     "the oracle suite dropped too: the environment or its grader regressed, not the policy"),
    "distribution": ("distribution_shift",
                     "the environment or task distribution changed: compare on the same versions first"),
    "env_failures": ("environment_failures", "environment failures rose: infrastructure, not the policy"),
    "model_errors": ("policy_action_errors",
                     "schema errors or safety blocks rose: the policy emits invalid or unsafe actions"),
    "trimming": ("memory_loss", "more failing episodes re-requested answers that context trimming had dropped: "
                                "the policy lost what it needed (window, summariser, or coping with trimming)"),
    "behaviour": ("policy_behaviour", "the policy takes more steps, loops or waits longer"),
    "version_switch": ("version_switch", "more episodes mixed policy versions: stale or lagging rollouts"),
    "reward_drift": ("reward_drift", "the reward drifted: the success signal may have changed meaning"),
    "contamination": ("contamination", "matched tasks are contaminated (seen in training): part of either run's "
                                       "score is memory; compare on the unflagged tasks"),
    "unexplained": ("unexplained", "no checked cause explains the drop"),
}


def _test(name: str, diff: float, ci_low: float, ci_high: float, p: float, **extra: Any) -> dict[str, Any]:
    return {"name": name, "diff": diff, "ci_low": ci_low, "ci_high": ci_high, "p_value": p, **extra}


def _paired_rate(data: EvalData, column: str, b_idx: np.ndarray, c_idx: np.ndarray, conf: float
                 ) -> dict[str, Any]:
    ep = data.ep
    b, c = ep[column][b_idx], ep[column][c_idx]
    pc = paired_difference(b, c, ep["task_code"][b_idx], confidence=conf)
    return _test(column, pc.estimate, pc.ci_low, pc.ci_high, pc.p_value,
                 baseline=float(b.mean()) if b.shape[0] else math.nan,
                 candidate=float(c.mean()) if c.shape[0] else math.nan, test="paired_clustered_t")


def _unpaired(name: str, a: np.ndarray, a_codes: np.ndarray, b: np.ndarray, b_codes: np.ndarray, conf: float
              ) -> dict[str, Any]:
    """``mean(b) - mean(a)`` of two independent samples: clustered SE of each mean, normal z test."""
    ea = clustered_mean(a, a_codes, confidence=conf)
    eb = clustered_mean(b, b_codes, confidence=conf)
    diff = eb.estimate - ea.estimate
    se = math.hypot(ea.se, eb.se)
    if not math.isfinite(se):
        return _test(name, diff, math.nan, math.nan, math.nan, baseline=ea.estimate, candidate=eb.estimate,
                     test="clustered_z_two_sample")
    z = float(sps.norm.ppf(0.5 + conf / 2.0))
    p = (1.0 if diff == 0.0 else 0.0) if se == 0.0 else float(2.0 * sps.norm.sf(abs(diff / se)))
    return _test(name, diff, diff - z * se, diff + z * se, p, baseline=ea.estimate, candidate=eb.estimate,
                 test="clustered_z_two_sample")


def _holm(tests: list[dict[str, Any]]) -> None:
    adj = holm_bonferroni(np.array([t["p_value"] for t in tests], dtype=np.float64))
    for t, p in zip(tests, adj, strict=True):
        t["p_holm"] = float(p)


def _rose(tests: list[dict[str, Any]], alpha: float) -> list[dict[str, Any]]:
    return [t for t in tests if t["diff"] > 0 and math.isfinite(t.get("p_holm", t["p_value"]))
            and t.get("p_holm", t["p_value"]) < alpha]


def _fmt(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f"{x:.4g}"


def _evidence(t: dict[str, Any]) -> str:
    p = t.get("p_holm", t["p_value"])
    label = "p_holm" if "p_holm" in t else "p"
    base = f"{t['name']}: {_fmt(t.get('baseline', math.nan))} -> {_fmt(t.get('candidate', math.nan))}, " \
           if "baseline" in t else f"{t['name']}: "
    return (base + f"diff {_fmt(t['diff'])} [{_fmt(t['ci_low'])}, {_fmt(t['ci_high'])}], {label} {_fmt(p)}")


def _facts(data: EvalData, baseline: str, candidate: str) -> dict[str, dict[str, Any]]:
    rows = data.query("run_facts", {"runs": sql.quote_list([baseline, candidate])},
                      what="run facts").fetchall()
    out: dict[str, dict[str, Any]] = {r: {"env_version": set(), "env_image_digest": set(), "tasks": {}}
                                      for r in (baseline, candidate)}
    for run, _env_id, ver, digest, task, task_version, _n in rows:
        f = out[str(run)]
        f["env_version"].add(str(ver))
        f["env_image_digest"].add(str(digest) if digest is not None else "(none)")
        f["tasks"].setdefault(str(task), set()).add(str(task_version))
    return out


def _short(items: set[str] | list[str], limit: int = 5) -> str:
    s = sorted(items)
    return ", ".join(s[:limit]) + (f" (+{len(s) - limit} more)" if len(s) > limit else "")


def _oracle_node(data: EvalData, facts: dict[str, dict[str, Any]], baseline: str, candidate: str,
                 settings: Settings, replay_suite: Mapping[str, Any] | None = None) -> dict[str, Any]:
    vb, vc = facts[baseline]["env_version"], facts[candidate]["env_version"]
    node: dict[str, Any] = {"node": "oracle_suite", "question": NODES["oracle_suite"], "tests": [], "evidence": []}
    if replay_suite is not None:
        drifted = list(replay_suite["drifted"])
        node["evidence"].append(f"replay suite {replay_suite['name']} ({replay_suite['source']}, pinned at "
                                f"{replay_suite['as_of']}): {len(drifted)} of {replay_suite['episodes']} episode(s) "
                                f"drifted on the current environment code"
                                + (f" ({_short(set(drifted))})" if drifted else ""))
        for d in list(replay_suite.get("drifts") or [])[:3]:  # where each first differs, in the lake's terms
            node["evidence"].append(f"episode {d['episode_id']} ({d['env_id']} {d['env_version']} recorded, "
                                    f"{d['env_version_now']} now): turn {d['turn']}, {d['field']}: recorded "
                                    f"{d['expected']!r}, now {d['got']!r}")
        if drifted:  # the environment answers the same actions differently now: not the policy
            node["result"] = "yes"
            return node
    if vb == vc:
        node["result"] = "not_applicable"
        node["evidence"].append(f"both runs used env_version {_short(vb)}: the fixed suite cannot differ")
        return node
    rows = data.query("oracle", {"env_versions": sql.quote_list(sorted(vb | vc))}, what="oracle suite").fetchall()
    base_rows = [r for r in rows if str(r[1]) in vb]
    cand_rows = [r for r in rows if str(r[1]) in vc]
    if not base_rows or not cand_rows:
        missing = [f"env_version {_short(v)}" for v, rs in ((vb, base_rows), (vc, cand_rows)) if not rs]
        node["result"] = "not_checkable" if replay_suite is None else "no"
        node["evidence"].append("could not be checked: no runs with policy_name 'oracle' on "
                                + " and ".join(missing)
                                + ("" if replay_suite is not None else "; a replay suite answers this node "
                                   "(`trajlake replay --run ID --pin-suite NAME`, then `diagnose --suite NAME`)"))
        return node
    task_codes = {t: i for i, t in enumerate(sorted({str(r[2]) for r in rows}))}
    bmap: dict[tuple[Any, ...], list[float]] = {}
    cmap: dict[tuple[Any, ...], list[float]] = {}
    for rs, mp in ((base_rows, bmap), (cand_rows, cmap)):
        for _run, _ver, task, seed, attempt, success in rs:
            mp.setdefault((str(task), seed, attempt), []).append(float(success))
    keys = sorted(k for k in bmap.keys() & cmap.keys() if len(bmap[k]) == 1 and len(cmap[k]) == 1)
    if keys:
        b = np.array([bmap[k][0] for k in keys])
        c = np.array([cmap[k][0] for k in keys])
        codes = np.array([task_codes[k[0]] for k in keys], dtype=np.float64)
        pc = paired_difference(b, c, codes, confidence=settings.confidence)
        p, test = _success_p(b, c, codes)
        t = _test("oracle_success", pc.estimate, pc.ci_low, pc.ci_high, p, baseline=float(b.mean()),
                  candidate=float(c.mean()), n_pairs=len(keys), test=test)
    else:
        b = np.array([float(r[5]) for r in base_rows])
        c = np.array([float(r[5]) for r in cand_rows])
        t = _unpaired("oracle_success", b, np.array([task_codes[str(r[2])] for r in base_rows], dtype=np.float64),
                      c, np.array([task_codes[str(r[2])] for r in cand_rows], dtype=np.float64),
                      settings.confidence)
    node["tests"].append(t)
    node["evidence"].append(f"oracle suite on env_version {_short(vb)} vs {_short(vc)}: " + _evidence(t))
    dropped = t["diff"] < 0 and math.isfinite(t["p_value"]) and t["p_value"] < settings.alpha
    node["result"] = "yes" if dropped else "no"
    return node


def _distribution_node(facts: dict[str, dict[str, Any]], baseline: str, candidate: str) -> dict[str, Any]:
    fb, fc = facts[baseline], facts[candidate]
    node: dict[str, Any] = {"node": "distribution", "question": NODES["distribution"], "tests": [], "evidence": []}
    changed = False
    for key in ("env_version", "env_image_digest"):
        if fb[key] != fc[key]:
            changed = True
            node["evidence"].append(f"{key}: {_short(fb[key])} -> {_short(fc[key])}")
        else:
            node["evidence"].append(f"{key}: unchanged ({_short(fb[key])})")
    common = fb["tasks"].keys() & fc["tasks"].keys()
    moved = sorted(t for t in common if fb["tasks"][t] != fc["tasks"][t])
    if moved:
        changed = True
        node["evidence"].append(f"task_version changed for {len(moved)} of {len(common)} common task(s): "
                                + _short(moved))
    else:
        node["evidence"].append(f"task_version: unchanged on the {len(common)} common task(s)")
    only_b = fb["tasks"].keys() - fc["tasks"].keys()
    only_c = fc["tasks"].keys() - fb["tasks"].keys()
    if only_b or only_c:
        node["evidence"].append(f"task sets differ: {len(only_b)} task(s) only in the baseline, {len(only_c)} only "
                                "in the candidate (excluded from the paired comparison)")
    node["result"] = "yes" if changed else "no"
    return node


def _reward_node(data: EvalData, b_idx: np.ndarray, c_idx: np.ndarray, baseline: str, candidate: str,
                 settings: Settings) -> dict[str, Any]:
    node: dict[str, Any] = {"node": "reward_drift", "question": NODES["reward_drift"], "tests": [], "evidence": []}
    rows = data.query("reward_components", {"runs": sql.quote_list([baseline, candidate])},
                      what="reward components").fetchnumpy()
    ep_idx = np.asarray(rows["ep_idx"], dtype=np.int64)
    comp = np.asarray(rows["component"], dtype=object)
    val = np.asarray(rows["value"], dtype=np.float64)
    ep = data.ep
    in_b = np.zeros(ep["task_code"].shape[0], dtype=bool)
    in_b[b_idx] = True
    in_c = np.zeros(ep["task_code"].shape[0], dtype=bool)
    in_c[c_idx] = True
    names_b = set(comp[in_b[ep_idx]].tolist()) if ep_idx.shape[0] else set()
    names_c = set(comp[in_c[ep_idx]].tolist()) if ep_idx.shape[0] else set()
    drift = False
    if names_b != names_c:
        drift = True
        node["evidence"].append(f"reward component names differ: {_short(names_b) or '(none)'} -> "
                                f"{_short(names_c) or '(none)'}")
    tests: list[dict[str, Any]] = []
    ok = np.isfinite(val)
    for name in sorted(names_b & names_c):
        for outcome, label in ((1.0, "successful"), (0.0, "failed")):
            sel = ok & (comp == name) & (ep["success"][ep_idx] == outcome)
            sb, sc = sel & in_b[ep_idx], sel & in_c[ep_idx]
            if sb.sum() < 2 or sc.sum() < 2:
                continue
            tests.append(_unpaired(f"{name} | {label}", val[sb], ep["task_code"][ep_idx[sb]], val[sc],
                                   ep["task_code"][ep_idx[sc]], settings.confidence))
    if tests:
        _holm(tests)
        shifted = [t for t in tests if math.isfinite(t["p_holm"]) and t["p_holm"] < settings.alpha]
        drift = drift or bool(shifted)
        node["evidence"] += [_evidence(t) for t in (shifted or tests)[:6]]
    elif not drift:
        node["evidence"].append("no reward component with at least two episodes per outcome in both runs")
    node["tests"] = tests
    node["result"] = "yes" if drift else "no"
    return node


def diagnose_data(data: EvalData, baseline: str, candidate: str, settings: Settings | None = None,
                  lake_path: str = "", replay_suite: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Walk the tree on loaded data (both runs must be in ``data``). ``replay_suite``: what replaying a pinned
    suite found (``name``, ``source``, ``as_of``, ``episodes``, ``drifted`` ids), for the first node."""
    settings = settings or Settings()
    alpha = settings.alpha
    b_idx, c_idx, dropped = pairs(data, baseline, candidate)
    cmp = compare(data.ep, b_idx, c_idx, data.tool_ep_idx, data.tool_latency_ms, settings,
                  f"{baseline}\x1d{candidate}")
    m = cmp["metrics"]
    path: list[dict[str, Any]] = []

    def finish(node_id: str | None) -> dict[str, Any]:
        diag_id, sentence = DIAGNOSES[node_id or "unexplained"]
        return {"report": "trajlake.diagnose", "contract_version": CONTRACT_VERSION, "lake": lake_path,
                "lake_versions": dict(sorted(data.lake_versions.items())), "as_of": data.as_of,
                "baseline": baseline, "candidate": candidate, "n_pairs": int(b_idx.shape[0]), "dropped": dropped,
                "alpha": alpha, "diagnosis": diag_id, "conclusion": sentence, "path": path}

    s = m["success"]
    t0 = _test("success", s["diff"], s["ci_low"], s["ci_high"], s["p_value"], baseline=s["baseline"],
               candidate=s["candidate"], test=s["test"])
    drop = s["diff"] < 0 and math.isfinite(s["p_value"]) and s["p_value"] < alpha
    path.append({"node": "success_drop", "question": NODES["success_drop"], "result": "yes" if drop else "no",
                 "tests": [t0], "evidence": [f"{b_idx.shape[0]} matched pairs over {cmp['n_tasks']} task(s); "
                                             + _evidence(t0)]})
    if not drop:
        return finish("success_drop")

    facts = _facts(data, baseline, candidate)
    path.append(_oracle_node(data, facts, baseline, candidate, settings, replay_suite))
    if path[-1]["result"] == "yes":
        return finish("oracle_suite")
    path.append(_distribution_node(facts, baseline, candidate))
    if path[-1]["result"] == "yes":
        return finish("distribution")

    conf = settings.confidence
    for node_id, columns in (("env_failures", ("had_env_transient", "had_env_bug")),
                             ("model_errors", ("had_invalid_action", "had_safety_block"))):
        tests = [_paired_rate(data, c, b_idx, c_idx, conf) for c in columns]
        _holm(tests)
        rose = _rose(tests, alpha)
        path.append({"node": node_id, "question": NODES[node_id], "result": "yes" if rose else "no",
                     "tests": tests, "evidence": [_evidence(t) for t in tests]})
        if rose:
            return finish(node_id)

    t = _paired_rate(data, "forgot", b_idx, c_idx, conf)
    trimmed = _paired_rate(data, "trimmed", b_idx, c_idx, conf)  # how often trimming happened at all
    forgot = t["diff"] > 0 and math.isfinite(t["p_value"]) and t["p_value"] < alpha
    path.append({"node": "trimming", "question": NODES["trimming"], "result": "yes" if forgot else "no",
                 "tests": [t], "evidence": [_evidence(t), "context: " + _evidence(trimmed)]})
    if forgot:
        return finish("trimming")

    tests = []
    for name in ("steps", "duplicate_rate", "episode_latency_p99", "tool_latency_p99"):
        r = m[name]
        tests.append(_test(name, r["diff"], r["ci_low"], r["ci_high"], r["p_value"], baseline=r["baseline"],
                           candidate=r["candidate"], test=r["test"]))
    _holm(tests)
    rose = _rose(tests, alpha)
    path.append({"node": "behaviour", "question": NODES["behaviour"], "result": "yes" if rose else "no",
                 "tests": tests, "evidence": [_evidence(t) for t in tests]})
    if rose:
        return finish("behaviour")

    t = _paired_rate(data, "version_switched", b_idx, c_idx, conf)
    switched = t["diff"] > 0 and math.isfinite(t["p_value"]) and t["p_value"] < alpha
    path.append({"node": "version_switch", "formerly": RENAMED_NODES["version_switch"],
                 "question": NODES["version_switch"], "result": "yes" if switched else "no", "tests": [t],
                 "evidence": [_evidence(t)]})
    if switched:
        return finish("version_switch")

    path.append(_reward_node(data, b_idx, c_idx, baseline, candidate, settings))
    if path[-1]["result"] == "yes":
        return finish("reward_drift")

    path.append(_contamination_node(data, baseline, candidate))
    if path[-1]["result"] == "yes":
        return finish("contamination")
    return finish(None)


def _contamination_node(data: EvalData, baseline: str, candidate: str) -> dict[str, Any]:
    """Scan the matched tasks (on the candidate's splits) with the contamination scan's defaults."""
    from trajlake.evaluators.contamination import scan, summary_lines

    node: dict[str, Any] = {"node": "contamination", "question": NODES["contamination"], "tests": []}
    rows = data.con.execute("SELECT DISTINCT task_id, split FROM episodes WHERE run_id IN (?, ?)",
                            [baseline, candidate]).fetchall()
    splits = sorted({str(s) for _, s in rows if s is not None})
    task_ids = sorted({str(t) for t, _ in rows})
    try:
        report = scan(None, eval_split=splits, eval_task_ids=task_ids, eval_runs=[baseline, candidate],
                      con=data.con)
    except TrajlakeError as e:
        node["result"] = "not_checkable"
        node["evidence"] = [f"contamination scan not possible: {e}"]
        return node
    flagged = report["flagged_tasks"]
    node["result"] = "yes" if flagged else "no"
    node["evidence"] = summary_lines(report)
    if flagged:
        shown = ", ".join(flagged[:5]) + (f" and {len(flagged) - 5} more" if len(flagged) > 5 else "")
        node["evidence"].append(f"flagged tasks: {shown} (trajlake contamination --eval-split "
                                f"{' '.join(splits)} for spans and sources)")
    node["flagged_tasks"] = flagged
    return node


def diagnose(lake: LakeArg, baseline: str, candidate: str, *,
             as_of: str | dict[str, int] | None = None, settings: Settings | None = None,
             memory_limit: str | None = None, threads: int | None = None,
             replay_suite: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Load both runs and walk the tree; returns the diagnosis dict (``path``, ``diagnosis``, ``conclusion``)."""
    if baseline == candidate:
        raise TrajlakeError("--baseline and --candidate must be different runs")
    data = load(lake, [baseline, candidate], as_of=as_of, memory_limit=memory_limit, threads=threads)
    try:
        return diagnose_data(data, baseline, candidate, settings, lake_path=lake_location(lake),
                             replay_suite=replay_suite)
    finally:
        data.close()
