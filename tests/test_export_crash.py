"""Crash safety of ``trajlake export hf`` (issue 26, security round 3).

A kill at any step of ``--overwrite``'s swap leaves the complete old export or the complete new one in the folder,
never a mix, and the folder's own files (``.git``, notes) survive; a killed fresh export leaves nothing that blocks
the rerun. In-process kills raise :class:`_Kill` (a ``BaseException`` the exporter does not catch) at the N-th
file-system step, with the exporter's error handler disabled, which is what SIGKILL does; the slow test kills real
processes with SIGKILL.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from trajlake import Lake, LakeWriter, open_lake
from trajlake.demo import write_demo
from trajlake.errors import TrajlakeError
from trajlake.io import hf as hfmod
from trajlake.io.hf import export_hf

pytestmark = pytest.mark.security

USER_FILES = {".git/HEAD": "ref: refs/heads/main", "notes.txt": "keep me", ".gitattributes": "*.parquet lfs"}
Snapshot = tuple[frozenset[str], str, frozenset[str]]


class _Kill(BaseException):
    """An in-process SIGKILL: nothing in the exporter catches it (its error handler is switched off)."""


@pytest.fixture(scope="module")
def lake_v(tmp_path_factory: pytest.TempPathFactory) -> tuple[Lake, dict[str, int]]:
    """A small demo lake written twice: (lake, the versions after the first write)."""
    lk = open_lake(tmp_path_factory.mktemp("crash") / "lake", create=True)
    with LakeWriter(lk) as w:
        write_demo(w, seeds=1, n_tasks=4)
    first = lk.versions()
    with LakeWriter(lk) as w:
        write_demo(w, seeds=1, n_tasks=8)
    return lk, first


def _export(lake_v: tuple[Lake, dict[str, int]], out: Path, which: str, **kw: Any) -> Any:
    """The "old" export (two tables at the first versions) or the "new" one (one table, current versions)."""
    lake, first = lake_v
    if which == "old":
        return export_hf(lake, out, tables="episodes,runs", as_of=first, shard_rows=5, contamination=False, **kw)
    return export_hf(lake, out, tables="episodes", shard_rows=3, contamination=False, **kw)


def _snapshot(out: Path) -> Snapshot:
    """(data files, card without its timestamp, the pins every shard records): equal for exports of one kind."""
    files = frozenset(str(p.relative_to(out)) for p in (out / "data").rglob("*") if p.is_file()) \
        if (out / "data").is_dir() else frozenset()
    card = (out / "README.md").read_text() if (out / "README.md").is_file() else ""
    card = re.sub(r" at \d{4}-\d\d-\d\dT[\d:+]+\. ", " at T. ", card)
    pins = frozenset(pq.read_schema(out / f).metadata[b"trajlake.as_of"].decode() for f in files)
    return files, card, pins


@pytest.fixture(scope="module")
def refs(lake_v: tuple[Lake, dict[str, int]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Reference exports: ``old`` and ``new``, each in its own folder."""
    root = tmp_path_factory.mktemp("refs")
    out = {w: root / w for w in ("old", "new")}
    for w, p in out.items():
        _export(lake_v, p, w)
    assert _snapshot(out["old"]) != _snapshot(out["new"])
    assert len(_snapshot(out["new"])[0]) > 2 and _snapshot(out["old"])[2] != _snapshot(out["new"])[2]
    return out


def _which(out: Path, refs: dict[str, Path]) -> str:
    """``old`` or ``new``: the complete export the folder holds (fails on a mix or a missing folder)."""
    assert out.is_dir(), f"{out} is missing"
    snap = _snapshot(out)
    for w, ref in refs.items():
        if snap == _snapshot(ref):
            return w
    raise AssertionError(f"{out} holds a mix: {sorted(snap[0])} / pins {sorted(snap[2])}")


def _old_folder(out: Path, refs: dict[str, Path]) -> None:
    """``out`` holding the old export and the user's own files."""
    shutil.copytree(refs["old"], out)
    for rel, text in USER_FILES.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)


def _assert_user_files(out: Path) -> None:
    for rel, text in USER_FILES.items():
        assert (out / rel).read_text() == text, rel


def _assert_no_leftovers(out: Path) -> None:
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name], "staging left beside the folder"
    assert not [p for p in out.iterdir() if p.name.startswith(".trajlake")], "staging left in the folder"


def _arm(mp: pytest.MonkeyPatch, n: int, build: bool, error: bool = False) -> list[str]:
    """Raise :class:`_Kill` at the n-th rename, replace, rmtree or exchange (shard renames of the build count only
    when ``build``); returns the steps seen. The exporter's error handler only closes its lock, as the kernel
    does for a killed process. ``error``: raise an ``OSError`` instead and keep the handler (a failing disk)."""
    seen: list[str] = []

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def step(*a: Any, **kw: Any) -> Any:
            if not build and any(".parquet.tmp" in str(x) for x in a):
                return fn(*a, **kw)
            if error and kw.get("ignore_errors"):  # such a delete never raises
                return fn(*a, **kw)
            seen.append(f"{name}({', '.join(Path(str(x)).name for x in a)})")
            if len(seen) == n:
                if error:
                    raise OSError(errno.EIO, "Input/output error", str(a[0]))
                if name == "rmtree" and Path(a[0]).is_dir():  # killed halfway through the delete
                    victim = next((p for p in Path(a[0]).rglob("*") if p.is_file()), None)
                    if victim is not None:
                        victim.unlink()
                raise _Kill(seen[-1])
            return fn(*a, **kw)
        return step

    mp.setattr(os, "rename", wrap("rename", os.rename))
    mp.setattr(os, "replace", wrap("replace", os.replace))
    mp.setattr(shutil, "rmtree", wrap("rmtree", shutil.rmtree))
    if hasattr(hfmod, "_exchange"):  # (absent before the crash-safe swap)
        mp.setattr(hfmod, "_exchange", wrap("exchange", hfmod._exchange))
    if not error:
        mp.setattr(hfmod, "_cleanup_after_error", lambda place, stage, fd: os.close(fd), raising=False)
    return seen


def _kill_every_step(lake_v: tuple[Lake, dict[str, int]], refs: dict[str, Path], root: Path) -> list[str]:
    """Kill an ``--overwrite`` export at its 1st, 2nd, ... step until one finishes; after every kill the folder
    holds the old or the new export, and a rerun gives the new one with the user's files and no leftovers."""
    states: list[str] = []
    for n in range(1, 40):
        out = root / f"k{n}" / "out"
        _old_folder(out, refs)
        with pytest.MonkeyPatch.context() as m:
            seen = _arm(m, n, False)
            try:
                _export(lake_v, out, "new", overwrite=True)
                killed = False
            except _Kill:
                killed = True
            m.undo()
        if not out.exists():  # only between the two renames of the fallback: the rerun finishes the swap
            assert seen[-1].startswith("rename(.out.trajlake-export-"), seen
            states.append(f"{seen[-1]}: missing")
        else:
            states.append(f"{seen[-1] if seen else '-'}: {_which(out, refs)}")
        if not killed:
            break
        before = _which(out, refs) if out.exists() else "new"
        hfmod.recover_export(out)  # what a rerun (or any later export) does first: same export, files back
        assert _which(out, refs) == before
        _assert_user_files(out)
        _assert_no_leftovers(out)
        if n == 1:
            _export(lake_v, out, "new", overwrite=True)  # and a real rerun
            assert _which(out, refs) == "new"
            _assert_user_files(out)
    else:
        raise AssertionError("the export never finished")
    assert _which(out, refs) == "new" and not killed
    _assert_user_files(out)
    _assert_no_leftovers(out)
    kinds = [s.rsplit(": ", 1)[1] for s in states if not s.endswith(": missing")]
    assert kinds == sorted(kinds, key=lambda k: k == "new") and "old" in kinds, states  # old ... old, new ... new
    return states


def test_overwrite_killed_at_every_step_holds_old_or_new(lake_v: tuple[Lake, dict[str, int]],
                                                         refs: dict[str, Path], tmp_path: Path) -> None:
    states = _kill_every_step(lake_v, refs, tmp_path)
    assert any(s.startswith("exchange") for s in states) or sys.platform != "linux", states


@pytest.mark.slow
def test_overwrite_killed_at_every_step_without_rename_exchange(lake_v: tuple[Lake, dict[str, int]],
                                                                refs: dict[str, Path], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """File systems without an atomic exchange: two renames; a kill between them leaves no folder for an
    instant, and the next export (or ``recover_export``) finishes the swap."""
    monkeypatch.setattr(hfmod, "_exchange", lambda a, b: False, raising=False)  # e.g. NFS
    states = _kill_every_step(lake_v, refs, tmp_path)
    assert sum(s.startswith("rename(out") for s in states) == 1, states


def test_killed_between_the_two_renames_is_repaired_by_recover(lake_v: tuple[Lake, dict[str, int]],
                                                               refs: dict[str, Path], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "p" / "out"
    _old_folder(out, refs)
    monkeypatch.setattr(hfmod, "_exchange", lambda a, b: False, raising=False)  # e.g. NFS
    with pytest.MonkeyPatch.context() as m:
        seen = _arm(m, 99, False)
        _export(lake_v, out, "new", overwrite=True)
        m.undo()
    n = next(i for i, s in enumerate(seen, 1) if s.startswith("rename(.out.trajlake-export-"))
    shutil.rmtree(out.parent)
    _old_folder(out, refs)
    with pytest.MonkeyPatch.context() as m:
        _arm(m, n, False)
        with pytest.raises(_Kill):
            _export(lake_v, out, "new", overwrite=True)
        m.undo()
    assert not out.exists()  # the one instant without a folder
    hfmod.recover_export(out)
    assert _which(out, refs) == "new"
    _assert_user_files(out)
    _assert_no_leftovers(out)


def test_fresh_export_killed_does_not_block_the_rerun(lake_v: tuple[Lake, dict[str, int]], refs: dict[str, Path],
                                                      tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed while writing shards or while moving the result in: no folder or the complete export, and the
    rerun without --overwrite works."""
    for n in (1, 4, 99):  # the first shard, a later one, after the last step
        out = tmp_path / f"f{n}" / "out"
        with pytest.MonkeyPatch.context() as m:
            seen = _arm(m, n, True)
            with contextlib.suppress(_Kill):
                _export(lake_v, out, "new")
            m.undo()
        if n == 99:
            assert len(seen) > 4 and _which(out, refs) == "new"
            continue
        assert not out.exists()
        _export(lake_v, out, "new")  # no --overwrite needed
        assert _which(out, refs) == "new"
        _assert_no_leftovers(out)


def test_staging_of_an_older_version_does_not_block(lake_v: tuple[Lake, dict[str, int]], refs: dict[str, Path],
                                                    tmp_path: Path) -> None:
    """Older trajlake staged inside the folder (``.trajlake-export-XXXX``); a killed one is cleaned up."""
    out = tmp_path / "out"
    (out / ".trajlake-export-k2j4x9_a" / "data" / "episodes").mkdir(parents=True)
    (out / ".trajlake-export-k2j4x9_a" / "data" / "episodes" / ".train-00000.parquet.tmp").write_bytes(b"PAR1")
    _export(lake_v, out, "new")
    assert _which(out, refs) == "new"
    _assert_no_leftovers(out)


@pytest.fixture
def held_lock() -> Iterator[Callable[[Path], None]]:
    """``lock(folder)``: hold a folder's lock like a running export does."""
    fds: list[int] = []

    def lock(p: Path) -> None:
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fds.append(fd)

    yield lock
    for fd in fds:
        os.close(fd)


def test_running_exports_staging_is_left_alone(lake_v: tuple[Lake, dict[str, int]], refs: dict[str, Path],
                                               tmp_path: Path, held_lock: Callable[[Path], None]) -> None:
    """A locked staging folder belongs to an export still running: never deleted; unlocked ones are."""
    out = tmp_path / "p" / "out"
    live, dead = out.parent / ".out.trajlake-export-4242-0123abcd", out.parent / ".out.trajlake-export-4243-0123abce"
    other = out.parent / ".other.trajlake-export-4244-0123abcf"  # another folder's: not ours to judge
    for p in (live, dead, other):
        (p / "data").mkdir(parents=True)
    held_lock(live)
    _export(lake_v, out, "new")
    assert live.is_dir() and other.is_dir() and not dead.exists()
    assert _which(out, refs) == "new"


def test_swap_errors_are_one_line_and_keep_the_old_export(lake_v: tuple[Lake, dict[str, int]],
                                                          refs: dict[str, Path], tmp_path: Path) -> None:
    """An I/O error at any step of the swap: a one-line error naming the folder, which holds the old export
    and the user's files, with nothing left behind."""
    for n in range(1, 20):
        out = tmp_path / f"e{n}" / "out"
        _old_folder(out, refs)
        with pytest.MonkeyPatch.context() as m:
            _arm(m, n, False, error=True)
            try:
                _export(lake_v, out, "new", overwrite=True)
                failed = None
            except TrajlakeError as e:
                failed = str(e)
        if failed is None:
            assert n > 2 and _which(out, refs) == "new"
            break
        assert "\n" not in failed and str(out) in failed and "Input/output error" in failed and "rerun" in failed
        assert _which(out, refs) == "old", n
        _assert_user_files(out)
        _assert_no_leftovers(out)


def test_overwrite_keeps_the_folders_mode(lake_v: tuple[Lake, dict[str, int]], refs: dict[str, Path],
                                          tmp_path: Path) -> None:
    out = tmp_path / "p" / "out"
    _old_folder(out, refs)
    out.chmod(0o750)
    _export(lake_v, out, "new", overwrite=True)
    assert (out.stat().st_mode & 0o777) == 0o750 and _which(out, refs) == "new"
    _assert_user_files(out)


def test_in_place_swap_is_rolled_forward(lake_v: tuple[Lake, dict[str, int]], refs: dict[str, Path],
                                         tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder that cannot be renamed (a mount point): README.md and data/ are renamed in place; a kill
    between them is finished by the next export."""
    out = tmp_path / "p" / "out"
    real_ismount = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == out or real_ismount(p))
    _old_folder(out, refs)
    _export(lake_v, out, "new", overwrite=True)
    assert _which(out, refs) == "new" and out.is_dir()
    _assert_user_files(out)
    _assert_no_leftovers(out)
    shutil.rmtree(out.parent)
    _old_folder(out, refs)
    with pytest.MonkeyPatch.context() as m:
        _arm(m, 3, False)  # rmtree(spill), rename(data -> aside), rename(data -> out): killed before it
        with pytest.raises(_Kill):
            _export(lake_v, out, "new", overwrite=True)
        m.undo()
    hfmod.recover_export(out)
    assert _which(out, refs) == "new"
    _assert_user_files(out)
    _assert_no_leftovers(out)


_CHILD = textwrap.dedent("""
    import os, signal, sys
    from trajlake import open_lake
    from trajlake.io import hf

    lake, out, where = sys.argv[1], sys.argv[2], sys.argv[3]
    real_exchange, real_replace = getattr(hf, "_exchange", None), os.replace

    def exchange(a, b):
        if where == "after-exchange":
            real_exchange(a, b)
        os.kill(os.getpid(), signal.SIGKILL)

    def replace(a, b, **kw):
        if where == "build" and str(a).endswith(".parquet.tmp"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(a, b, **kw)

    hf._exchange, os.replace = exchange, replace
    hf.export_hf(open_lake(lake), out, tables="episodes", shard_rows=3, contamination=False,
                 overwrite=where != "build")
    sys.exit(3)  # not killed
""")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RENAME_EXCHANGE and SIGKILL points are Linux")
def test_sigkill_mid_export_real_process(lake_v: tuple[Lake, dict[str, int]], refs: dict[str, Path],
                                         tmp_path: Path) -> None:
    """Real processes killed by SIGKILL: during a fresh export's build, and just before / just after the
    exchange of an --overwrite export."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for where, expect in (("build", None), ("before-exchange", "old"), ("after-exchange", "new")):
        out = tmp_path / where / "out"
        if expect is not None:
            _old_folder(out, refs)
        r = subprocess.run([sys.executable, str(script), str(lake_v[0].root), str(out), where], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == -signal.SIGKILL, (where, r.returncode, r.stderr[-2000:])
        if expect is None:
            assert not out.exists()
            _export(lake_v, out, "new")  # the rerun: no --overwrite needed
        else:
            assert _which(out, refs) == expect, where
            _export(lake_v, out, "new", overwrite=True)
            _assert_user_files(out)
        assert _which(out, refs) == "new"
        _assert_no_leftovers(out)
