"""Submissions for the grading tests, built from an assignment's released and source notebooks."""

from __future__ import annotations

import json
from pathlib import Path

SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
# Answer code that makes its grading kernel drop every execute reply (ipykernel sends each through its session)
# while it keeps answering everything else: a kernel that stops answering.
SILENT_KERNEL = """def _silence(kernel):
    send = kernel.session.send
    def dropping(stream, kind, *args, **kwargs):
        return {'content': {'status': 'ok'}} if kind == 'execute_reply' else send(stream, kind, *args, **kwargs)
    kernel.session.send = dropping
_silence(get_ipython().kernel)"""


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


def lms_export(folder: Path, notebooks: dict) -> Path:
    """An LMS export of ``{student: notebook}``: the first student Moodle-style (a folder named
    ``<Name>_<id>_assignsubmission_file_``), the second Canvas-style (``<name>_<id>_<sub>_<file>.ipynb``),
    the rest as plain ``<student>/`` folders. Returns ``folder``; the students' ids after collect are
    ``<name>_<id>`` for the first two and the name for the rest."""
    for position, (student, notebook) in enumerate(notebooks.items()):
        if position == 0:
            path = folder / f"{student.title()}_1001_assignsubmission_file_" / "upload.ipynb"
        elif position == 1:
            path = folder / f"{student}_1002_555_upload.ipynb"
        else:
            path = folder / student / "upload.ipynb"
        write(notebook, path)
    return folder


def collected_ids(students) -> list[str]:
    """The student ids ``lms_export``'s layout gives after collect, in the same order."""
    return [f"{s}_{1001 + i}" if i < 2 else s for i, s in enumerate(students)]
