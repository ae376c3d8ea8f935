"""trajlake browse: the failing-episode HTML page (content, caps, self-containment, headless rendering)."""

from __future__ import annotations

import html as html_mod
import json
import re
import shutil
import struct
import subprocess
import urllib.parse
import zlib
from pathlib import Path
from typing import Any

import pytest
import typer
from trajlake.evaluators import data as eval_data
from trajlake.evaluators import sql
from trajlake.evaluators.browse import build_browser, embed_json
from typer.testing import CliRunner

from trajlake import Lake, connect
from trajlake.cli.browse_cmd import register

_DATA = re.compile(r'<script id="trajlake-data" type="application/json">(.*?)</script>', re.S)


def _page(path: Path) -> tuple[str, dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    m = _DATA.search(text)
    assert m, "no embedded JSON"
    return text, json.loads(m.group(1))


def _failing(lake: Lake, runs: list[str] | None = None) -> list[tuple[str, str, Any]]:
    """(episode_id, run_id, ended_at) of the failing episodes, most recent first."""
    con = connect(lake)
    try:
        where = "NOT success" + (f" AND run_id IN {sql.quote_list(runs)}" if runs else "")
        return [(str(a), str(b), c) for a, b, c in con.execute(
            f"SELECT episode_id, run_id, ended_at FROM episodes WHERE {where} "
            "ORDER BY ended_at DESC, episode_id").fetchall()]
    finally:
        con.close()


def _full_taxonomy(lake: Lake) -> dict[str, str]:
    """episode_id -> failure class, from taxonomy.sql over the whole lake (as trajlake eval runs it)."""
    ed = eval_data.load(lake)
    try:
        ed.materialise("t_tax", "taxonomy", {"runs": sql.quote_list(ed.runs)}, what="taxonomy")
        return {str(e): str(c) for e, c in ed.con.execute("SELECT episode_id, failure_class FROM t_tax").fetchall()}
    finally:
        ed.close()


@pytest.fixture(scope="module")
def page(demo_lake: Lake, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("browse") / "browse.html"
    build_browser(demo_lake, out)
    text, data = _page(out)
    return out, text, data


def test_page_is_self_contained_and_lists_failing_episodes(demo_lake: Lake, page: Any) -> None:
    _, text, data = page
    refs = re.findall(r'(?:src|href)\s*=\s*["\']?\s*(?:https?:)?//', text, re.I)
    assert refs == [], refs
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in text
    failing = _failing(demo_lake)
    assert failing, "the demo lake must have failing episodes"
    ids = [e["id"] for e in data["episodes"]]
    assert ids == [f[0] for f in failing]  # failing only, most recent first
    assert data["meta"]["n_failing"] == len(failing) == data["meta"]["n_shown"]
    assert f"showing {len(failing)} of {len(failing)}" not in text  # the note is rendered by the script


def test_class_counts_match_the_lake(demo_lake: Lake, page: Any) -> None:
    _, _, data = page
    full = _full_taxonomy(demo_lake)
    counts: dict[str, int] = {}
    for e in data["episodes"]:
        assert e["class"] == full[e["id"]], e["id"]
        counts[e["class"]] = counts.get(e["class"], 0) + 1
    expected: dict[str, int] = {}
    for c in full.values():
        expected[c] = expected.get(c, 0) + 1
    assert counts == expected
    con = connect(demo_lake)
    try:
        err = dict(con.execute("SELECT coalesce(error_class, '(none)'), count(*) FROM episodes WHERE NOT success "
                               "GROUP BY 1").fetchall())
    finally:
        con.close()
    assert data["meta"]["error_counts_all"] == err
    shown_err: dict[str, int] = {}
    for e in data["episodes"]:
        shown_err[e["error_class"]] = shown_err.get(e["error_class"], 0) + 1
    assert shown_err == err
    # Every turn of every shown episode, with its gateway decisions.
    con = connect(demo_lake)
    try:
        n_turns = con.execute("SELECT count(*) FROM turns WHERE episode_id IN (SELECT episode_id FROM episodes "
                              "WHERE NOT success)").fetchone()
        n_events = con.execute("SELECT count(*) FROM gateway_events WHERE episode_id IN (SELECT episode_id "
                               "FROM episodes WHERE NOT success)").fetchone()
    finally:
        con.close()
    assert n_turns is not None and n_events is not None
    assert sum(len(v) for v in data["turns"].values()) == n_turns[0]
    assert sum(len(t["events"]) for v in data["turns"].values() for t in v) == n_events[0]
    assert {x["decision"] for v in data["turns"].values() for t in v for x in t["events"]} >= {"allow"}
    policy = [t for v in data["turns"].values() for t in v if t["actor"] == "policy"]
    assert policy and all(t["mask_ones"] == t["mask_len"] == t["tokens"] for t in policy)


def test_caps_and_run_filter(demo_lake: Lake, tmp_path: Path) -> None:
    out = tmp_path / "small.html"
    s = build_browser(demo_lake, out, runs=["demo-B0"], max_episodes=3, max_chars=8)
    _, data = _page(out)
    failing = _failing(demo_lake, ["demo-B0"])
    assert s.n_shown == 3 and s.n_failing == len(failing) > 3
    assert [e["id"] for e in data["episodes"]] == [f[0] for f in failing[:3]]
    assert set(data["turns"]) == {f[0] for f in failing[:3]}
    turns = [t for v in data["turns"].values() for t in v]
    assert all(t["text"] is None or len(t["text"]) <= 8 for t in turns)
    assert any(t["text_cut"] for t in turns)
    assert all(t["args"] is None or len(t["args"]) <= 8 for t in turns)


def test_embedded_json_cannot_close_the_script() -> None:
    text = embed_json({"x": "</script><script>alert(1)</script> & <!-- \u2028"})
    assert "</" not in text and "<!--" not in text and "<" not in text
    assert json.loads(text) == {"x": "</script><script>alert(1)</script> & <!-- \u2028"}


def test_cli(demo_lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJLAKE_LAKE", str(demo_lake.root))  # the lake a command uses without --lake
    app = typer.Typer()
    register(app)
    register(app)  # idempotent

    @app.command("noop")
    def _noop() -> None:  # a second command keeps typer from collapsing the app into one command
        pass

    out = tmp_path / "cli.html"
    res = CliRunner().invoke(app, ["browse", "--out", str(out), "--run", "demo-R1", "--max-episodes", "2"])
    assert res.exit_code == 0, res.output
    _, data = _page(out)
    assert data["meta"]["runs"] == ["demo-R1"] and data["meta"]["n_shown"] == 2
    res = CliRunner().invoke(app, ["browse", "--out", str(out), "--run", "nope"])
    assert res.exit_code != 0
    assert "unknown run id(s): nope" in str(res.exception)


def _png_pixels(path: Path) -> bytes:
    """Decompressed image data of a PNG (filter bytes included): enough to tell a blank image."""
    blob = path.read_bytes()
    assert blob[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(blob):
        (length,) = struct.unpack(">I", blob[pos:pos + 4])
        kind = blob[pos + 4:pos + 8]
        if kind == b"IDAT":
            idat += blob[pos + 8:pos + 8 + length]
        pos += 12 + length
    return zlib.decompress(idat)


_CHROMIUM = shutil.which("chromium") or ""


@pytest.mark.skipif(not _CHROMIUM, reason="chromium not installed (apt-get install -y chromium): "
                    "headless rendering of the browse page not checked")
def test_headless_chromium_renders_episode(page: Any, tmp_path: Path) -> None:
    out, _, data = page
    ep = next(e for e in data["episodes"]
              if any(t["events"] for t in data["turns"][e["id"]]))
    url = out.resolve().as_uri() + "#episode=" + urllib.parse.quote(ep["id"], safe="")

    def chromium(*args: str) -> subprocess.CompletedProcess[str]:
        profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
        profile.mkdir()
        return subprocess.run(
            [_CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args, url],
            capture_output=True, text=True, timeout=60, check=False)

    res = chromium("--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    dom = res.stdout
    # What a person sees: the note, the list of failing episodes, class names, the episode's turns.
    n = data["meta"]["n_shown"]
    assert f'id="note">showing {n} of {data["meta"]["n_failing"]} failing episodes' in dom
    assert dom.count('class="ep') >= n
    for cls in {e["class"] for e in data["episodes"]}:
        assert f"{cls} \u2014 " in dom  # group headings
    title = re.search(r'id="episode-title"[^>]*>([^<]*)<', dom)
    assert title and html_mod.unescape(title.group(1)) == ep["id"]
    assert dom.count('class="turn ') == len(data["turns"][ep["id"]])
    assert 'class="gw-event"' in dom
    assert re.search(r'class="badge b-(allow|deny|modify|confirm)">(allow|deny|modify|confirm)<', dom)

    shot = tmp_path / "shot.png"
    res = chromium(f"--screenshot={shot}", "--window-size=1280,900")
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    assert shot.stat().st_size > 20_000
    try:
        from PIL import Image
    except ImportError:
        pixels = _png_pixels(shot)
        assert len(set(pixels[:: 97])) > 16, "screenshot looks blank"
    else:
        with Image.open(shot) as im:
            assert im.size == (1280, 900)
            colors = im.convert("RGB").getcolors(maxcolors=1 << 20)
            assert colors is None or len(colors) > 16, "screenshot looks blank"
