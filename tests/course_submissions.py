"""Submissions for the grading tests, built from an assignment's released and source notebooks."""

from __future__ import annotations

import json
from pathlib import Path

SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def answer_cells(source_notebook: Path) -> dict[str, str]:
    """{grade_id: the answer code} of every solution cell of an nbgrader source notebook (markers dropped)."""
    cells = json.loads(Path(source_notebook).read_text())["cells"]
    answers = {}
    for cell in cells:
        meta = cell["metadata"].get("nbgrader", {})
        if meta.get("solution"):
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            lines = [line for line in source.splitlines() if line.strip() not in SOLUTION_MARKERS]
            answers[meta["grade_id"]] = "\n".join(lines)
    return answers


def answered(released_notebook: Path, source_notebook: Path, grade_ids=None) -> dict:
    """The released notebook with the answers of ``grade_ids`` (all for None) filled in, as a JSON dict."""
    notebook = json.loads(Path(released_notebook).read_text())
    answers = answer_cells(source_notebook)
    for cell in notebook["cells"]:
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if grade_id in answers and (grade_ids is None or grade_id in grade_ids):
            cell["source"] = answers[grade_id]
    return notebook


def write(notebook, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(notebook) if not isinstance(notebook, str) else notebook)
    return path
