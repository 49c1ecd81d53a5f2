"""A debug task's planted bug is caught: the code the handout gives (a locked ``<task>_given`` cell of
exercises/NN_slug.ipynb) fails the grader's check of ``<task>_tests`` on fresh inputs, and the solution's fix
passes it (see solutions/README.md). No nbgrader needed: the cells run here, the check is judged as the grader
judges it (``compare.judge`` against the library's references)."""

import json
from pathlib import Path

import pytest

from moe_course.course.answers import check_cases, load_checks
from moe_course.course.build import graded_functions, source_notebook
from moe_course.course.compare import judge

ROOT = Path(__file__).resolve().parents[1]
GIVEN = "_given"


def _debug_tasks():
    for notebook in sorted((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id", "")
            if grade_id.endswith(GIVEN):
                yield notebook.stem, grade_id.removesuffix(GIVEN)


def _run_given(cells, upto: str) -> dict:
    """Run the locked, ungraded code cells (setup, given code) up to and including the cell ``upto``."""
    namespace = {}
    for cell in cells:
        meta = cell["metadata"].get("nbgrader", {})
        if cell["cell_type"] == "code" and meta.get("locked") and not meta.get("grade"):
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            exec(compile(source, f"<{meta.get('grade_id')}>", "exec"), namespace)
            if meta.get("grade_id") == upto:
                return namespace
    raise AssertionError(f"no cell {upto}")


def _verdict(check, grade_id: str, function) -> str | None:
    cases = check_cases(check, grade_id, seed=0)
    return judge(check, grade_id, cases, [check.outputs(function, case) for case in cases],
                 [check.reference_outputs(case) for case in cases])


def test_there_is_a_debug_task():
    assert list(_debug_tasks()), "no exercise has a <task>_given cell"


@pytest.mark.parametrize("name, task", list(_debug_tasks()))
def test_the_given_code_fails_its_check_and_the_fix_passes(name, task, capsys):
    grade_id = f"{task}_tests"
    check = load_checks(ROOT / "solutions" / "checks" / f"{name}.py")[grade_id]
    function_name, = graded_functions(ROOT / "solutions" / f"{name}.py")[grade_id]
    handout = _run_given(json.loads((ROOT / "exercises" / f"{name}.ipynb").read_text())["cells"], f"{task}{GIVEN}")
    reason = _verdict(check, grade_id, handout[function_name])
    assert reason is not None and reason.startswith(f"{grade_id}, case "), reason

    solution = {}
    for cell in source_notebook(ROOT / "solutions" / f"{name}.py").cells:
        if cell.cell_type == "code" and "_answers.record" not in cell.source:
            exec(compile(cell.source, f"<{name}>", "exec"), solution)
    assert _verdict(check, grade_id, solution[function_name]) is None
    capsys.readouterr()  # the cells' prints
