"""``trajlake browse``: a self-contained HTML page for browsing failing episodes and their turns.

The page lists the failing episodes (``success = false``) of the selected runs, grouped by failure-taxonomy
class (``evaluators/taxonomy.sql``, the same rules as ``trajlake eval``) and by error class, with filters (run,
taxonomy class, error class, text search on episode/task id), and a turn-by-turn view of one episode: text,
tool calls with the gateway decisions of each turn, statuses, loss masks and rewards.

It stays small and fast on big lakes because it queries only what it shows:

* the failing-episode index is capped at ``max_episodes`` (most recent ``ended_at`` first); the total number
  of failing episodes is counted (one aggregate over ``episodes``) and shown as "showing N of M";
* the taxonomy (``episode_metrics.sql`` + ``taxonomy.sql``) runs only over the shown episodes: the views
  ``episodes``, ``turns`` and ``gateway_events`` are shadowed by temporary views restricted to them, so the
  SQL rules are reused unchanged (they are per-episode, so a subset classifies exactly as the full lake does);
* turn details and gateway events are read only for the shown episodes, text capped at ``max_chars`` per turn,
  loss masks reduced in SQL to counts.

The data is embedded as JSON in a ``<script type="application/json">`` tag (``<``, ``>`` and ``&`` escaped as
``\\u003c`` etc., so no ``</script>`` can end it early). Opening ``FILE.html#episode=<id>`` shows that episode's
turns on load.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
from trajlake.evaluators import sql
from trajlake.schemas.vocab import Decision, TaxonomyClass

from trajlake.errors import QueryError, TrajlakeError
from trajlake.lake.store import LakeArg
from trajlake.query import connect, lake_versions

__all__ = ["TAXONOMY_CLASSES", "BrowseSummary", "build_browser", "collect", "render_html"]

#: Failure classes of taxonomy.sql in rule order.
TAXONOMY_CLASSES: tuple[str, ...] = tuple(TaxonomyClass)

#: Tables shadowed by temporary views restricted to the shown episodes while the taxonomy runs.
_SHADOWED = ("episodes", "turns", "gateway_events")


@dataclass(frozen=True)
class BrowseSummary:
    """What :func:`build_browser` wrote."""

    out: Path
    runs: list[str]
    as_of: str
    n_failing: int
    n_shown: int
    n_turns: int
    n_gateway_events: int
    html_bytes: int
    seconds: float
    class_counts: dict[str, int] = field(default_factory=dict)
    error_counts: dict[str, int] = field(default_factory=dict)


def _q(value: str) -> str:
    return sql.quote(value)


def _qlist(values: list[str]) -> str:
    return "(" + (", ".join(_q(v) for v in values) if values else "NULL") + ")"


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    return str(value)


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


def _rows(con: duckdb.DuckDBPyConnection, query: str, what: str) -> list[dict[str, Any]]:
    try:
        cur = con.execute(query)
        names = [d[0] for d in cur.description or []]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    except duckdb.Error as e:
        raise QueryError(f"{what} failed: {str(e).splitlines()[0]}") from e


def _select_runs(con: duckdb.DuckDBPyConnection, runs: list[str] | None) -> list[str]:
    from trajlake.evaluators.data import list_runs, select_runs

    return select_runs(list_runs(con), runs)


def _taxonomy(con: duckdb.DuckDBPyConnection, runs_sql: str) -> dict[str, tuple[str, str, str]]:
    """episode_id -> (failure_class, attribution, rule) for the episodes of ``browse_shown``."""
    from trajlake.evaluators import sql

    db = con.execute("SELECT current_database()").fetchone()
    catalog = str(db[0]) if db else "memory"
    try:
        for name in _SHADOWED:
            # Temporary views shadow the connection's views; the catalog-qualified name reaches the original.
            con.execute(f'CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM "{catalog}".main.{name} '
                        f"WHERE run_id IN {runs_sql} AND episode_id IN (SELECT episode_id FROM browse_shown)")
        con.execute("CREATE OR REPLACE TEMP TABLE eval_episode_metrics AS "
                    + sql.render("episode_metrics", {"runs": runs_sql}))
        rows = con.execute(sql.render("taxonomy", {"runs": runs_sql})).fetchall()
    except duckdb.Error as e:
        raise QueryError(f"failure taxonomy (taxonomy.sql) failed: {str(e).splitlines()[0]}") from e
    finally:
        for name in _SHADOWED:
            con.execute(f"DROP VIEW IF EXISTS temp.main.{name}")
    return {str(r[1]): (str(r[3]), str(r[2]), str(r[4])) for r in rows}


def collect(lake: LakeArg, *, runs: list[str] | None = None,
            as_of: str | dict[str, int] | None = None, max_episodes: int = 500,
            max_chars: int = 4000) -> dict[str, Any]:
    """The data of the page (what is embedded as JSON): ``meta``, ``episodes`` (the shown failing episodes,
    most recent first) and ``turns`` (episode_id -> turns with their gateway events)."""
    if max_episodes < 1:
        raise TrajlakeError(f"--max-episodes must be at least 1, not {max_episodes}")
    if max_chars < 1:
        raise TrajlakeError(f"--max-chars must be at least 1, not {max_chars}")
    con = connect(lake, as_of)
    try:
        versions = lake_versions(con)
        selected = _select_runs(con, runs)
        runs_sql = _qlist(selected)
        failing = f"run_id IN {runs_sql} AND NOT success"
        err_all = _rows(con, "SELECT coalesce(error_class, '(none)') AS error_class, count(*) AS n "
                        f"FROM episodes WHERE {failing} GROUP BY 1 ORDER BY 2 DESC, 1", "counting failing episodes")
        n_failing = sum(int(r["n"]) for r in err_all)
        try:
            con.execute(
                "CREATE TEMP TABLE browse_shown AS SELECT episode_id, run_id, task_id, task_version, split, "
                "env_id, env_version, started_at, ended_at, n_turns, termination_reason, error_class, "
                "reward_total, reward_components, tokens_in, tokens_out, cost_usd, wall_seconds, "
                f"faults_injected FROM episodes WHERE {failing} "
                f"ORDER BY ended_at DESC, episode_id LIMIT {int(max_episodes)}")
        except duckdb.Error as e:
            raise QueryError(f"selecting failing episodes failed: {str(e).splitlines()[0]}") from e
        taxonomy = _taxonomy(con, runs_sql)
        shown = _rows(con, "SELECT * FROM browse_shown ORDER BY ended_at DESC, episode_id", "reading episodes")
        in_shown = f"run_id IN {runs_sql} AND episode_id IN (SELECT episode_id FROM browse_shown)"
        mc = int(max_chars)
        turn_rows = _rows(con, (
            "SELECT episode_id, turn_idx, role, actor, status, policy_version, "
            f"left(raw_content, {mc}) AS text, length(raw_content) AS text_len, action_schema, "
            f"left(tool_args, {mc}) AS tool_args, length(tool_args) AS args_len, tool_call_id, tokens, "
            "len(loss_mask) AS mask_len, "
            "coalesce(list_sum(list_transform(loss_mask, x -> CAST(x AS INTEGER))), 0) AS mask_ones, "
            "latency_ms, tool_seconds, cost_usd, fault_injected, reward_components "
            f"FROM turns WHERE {in_shown} ORDER BY episode_id, turn_idx"), "reading turns")
        event_rows = _rows(con, (
            "SELECT episode_id, turn_idx, event_idx, tool, capability, decision, reason, executed "
            f"FROM gateway_events WHERE {in_shown} ORDER BY episode_id, turn_idx, event_idx"),
            "reading gateway events")
    finally:
        con.close()

    events: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for ev in event_rows:
        events.setdefault((str(ev["episode_id"]), int(ev["turn_idx"])), []).append({
            "tool": ev["tool"], "capability": ev["capability"], "decision": ev["decision"],
            "reason": ev["reason"], "executed": bool(ev["executed"])})
    turns: dict[str, list[dict[str, Any]]] = {}
    for t in turn_rows:
        eid, idx = str(t["episode_id"]), int(t["turn_idx"])
        text_len = t["text_len"]
        args_len = t["args_len"]
        turns.setdefault(eid, []).append({
            "idx": idx, "role": t["role"], "actor": t["actor"], "status": t["status"],
            "policy_version": t["policy_version"], "text": t["text"],
            "text_cut": bool(text_len is not None and text_len > mc), "text_len": text_len,
            "tool": t["action_schema"], "args": t["tool_args"],
            "args_cut": bool(args_len is not None and args_len > mc), "call_id": t["tool_call_id"],
            "tokens": t["tokens"], "mask_len": t["mask_len"], "mask_ones": int(t["mask_ones"]),
            "latency_ms": _num(t["latency_ms"]), "tool_seconds": _num(t["tool_seconds"]),
            "cost_usd": _num(t["cost_usd"]), "fault": t["fault_injected"],
            "rewards": {str(k): float(v) for k, v in (t["reward_components"] or {}).items()},
            "events": events.get((eid, idx), []),
        })
    episodes: list[dict[str, Any]] = []
    for row in shown:
        eid = str(row["episode_id"])
        cls, attribution, rule = taxonomy.get(eid, ("unclassified", "unknown", ""))
        ev_all = [x for t in turns.get(eid, []) for x in t["events"]]
        episodes.append({
            "id": eid, "run": row["run_id"], "task": row["task_id"], "task_version": row["task_version"],
            "split": row["split"], "env": f"{row['env_id']}@{row['env_version']}",
            "started_at": _iso(row["started_at"]), "ended_at": _iso(row["ended_at"]), "n_turns": row["n_turns"],
            "termination_reason": row["termination_reason"], "error_class": row["error_class"] or "(none)",
            "class": cls, "attribution": attribution, "rule": rule,
            "reward_total": _num(row["reward_total"]),
            "rewards": {str(k): float(v) for k, v in (row["reward_components"] or {}).items()},
            "tokens_in": row["tokens_in"], "tokens_out": row["tokens_out"], "cost_usd": _num(row["cost_usd"]),
            "wall_seconds": _num(row["wall_seconds"]), "faults": row["faults_injected"],
            "denials": sum(1 for x in ev_all if x["decision"] in (Decision.DENY, Decision.CONFIRM)),
        })
    as_of_str = ",".join(f"{t}={v}" for t, v in sorted(versions.items()))
    return {
        "meta": {
            "generated_at": _iso(dt.datetime.now(dt.UTC)), "as_of": as_of_str, "runs": selected,
            "n_failing": n_failing, "n_shown": len(episodes), "max_episodes": int(max_episodes),
            "max_chars": mc, "classes": list(TAXONOMY_CLASSES),
            "error_counts_all": {str(r["error_class"]): int(r["n"]) for r in err_all},
        },
        "episodes": episodes,
        "turns": turns,
    }


def embed_json(data: Any) -> str:
    """``data`` as JSON safe inside a ``<script>`` element (``<``, ``>``, ``&`` and U+2028/9 escaped)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str)
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def render_html(data: dict[str, Any]) -> str:
    """The self-contained page (inline CSS and JS, no external URL) for ``data`` from :func:`collect`."""
    return _TEMPLATE.replace("/*DATA*/", embed_json(data))


def build_browser(lake: LakeArg, out: str | os.PathLike[str], *,
                  runs: list[str] | None = None, as_of: str | dict[str, int] | None = None,
                  max_episodes: int = 500, max_chars: int = 4000) -> BrowseSummary:
    """Write the failing-episode browser of ``lake`` to ``out`` and return what it holds.

    ``runs`` restricts to those run ids (default: every run; unknown ids raise
    :class:`trajlake.evaluators.data.UnknownRunError`), ``as_of`` pins table versions like ``trajlake eval``,
    ``max_episodes`` caps the failing-episode index (most recent first) and ``max_chars`` the text and tool
    arguments of each turn."""
    t0 = time.perf_counter()
    path = Path(out)
    # a mistyped --out must not create a folder tree (nor cost the whole collection first)
    if not path.parent.is_dir():
        raise TrajlakeError(f"--out {path}: the folder {path.parent} does not exist; create it first")
    if path.is_dir():
        raise TrajlakeError(f"--out {path}: is a folder; give the HTML file to write")
    data = collect(lake, runs=runs, as_of=as_of, max_episodes=max_episodes, max_chars=max_chars)
    html = render_html(data)
    try:
        path.write_text(html, encoding="utf-8")
    except OSError as e:
        raise TrajlakeError(f"cannot write {path}: {e.strerror or e}") from e
    class_counts: dict[str, int] = {}
    error_counts: dict[str, int] = {}
    for ep in data["episodes"]:
        class_counts[ep["class"]] = class_counts.get(ep["class"], 0) + 1
        error_counts[ep["error_class"]] = error_counts.get(ep["error_class"], 0) + 1
    meta = data["meta"]
    return BrowseSummary(
        out=path, runs=list(meta["runs"]), as_of=str(meta["as_of"]), n_failing=int(meta["n_failing"]),
        n_shown=int(meta["n_shown"]), n_turns=sum(len(v) for v in data["turns"].values()),
        n_gateway_events=sum(len(t["events"]) for v in data["turns"].values() for t in v),
        html_bytes=len(html.encode("utf-8")), seconds=time.perf_counter() - t0,
        class_counts=class_counts, error_counts=error_counts)


_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>trajlake browse: failing episodes</title>
<style>
*{box-sizing:border-box}
body{margin:0;font:13px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d232b;background:#f4f5f7}
header{background:#1f2d3d;color:#fff;padding:10px 16px}
header h1{font-size:17px;margin:0 0 2px}
header .sub{color:#c4d0dc;font-size:12px}
#note{font-weight:600;color:#ffd479}
main{display:flex;height:calc(100vh - 58px)}
#side{width:440px;min-width:320px;border-right:1px solid #d5d9df;background:#fff;display:flex;flex-direction:column}
#filters{padding:8px;border-bottom:1px solid #e3e6ea;display:grid;grid-template-columns:1fr 1fr;gap:6px}
#filters label{font-size:11px;color:#5a6672;display:flex;flex-direction:column}
#filters select,#filters input{font:inherit;padding:3px 4px;border:1px solid #c3c9d0;border-radius:3px}
#summary{padding:6px 8px;border-bottom:1px solid #e3e6ea;font-size:12px}
#summary table{border-collapse:collapse;width:100%}
#summary td,#summary th{padding:1px 4px;text-align:left}
#summary td.n{text-align:right;font-variant-numeric:tabular-nums}
#summary tr.click{cursor:pointer}
#summary tr.click:hover{background:#eef3fb}
#list{overflow:auto;flex:1}
.group h3{margin:0;padding:5px 8px;font-size:12px;background:#eef1f4;border-bottom:1px solid #e0e4e8;position:sticky;top:0}
.ep{padding:4px 8px;border-bottom:1px solid #f0f1f3;cursor:pointer}
.ep:hover{background:#f5f8fc}
.ep.sel{background:#dbe8fb}
.ep .id{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
.ep .m{color:#5a6672;font-size:11px}
#view{flex:1;overflow:auto;padding:12px 16px}
.badge{display:inline-block;padding:0 6px;border-radius:9px;font-size:11px;background:#e3e7ec;margin-right:3px}
.b-OK{background:#dff3e3;color:#1d6b2c}.b-bad{background:#fde2e1;color:#9b1c14}
.b-allow{background:#dff3e3;color:#1d6b2c}.b-deny,.b-confirm{background:#fde2e1;color:#9b1c14}.b-modify{background:#fff0c8;color:#7a5600}
.cls{background:#e6e0f8;color:#43307a}
table.kv td{padding:1px 8px 1px 0;vertical-align:top}
table.kv td:first-child{color:#5a6672}
.turn{background:#fff;border:1px solid #dde1e6;border-radius:5px;margin:8px 0;padding:6px 10px}
.turn.policy{border-left:4px solid #3b6fd4}.turn.env{border-left:4px solid #8a96a3}
.turn.err{border-left:4px solid #d23b2f}
.turn .hd{display:flex;flex-wrap:wrap;gap:6px;align-items:center;font-size:12px;color:#3a4550}
.turn pre{white-space:pre-wrap;word-break:break-word;margin:5px 0;background:#f7f8fa;padding:5px;border-radius:3px;font:12px/1.35 ui-monospace,Menlo,Consolas,monospace;max-height:320px;overflow:auto}
.call{font-size:12px;margin:4px 0}
.call code{font-family:ui-monospace,Menlo,Consolas,monospace}
table.gw{border-collapse:collapse;font-size:12px;margin:3px 0}
table.gw td,table.gw th{border:1px solid #e0e3e7;padding:1px 6px;text-align:left}
.muted{color:#7b8793}
.cut{color:#a05a00;font-size:11px}
</style>
</head>
<body>
<header>
<h1>trajlake browse: failing episodes</h1>
<div class="sub"><span id="note"></span> <span id="meta"></span></div>
</header>
<main>
<section id="side">
<div id="filters">
<label>Run<select id="f-run"></select></label>
<label>Taxonomy class<select id="f-class"></select></label>
<label>Error class<select id="f-error"></select></label>
<label>Group by<select id="f-group"><option value="class">taxonomy class</option><option value="error_class">error class</option></select></label>
<label style="grid-column:1 / span 2">Search episode / task id<input id="f-text" type="search" placeholder="substring of episode or task id"></label>
</div>
<div id="summary"></div>
<div id="list"></div>
</section>
<section id="view"><p class="muted">Select a failing episode to see its turns.</p></section>
</main>
<script id="trajlake-data" type="application/json">/*DATA*/</script>
<script>
(function(){
"use strict";
var D=JSON.parse(document.getElementById("trajlake-data").textContent);
var M=D.meta, EPS=D.episodes, TURNS=D.turns, BYID={};
EPS.forEach(function(e){BYID[e.id]=e;});
var current=null;
function el(tag,attrs,kids){var n=document.createElement(tag);if(attrs){for(var k in attrs){if(k==="text")n.textContent=attrs[k];else if(k==="cls")n.className=attrs[k];else n.setAttribute(k,attrs[k]);}}(kids||[]).forEach(function(c){if(c!=null)n.appendChild(typeof c==="string"?document.createTextNode(c):c);});return n;}
function badge(text,extra){return el("span",{cls:"badge "+(extra||""),text:String(text)});}
function fmt(x,d){return x==null?"-":(typeof x==="number"?x.toFixed(d==null?3:d):String(x));}
function uniq(key){var s={};EPS.forEach(function(e){s[e[key]]=(s[e[key]]||0)+1;});return s;}
function fillSelect(id,counts,order){var s=document.getElementById(id);s.appendChild(el("option",{value:"",text:"(all)"}));var keys=order?order.filter(function(k){return counts[k];}):Object.keys(counts).sort();Object.keys(counts).forEach(function(k){if(keys.indexOf(k)<0)keys.push(k);});keys.forEach(function(k){s.appendChild(el("option",{value:k,text:k+" ("+counts[k]+")"}));});}
document.getElementById("note").textContent="showing "+M.n_shown+" of "+M.n_failing+" failing episodes"+(M.n_shown<M.n_failing?" (most recent first; raise --max-episodes for more)":"");
document.getElementById("meta").textContent="runs: "+M.runs.join(", ")+" \u00b7 as of "+M.as_of+" \u00b7 generated "+M.generated_at+" \u00b7 text capped at "+M.max_chars+" chars/turn";
fillSelect("f-run",uniq("run"));fillSelect("f-class",uniq("class"),M.classes);fillSelect("f-error",uniq("error_class"));
var F={run:document.getElementById("f-run"),cls:document.getElementById("f-class"),err:document.getElementById("f-error"),group:document.getElementById("f-group"),text:document.getElementById("f-text")};
function filtered(){var r=F.run.value,c=F.cls.value,x=F.err.value,t=F.text.value.trim().toLowerCase();return EPS.filter(function(e){return(!r||e.run===r)&&(!c||e["class"]===c)&&(!x||e.error_class===x)&&(!t||e.id.toLowerCase().indexOf(t)>=0||e.task.toLowerCase().indexOf(t)>=0);});}
function countTable(title,key,order,eps,sel){var c={};eps.forEach(function(e){c[e[key]]=(c[e[key]]||0)+1;});var keys=(order||[]).filter(function(k){return c[k];});Object.keys(c).sort().forEach(function(k){if(keys.indexOf(k)<0)keys.push(k);});var tb=el("table",null,[el("tr",null,[el("th",{text:title}),el("th",{text:"n"})])]);keys.forEach(function(k){var tr=el("tr",{cls:"click",title:"filter on "+k},[el("td",null,[badge(k,key==="class"?"cls":"")]),el("td",{cls:"n",text:String(c[k])})]);tr.addEventListener("click",function(){sel.value=(sel.value===k?"":k);refresh();});tb.appendChild(tr);});return tb;}
function refresh(){var eps=filtered();var sum=document.getElementById("summary");sum.textContent="";
var wrap=el("div",{style:"display:flex;gap:12px"},[countTable("taxonomy class","class",M.classes,eps,F.cls),countTable("error class","error_class",null,eps,F.err)]);
sum.appendChild(el("div",{cls:"muted",text:eps.length+" episode(s) match the filters"}));sum.appendChild(wrap);
var list=document.getElementById("list");list.textContent="";var key=F.group.value,groups={},order=[];
eps.forEach(function(e){var g=e[key];if(!groups[g]){groups[g]=[];order.push(g);}groups[g].push(e);});
if(key==="class"){order.sort(function(a,b){return M.classes.indexOf(a)-M.classes.indexOf(b);});}else{order.sort();}
order.forEach(function(g){var box=el("div",{cls:"group"},[el("h3",{text:g+" \u2014 "+groups[g].length})]);
groups[g].forEach(function(e){var row=el("div",{cls:"ep"+(current===e.id?" sel":""),"data-id":e.id},[el("div",{cls:"id",text:e.id}),el("div",{cls:"m",text:e.run+" \u00b7 "+e.task+" \u00b7 "+(key==="class"?e.error_class:e["class"])+" \u00b7 "+e.termination_reason+" \u00b7 "+e.n_turns+" turns \u00b7 reward "+fmt(e.reward_total,2)})]);
row.addEventListener("click",function(){location.hash="episode="+encodeURIComponent(e.id);});box.appendChild(row);});list.appendChild(box);});
if(!eps.length)list.appendChild(el("p",{cls:"muted",style:"padding:8px",text:"No failing episode matches the filters."}));}
function kv(rows){var t=el("table",{cls:"kv"});rows.forEach(function(r){t.appendChild(el("tr",null,[el("td",{text:r[0]}),el("td",null,[r[1] instanceof Node?r[1]:String(r[1])])]));});return t;}
function rewards(o){var k=Object.keys(o||{});return k.length?k.map(function(n){return n+"="+fmt(o[n],3);}).join(", "):"-";}
function show(id){var v=document.getElementById("view");v.textContent="";current=id;
document.querySelectorAll(".ep").forEach(function(n){n.classList.toggle("sel",n.getAttribute("data-id")===id);});
var e=BYID[id];if(!e){v.appendChild(el("p",{cls:"muted",text:"Episode "+id+" is not among the "+M.n_shown+" failing episodes shown on this page."}));return;}
document.title="trajlake browse: "+id;
v.appendChild(el("h2",{id:"episode-title",style:"margin:0 0 6px;font-size:16px;word-break:break-all",text:e.id}));
v.appendChild(kv([["run",e.run],["task",e.task+" ("+e.task_version+", "+e.split+")"],["environment",e.env],["taxonomy class",el("span",null,[badge(e["class"],"cls"),e.attribution+" \u2014 "+e.rule])],["error class",e.error_class],["termination",e.termination_reason],["reward",fmt(e.reward_total,3)+"  ("+rewards(e.rewards)+")"],["tokens in / out",e.tokens_in+" / "+e.tokens_out],["cost / wall",fmt(e.cost_usd,4)+" USD / "+fmt(e.wall_seconds,1)+" s"],["faults injected",e.faults],["gateway denials",e.denials],["started / ended",e.started_at+" / "+e.ended_at]]));
var turns=TURNS[id]||[];v.appendChild(el("h3",{style:"margin:12px 0 0;font-size:14px",text:turns.length+" turn(s)"}));
turns.forEach(function(t){var bad=t.status!=="OK";var box=el("div",{cls:"turn "+(t.actor==="policy"?"policy":"env")+(bad?" err":""),id:"turn-"+t.idx});
var mask=t.mask_len==null?"no tokens":(t.mask_ones+"/"+t.mask_len+" mask-1");
box.appendChild(el("div",{cls:"hd"},[el("b",{text:"#"+t.idx}),badge(t.role),badge(t.actor),badge(t.status,bad?"b-bad":"b-OK"),el("span",{text:t.tokens+" tok \u00b7 "+mask+" \u00b7 "+fmt(t.latency_ms,0)+" ms"+(t.tool_seconds?" \u00b7 tool "+fmt(t.tool_seconds,2)+" s":"")}),t.fault?badge("fault: "+t.fault,"b-bad"):null,t.policy_version?el("span",{cls:"muted",text:t.policy_version}):null,Object.keys(t.rewards).length?el("span",{text:"reward "+rewards(t.rewards)}):null]));
if(t.text!=null){box.appendChild(el("pre",{cls:"text",text:t.text}));if(t.text_cut)box.appendChild(el("div",{cls:"cut",text:"\u2026 cut at "+M.max_chars+" of "+t.text_len+" chars"}));}
if(t.tool){box.appendChild(el("div",{cls:"call"},["tool call ",el("code",{text:t.tool}),t.call_id?el("span",{cls:"muted",text:" ["+t.call_id+"]"}):null," args ",el("code",{text:t.args==null?"-":t.args}),t.args_cut?el("span",{cls:"cut",text:" \u2026 cut"}):null]));}
else if(t.call_id){box.appendChild(el("div",{cls:"call muted",text:"observation of "+t.call_id}));}
if(t.events.length){var g=el("table",{cls:"gw"},[el("tr",null,[el("th",{text:"gateway"}),el("th",{text:"tool"}),el("th",{text:"capability"}),el("th",{text:"reason"}),el("th",{text:"executed"})])]);
t.events.forEach(function(x){g.appendChild(el("tr",{cls:"gw-event"},[el("td",null,[badge(x.decision,"b-"+x.decision)]),el("td",{text:x.tool}),el("td",{text:x.capability}),el("td",{text:x.reason==null?"-":x.reason}),el("td",{text:x.executed?"yes":"no"})]));});box.appendChild(g);}
v.appendChild(box);});v.scrollTop=0;}
function fromHash(){var m=/(?:^#|&)episode=([^&]*)/.exec(location.hash);if(m){var id;try{id=decodeURIComponent(m[1]);}catch(err){id=m[1];}show(id);}}
[F.run,F.cls,F.err,F.group].forEach(function(s){s.addEventListener("change",refresh);});F.text.addEventListener("input",refresh);
window.addEventListener("hashchange",fromHash);
refresh();fromHash();
})();
</script>
</body>
</html>
"""
