"""`moe-course check`: a learner runs an exercise's visible checks with the base install. Every run here is
a subprocess in which importing nbgrader or traitlets fails (a sitecustomize on PYTHONPATH blocks them, in the
command and in the notebook process it starts), on the committed handout and on it with the answers filled in."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_submissions import answer_cells, answered
from moe_course import selfcheck
from moe_course.cli import main
from moe_course.course.instructor.build import source_notebook

ROOT = Path(__file__).resolve().parents[1]
NAME = "03_vmoe_bpr"  # the learner's V-MoE: the filled notebook trains it beside the library's (300 steps of 64)
BLOCKER = '''import importlib.abc, sys
class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("nbgrader", "traitlets"):
            raise ImportError(f"{name} is blocked: moe-course check must run without the instructor stack")
sys.meta_path.insert(0, _Blocked())
'''


@pytest.fixture(scope="module")
def blocked_env(tmp_path_factory):
    folder = tmp_path_factory.mktemp("blocker")
    (folder / "sitecustomize.py").write_text(BLOCKER)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)])}


def _check(notebook: Path, env, *more, cli=False):
    """``moe-course check NOTEBOOK`` through the command's main (``cli``), or the same check without the
    rest of the command's imports (faster: the notebook's process is the same)."""
    code = ("import sys; from moe_course.cli import main; sys.exit(main(sys.argv[1:]))" if cli else
            "import sys; from moe_course.selfcheck import check; sys.exit(check(sys.argv[2]))")
    return subprocess.run([sys.executable, "-c", code, "check", str(notebook), *more],
                          capture_output=True, text=True, env=env, timeout=400)


def test_the_blocker_blocks(blocked_env):
    done = subprocess.run([sys.executable, "-c", "import traitlets"], capture_output=True, text=True, env=blocked_env)
    assert done.returncode == 1 and "blocked" in done.stderr


def test_a_filled_exercise_passes(blocked_env, tmp_path):
    source = tmp_path / "source.ipynb"
    source.write_text(json.dumps(source_notebook(ROOT / "solutions" / f"{NAME}.py")))
    mine = tmp_path / "mywork" / f"{NAME}.ipynb"
    mine.parent.mkdir()
    mine.write_text(json.dumps(answered(ROOT / "exercises" / f"{NAME}.ipynb", source)))
    done = _check(mine, blocked_env, cli=True)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(lines) == 10 and sum(": passed (" in line for line in lines[:9]) == 8, done.stdout
    assert lines[8].endswith("(2 pt): explain: graded by the instructor"), done.stdout  # the answer is written
    assert "the two curves at most" in lines[7] and "test accuracy: your V-MoE" in lines[7], done.stdout  # trained
    assert lines[-1].startswith(f"8 of 8 tasks passed ({NAME}.ipynb)")

    changed = json.loads(mine.read_text())  # the prediction changed after it was recorded: the first answer counts
    cell = next(c for c in changed["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "noexpert_answer")
    cell["source"] = "PREDICTED_NO_EXPERT = 5"
    changed["cells"] = [c for c in changed["cells"]  # (the training left out from here on: it takes the longest)
                        if c["metadata"].get("nbgrader", {}).get("grade_id") not in ("step_answer", "train_tests")]
    mine.write_text(json.dumps(changed))
    done = _check(mine, blocked_env)
    assert done.returncode == 1
    line = next(line for line in done.stdout.splitlines() if line.startswith("noexpert_tests "))
    assert "(2 pt): failed: AssertionError: PREDICTED_NO_EXPERT was 1 when first recorded and is 5 now" in line, line

    (mine.parent / f"{NAME}.predictions.json").unlink()  # a wrong first answer: the message names no expected value
    done = _check(mine, blocked_env)
    line = next(line for line in done.stdout.splitlines() if line.startswith("noexpert_tests "))
    assert line.endswith("(2 pt): failed: AssertionError: not what BPR does: follow the TOP-1 round in priority "
                         "order, then the TOP-2 round"), done.stdout


def test_a_prediction_left_blank_marks_only_its_own_check(blocked_env, tmp_path):
    """The prediction is answered before the function it is checked with: left blank, only its own check is not
    attempted, not the function's test that comes between (the training step left blank too: no training run)."""
    source = tmp_path / "source.ipynb"
    source.write_text(json.dumps(source_notebook(ROOT / "solutions" / f"{NAME}.py")))
    answers = [grade_id for grade_id in answer_cells(source) if grade_id not in ("noexpert_answer", "step_answer")]
    mine = tmp_path / f"{NAME}.ipynb"
    mine.write_text(json.dumps(answered(ROOT / "exercises" / f"{NAME}.ipynb", source, answers)))
    done = _check(mine, blocked_env)
    verdicts = {line.split()[0]: line.split(":", 1)[1].strip() for line in done.stdout.strip().splitlines()[:-1]}
    assert verdicts["allocate_tests"].startswith("passed") and verdicts["noexpert_tests"] == "not attempted", done.stdout


def test_a_blank_exercise_is_not_attempted(blocked_env):
    """The handout: every function and the prediction (answered first, checked last) not attempted, the debug
    task's given code failing its visible test, the explain task not written yet."""
    done = _check(ROOT / "exercises" / f"{NAME}.ipynb", blocked_env)
    verdicts = {line.split()[0]: line.split(":", 1)[1].strip() for line in done.stdout.strip().splitlines()[:-1]}
    assert done.returncode == 1
    assert verdicts == {**{grade_id: "not attempted" for grade_id in (
        "priority_tests", "allocate_tests", "noexpert_tests", "layer_tests", "forward_tests", "loss_tests", "train_tests")},
                        "evaluation_tests": "failed: AssertionError: classes per group: [1, 1, 1, 1] -- a group "
                                            "of one class wants the same experts",
                        "drops_explain": "explain: graded by the instructor, not written yet"}, done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith(f"0 of 8 tasks passed ({NAME}.ipynb)")


@pytest.mark.parametrize("make, message", [
    (lambda folder: folder / "missing.ipynb", "does not exist"),
    (lambda folder: (folder / "notes.ipynb").write_text("not json") and folder / "notes.ipynb",
     "is not a Jupyter notebook"),
    (lambda folder: (folder / "chapter.ipynb").write_text(json.dumps({"cells": [{"cell_type": "code", "source": "1",
                                                                                  "metadata": {}}]}))
     and folder / "chapter.ipynb", "has no graded test cells"),
])
def test_not_an_exercise_is_a_clear_error(tmp_path, make, message):
    with pytest.raises(selfcheck.NotAnExercise, match=f"notebook=.*{message}"):
        selfcheck.check(make(tmp_path))


def test_the_command_says_it_in_one_line(tmp_path, capsys):
    assert main(["check", str(tmp_path / "missing.ipynb")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moe-course check: error: notebook=") and "does not exist" in err[0]


def test_a_notebook_past_its_time_limit_is_stopped(tmp_path, capsys):
    slow = {"cells": [{"cell_type": "code", "source": "import time; time.sleep(30)", "metadata": {}},
                      {"cell_type": "code", "source": "pass", "metadata": {"nbgrader": {"grade": True, "grade_id": "t",
                                                                                         "points": 1}}}]}
    (tmp_path / "slow.ipynb").write_text(json.dumps(slow))
    assert selfcheck.check(tmp_path / "slow.ipynb", timeout=2) == 1
    assert "did not finish within 2 s" in capsys.readouterr().out


def test_a_prediction_written_before_the_code_that_checks_it_is_its_own_task():
    """The answer cell ``guess_answer`` stands before ``impl_answer`` and its test cell ``guess_tests`` after
    ``impl_tests``: an unanswered prediction makes only ``guess_tests`` not attempted (not the next test cell)."""
    def cell(grade_id, grade=False, solution=False):
        return {"metadata": {"nbgrader": {"grade_id": grade_id, "grade": grade, "solution": solution, "points": 1}}}

    cells = [cell("guess_answer", solution=True), cell("impl_answer", solution=True), cell("impl_tests", grade=True),
             cell("guess_tests", grade=True)]
    blank = {"ok": False, "error": ["NotImplementedError", ""], "stdout": ""}
    fine = {"ok": True, "error": None, "stdout": "ok: impl\n"}
    missing = {"ok": False, "error": ["NameError", "name 'GUESS' is not defined"], "stdout": ""}
    rows = selfcheck.verdicts(cells, [blank, fine, fine, missing])
    assert rows == [("impl_tests", 1, "passed (ok: impl)"), ("guess_tests", 1, "not attempted")]
    rows = selfcheck.verdicts(cells, [fine, blank, blank, fine])
    assert rows == [("impl_tests", 1, "not attempted"), ("guess_tests", 1, "passed (ok: impl)")]


@pytest.mark.parametrize("written, says", [("YOUR ANSWER HERE", "explain: graded by the instructor, not written yet"),
                                           ("Attention is permutation-equivariant.", "explain: graded by the instructor")])
def test_an_explain_task_is_graded_by_the_instructor(tmp_path, capsys, written, says):
    """A graded markdown cell (a written answer) is reported, and does not decide the exit status."""
    graded = {"grade": True, "solution": True, "points": 2, "grade_id": "why_explain"}
    notebook = {"cells": [{"cell_type": "code", "source": "print('ok: done')",
                           "metadata": {"nbgrader": {"grade": True, "grade_id": "t_tests", "points": 1}}},
                          {"cell_type": "markdown", "source": written, "metadata": {"nbgrader": graded}}]}
    (tmp_path / "x.ipynb").write_text(json.dumps(notebook))
    assert selfcheck.check(tmp_path / "x.ipynb") == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "t_tests     (1 pt): passed (ok: done)" and lines[1] == f"why_explain (2 pt): {says}", lines
    assert lines[2].startswith("1 of 1 tasks passed (x.ipynb)") and "1 explain task graded by the instructor" in lines[2]
