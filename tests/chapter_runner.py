"""Run one chapter top to bottom as tests/test_chapters.py does: jupytext -> .ipynb -> pytest --nbval-lax.

Shared by tests/test_chapters.py and benchmarks/chapter_robustness.py, so that a chapter "passes" in the
benchmark exactly when it passes in the test suite. The nbval run loads tests/nbval_outputs.py, which records
every executed cell's figures, longest output and printed text.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jupytext

TESTS = Path(__file__).resolve().parent
CHAPTERS = sorted((TESTS.parent / "chapters").glob("[0-9][0-9]_*.py"))
# Settings of the caller's environment that would change what a chapter runs: the full-scale cells, the seed and
# retraining of recorded models (a run's ``env`` sets them on purpose), and a matplotlib backend that would replace
# the inline one a learner's Jupyter uses.
CLEARED = ("MOE_COURSE_FULL_SCALE", "MOE_COURSE_SEED", "MOE_COURSE_RETRAIN", "MPLBACKEND")


@dataclasses.dataclass
class ChapterRun:
    """returncode 0: every cell ran and every assertion held; cells: nbval_outputs.py's per-cell records."""
    returncode: int
    output: str
    cells: list[dict]

    def text(self) -> str:
        """Everything the chapter printed, cell after cell."""
        return "\n".join(cell.get("text", "") for cell in self.cells)


def run_chapter(chapter: Path, folder: Path, env: dict[str, str] | None = None, timeout: int = 900) -> ChapterRun:
    """Execute ``chapter`` in a fresh kernel; its runs and the temporary notebook go under ``folder``.

    ``env`` adds or replaces environment variables (e.g. MOE_COURSE_SEED, XLA_FLAGS) on top of this process's.
    """
    folder.mkdir(parents=True, exist_ok=True)
    notebook = folder / f"{chapter.stem}.ipynb"
    jupytext.write(jupytext.read(chapter), notebook)
    summary = folder / "outputs.json"
    summary.unlink(missing_ok=True)
    full_env = {key: value for key, value in os.environ.items() if key not in CLEARED}
    full_env.update({"MOE_COURSE_WORKDIR": str(folder / "runs"), "MOE_COURSE_OUTPUT_SUMMARY": str(summary),
                     "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))})
    full_env.update(env or {})
    # -x: stop at the first failing cell, so the report ends with the cause rather than the NameErrors after it
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "--nbval-lax", "-p", "no:cacheprovider", "-p", "nbval_outputs", "-q",
         str(notebook)],
        cwd=chapter.parent, env=full_env, capture_output=True, text=True, timeout=timeout,
    )
    cells = json.loads(summary.read_text()) if summary.exists() else []
    return ChapterRun(result.returncode, result.stdout[-6000:] + result.stderr[-3000:], cells)
