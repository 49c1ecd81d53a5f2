"""Where an instructor's course lives on disk, and the nbgrader configuration the course commands use.

A course directory follows nbgrader's layout (``source/``, ``release/``, ``submitted/``, ``autograded/``,
``feedback/`` with one folder per assignment or per student and assignment) plus the course's own:
``gradebook.db`` (the master gradebook: assignments and their grade cells, hidden tests included),
``gradebooks/<assignment>/<student>.db|.json`` (one gradebook copy and one result record per graded
submission, so that parallel grading processes never write the same database), ``checks/<assignment>.py``
(the graded checks, copied from ``solutions/checks/`` at release), ``jupyter/kernels/`` (the grading
kernel's spec) and ``grades.csv``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from moe_course.course.limits.bounded import MAX_NOTEBOOK_BYTES

REPO = Path(__file__).resolve().parents[3]
SOLUTIONS = REPO / "solutions"
EXERCISES = REPO / "exercises"
GRADEBOOK = "gradebook.db"


@dataclasses.dataclass(frozen=True)
class Limits:
    """Limits for grading one submission.

    cell_timeout: seconds one cell may run before it is interrupted (that cell then scores 0).
    submission_timeout: wall-clock seconds for a whole submission (its kernel included) before it is killed.
    memory_bytes: address-space limit of the grading kernel (bytes). cpu_seconds: its CPU-time limit (s).
    output_bytes: bytes of output (printed text, displays, errors) one notebook may send back
    (``output_cap.CappedExecute``); past it, grading of that submission stops with status "failed".
    notebook_bytes: size of a submitted notebook past which it is not graded (``bounded.read_notebook``).
    """

    cell_timeout: int = 60
    submission_timeout: int = 900
    memory_bytes: int = 6 * 2**30
    cpu_seconds: int = 600
    output_bytes: int = 16 * 2**20
    notebook_bytes: int = MAX_NOTEBOOK_BYTES

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field.name}={value!r} is not allowed; use a positive integer")


def course_paths(course_dir: Path) -> dict[str, Path]:
    """The folders and files of a course directory (see the module docstring), by name."""
    root = Path(course_dir).resolve()
    folders = ("source", "release", "submitted", "autograded", "feedback", "gradebooks", "jupyter", "checks")
    return {name: root / name for name in folders} | {"root": root, "db": root / GRADEBOOK}


def checks_file(course_dir: Path, assignment: str) -> Path:
    """The copy of ``solutions/checks/<assignment>.py`` that ``release`` puts into the course directory."""
    return course_paths(course_dir)["checks"] / f"{assignment}.py"


def nbgrader_config(course_dir: Path, *, db: Path | None = None, limits: Limits = Limits(),
                    kernel_name: str | None = None, sockets: Path | None = None):
    """The traitlets Config for nbgrader's API on ``course_dir``.

    db: the gradebook to use (default: the master ``gradebook.db``). kernel_name: the kernelspec that runs
    submissions (the grading kernel) -- None keeps each notebook's own (for release). Grade cells deleted,
    duplicated or changed by a student are restored from the gradebook (OverwriteCells.add_missing_cells,
    nbgrader's checksums and DeduplicateIds); a cell running past ``limits.cell_timeout`` is interrupted and
    fails. sockets: a folder of this process's own (short path: Unix socket names hold at most 107 bytes)
    where the kernel's channels become Unix sockets (ZeroMQ's ``ipc`` transport) instead of TCP ports -- two
    grading processes that start kernels at the same moment can otherwise be handed the same free port, and
    the kernel that loses the race dies before it answers. With a kernel_name, cells run in
    ``output_cap.CappedExecute`` (at most ``limits.output_bytes`` of output).
    """
    from traitlets.config import Config  # here: `moe-course train` and `evaluate` import no grading stack

    paths = course_paths(course_dir)
    c = Config()
    c.NbGraderAPI.log_level = "WARN"  # nbgrader's per-file INFO lines would drown the summary
    c.CourseDirectory.root = str(paths["root"])
    c.CourseDirectory.db_url = f"sqlite:///{Path(db or paths['db']).resolve()}"
    c.CourseDirectory.course_id = "moe-course"
    c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", ".*"]
    c.OverwriteCells.add_missing_cells = True
    c.Autograde.sanitize_preprocessors = sanitize_preprocessors()
    c.Execute.timeout = limits.cell_timeout
    c.Execute.interrupt_on_timeout = True
    c.Execute.startup_timeout = 120
    if kernel_name is not None:
        c.Execute.kernel_name = kernel_name
        c.Autograde.autograde_preprocessors = autograde_preprocessors()
        c.CappedExecute.output_bytes = limits.output_bytes
    if sockets is not None:
        c.KernelManager.transport = "ipc"
        c.KernelManager.ip = str(Path(sockets).resolve() / "kernel")
    c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
    c.Autograde.create_student = True
    c.GenerateFeedback.force = True
    return c


def drop_emptied_metadata(notebook, resources):
    """nbgrader preprocessor: remove the empty ``nbgrader`` metadata DeduplicateIds leaves on a duplicated
    grade cell (nbgrader 0.9's add_missing_cells would fail on it with KeyError 'grade_id')."""
    for cell in notebook.cells:
        if "nbgrader" in cell.metadata and not cell.metadata["nbgrader"]:
            del cell.metadata["nbgrader"]
    return notebook, resources


def sanitize_preprocessors() -> list:
    """nbgrader's Autograde.sanitize_preprocessors with ``drop_emptied_metadata`` after DeduplicateIds."""
    from nbgrader.preprocessors import CheckCellMetadata, ClearOutput, DeduplicateIds, OverwriteCells, OverwriteKernelspec

    return [ClearOutput, DeduplicateIds, drop_emptied_metadata, OverwriteKernelspec, OverwriteCells, CheckCellMetadata]


_HELD_STDERR = "moe_course_held_stderr"


def hold_stderr(notebook, resources):
    """nbgrader preprocessor, before SaveAutoGrades: take the stderr text out of every test cell's outputs
    (nbgrader would score a test cell 0 for it, so a correct answer that prints a warning lost its marks;
    a failing test is an ``error`` output, which stays). ``restore_stderr`` puts it back afterwards."""
    held = resources.setdefault(_HELD_STDERR, {})
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
            outputs = cell.get("outputs", [])
            stderr = [(i, o) for i, o in enumerate(outputs) if o.get("output_type") == "stream"
                      and o.get("name") == "stderr"]
            if stderr:
                held[index] = stderr
                cell.outputs = [o for o in outputs if all(o is not kept for _, kept in stderr)]
    return notebook, resources


def restore_stderr(notebook, resources):
    """nbgrader preprocessor, after SaveAutoGrades: the stderr outputs ``hold_stderr`` took, back in place."""
    for index, outputs in resources.pop(_HELD_STDERR, {}).items():
        for position, output in outputs:
            notebook.cells[index].outputs.insert(position, output)
    return notebook, resources


def autograde_preprocessors() -> list:
    """nbgrader's Autograde.autograde_preprocessors with its ``Execute`` replaced by ``CappedExecute`` and
    SaveAutoGrades after ``verdict.score_outside`` (the grader's own checks) and between ``hold_stderr`` and
    ``restore_stderr``."""
    from nbgrader.converters.autograde import Autograde
    from nbgrader.preprocessors import Execute, SaveAutoGrades

    from moe_course.course.limits.output_cap import CappedExecute
    from moe_course.course.limits.verdict import score_outside

    chosen = []
    for preprocessor in Autograde.class_traits()["autograde_preprocessors"].default():
        if preprocessor is SaveAutoGrades:
            chosen += [score_outside, hold_stderr, SaveAutoGrades, restore_stderr]
        else:
            chosen.append(CappedExecute if preprocessor is Execute else preprocessor)
    return chosen


def grading_env(course_dir: Path) -> dict[str, str]:
    """The environment of a grading process: the course's kernelspec folder first on JUPYTER_PATH."""
    jupyter = str(course_paths(course_dir)["jupyter"])
    return {**os.environ, "JUPYTER_PATH": os.pathsep.join(filter(None, [jupyter, os.environ.get("JUPYTER_PATH")]))}
