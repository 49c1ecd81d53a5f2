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

from moe_course.course.limits.config import EXERCISES, SOLUTIONS, checks_file, course_paths, nbgrader_config

ASSIGNMENT_PATTERN = re.compile(r"^\d\d_[a-z0-9_]+$")
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
# Text that must never reach a learner: nbgrader's markers around answers and hidden tests.
SECRET_MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "BEGIN HANDOUT",
                  "END HANDOUT")
HANDOUT = re.compile(r"^[ \t]*### BEGIN HANDOUT\n(.*?)^[ \t]*### END HANDOUT\n", re.M | re.S)
MARKDOWN_SOLUTION = re.compile(r"^### BEGIN SOLUTION$.*^### END SOLUTION$", re.M | re.S)


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


def hand_out_debug_code(notebook_path: Path) -> int:
    """Put the given code of every debug task into the released notebook at ``notebook_path``: a solution code
    cell that holds ``### BEGIN HANDOUT`` / ``### END HANDOUT`` (working code with one planted bug) before its
    ``### BEGIN SOLUTION`` region (the fixed code) is released as the handout code alone, without nbgrader's
    stub and the markers. Returns how many cells it changed."""
    notebook = nbformat.read(notebook_path, as_version=4)
    changed = 0
    for cell in notebook.cells:
        if cell.cell_type == "code" and (given := HANDOUT.search(cell.source)):
            cell.source = given.group(1).rstrip("\n")
            changed += 1
    if changed:
        nbformat.write(notebook, notebook_path)
    return changed


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

    from moe_course.course.inside.answers import check_cases, load_checks
    from moe_course.course.limits.inputs import hidden_packages, inputs_only

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
            same = len(ours) == len(theirs) and all(_same_input(a, b) for a, b in zip(ours, theirs))
            if not same:
                raise ReleaseError(f"{checks}: the sandbox's version of {grade_id} draws other inputs for seed {seed}")


def _same_input(a, b) -> bool:
    """Whether two drawn inputs are equal: arrays and numbers by value, tuples and lists item by item, dicts (a
    parameter tree) key by key."""
    import numpy as np

    if isinstance(a, dict) or isinstance(b, dict):
        return isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and all(
            _same_input(a[key], b[key]) for key in a)
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b) and all(
            _same_input(x, y) for x, y in zip(a, b))
    return np.array_equal(np.asarray(a), np.asarray(b))


def graded_functions(solution: Path) -> dict[str, list[str]]:
    """{grade_id: the names of the functions its hidden test records} of one solution file, read from its
    syntax tree (``record("topk_tests", top_k_routing)``, or a tuple of names; a lambda records no name)."""
    import ast

    found = {}
    for node in ast.walk(ast.parse(Path(solution).read_text(), filename=str(solution))):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "record"
                and len(node.args) == 2 and isinstance(node.args[0], ast.Constant)):
            answer = node.args[1]
            parts = answer.elts if isinstance(answer, ast.Tuple) else [answer]
            found[node.args[0].value] = [part.id for part in parts if isinstance(part, ast.Name)]
    return found


def _sandbox_helpers(checks: Path) -> dict[str, object]:
    """{name: function} of what the sandbox's version of ``checks`` (``inputs.inputs_only``) defines at
    module level: the helpers a submission can read and call."""
    import importlib.util
    import inspect
    import tempfile

    from moe_course.course.limits.inputs import inputs_only

    with tempfile.TemporaryDirectory() as folder:
        stripped = Path(folder) / checks.name
        stripped.write_text(inputs_only(checks.read_text(), checks))
        spec = importlib.util.spec_from_file_location(f"moe_course_sandbox_checks_{checks.stem}", stripped)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return {name: value for name, value in vars(module).items()
            if inspect.isfunction(value) and value.__module__ == module.__name__}


ANSWER_ARITIES = (1, 2, 3)  # a check's answer: one function, or a tuple of 2 or 3 (its ``call`` unpacks them)


def _answered_parts(helper, check, grade_id: str, cases: list, wants) -> list[int]:
    """The output positions of ``check`` that ``helper`` answers on ``cases``: all of them (as [-1]) when it,
    called as the learner's function, passes the whole check; else, where the check calls a tuple of n
    functions (each giving one output), the positions p whose output a tuple of n copies of ``helper``
    gets right in every case. ``wants(n)`` gives the references of the first n cases (computed only when
    needed: the first case decides whether the others are worth computing)."""
    from moe_course.course.inside.compare import judge

    def passes(outputs, pick=None) -> bool:
        for count in (1, len(cases)):
            references = wants(count)
            if pick is not None:
                if any(len(got) != len(want) for got, want in zip(outputs, references)):
                    return False
                got, want = [(out[pick],) for out in outputs[:count]], [(ref[pick],) for ref in references]
            else:
                got, want = outputs[:count], references
            if judge(check, grade_id, cases[:count], got, want) is not None:
                return False
        return True

    for arity in ANSWER_ARITIES:
        answer = helper if arity == 1 else (helper,) * arity
        try:
            outputs = [check.outputs(answer, case) for case in cases]
        except Exception:  # not a working call of this shape: the usual case for a helper
            continue
        if arity == 1:
            if passes(outputs):
                return [-1]
        elif all(len(out) == arity for out in outputs):
            return [p for p in range(arity) if passes(outputs, p)]
    return []


def check_no_cross_answers(solutions_dir: Path = SOLUTIONS, names=None, seed: int = 0) -> None:
    """Check that the sandbox checks files of the assignments ``names`` (all for None) hold no helper that
    answers any assignment's graded function: every module-level function of such a ``checks/NN_slug.py``
    without its references (``_sandbox_helpers``: what a submission can read, print into its feedback and
    paste into another assignment) is refused when its name, leading underscores dropped, is a graded
    function's name in any ``NN_slug.py`` (``graded_functions``), or when, called as the answer, it passes any
    assignment's check on the inputs of ``seed`` (or one part of a check of several functions;
    ``_answered_parts``), or when it -- or a lambda of the file -- shares code with any function of any
    ``NN_slug.py``, whatever its signature: its whole body or one expression of at least
    ``shared_code.MIN_NODES`` nodes, equal after normalising names (``shared_code``; 03's old ``_routing(rng,
    shape, num_experts)`` held 02's ``top_k_routing`` and passed no check, taking a generator). Raises
    ReleaseError naming, for every such helper, the file and the function or check it answers."""
    import functools

    from moe_course.course.instructor import shared_code
    from moe_course.course.inside.answers import check_cases, load_checks
    from moe_course.course.limits.inputs import inputs_only
    from moe_course.course.limits.verdict import references

    files = sorted(p for p in (Path(solutions_dir) / "checks").glob("[0-9][0-9]_*.py")
                   if ASSIGNMENT_PATTERN.match(p.stem))
    graded = {function: assignment for assignment in assignment_names(solutions_dir)
              for functions in graded_functions(Path(solutions_dir) / f"{assignment}.py").values()
              for function in functions}
    all_checks = [(checks.stem, grade_id, check) for checks in files for grade_id, check in load_checks(checks).items()]
    cases = {(name, grade_id): check_cases(check, grade_id, seed) for name, grade_id, check in all_checks}
    wants = {(name, grade_id): functools.cache(lambda count, check=check, given=cases[name, grade_id]:
                                               references(check, given[:count]))
             for name, grade_id, check in all_checks}
    solution_functions = [(assignment, name, function) for assignment in assignment_names(solutions_dir)
                          for name, function in shared_code.functions(
                              (Path(solutions_dir) / f"{assignment}.py").read_text()).items()]
    found = []
    for checks in (p for p in files if not names or p.stem in names):
        sandboxed = shared_code.functions(inputs_only(checks.read_text(), checks), str(checks), lambdas=True)
        for helper_name, helper in sandboxed.items():
            for assignment, name, function in solution_functions:
                if pieces := shared_code.shared(helper, function):
                    found.append(f"{checks}: {helper_name} shares code with {assignment}'s {name} "
                                 f"({'; '.join(pieces[:2])[:200]})")
        for helper_name, helper in _sandbox_helpers(checks).items():
            if (owner := graded.get(helper_name.lstrip("_"))) is not None:
                found.append(f"{checks}: {helper_name} is named as {owner}'s graded function")
            for name, grade_id, check in all_checks:
                if parts := _answered_parts(helper, check, grade_id, cases[name, grade_id], wants[name, grade_id]):
                    which = "" if parts == [-1] else f" (output {', '.join(str(p + 1) for p in parts)})"
                    found.append(f"{checks}: {helper_name} answers {name}'s {grade_id}{which}")
    if found:
        raise ReleaseError("a sandbox's checks file keeps a helper that a submission can read there and paste into "
                           "an assignment (draw the inputs without it, or compute what it gives in a reference, "
                           "outside the sandbox): " + "; ".join(found))


def install_checks(solution: Path, course_dir: Path) -> Path:
    """Copy ``checks/<name>.py`` beside ``solution`` into the course (``config.checks_file``) after checking
    that it has a check for every graded code cell of the solution and nothing else, and that its sandbox version
    (without references) draws the same inputs (``check_inputs_only``); returns the copy. A graded markdown cell
    is an explain cell, graded by the instructor: it has no check, and must be a solution cell whose answer and
    rubric sit between the solution markers (so nbgrader releases ``YOUR ANSWER HERE`` in their place).
    Raises ReleaseError naming the file and the grade cells that differ, or a graded markdown cell that is not
    an explain cell."""
    from moe_course.course.inside.answers import load_checks

    name = Path(solution).stem
    checks = Path(solution).parent / "checks" / f"{name}.py"
    if not checks.is_file():
        raise ReleaseError(f"{checks} is missing: every graded cell is judged by a check there (see "
                           f"solutions/README.md)")
    cells = source_notebook(solution).cells
    graded = {cell.metadata["nbgrader"]["grade_id"] for cell in cells
              if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade")}
    for cell in cells:  # an explain cell: graded by the instructor (no check), its answer and rubric never released
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "markdown" and meta.get("grade") and not (meta.get("solution") and MARKDOWN_SOLUTION
                                                                       .search(cell.source)):
            raise ReleaseError(f"{solution}: the graded markdown cell {meta.get('grade_id')!r} must be an explain "
                               f"cell: nbgrader metadata \"solution\": true and its model answer and rubric between "
                               f"### BEGIN SOLUTION and ### END SOLUTION (released as YOUR ANSWER HERE)")
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

    Copies each assignment's checks into the course (``install_checks``), after checking every assignment's
    checks against every assignment's graded functions (``check_no_cross_answers``).

    Raises ValueError for an unknown assignment name, ReleaseError when nbgrader fails, a released notebook
    still holds a SECRET_MARKER, the checks do not match the grade cells, or a checks file keeps a helper that
    answers a graded function.
    """
    from nbgrader.apps import NbGraderAPI

    names = check_names(names, solutions_dir)
    check_no_cross_answers(solutions_dir, names)
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
        hand_out_debug_code(notebook)
        if leaked := leaked_markers(notebook):
            raise ReleaseError(f"{notebook} still contains {leaked}; check the markers in solutions/{name}.py")
        if exercises_dir is not None:
            Path(exercises_dir).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(notebook, Path(exercises_dir) / f"{name}.ipynb")
        released.append(notebook)
    return released
