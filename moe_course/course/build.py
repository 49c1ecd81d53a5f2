"""Build the assignments: ``solutions/NN_slug.py`` (py:percent with nbgrader cell metadata) -> nbgrader's
``source/NN_slug/NN_slug.ipynb`` -> ``generate_assignment`` -> ``release/`` and the committed ``exercises/``.

The conversion is a one-way jupytext read/write into nbgrader's source folder, never a pairing: a paired
released notebook could pull the answers back in from its text twin. Cell ids are derived from the cell's
position (and its grade id), and jupytext's own metadata is dropped, so the same solutions always give
byte-identical exercises (``tests/test_course_release.py`` regenerates them and fails on any drift).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import jupytext
import nbformat

from moe_course.course.config import EXERCISES, SOLUTIONS, checks_file, course_paths, nbgrader_config

ASSIGNMENT_PATTERN = re.compile(r"^\d\d_[a-z0-9_]+$")
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
# Text that must never reach a learner: nbgrader's markers around answers and hidden tests.
SECRET_MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")


class ReleaseError(RuntimeError):
    """nbgrader could not generate an assignment, or a released notebook still holds answer or test text."""


def assignment_names(solutions_dir: Path = SOLUTIONS) -> list[str]:
    """The assignments in ``solutions_dir``: the stems of its ``NN_slug.py`` files, sorted."""
    return sorted(p.stem for p in Path(solutions_dir).glob("[0-9][0-9]_*.py") if ASSIGNMENT_PATTERN.match(p.stem))


def check_names(names, solutions_dir: Path = SOLUTIONS) -> list[str]:
    """``names`` (all assignments for None/empty), each checked to exist; ValueError naming an unknown one."""
    known = assignment_names(solutions_dir)
    for name in names or ():
        if name not in known:
            raise ValueError(f"assignment={name!r} is not allowed; use one of {known} (solutions/NN_slug.py)")
    return list(names) if names else known


def source_notebook(solution: Path) -> nbformat.NotebookNode:
    """The .ipynb nbgrader reads, from one py:percent solution file (no outputs; deterministic cell ids)."""
    notebook = jupytext.read(solution, fmt="py:percent")
    notebook.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    for index, cell in enumerate(notebook.cells):
        cell.metadata = {k: v for k, v in cell.metadata.items() if k == "nbgrader"}  # no jupytext layout keys
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        cell.id = f"{grade_id or 'cell'}-{index:02d}".replace("_", "-")
    nbformat.validate(notebook)
    return notebook


def write_source(solution: Path, course_dir: Path) -> Path:
    """Write ``course_dir/source/<name>/<name>.ipynb`` from ``solution``; returns its path."""
    name = Path(solution).stem
    target = course_paths(course_dir)["source"] / name / f"{name}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(source_notebook(solution), target)
    return target


def leaked_markers(notebook_path: Path) -> list[str]:
    """The SECRET_MARKERS found anywhere in a released notebook's text (empty when it is clean)."""
    text = Path(notebook_path).read_text()
    return [marker for marker in SECRET_MARKERS if marker in text]


def check_inputs_only(checks: Path, seeds=(0, 1)) -> None:
    """Check that the sandbox's version of ``checks`` (``inputs.inputs_only``: no references) loads and draws
    the same inputs for ``seeds`` as the whole file; raises ReleaseError naming the file and the check."""
    import tempfile

    import numpy as np

    from moe_course.course.answers import check_cases, load_checks
    from moe_course.course.inputs import hidden_packages, inputs_only

    hidden_packages(checks)  # ValueError for a malformed SANDBOX_WITHOUT
    with tempfile.TemporaryDirectory() as folder:
        stripped = Path(folder) / checks.name
        stripped.write_text(inputs_only(checks.read_text(), checks))
        try:
            sandboxed = load_checks(stripped)
        except Exception as error:
            raise ReleaseError(f"{checks} without its references does not load ({type(error).__name__}: {error}): "
                               "what draws the inputs or calls the answers must not use a reference") from error
    for grade_id, check in load_checks(checks).items():
        for seed in seeds:
            ours = check_cases(check, grade_id, seed)
            theirs = check_cases(sandboxed[grade_id], grade_id, seed)
            same = len(ours) == len(theirs) and all(
                len(a) == len(b) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))
                for a, b in zip(ours, theirs))
            if not same:
                raise ReleaseError(f"{checks}: the sandbox's version of {grade_id} draws other inputs for seed {seed}")


def install_checks(solution: Path, course_dir: Path) -> Path:
    """Copy ``checks/<name>.py`` beside ``solution`` into the course (``config.checks_file``) after checking
    that it has a check for every grade cell of the solution and nothing else, and that its sandbox version
    (without references) draws the same inputs (``check_inputs_only``); returns the copy.
    Raises ReleaseError naming the file and the grade cells that differ."""
    from moe_course.course.answers import load_checks

    name = Path(solution).stem
    checks = Path(solution).parent / "checks" / f"{name}.py"
    if not checks.is_file():
        raise ReleaseError(f"{checks} is missing: every graded cell is judged by a check there (see "
                           f"solutions/README.md)")
    graded = {cell.metadata["nbgrader"]["grade_id"] for cell in source_notebook(solution).cells
              if cell.metadata.get("nbgrader", {}).get("grade")}
    defined = set(load_checks(checks))
    if graded != defined:
        raise ReleaseError(f"{checks} must define one check per grade cell of {solution}: missing "
                           f"{sorted(graded - defined)}, unknown {sorted(defined - graded)}")
    check_inputs_only(checks)
    target = checks_file(course_dir, name)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(checks, target)
    return target


def release(course_dir: Path, names=None, *, solutions_dir: Path = SOLUTIONS,
            exercises_dir: Path | None = EXERCISES) -> list[Path]:
    """Generate the student version of each assignment in ``names`` (all for None) and copy it to
    ``exercises_dir`` (None: only into the course's ``release/``). Also records the assignment and its grade
    cells in the course's gradebook, which ``autograde`` needs. Returns the released notebooks' paths.

    Copies each assignment's checks into the course (``install_checks``).

    Raises ValueError for an unknown assignment name, ReleaseError when nbgrader fails, a released notebook
    still holds a SECRET_MARKER or the checks do not match the grade cells.
    """
    from nbgrader.apps import NbGraderAPI

    names = check_names(names, solutions_dir)
    paths = course_paths(course_dir)
    paths["root"].mkdir(parents=True, exist_ok=True)
    api = NbGraderAPI(config=nbgrader_config(course_dir))
    released = []
    for name in names:
        write_source(Path(solutions_dir) / f"{name}.py", course_dir)
        install_checks(Path(solutions_dir) / f"{name}.py", course_dir)
        result = api.generate_assignment(name, force=True, create=True)
        if not result["success"]:
            raise ReleaseError(f"nbgrader could not generate {name}: {result['error']}\n{result['log']}")
        notebook = paths["release"] / name / f"{name}.ipynb"
        if leaked := leaked_markers(notebook):
            raise ReleaseError(f"{notebook} still contains {leaked}; check the markers in solutions/{name}.py")
        if exercises_dir is not None:
            Path(exercises_dir).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(notebook, Path(exercises_dir) / f"{name}.ipynb")
        released.append(notebook)
    return released
