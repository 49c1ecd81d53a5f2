"""Every chapter runs top to bottom under nbval (jupytext -> temporary .ipynb -> pytest --nbval-lax).

The chapters assert their own claims, so a chapter whose measured result stops holding fails here.
"""

import os
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest

CHAPTERS = sorted((Path(__file__).resolve().parents[1] / "chapters").glob("[0-9][0-9]_*.py"))


def test_there_are_chapters():
    assert CHAPTERS, "no chapters/NN_*.py found"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_executes(chapter, tmp_path):
    notebook = tmp_path / f"{chapter.stem}.ipynb"
    jupytext.write(jupytext.read(chapter), notebook)
    env = {**os.environ, "MPLBACKEND": "Agg", "MOE_COURSE_WORKDIR": str(tmp_path / "runs")}
    env.pop("MOE_COURSE_FULL_SCALE", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval-lax", "-p", "no:cacheprovider", "-q", str(notebook)],
        cwd=chapter.parent, env=env, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
