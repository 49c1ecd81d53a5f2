"""Collect submissions from a learning-management-system export into nbgrader's ``submitted/`` folder.

Layouts understood (one export per assignment):
- one folder per student holding the notebook (Moodle: ``Ada Lovelace_123456_assignsubmission_file_/``,
  Brightspace, a plain ``<student>/`` folder); a folder with several notebooks uses ``<assignment>.ipynb``;
- flat files named the Canvas way, ``<name>[_late]_<user id>_<submission id>_<original name>.ipynb``;
- flat files named by student, ``<student>.ipynb``.
Student ids are the folder or file names reduced to ``[a-z0-9_.-]`` (Moodle's suffix dropped). Every
notebook is copied as ``submitted/<student>/<assignment>/<assignment>.ipynb``, broken ones too: whether a
file can be read is the grader's question, and it answers it per student.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from moe_course.course.config import course_paths

CANVAS = re.compile(r"^(?P<name>[^_]+)(?:_late)?_(?P<user>\d+)_\d+_.+\.ipynb$", re.I)
MOODLE_SUFFIX = re.compile(r"_assignsubmission_\w*$")


def student_id(name: str) -> str:
    """A folder-safe student id from an LMS name; ValueError for a name with no usable character."""
    cleaned = re.sub(r"[^a-z0-9_.-]+", "-", MOODLE_SUFFIX.sub("", name).strip().lower()).strip("-.")
    if not cleaned:
        raise ValueError(f"student name {name!r} has no letters or digits to make an id from")
    return cleaned


def _notebooks(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def find_submissions(export_dir: Path, assignment: str) -> tuple[dict[str, Path], dict[str, str]]:
    """({student: notebook}, {entry name: why it was skipped}) for an LMS export folder."""
    found, skipped = {}, {}
    for entry in sorted(Path(export_dir).iterdir()):
        if entry.is_dir():
            notebooks = _notebooks(entry)
            named = [p for p in notebooks if p.name == f"{assignment}.ipynb"]
            chosen = named[:1] if named else notebooks
            if len(chosen) != 1:
                skipped[entry.name] = f"{len(notebooks)} notebooks and none named {assignment}.ipynb"
                continue
            student, notebook = student_id(entry.name), chosen[0]
        elif entry.suffix == ".ipynb":
            match = CANVAS.match(entry.name)
            student = student_id(f"{match['name']}_{match['user']}" if match else entry.stem)
            notebook = entry
        else:
            skipped[entry.name] = "not a notebook or a folder"
            continue
        if student in found:
            skipped[entry.name] = f"a second submission for student {student!r} (kept {found[student].name})"
            continue
        found[student] = notebook
    return found, skipped


def collect(export_dir: Path, course_dir: Path, assignment: str) -> tuple[dict[str, Path], dict[str, str]]:
    """Copy every submission of ``export_dir`` into the course; returns ``find_submissions``'s answer.

    Raises ValueError naming export_dir when it is not a folder.
    """
    if not Path(export_dir).is_dir():
        raise ValueError(f"export_dir={str(export_dir)!r} is not a folder; give the unpacked LMS export")
    found, skipped = find_submissions(export_dir, assignment)
    submitted = course_paths(course_dir)["submitted"]
    for student, notebook in found.items():
        target = submitted / student / assignment / f"{assignment}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(notebook, target)
    return found, skipped
