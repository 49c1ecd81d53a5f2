"""Every debug task fails on the handout's code and passes once fixed.

A debug task is a locked cell ``X_given`` that defines one function with a planted bug (a failure mode a chapter
documents), the answer cell ``X_answer`` where the learner writes it fixed, and the test cell ``X_tests``. Here the
given function stands in for the answer: the visible test must fail on it (the learner sees that something is
wrong) and so must the hidden check, compared with the library as the grader does (``compare.judge``); the
solution's fixed function passes both. The given cell in exercises/ is the one tested here."""

import ast
import json
import re
from pathlib import Path

import pytest

from moe_course.course.answers import check_cases, load_checks
from moe_course.course.build import SOLUTIONS, graded_functions, source_notebook
from moe_course.course.compare import judge

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS", re.S)


def _debug_tasks():
    for solution in sorted(SOLUTIONS.glob("[0-9][0-9]_*.py")):
        for cell in source_notebook(solution).cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
            if cell.cell_type == "code" and grade_id.endswith("_given"):
                yield pytest.param(solution, grade_id, id=f"{solution.stem}-{grade_id}")


def _cell(cells, grade_id):
    return next(c for c in cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


@pytest.mark.parametrize("solution, given_id", list(_debug_tasks()))
def test_the_planted_bug_fails_the_visible_and_the_hidden_test(solution, given_id, monkeypatch):
    stem = given_id.removesuffix("_given")
    cells = source_notebook(solution).cells
    given, tests = _cell(cells, given_id), _cell(cells, f"{stem}_tests")
    released = json.loads((ROOT / "exercises" / f"{solution.stem}.ipynb").read_text())["cells"]
    handout = next(c for c in released if c["metadata"].get("nbgrader", {}).get("grade_id") == given_id)
    assert "".join(handout["source"]) == given.source, "the handout's given cell differs from the solution's"
    (port,) = [node.name for node in ast.parse(given.source).body if isinstance(node, ast.FunctionDef)]
    (fixed,) = graded_functions(solution)[f"{stem}_tests"]

    monkeypatch.chdir(solution.parent)
    namespace = {}
    for cell in cells[:cells.index(tests)]:  # setup, the solution's answers, the given cell; no test cell
        if cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("grade"):
            exec(compile(cell.source, f"<{solution.stem}>", "exec"), namespace)
    visible = HIDDEN.sub("", tests.source)
    exec(compile(visible, f"<{stem}_tests, fixed>", "exec"), dict(namespace))  # the fix passes
    with pytest.raises(AssertionError):  # the learner sees the bug
        exec(compile(visible, f"<{stem}_tests, given>", "exec"), {**namespace, fixed: namespace[port]})

    check = load_checks(SOLUTIONS / "checks" / f"{solution.stem}.py")[f"{stem}_tests"]
    cases = check_cases(check, f"{stem}_tests", seed=3)
    wants = [check.reference_outputs(case) for case in cases]
    outputs = {name: [check.outputs(namespace[name], case) for case in cases] for name in (fixed, port)}
    assert judge(check, f"{stem}_tests", cases, outputs[fixed], wants) is None
    assert judge(check, f"{stem}_tests", cases, outputs[port], wants) is not None, "the grader accepts the bug"
