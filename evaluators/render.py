"""Render ``trajlake eval`` and ``trajlake diagnose`` reports: rich terminal tables, Markdown and a
self-contained HTML page (inline CSS and SVG plots, no scripts, no external resources).

All three formats are built from the same list of :class:`TextTable` (see :func:`report_tables`), so they show
the same numbers; JSON is :func:`trajlake.evaluators.report.to_json`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Any

from rich.console import Console
from rich.table import Table
from trajlake.evaluators import svg
from trajlake.evaluators.metrics import ERROR_CLASSES, METRICS, TERMINATION_REASONS
from trajlake.evaluators.report import TAXONOMY_CLASSES

__all__ = ["TextTable", "diagnosis_lines", "print_diagnosis", "print_report", "render_diagnosis_markdown",
           "render_html", "render_markdown", "report_tables"]

_CORE = [s.name for s in METRICS if not s.name.startswith(("error_rate_", "termination_rate_"))]
_BREAKDOWN = ("success", "cost_per_success", "steps", "recovery_rate", "duplicate_rate", "episode_latency_p99")


@dataclass
class TextTable:
    """A titled table of strings, rendered identically by every format."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""


def num(x: Any) -> str:
    """A number with 4 significant digits; ``n/a`` for missing values."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) >= 1e5 or abs(x) < 1e-3:
        return f"{x:.3e}"
    return f"{x:.4g}"


def pval(p: Any) -> str:
    """A p-value with 4 decimals (``<1e-4`` below that); ``n/a`` when missing."""
    if p is None or (isinstance(p, float) and not math.isfinite(p)):
        return "n/a"
    return "<1e-4" if p < 1e-4 else f"{p:.4f}"


#: Marks a number whose interval rests on fewer task clusters than its method needs (``few_clusters``).
FEW_CLUSTERS_MARK = "†"


def few_clusters_note(settings: dict[str, Any]) -> str:
    """The footnote explaining :data:`FEW_CLUSTERS_MARK`."""
    return (f"{FEW_CLUSTERS_MARK} fewer task clusters than the interval's method needs (t intervals "
            f"{settings.get('min_clusters_t', '?')}, bootstrap {settings.get('min_clusters_bootstrap', '?')}): "
            "the interval is not to be trusted")


def cell(m: dict[str, Any] | None, key: str = "estimate") -> str:
    """``estimate [ci_low, ci_high]``, with :data:`FEW_CLUSTERS_MARK` when there are too few task clusters for
    the interval, and ``no data`` when no episode had a known value."""
    if not m:
        return ""
    if m.get("n") == 0 and (m.get(key) is None or not math.isfinite(m[key])):
        return "no data"
    est = num(m.get(key))
    mark = FEW_CLUSTERS_MARK if m.get("few_clusters") else ""
    lo, hi = m.get("ci_low"), m.get("ci_high")
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return est + mark
    return f"{est} [{num(lo)}, {num(hi)}]{mark}"


def _sources(sources: dict[str, int]) -> str:
    return ", ".join(f"{k} ({v})" for k, v in sources.items()) or "none"


def _decoding(run: dict[str, Any]) -> str:
    """``constrained (grammar sha256:1234abcd)`` or ``free``."""
    if not run.get("constrained"):
        return "free"
    return f"constrained (grammar {str(run.get('grammar_sha256'))[:15]})"


def _metric_names(report: dict[str, Any]) -> list[str]:
    names = list(_CORE)
    extra: list[str] = []
    for r in report["runs"].values():
        extra += [k for k in r["metrics"] if k.startswith("pass") and k not in extra]
    i = names.index("budgeted_success") + 1
    return names[:i] + extra + names[i:]


def report_tables(report: dict[str, Any]) -> list[TextTable]:
    """The report as titled tables: metrics, comparison, breakdown, errors, terminations, taxonomy."""
    runs: dict[str, Any] = report["runs"]
    ids = list(runs)
    if not ids:
        return [TextTable("Runs", ["runs"], [["none: the lake has no runs at these table versions"]])]
    out: list[TextTable] = []
    rows = [["episodes"] + [str(runs[r]["n_episodes"]) for r in ids],
            ["tasks (clusters)"] + [str(runs[r]["n_tasks"]) for r in ids],
            ["graded / ungraded"] + [f"{runs[r].get('n_graded', '?')} / {runs[r].get('n_ungraded', '?')}"
                                     for r in ids],
            ["verification source"] + [_sources(runs[r].get("verification_sources", {})) for r in ids],
            ["isolation"] + [_sources(runs[r].get("isolation", {})) for r in ids],
            ["decoding"] + [_decoding(runs[r]) for r in ids]]
    for name in _metric_names(report):
        rows.append([name] + [cell(runs[r]["metrics"].get(name)) for r in ids])
    settings = report["settings"]
    conf = settings["confidence"]
    out.append(TextTable("Metrics per run", ["metric", *ids], rows,
                         f"estimate [{conf:.0%} CI]; means and proportions: task-clustered t intervals; ratios and "
                         "tails: task-cluster bootstrap; intervals never leave the metric's range; success "
                         "metrics count graded episodes only; no data: no episode had a known value. "
                         + few_clusters_note(settings)))
    cmp = report.get("comparison")
    if cmp:
        alpha = report["settings"]["alpha"]
        crow = []
        for name, m in cmp["metrics"].items():
            if "alias_of" in m:  # a deprecated name of a metric already shown
                continue
            sig = "*" if m.get("p_holm") is not None and math.isfinite(m["p_holm"]) and m["p_holm"] < alpha else ""
            diff = cell(m, "diff")
            crow.append([name, num(m.get("baseline")), num(m.get("candidate")), diff, num(m["se"]),
                         pval(m["p_value"]), pval(m.get("p_holm")) + sig, m.get("test", "")])
        d = cmp["dropped"]
        pw = cmp["power"]
        power = (f"power: MDD {num(pw['mdd'])} on success at alpha {pw['alpha']}, power {pw['power']} with "
                 f"{pw['n_tasks']} task(s); {pw['tasks_needed']} task(s) needed to detect {num(pw['target'])}"
                 if pw.get("tasks_needed") is not None else f"power: MDD {num(pw['mdd'])}; {pw.get('note', '')}")
        note = "".join(f"WARNING: {w}. " for w in cmp.get("warnings", [])) + (
                f"{cmp['candidate']} - {cmp['baseline']} over {cmp['n_pairs']} matched pairs in {cmp['n_tasks']} "
                f"task(s); dropped: baseline {d['baseline']['total']} (unmatched {d['baseline']['unmatched']}, "
                f"ambiguous {d['baseline']['ambiguous']}), candidate {d['candidate']['total']} (unmatched "
                f"{d['candidate']['unmatched']}, ambiguous {d['candidate']['ambiguous']}). * p_holm < {alpha}. "
                + power)
        out.append(TextTable(f"Comparison: {cmp['candidate']} vs {cmp['baseline']}",
                             ["metric", "baseline", "candidate", "diff [CI]", "se", "p", "p_holm", "test"], crow,
                             note))
    if report.get("breakdown"):
        brow = [[b["run_id"], b["split"], b["env_version"], str(b["n_episodes"])]
                + [cell(b["metrics"].get(n)) for n in _BREAKDOWN] for b in report["breakdown"]]
        out.append(TextTable("Breakdown by run x split x env_version",
                             ["run", "split", "env_version", "episodes", *_BREAKDOWN], brow,
                             few_clusters_note(report["settings"])))
    attr = report.get("error_attribution", {})
    if attr:
        arow = []
        for r in ids:
            a = attr[r]
            arow.append([r, str(a["n_episodes"]), str(a["failed"]), str(a.get("ungraded", 0)), str(a["model_failures"]),
                         str(a["env_failures"])] + [str(a["error_class"][c]) for c in ERROR_CLASSES]
                        + [str(a["safety"]["gateway_denials"]), str(a["safety"]["executed_violations"]),
                           str(a["safety"]["injection_obeyed_calls"])])
        out.append(TextTable("Error attribution (episodes by error_class; ENV_* are environment failures)",
                             ["run", "episodes", "failed", "ungraded", "model failures", "env failures",
                              *ERROR_CLASSES,
                              "gateway denials", "executed violations", "injection-obeyed calls"], arow))
    term = report.get("termination_reasons", {})
    if term:
        reasons = [r for r in TERMINATION_REASONS if any(term[x][r] for x in ids)] or list(TERMINATION_REASONS)
        out.append(TextTable("Termination reasons (episodes)", ["run", *reasons],
                             [[r] + [str(term[r][k]) for k in reasons] for r in ids]))
    tax = report.get("taxonomy")
    if tax:
        trow = [[r] + [str(tax[r]["counts"][c]) for c in TAXONOMY_CLASSES] for r in ids]
        examples = []
        for r in ids:
            for c in TAXONOMY_CLASSES:
                if tax[r]["examples"][c]:
                    examples.append(f"{r} {c}: {', '.join(tax[r]['examples'][c][:3])}")
        out.append(TextTable("Failure taxonomy (failing episodes; first matching rule wins)",
                             ["run", *TAXONOMY_CLASSES], trow, "examples: " + "; ".join(examples)
                             if examples else ""))
    return out


def _header(report: dict[str, Any]) -> list[str]:
    pins = report["as_of"]
    st = report["settings"]
    cmp = report.get("comparison")
    select = (f"--baseline {cmp['baseline']} --candidate {cmp['candidate']} " if cmp else "") + "".join(
        f"--run {r} " for r in report["runs"])
    return [f"lake: {report['lake']}",
            "read table versions: " + ", ".join(f"{t}={v}" for t, v in report["lake_versions"].items()),
            f"reproduce with: {select}--as-of {pins} --seed {st['seed']} --resamples {st['resamples']} "
            f"--confidence {st['confidence']} --mdd-target {st['mdd_target']}"]


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    """The report as rich tables on the terminal."""
    con = console or Console(width=max(120, Console().width))
    con.print("[bold]trajlake eval[/bold]")
    for line in _header(report):
        con.print(line, highlight=False, markup=False)
    for t in report_tables(report):
        table = Table(title=t.title, title_justify="left", show_lines=False)
        for c in t.columns:
            table.add_column(c, overflow="fold")
        for r in t.rows:
            table.add_row(*r)
        con.print(table)
        if t.note:
            con.print(t.note, style="dim", highlight=False, markup=False)


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _md_table(t: TextTable) -> list[str]:
    lines = [f"## {t.title}", "", "| " + " | ".join(_md_escape(c) for c in t.columns) + " |",
             "| " + " | ".join("---" for _ in t.columns) + " |"]
    lines += ["| " + " | ".join(_md_escape(v) for v in r) + " |" for r in t.rows]
    if t.note:
        lines += ["", _md_escape(t.note)]
    return [*lines, ""]


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown (GitHub tables)."""
    lines = ["# trajlake eval", ""] + [f"- {_md_escape(h)}" for h in _header(report)] + [""]
    for t in report_tables(report):
        lines += _md_table(t)
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ HTML


def _color(i: int) -> str:
    """The plot colour of the ``i``-th run."""
    return svg.PALETTE[i % len(svg.PALETTE)]


def _mark(m: dict[str, Any] | None) -> str:
    return FEW_CLUSTERS_MARK if m and m.get("few_clusters") else ""


def _iv(label: str, m: dict[str, Any] | None, color: str, key: str = "estimate") -> svg.Interval:
    m = m or {}

    def f(k: str) -> float:
        v = m.get(k)
        return float(v) if isinstance(v, int | float) and v is not None else math.nan

    return svg.Interval(label, f(key), f("ci_low"), f("ci_high"), color)


def plots(report: dict[str, Any]) -> list[str]:
    """The SVG charts of the HTML report: Pareto, metric intervals, comparison (if any), latency CDFs."""
    runs = report["runs"]
    ids = list(runs)
    out = [svg.pareto([(_iv(r, runs[r]["metrics"].get("cost_usd"), _color(i)),
                        _iv(r, runs[r]["metrics"].get("success"), _color(i))) for i, r in enumerate(ids)],
                      x_label="cost per episode (USD)", y_label="success",
                      title="Success vs cost per episode (95% CIs; filled: Pareto frontier)")]
    rows = [(name, [_iv(r + _mark(runs[r]["metrics"].get(name)), runs[r]["metrics"].get(name), _color(i))
                    for i, r in enumerate(ids)]) for name in _metric_names(report)]
    out.append(svg.forest(rows, title=f"Metric vector with intervals ({FEW_CLUSTERS_MARK} too few tasks for the "
                                      "interval)"))
    cmp = report.get("comparison")
    if cmp:
        alpha = report["settings"]["alpha"]
        crow = []
        for name, m in cmp["metrics"].items():
            if "alias_of" in m:  # a deprecated name of a metric already shown
                continue
            sig = m.get("p_holm") is not None and math.isfinite(m["p_holm"]) and m["p_holm"] < alpha
            crow.append((name, [_iv("diff" + (" *" if sig else "") + _mark(m), m, "#d62728" if sig else "#555",
                                    "diff")]))
        out.append(svg.forest(crow, title=f"{cmp['candidate']} - {cmp['baseline']} (paired; * p_holm < {alpha}; "
                              f"{FEW_CLUSTERS_MARK} too few tasks for the interval)", zero_line=True))
    dist = report.get("distributions", {})
    for key, label, title in (("episode_latency_s", "episode wall-clock seconds", "Episode latency CDF"),
                              ("tool_latency_ms", "tool-call latency (ms)", "Tool-call latency CDF")):
        series = [(r, dist.get(r, {}).get(key, []), _color(i)) for i, r in enumerate(ids)]
        out.append(svg.cdf(series, x_label=label, title=title))
    return out


_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px;color:#222}
h1{font-size:22px} h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f3f3f3} tr:nth-child(even) td{background:#fafafa}
.note{color:#666;font-size:12px;max-width:1100px} .meta{font-size:13px;color:#444}
.plots svg{display:block;margin:14px 0;border:1px solid #eee}
"""


def _html_table(t: TextTable) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{escape(v)}</td>" for v in r) + "</tr>" for r in t.rows)
    note = f'<p class="note">{escape(t.note)}</p>' if t.note else ""
    return f"<h2>{escape(t.title)}</h2><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}"


def render_html(report: dict[str, Any]) -> str:
    """A self-contained HTML page: inline CSS, inline SVG plots, the tables; no scripts or external links."""
    meta = "".join(f"<div>{escape(h)}</div>" for h in _header(report))
    figs = "".join(plots(report))
    tables = "".join(_html_table(t) for t in report_tables(report))
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<title>trajlake eval report</title>"
            f"<style>{_CSS}</style></head><body><h1>trajlake eval</h1><div class=\"meta\">{meta}</div>"
            f"<div class=\"plots\">{figs}</div>{tables}</body></html>\n")


# ------------------------------------------------------------------------------------------------ diagnose

_RESULT = {"yes": "YES", "no": "no", "not_checkable": "not checkable", "not_applicable": "not applicable"}


def diagnosis_lines(d: dict[str, Any]) -> list[str]:
    """The diagnosis as plain lines: the path with evidence, then the conclusion."""
    drop = d["dropped"]
    lines = [f"trajlake diagnose: {d['baseline']} (baseline) -> {d['candidate']} (candidate)",
             f"{d['n_pairs']} matched pairs; dropped {drop['baseline']['total']} baseline and "
             f"{drop['candidate']['total']} candidate episode(s); alpha {d['alpha']}",
             "read table versions: " + ", ".join(f"{t}={v}" for t, v in d["lake_versions"].items()),
             f"reproduce with: --as-of {d['as_of']}", ""]
    for i, node in enumerate(d["path"], 1):
        lines.append(f"{i}. [{_RESULT.get(node['result'], node['result'])}] {node['question']}")
        lines += [f"     {e}" for e in node["evidence"]]
    lines += ["", f"diagnosis: {d['diagnosis']}: {d['conclusion']}"]
    return lines


def print_diagnosis(d: dict[str, Any], console: Console | None = None) -> None:
    """The diagnosis on the terminal (:func:`diagnosis_lines`)."""
    con = console or Console(width=max(120, Console().width))
    for line in diagnosis_lines(d):
        con.print(line, highlight=False, markup=False, soft_wrap=True)


def render_diagnosis_markdown(d: dict[str, Any]) -> str:
    """The diagnosis as Markdown: the path as a numbered list with the evidence, then the conclusion."""
    lines = [f"# trajlake diagnose: {_md_escape(d['candidate'])} vs {_md_escape(d['baseline'])}", ""]
    body = diagnosis_lines(d)
    lines += [f"- {_md_escape(x)}" for x in body[1:4]] + [""]
    for i, node in enumerate(d["path"], 1):
        lines.append(f"{i}. **{_RESULT.get(node['result'], node['result'])}**: {_md_escape(node['question'])}")
        lines += [f"    - {_md_escape(e)}" for e in node["evidence"]]
    lines += ["", f"**Diagnosis: `{d['diagnosis']}`**: {_md_escape(d['conclusion'])}", ""]
    return "\n".join(lines)
