"""Collect submissions from a learning-management-system export into nbgrader's ``submitted/`` folder.

Layouts understood (one export per assignment):
- one folder per student holding the notebook (Moodle: ``Ada Lovelace_123456_assignsubmission_file_/``,
  Brightspace, a plain ``<student>/`` folder); a folder with several notebooks uses ``<assignment>.ipynb``;
- flat files named the Canvas way, ``<name>[_late]_<user id>_<submission id>_<original name>.ipynb``;
- flat files named by student, ``<student>.ipynb``.
Student ids are the folder or file names reduced to ``[a-z0-9_.-]`` (Moodle's suffix dropped, accents
dropped: ``José`` -> ``jose``); a name with no ASCII letter or digit left (``王芳``) gets its Punycode form
(``xn--...``, as in domain names: ASCII, distinct per name). An id longer than ``MAX_ID`` characters keeps its
first characters and ends in a short hash of the whole name, so that every id is a folder name any file system
takes and two long names stay apart. Every notebook is copied as
``submitted/<student>/<assignment>/<assignment>.ipynb``, broken ones too: whether a file can be read is the
grader's question, and it answers it per student. Symbolic links and special files (FIFOs, devices,
sockets) are never followed or copied; each skipped entry gets a line saying why (an entry that cannot be read,
or a folder tree too deep to walk, too), and nothing aborts the class.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import unicodedata
from pathlib import Path

from moe_course.course.limits.config import course_paths

CANVAS = re.compile(r"^(?P<name>[^_]+)(?:_late)?_(?P<user>\d+)_\d+_.+\.ipynb$", re.I)
MOODLE_SUFFIX = re.compile(r"_assignsubmission_\w*$")
MAX_ID = 64  # characters of a student id (a folder name, and part of deeper paths; file systems allow 255 bytes)


def _ascii_id(name: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", name.strip().lower()).strip("-.")


def student_id(name: str) -> str:
    """A folder-safe ASCII student id from an LMS name (see the module docstring); ValueError for a name
    with no letter or digit at all."""
    name = MOODLE_SUFFIX.sub("", name)
    cleaned = _ascii_id(unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode())
    if not re.search(r"[a-z0-9]", cleaned):
        letters = "".join(c for c in unicodedata.normalize("NFC", name).lower() if c.isalnum())
        cleaned = "xn--" + _ascii_id(letters.encode("punycode").decode()) if letters else ""
    if not cleaned:
        raise ValueError(f"student name {name!r} has no letters or digits to make an id from")
    if len(cleaned) > MAX_ID:
        digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:10]
        cleaned = f"{cleaned[:MAX_ID - 11].rstrip('-.')}-{digest}"
    return cleaned


def _kind(path: Path) -> str | None:
    """None for a regular file or folder; else what it is (never followed)."""
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        return "a symbolic link (not followed)"
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return "a special file (FIFO, device or socket)"
    return None


def _notebooks(folder: Path) -> list[Path]:
    """Regular ``*.ipynb`` files under ``folder``, links neither followed nor taken."""
    found = []
    for parent, folders, files in os.walk(folder):
        folders[:] = [f for f in folders if f != ".ipynb_checkpoints" and _kind(Path(parent, f)) is None]
        found += [Path(parent, f) for f in files if f.endswith(".ipynb") and _kind(Path(parent, f)) is None]
    return sorted(found)


def find_submissions(export_dir: Path, assignment: str) -> tuple[dict[str, Path], dict[str, str]]:
    """({student: notebook}, {entry name: why it was skipped}) for an LMS export folder."""
    found, skipped = {}, {}
    for entry in sorted(Path(export_dir).iterdir()):
        if why := _kind(entry):
            skipped[entry.name] = why
            continue
        try:
            student, notebook = _submission(entry, assignment)
        except ValueError as err:
            skipped[entry.name] = str(err)
            continue
        except (OSError, RecursionError) as err:  # unreadable, or a folder tree deeper than the walk can go
            skipped[entry.name] = f"could not be read ({type(err).__name__}: {str(err)[:200]})"
            continue
        if student in found:
            skipped[entry.name] = f"a second submission for student {student!r} (kept {found[student].name})"
            continue
        found[student] = notebook
    return found, skipped


def _submission(entry: Path, assignment: str) -> tuple[str, Path]:
    """(student, notebook) of one export entry; ValueError saying why it is not a submission."""
    if entry.is_dir():
        notebooks = _notebooks(entry)
        named = [p for p in notebooks if p.name == f"{assignment}.ipynb"]
        chosen = named[:1] if named else notebooks
        if len(chosen) != 1:
            raise ValueError(f"{len(notebooks)} notebooks and none named {assignment}.ipynb")
        return student_id(entry.name), chosen[0]
    if entry.suffix == ".ipynb":
        match = CANVAS.match(entry.name)
        return student_id(f"{match['name']}_{match['user']}" if match else entry.stem), entry
    raise ValueError("not a notebook or a folder")


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
