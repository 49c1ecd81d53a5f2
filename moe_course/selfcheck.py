"""``moe-course check NOTEBOOK``: a learner runs an exercise notebook's visible checks with the base install.

No nbgrader, traitlets or Jupyter kernel: the notebook's code cells run in order, in one plain Python
subprocess (``python -c RUNNER``, in the notebook's folder, with a wall-clock limit), each cell's exception
caught so that the next cells still run. Every graded test cell of the exercise (nbgrader metadata
``"grade": true`` on a code cell) is one task, reported as

- ``passed`` (with what the cell printed, e.g. ``ok: top_k_routing matches on 3 cases``),
- ``failed: <the check's message>`` (the exception the test cell raised, e.g. its AssertionError text),
- ``not attempted`` when the handout's ``NotImplementedError`` is still there: raised by the test cell (a
  function still unwritten) or by its answer cell (a prediction not written) -- the answer cell ``<what>_answer``
  of test cell ``<what>_tests`` wherever it stands (a prediction is answered before the function it is checked
  with), else any answer cell since the previous test cell.

An explain task (a graded markdown cell: a written answer) is reported as ``explain: graded by the instructor``
(``, not written yet`` while the handout's ``YOUR ANSWER HERE`` is still there); it does not count towards the
tasks that must pass.

Exit status 0 only when every autograded task passed (1 otherwise; 2 for a file that is missing or not an exercise).
Grading is unchanged: the hidden checks and the comparison with the library run only in
``moe-course course autograde`` (see exercises/README.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DEFAULT_TIMEOUT = 300  # seconds for the whole notebook; the exercises run in well under a minute

# Runs in the subprocess: argv[1] is a JSON list of cell sources; prints one JSON line per cell,
# {"ok": bool, "error": [type name, message] or null, "stdout": str}, after a marker line.
RUNNER = r"""
import contextlib, io, json, sys, traceback
cells = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
results = []
for index, source in enumerate(cells):
    out = io.StringIO()
    error = None
    try:
        code = compile(source, f"<cell {index + 1}>", "exec")
        with contextlib.redirect_stdout(out):
            exec(code, namespace)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: a cell's sys.exit() must not end the run
        error = [type(exc).__name__, str(exc)]
    results.append({"ok": error is None, "error": error, "stdout": out.getvalue()})
sys.__stdout__.write("\n@@MOE-COURSE-CHECK@@\n" + json.dumps(results) + "\n")
"""
MARKER = "@@MOE-COURSE-CHECK@@"
EXPLAIN = "explain: graded by the instructor"
EXPLAIN_STUB = "YOUR ANSWER HERE"  # what nbgrader releases in place of a written answer


class NotAnExercise(ValueError):
    """The file is missing, not a notebook, or has no graded test cells."""


def _nbgrader(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _explain(cell: dict) -> bool:
    return cell.get("cell_type") == "markdown" and bool(_nbgrader(cell).get("grade"))


def load_exercise(path: str | Path) -> list[dict]:
    """The code cells and explain cells (graded markdown) of the exercise notebook ``path`` (JSON, nbformat 4),
    in order. Raises NotAnExercise naming the path when it does not exist, is not a notebook, or holds no
    graded test cell."""
    path = Path(path)
    if not path.is_file():
        raise NotAnExercise(f"notebook={str(path)!r} does not exist; give an exercise notebook, e.g. "
                            f"exercises/03_vmoe_bpr.ipynb or your copy in mywork/")
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
        cells = [c for c in notebook["cells"] if c.get("cell_type") == "code" or _explain(c)]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise NotAnExercise(f"notebook={str(path)!r} is not a Jupyter notebook ({type(error).__name__}); "
                            f"give an .ipynb from exercises/") from error
    if not any(_nbgrader(c).get("grade") and c.get("cell_type") == "code" for c in cells):
        raise NotAnExercise(f"notebook={str(path)!r} has no graded test cells: it is not an exercise "
                            f"notebook (exercises/NN_slug.ipynb)")
    for cell in cells:
        if isinstance(cell.get("source"), list):
            cell["source"] = "".join(cell["source"])
    return cells


def run_cells(cells: list[dict], folder: Path, timeout: float) -> list[dict] | str:
    """Run the code cells' sources in order in a fresh ``python`` (``sys.executable``) started in ``folder``;
    one result dict per code cell (see RUNNER), or a one-line reason when the run did not finish."""
    sources = [c["source"] for c in cells if c.get("cell_type") == "code"]
    try:
        done = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(sources),
                              capture_output=True, text=True, cwd=folder, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"the notebook did not finish within {timeout:g} s (--timeout)"
    head, _, tail = done.stdout.rpartition(MARKER)
    if not _:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"the notebook's Python process ended early (exit status {done.returncode}): {last}"
    return json.loads(tail)


def verdicts(cells: list[dict], results: list[dict]) -> list[tuple[str, int | float, str]]:
    """(task name, points, "passed..." / "failed: ..." / "not attempted" / "explain: ...") for every graded
    cell; ``results`` holds one result per code cell."""
    rows, unanswered, ran = [], False, iter(results)
    tests = {_nbgrader(c).get("grade_id") for c in cells if _nbgrader(c).get("grade")}
    unwritten_for = set()  # test cells whose own answer cell (``<what>_answer``) raised NotImplementedError
    for cell in cells:
        meta = _nbgrader(cell)
        if _explain(cell):
            unwritten = ", not written yet" if cell["source"].strip() in ("", EXPLAIN_STUB) else ""
            rows.append((meta.get("grade_id", "?"), meta.get("points", 0), f"{EXPLAIN}{unwritten}"))
            continue
        result = next(ran)
        if meta.get("solution") and not meta.get("grade"):
            raised = bool(result["error"]) and result["error"][0] == "NotImplementedError"
            paired = str(meta.get("grade_id", "")).removesuffix("_answer") + "_tests"
            if paired in tests:
                unwritten_for |= {paired} if raised else set()
            else:
                unanswered |= raised
            continue
        if not meta.get("grade"):
            continue
        name, points = meta.get("grade_id", "?"), meta.get("points", 0)
        if unanswered or name in unwritten_for or (result["error"] and result["error"][0] == "NotImplementedError"):
            rows.append((name, points, "not attempted"))
        elif result["error"]:
            kind, message = result["error"]
            rows.append((name, points, f"failed: {kind}: {message}" if message else f"failed: {kind}"))
        else:
            printed = " ".join(result["stdout"].split())
            rows.append((name, points, f"passed ({printed})" if printed else "passed"))
        unanswered = False
    return rows


def check(path: str | Path, timeout: float = DEFAULT_TIMEOUT, stream=None) -> int:
    """Run exercise ``path``'s visible checks, print one line per task to ``stream`` (stdout) and return
    0 when all passed, 1 otherwise. Raises NotAnExercise (a ValueError) for a file that is not an exercise."""
    stream = stream or sys.stdout
    if not timeout > 0:
        raise ValueError(f"timeout={timeout} is not allowed; give seconds > 0")
    cells = load_exercise(path)
    results = run_cells(cells, Path(path).resolve().parent, timeout)
    if isinstance(results, str):
        print(f"{path}: {results}", file=stream)
        return 1
    rows = verdicts(cells, results)
    width = max(len(name) for name, _, _ in rows)
    for name, points, verdict in rows:
        print(f"{name:{width}s} ({points:g} pt): {verdict}", file=stream)
    passed = sum(verdict.startswith("passed") for _, _, verdict in rows)
    checked = sum(not verdict.startswith(EXPLAIN) for _, _, verdict in rows)
    written = len(rows) - checked
    print(f"{passed} of {checked} tasks passed ({Path(path).name}); grading also compares your functions "
          f"with the course library on fresh inputs" + (f"; {written} explain task{'s' * (written > 1)} graded by "
                                                        "the instructor" if written else ""), file=stream)
    return 0 if passed == checked else 1


def add_parser(sub) -> None:
    """Register ``moe-course check`` on the ``moe-course`` subparsers ``sub``."""
    parser = sub.add_parser("check", help="run an exercise notebook's visible checks (no nbgrader needed)")
    parser.add_argument("notebook", help="an exercise notebook, e.g. exercises/03_vmoe_bpr.ipynb")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds for the whole notebook (default {DEFAULT_TIMEOUT})")


def run(args) -> dict:
    """The ``check`` command for ``moe_course.cli.main``: exits with status 1 when a task did not pass."""
    status = check(args.notebook, args.timeout)
    if status:
        raise SystemExit(status)
    return {}
