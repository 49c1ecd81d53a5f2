"""Every chapter runs top to bottom under nbval (jupytext -> temporary .ipynb -> pytest --nbval-lax).

The chapters assert their own claims, so a chapter whose measured result stops holding fails here. They run
with the inline matplotlib backend a learner's Jupyter uses, and every chapter must draw its figures: the
nbval run reports each cell's outputs (tests/nbval_outputs.py), and a chapter that draws fewer figures than
listed below, or prints a wall of text (such as a model's repr), fails.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest

CHAPTERS = sorted((Path(__file__).resolve().parents[1] / "chapters").glob("[0-9][0-9]_*.py"))
# Figures (image outputs) each chapter draws when executed; the slider figure of chapter 3 counts once.
FIGURES = {"01_vit": 5, "02_moe_layer": 1, "03_vmoe_bpr": 4, "04_limoe": 8, "05_soft_moe": 3, "06_mod": 5,
           "07_scale": 4}
MAX_OUTPUT_LINES = 60


def test_there_are_chapters():
    assert CHAPTERS, "no chapters/NN_*.py found"
    assert sorted(FIGURES) == [c.stem for c in CHAPTERS], "list every chapter's figure count in FIGURES"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_executes(chapter, tmp_path):
    notebook = tmp_path / f"{chapter.stem}.ipynb"
    jupytext.write(jupytext.read(chapter), notebook)
    summary = tmp_path / "outputs.json"
    env = {**os.environ, "MOE_COURSE_WORKDIR": str(tmp_path / "runs"), "MOE_COURSE_OUTPUT_SUMMARY": str(summary),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))}
    for name in ("MOE_COURSE_FULL_SCALE", "MPLBACKEND"):  # MPLBACKEND would replace the inline backend
        env.pop(name, None)
    # -x: stop at the first failing cell, so the report ends with the cause rather than the NameErrors after it
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "--nbval-lax", "-p", "no:cacheprovider", "-p", "nbval_outputs", "-q",
         str(notebook)],
        cwd=chapter.parent, env=env, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    cells = json.loads(summary.read_text())
    images = sum(cell["images"] for cell in cells)
    assert images >= FIGURES[chapter.stem], f"{chapter.stem} drew {images} figures, expected {FIGURES[chapter.stem]}"
    walls = [cell for cell in cells if cell["longest_text"] > MAX_OUTPUT_LINES]
    assert not walls, f"cells printing more than {MAX_OUTPUT_LINES} lines: {walls}"
