"""The grader's side of a check (moe_course.course.limits.verdict) and the recorder the hidden tests call
(moe_course.course.inside.answers), without a kernel: inputs from the seed, outputs read as plain numbers only,
reasons that never quote an expected value, and a release that refuses checks that miss a grade cell."""

import io
import os

import numpy as np
import pytest

from moe_course.course.inside import answers

from moe_course.course.limits import verdict
from moe_course.course.inside.answers import Check

CHECKS = '''import numpy as np

from moe_course.course.inside.answers import Check

CHECKS = {
    "double_tests": Check(lambda rng: [(rng.normal(size=(2, 3)),), (rng.normal(size=4),)], lambda x: 2 * x),
    "count_tests": Check(lambda rng: [(int(rng.integers(1, 9)),)], lambda n: n + 1, exact=True, scalar=True),
}
'''


@pytest.fixture
def checks_file(tmp_path):
    path = tmp_path / "checks.py"
    path.write_text(CHECKS)
    return path


def _record(monkeypatch, checks_file, folder, seed, **functions):
    monkeypatch.setenv(answers.CHECKS_ENV, str(checks_file))
    monkeypatch.setenv(answers.ANSWERS_ENV, str(folder))
    monkeypatch.setenv(answers.SEED_ENV, str(seed))
    for grade_id, function in functions.items():
        answers.record(grade_id, function)


def test_the_seed_decides_the_inputs():
    check = Check(lambda rng: [(rng.normal(size=3),)], lambda x: x)
    same = [answers.check_cases(check, "a_tests", 7)[0][0] for _ in range(2)]
    assert np.array_equal(*same)
    assert not np.array_equal(same[0], answers.check_cases(check, "a_tests", 8)[0][0])
    assert not np.array_equal(same[0], answers.check_cases(check, "b_tests", 7)[0][0])  # each check its own


def test_recorded_answers_are_judged_outside(tmp_path, monkeypatch, checks_file):
    _record(monkeypatch, checks_file, tmp_path, 11, double_tests=lambda x: x + x, count_tests=lambda n: n + 1)
    assert verdict.verdicts(checks_file, tmp_path, 11) == {"double_tests": None, "count_tests": None}
    # the same answers for another submission's seed: other inputs, so they fail
    assert verdict.verdicts(checks_file, tmp_path, 12)["double_tests"].startswith("double_tests, case 1 of 2")


@pytest.mark.parametrize("function, reason", [
    (lambda x: 3 * x, "case 1 of 2: output 1 differs from the reference in 6 of 6 value(s)"),
    (lambda x: (2 * x)[..., :1], "output 1 has shape"),
    (lambda x: (2 * x, x), "returned 2 output(s), expected 1"),
    (lambda x: np.full(x.shape, np.nan), "non-finite value(s)"),
    (lambda x: (2 * x).astype(str), "is not numbers (dtype <U"),
])
def test_a_wrong_answer_gets_its_reason_and_never_the_expected_values(tmp_path, monkeypatch, checks_file,
                                                                       function, reason):
    _record(monkeypatch, checks_file, tmp_path, 3, double_tests=function)
    said = verdict.verdicts(checks_file, tmp_path, 3)["double_tests"]
    assert reason in said, said
    want = 2 * answers.check_cases(answers.load_checks(checks_file)["double_tests"], "double_tests", 3)[0][0]
    assert f"{want.flat[0]:.3g}" not in said and "largest" not in said


def test_a_scalar_check_wants_one_number(tmp_path, monkeypatch, checks_file):
    _record(monkeypatch, checks_file, tmp_path, 5, count_tests=lambda n: np.array([n + 1]))
    assert "is not one number" in verdict.verdicts(checks_file, tmp_path, 5)["count_tests"]


def test_what_the_function_raised_is_the_reason(tmp_path, monkeypatch, checks_file):
    def broken(x):
        raise ValueError("no")

    with pytest.raises(ValueError):
        _record(monkeypatch, checks_file, tmp_path, 1, double_tests=broken)
    said = verdict.verdicts(checks_file, tmp_path, 1)["double_tests"]
    assert said == "double_tests: your function raised ValueError: no"
    with pytest.raises(TypeError, match="object array"):
        _record(monkeypatch, checks_file, tmp_path, 1, double_tests=lambda x: np.array([object()]))
    assert "object array" in verdict.verdicts(checks_file, tmp_path, 1)["double_tests"]


WANTS = [(np.zeros((2, 3)),), (np.zeros(4),)]  # the shapes of double_tests' two cases


def test_forged_links_fifos_and_pickles_count_for_nothing(tmp_path, checks_file):
    nothing = "no answers were recorded"
    assert nothing in verdict.read_outputs(tmp_path, "double_tests", WANTS)
    (tmp_path / "elsewhere.npz").write_bytes(b"")
    os.symlink(tmp_path / "elsewhere.npz", tmp_path / "double_tests.npz")
    assert nothing in verdict.read_outputs(tmp_path, "double_tests", WANTS)  # a link is not followed
    os.remove(tmp_path / "double_tests.npz")
    os.mkfifo(tmp_path / "double_tests.npz")
    assert nothing in verdict.read_outputs(tmp_path, "double_tests", WANTS)  # returns at once: no reader hangs
    os.remove(tmp_path / "double_tests.npz")
    buffer = io.BytesIO()
    np.savez(buffer, c0_0=np.array([{"any": 1}], dtype=object), c1_0=np.zeros(4))
    (tmp_path / "double_tests.npz").write_bytes(buffer.getvalue())
    assert "were not read" in verdict.read_outputs(tmp_path, "double_tests", WANTS)  # no unpickling
    (tmp_path / "double_tests.npz").write_bytes(b"PK\x03\x04 not a zip")
    assert "cannot be read" in verdict.read_outputs(tmp_path, "double_tests", WANTS)
    buffer = io.BytesIO()
    np.savez(buffer, c0_0=np.zeros((2, 3)))
    (tmp_path / "double_tests.npz").write_bytes(buffer.getvalue())
    assert verdict.read_outputs(tmp_path, "double_tests", WANTS) == "double_tests: no answer recorded for case 2"


@pytest.mark.parametrize("forgery", ["zip", "header", "name"])
def test_recorded_answers_are_sized_against_the_references_before_anything_is_inflated(tmp_path, forgery):
    """A small .npz whose zip member (or .npy header) declares 64 MiB is refused from its directory and header
    alone: nothing near that size is allocated in the grading process, outside the sandbox."""
    import tracemalloc
    import zipfile

    header = io.BytesIO()
    shape = (2**23,) if forgery != "name" else (2, 3)
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(tmp_path / "double_tests.npz", "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("c0_0.npy" if forgery != "name" else "x.npy", "w", force_zip64=True) as member:
            member.write(header.getvalue())
            if forgery == "zip":
                for _ in range(64):
                    member.write(bytes(2**20))
    assert (tmp_path / "double_tests.npz").stat().st_size < 2**20
    tracemalloc.start()
    said = verdict.read_outputs(tmp_path, "double_tests", WANTS)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert said.startswith("double_tests: the recorded answers were not read: the file "), said
    assert ("no output of a case" if forgery == "name" else "more than its shape allows") in said, said
    assert peak < 2**20, peak


def test_outside_grading_record_judges_at_once(monkeypatch, checks_file):
    monkeypatch.delenv(answers.ANSWERS_ENV, raising=False)
    monkeypatch.setenv(answers.CHECKS_ENV, str(checks_file))
    answers.record("double_tests", lambda x: 2 * x)
    with pytest.raises(AssertionError, match="double_tests, case 1 of 2: output 1 differs"):
        answers.record("double_tests", lambda x: x)


def test_release_refuses_checks_that_do_not_match_the_grade_cells(tmp_path):
    from moe_course.course.instructor.build import ReleaseError, install_checks
    from moe_course.course.limits.config import SOLUTIONS

    solution = tmp_path / "02_moe_layer.py"
    solution.write_text((SOLUTIONS / "02_moe_layer.py").read_text())
    with pytest.raises(ReleaseError, match="is missing"):
        install_checks(solution, tmp_path / "course")
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "02_moe_layer.py").write_text(CHECKS)
    with pytest.raises(ReleaseError, match=r"missing \[.*'capacity_tests'.*'topk_tests'.*\], unknown \['count_tests', 'double_tests'\]"):
        install_checks(solution, tmp_path / "course")
    (tmp_path / "checks" / "02_moe_layer.py").write_text((SOLUTIONS / "checks" / "02_moe_layer.py").read_text())
    installed = install_checks(solution, tmp_path / "course")
    assert installed.read_text() == (tmp_path / "checks" / "02_moe_layer.py").read_text()


def test_a_solution_notebook_run_by_hand_finds_its_checks(tmp_path, monkeypatch):
    """Outside grading, without MOE_COURSE_CHECKS, record finds solutions/checks/<folder name>.py: an
    instructor running a solution in nbgrader's source/<assignment>/ folder sees a failing check at once."""
    from moe_course.course.limits.config import SOLUTIONS

    for name in (answers.ANSWERS_ENV, answers.CHECKS_ENV, answers.SEED_ENV):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "02_moe_layer").mkdir()
    monkeypatch.chdir(tmp_path / "02_moe_layer")
    checks = answers.load_checks(SOLUTIONS / "checks" / "02_moe_layer.py")
    answers.record("capacity_tests", lambda *case: checks["capacity_tests"].reference(*case))
    with pytest.raises(AssertionError, match="capacity_tests, case 1 of"):
        answers.record("capacity_tests", lambda *case: 0)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="set MOE_COURSE_CHECKS"):
        answers.record("capacity_tests", lambda *case: 0)
