"""exercises/ is what `moe-course course release` makes of solutions/, byte for byte, and holds no answer or
hidden test; every chapter has its assignment. Needs nbgrader (the `test` extra installs it)."""

import re
from pathlib import Path

import pytest

pytest.importorskip("nbgrader", reason="nbgrader is not installed: pip install -e '.[instructor]'")

from moe_course.cli import main  # noqa: E402
from moe_course.course.instructor import build  # noqa: E402
from moe_course.course.instructor.build import SECRET_MARKERS, assignment_names  # noqa: E402
from test_chapters import WITHOUT_ASSIGNMENT  # noqa: E402  (chapters with no assignment, and why)

ROOT = Path(__file__).resolve().parents[1]
REGION = re.compile(r"### BEGIN (SOLUTION|HIDDEN TESTS)\n(.*?)### END \1", re.S)


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    folder = tmp_path_factory.mktemp("release")
    assert main(["course", "release", "--course-dir", str(folder / "course"), "--exercises",
                 str(folder / "exercises")]) == 0
    return folder / "exercises"


def test_every_chapter_has_an_assignment():
    chapters = {p.stem for p in (ROOT / "chapters").glob("[0-9][0-9]_*.py")} - set(WITHOUT_ASSIGNMENT)
    missing = chapters - set(assignment_names())
    assert not missing, f"chapters without solutions/<chapter>.py: {sorted(missing)}"


def test_exercises_equal_a_fresh_release(regenerated):
    committed = sorted(p.name for p in (ROOT / "exercises").glob("*.ipynb"))
    assert committed == sorted(p.name for p in regenerated.glob("*.ipynb")) == [f"{n}.ipynb" for n in assignment_names()]
    for name in committed:
        assert (ROOT / "exercises" / name).read_bytes() == (regenerated / name).read_bytes(), (
            f"exercises/{name} differs from a fresh release: run `moe-course course release` and commit")


@pytest.mark.parametrize("name", assignment_names())
def test_exercise_holds_no_answer_or_hidden_test(name):
    source = (ROOT / "solutions" / f"{name}.py").read_text()
    released = (ROOT / "exercises" / f"{name}.ipynb").read_text()
    public = REGION.sub("", source)
    secret = {line.strip() for _, body in REGION.findall(source) for line in body.splitlines()}
    # Lines of an answer or hidden test that the visible text does not also contain must not be released.
    leaked = [line for line in secret if len(line) > 8 and line not in public and line.replace('"', '\\"') in released]
    assert not leaked, f"exercises/{name}.ipynb contains answer or hidden-test lines: {leaked[:5]}"
    assert not [m for m in SECRET_MARKERS if m in released]
    assert len(REGION.findall(source)) >= 4, "an assignment has answers and hidden tests"
    assert "raise NotImplementedError()" in released


def _explain_cells(notebook) -> dict:
    """{grade_id: source} of the explain cells (graded markdown cells) of a notebook node or JSON dict."""
    return {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in notebook["cells"]
            if c["cell_type"] == "markdown" and c["metadata"].get("nbgrader", {}).get("grade")}


@pytest.mark.parametrize("name", assignment_names())
def test_an_explain_answer_and_its_rubric_are_never_released(name):
    """The model answer and the rubric of every explain cell (between its solution markers) are replaced by
    nbgrader's YOUR ANSWER HERE; no line of them is anywhere in the released notebook."""
    import json

    source = _explain_cells(build.source_notebook(ROOT / "solutions" / f"{name}.py"))
    released_text = (ROOT / "exercises" / f"{name}.ipynb").read_text()
    released = _explain_cells(json.loads(released_text))
    assert sorted(released) == sorted(source)
    for grade_id, text in source.items():
        assert released[grade_id] == "YOUR ANSWER HERE", (name, grade_id)
        answer = REGION.search(text + "\n").group(2)
        assert "Rubric" in answer, f"{name}: {grade_id} has no rubric for the instructor"
        leaked = [line for line in answer.splitlines() if len(line.strip()) > 8 and line.strip() in released_text]
        assert not leaked, (name, grade_id, leaked[:3])


DEBUG_TASKS = {"01_vit": "attention_debug", "02_moe_layer": "softmax_debug", "03_vmoe_bpr": "order_debug",
               "04_limoe": "padding_debug", "05_soft_moe": "layer_debug", "06_mod": "block_debug",
               "07_scale": "bytes_debug", "08_upcycling": "normalized_debug"}  # the debug task of each assignment (issue 53)


@pytest.mark.parametrize("name", sorted(DEBUG_TASKS))
def test_a_debug_task_hands_out_code_that_fails_its_hidden_check(name, tmp_path, monkeypatch):
    """The released debug cell holds the handout code (the planted bug), not nbgrader's stub; run on the grader's
    inputs (after the solution's cells above it: the learner's earlier answers), that code fails the check of the
    test cell that records its function (the fixed code in the solution passes it: the grading round trip's full
    marks)."""
    import json

    from moe_course.course.inside.answers import check_cases, load_checks
    from moe_course.course.inside.compare import judge
    from moe_course.course.limits.verdict import references

    cells = json.loads((ROOT / "exercises" / f"{name}.ipynb").read_text())["cells"]
    by_id = {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(c["source"]) for c in cells}
    handout = by_id[DEBUG_TASKS[name]]
    assert "NotImplementedError" not in handout and "HANDOUT" not in handout, handout
    namespace = {}
    monkeypatch.chdir(tmp_path)  # a prediction's record cell writes NN_slug.predictions.json beside the notebook
    for cell in build.source_notebook(ROOT / "solutions" / f"{name}.py").cells:  # setup and the answers above it
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade_id") == DEBUG_TASKS[name]:
            break
        if cell.cell_type == "code" and not meta.get("grade"):
            exec(cell.source, namespace)
    exec(handout, namespace)
    graded = build.graded_functions(ROOT / "solutions" / f"{name}.py")
    grade_id, function = next((g, f[0]) for g, f in graded.items() if f and f[0] in namespace and
                              f"def {f[0]}(" in handout)
    check = load_checks(ROOT / "solutions" / "checks" / f"{name}.py")[grade_id]
    cases = check_cases(check, grade_id, 0)
    reason = judge(check, grade_id, cases, [check.outputs(namespace[function], c) for c in cases],
                   references(check, cases))
    assert reason is not None, f"{name}: the handout's {function} passes {grade_id}"


def test_exercise_5s_debug_test_shows_the_normalised_slots():
    """Task 2's visible test fails on the handed-out port (slots of normalised tokens) with a message that names
    the symptom and no expected value, and passes on the fixed code."""
    cells = build.source_notebook(ROOT / "solutions" / "05_soft_moe.py").cells
    visible = {c.metadata["nbgrader"]["grade_id"]: c.source.split("### BEGIN HIDDEN TESTS")[0]
               for c in cells if c.metadata.get("nbgrader", {}).get("grade_id")}
    namespace = {}
    exec(visible["setup"], namespace)
    handout = visible["layer_debug"]
    exec(handout[handout.index("### BEGIN HANDOUT"):handout.index("### END HANDOUT")], namespace)
    with pytest.raises(AssertionError, match="unchanged"):
        exec(visible["slots_tests"], namespace)
    exec(handout[handout.index("### BEGIN SOLUTION"):handout.index("### END SOLUTION")], namespace)
    exec(visible["slots_tests"], namespace)


def test_a_graded_markdown_cell_without_its_solution_markers_is_refused(tmp_path):
    """A graded markdown cell is an explain cell: without the markers nbgrader would release the rubric."""
    solutions = tmp_path / "solutions"
    (solutions / "checks").mkdir(parents=True)
    text = (ROOT / "solutions" / "01_vit.py").read_text()
    assert "# ### BEGIN SOLUTION\n# The same output" in text
    (solutions / "01_vit.py").write_text(text.replace("# ### BEGIN SOLUTION\n# The same output", "# The same output"))
    (solutions / "checks" / "01_vit.py").write_text((ROOT / "solutions" / "checks" / "01_vit.py").read_text())
    with pytest.raises(build.ReleaseError, match="'positions_explain' must be an explain cell"):
        build.install_checks(solutions / "01_vit.py", tmp_path / "course")


@pytest.mark.parametrize("argv, message", [
    (["release", "99_nope"], "assignment='99_nope' is not allowed"),
    (["collect", "/nonexistent", "--assignment", "01_vit"], "export_dir='/nonexistent' is not a folder"),
    # --memory-mb 2048: past the jobs x memory check on a machine with less memory available than the default needs
    (["autograde", "01_vit", "--memory-mb", "2048"], "assignment='01_vit' is not released"),
    (["autograde", "01_vit", "--jobs", "0"], "jobs=0 is not allowed"),
    (["autograde", "01_vit", "--cell-timeout", "0"], "cell_timeout=0 is not allowed"),
])
def test_bad_input_is_one_clear_line(argv, message, tmp_path, capsys):
    assert main(["course", *argv, "--course-dir", str(tmp_path / "course")]) == 2
    assert message in capsys.readouterr().err


def test_autograde_refuses_without_bubblewrap_unless_told_and_says_so_per_row(tmp_path, capsys, monkeypatch):
    from moe_course.course.instructor import grade
    from moe_course.course.limits import sandbox

    course = tmp_path / "course"
    (course / "release" / "01_vit").mkdir(parents=True)
    (course / "submitted" / "ann" / "01_vit").mkdir(parents=True)
    (course / "gradebooks" / "01_vit").mkdir(parents=True)
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    # --memory-mb 2048: the jobs x memory check passes on a small machine too, so that the sandbox's is reached
    assert main(["course", "autograde", "01_vit", "--course-dir", str(course), "--memory-mb", "2048"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "apt-get install bubblewrap" in err[0] and "--no-sandbox" in err[0], err
    monkeypatch.setattr(grade, "_run_worker", lambda course_dir, assignment, student, limits, uid, **how: {
        "student": student, "assignment": assignment, "status": "graded", "error": "", "score": 1.0, "max_score": 1.0})
    monkeypatch.setattr(grade, "scan_notebook", lambda notebook, limit: [])
    assert main(["course", "autograde", "01_vit", "--course-dir", str(course), "--no-sandbox", "--memory-mb",
                 "2048"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "capped per process only" in line]
    assert said == ["moe-course course autograde: memory is capped per process only (no cgroup per submission: grade "
                    "as root, or as a user whose systemd manager has the memory controller delegated, for one): each "
                    "of a submission's up to 512 processes may take 2048 MiB (--memory-mb), and memfd files, which "
                    "count against no process, 64 MiB each with 1024 open per process"], said
    kernelspec = course / "jupyter" / "kernels" / "moe-course-grader" / "kernel.json"
    assert "moe_course.course.inside.kernel" in kernelspec.read_text()
    record = (course / "gradebooks" / "01_vit" / "ann.json").read_text()
    assert '"sandbox": "none (--no-sandbox)"' in record


CHECKS_HEADER = "import numpy as np\n\nfrom moe_course.course.inside.answers import Check\n\n\n"
ONE_ANSWER = "CHECKS = {'double_tests': Check(lambda rng: [(rng.normal(size=5),)], lambda x: 2 * x)}\n"
TWO_ANSWERS = ("CHECKS = {'double_tests': Check(lambda rng: [(rng.normal(size=5),)], lambda x: (x - 1, 2 * x),\n"
               "                              call=lambda functions, x: (functions[0](x), functions[1](x)))}\n")


def _solutions(folder: Path, helpers: str, graded: str = ONE_ANSWER) -> Path:
    """A solutions folder of two small assignments: 01_double, whose graded function ``double`` (with
    ``minus_one`` for ``TWO_ANSWERS``) is checked against 2 x, and 02_other, whose checks file's sandbox side
    holds ``helpers`` (defining ``_cases``)."""
    (folder / "checks").mkdir(parents=True)
    (folder / "01_double.py").write_text("_answers.record('double_tests', (minus_one, double))\n")
    (folder / "checks" / "01_double.py").write_text(CHECKS_HEADER + graded)
    (folder / "02_other.py").write_text("_answers.record('sum_tests', total)\n")
    (folder / "checks" / "02_other.py").write_text(
        CHECKS_HEADER + helpers + "\n\nCHECKS = {'sum_tests': Check(_cases, lambda x: x.sum(), scalar=True)}\n")
    return folder


DRAWS = "def _cases(rng):\n    return [(rng.normal(size=4),)]\n"
TWICE = "def _twice(x):\n    return x + x\n\n\ndef _cases(rng):\n    return [(_twice(rng.normal(size=4)),)]\n"
NAMED = "def _double(rng):\n    return rng.normal(size=4)\n\n\ndef _cases(rng):\n    return [(_double(rng),)]\n"


def test_graded_functions_are_read_from_the_record_calls():
    functions = build.graded_functions(ROOT / "solutions" / "02_moe_layer.py")
    assert functions["topk_tests"] == ["top_k_routing"], functions


@pytest.mark.parametrize("helpers, graded, found", [
    (DRAWS, ONE_ANSWER, None),
    (TWICE, ONE_ANSWER, "02_other.py: _twice answers 01_double's double_tests"),
    (TWICE, TWO_ANSWERS, "02_other.py: _twice answers 01_double's double_tests (output 2)"),
    (NAMED, ONE_ANSWER, "02_other.py: _double is named as 01_double's graded function"),
], ids=["clean", "answers", "answers-one-of-two", "named"])
def test_a_helper_that_answers_another_assignment_is_refused(helpers, graded, found, tmp_path):
    solutions = _solutions(tmp_path / "solutions", helpers, graded)
    if found is None:
        build.check_no_cross_answers(solutions)
        return
    with pytest.raises(build.ReleaseError) as refused:
        build.check_no_cross_answers(solutions)
    assert found in str(refused.value) and "outside the sandbox" in str(refused.value), refused.value
    # release refuses before it writes anything, also when only the leaking assignment is released
    with pytest.raises(build.ReleaseError, match="_twice|_double"):
        build.release(tmp_path / "course", ["02_other"], solutions_dir=solutions, exercises_dir=None)
    assert not (tmp_path / "course" / "release").exists()
    build.check_no_cross_answers(solutions, ["01_double"])  # 01's own checks file keeps no helper


# 03's sandbox helper before it was taken out: 02's graded top_k_routing behind another signature (it takes the
# generator, so called as an answer it passed no check; a learner wrapped it with an object whose normal() gives
# the logits).
OLD_ROUTING = '''def _routing(rng, shape, num_experts, decimals=None):
    """(expert_index, gates), each ``shape`` = (groups, tokens, k), for random logits drawn here."""
    groups, tokens, k = shape
    logits = rng.normal(size=(groups, tokens, num_experts))
    logits = logits if decimals is None else np.round(logits, decimals)
    z = logits - logits.max(axis=-1, keepdims=True)
    probs = (np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)).astype(np.float32)
    expert_index = np.argsort(-probs, axis=-1, kind="stable")[..., :k].astype(np.int32)
    return expert_index, np.take_along_axis(probs, expert_index, axis=-1)
'''
OLD_TOP_K = '''# %% nbgrader={"grade": false, "grade_id": "topk_answer", "locked": false, "schema_version": 3, "solution": true}
def top_k_routing(logits, k):
    ### BEGIN SOLUTION
    shifted = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
    expert_index = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    return expert_index, np.take_along_axis(probs, expert_index, axis=-1)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "topk_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false}
### BEGIN HIDDEN TESTS
_answers.record("topk_tests", top_k_routing)
### END HIDDEN TESTS
'''
ROUTING_CHECKS = (CHECKS_HEADER + "{helper}\n\ndef _cases(rng):\n    return [{call}]\n\n\n"
                  "CHECKS = {{'served_tests': Check(_cases, lambda i, g: int(i.sum()), scalar=True)}}\n")


@pytest.mark.parametrize("helper, call", [
    (OLD_ROUTING, "_routing(rng, (2, 14, 1), 5)"),
    # renamed, its steps inlined into one statement, behind a lambda of the CHECKS line's kind
    ("def _draw(generator, e):\n    s = generator.normal(size=(2, 3, e))\n    return np.argsort(-(np.exp(s) / "
     "np.exp(s).sum(axis=-1, keepdims=True)), axis=-1, kind='stable')", "(_draw(rng, 4), 0)"),
], ids=["03-routing", "renamed-and-inlined"])
def test_a_helper_that_holds_a_solution_functions_code_is_refused_whatever_its_signature(helper, call, tmp_path):
    import shutil

    folder = tmp_path / "solutions"
    (folder / "checks").mkdir(parents=True)
    shutil.copyfile(ROOT / "solutions" / "checks" / "02_moe_layer.py", folder / "checks" / "02_moe_layer.py")
    (folder / "02_moe_layer.py").write_text(OLD_TOP_K)  # 02's NumPy answer before issue 61 (now in jax.numpy)
    (folder / "03_vmoe_bpr.py").write_text("_answers.record('served_tests', bpr_top1_served)\n")
    (folder / "checks" / "03_vmoe_bpr.py").write_text(ROUTING_CHECKS.format(helper=helper, call=call))
    with pytest.raises(build.ReleaseError) as refused:
        build.check_no_cross_answers(folder)
    name = helper.split("(")[0].removeprefix("def ")
    assert f"03_vmoe_bpr.py: {name} shares code with 02_moe_layer's top_k_routing (" in str(refused.value), refused
    (folder / "checks" / "03_vmoe_bpr.py").write_text(
        ROUTING_CHECKS.format(helper="", call="(rng.integers(0, 5, size=(2, 14)), rng.random((2, 14)))"))
    build.check_no_cross_answers(folder)  # inputs drawn as such share nothing


def test_shared_code_matches_renamed_variables_not_small_idioms():
    from moe_course.course.instructor import shared_code

    answer, = shared_code.functions("def f(logits):\n    '''Doc.'''\n    z = np.exp(logits - logits.max(axis=-1))\n"
                                    "    return z / z.sum(axis=-1, keepdims=True)\n").values()
    same, = shared_code.functions("def g(a, b=1):\n    w = np.exp(a - a.max(axis=-1))\n"
                                  "    return w / w.sum(axis=-1, keepdims=True)\n").values()
    wrapped, = shared_code.functions("def h(rng):\n    y = rng.normal(size=3)\n"
                                     "    return 2 * (y / y.sum(axis=-1, keepdims=True))\n").values()
    small, = shared_code.functions("def k(x):\n    return x / x.sum()\n").values()
    assert shared_code.shared(same, answer)[0] == "the whole body"
    assert shared_code.shared(wrapped, answer) == ["y / y.sum(axis=-1, keepdims=True)"]
    assert shared_code.shared(small, answer) == []
