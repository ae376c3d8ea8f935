"""The notebooks run top to bottom on a small generated lake and print what they should."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("matplotlib")
pytest.importorskip("ipykernel")

from trajlake import LakeWriter, open_lake  # noqa: E402
from trajlake.demo import write_demo  # noqa: E402

NB = Path(__file__).resolve().parents[1] / "notebooks"


def _run(name: str, env: dict[str, str], cwd: Path) -> str:
    nb = nbformat.read(NB / name, as_version=4)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", out
            texts.append(out.get("text", ""))
    return "".join(texts)


@pytest.fixture(scope="module")
def nb_lake(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("nb") / "lake"
    with LakeWriter(open_lake(path, create=True), handle_signals=False) as w:
        write_demo(w, seeds=2, n_tasks=10)
    return path


def test_explore_notebook(nb_lake: Path, tmp_path: Path) -> None:
    text = _run("01_explore_lake.ipynb", {"TRAJLAKE_LAKE": str(nb_lake)}, tmp_path)
    assert "versions read:" in text and "demo-B0" in text and "trainable_tokens" in text
    assert "p99_ms" in text and "episodes at version 0: 0" in text


def test_compare_notebook(nb_lake: Path, tmp_path: Path) -> None:
    plot = tmp_path / "success.png"
    text = _run("02_compare_runs.ipynb", {"TRAJLAKE_LAKE": str(nb_lake), "PLOT_OUT": str(plot)}, tmp_path)
    assert "pairs: 20" in text and "success" in text and "plotted" in text
    assert plot.exists() and plot.stat().st_size > 1000
