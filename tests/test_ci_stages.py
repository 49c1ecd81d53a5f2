"""The options of tests/conftest.py that split .ci/run into two stages run every test exactly once."""

from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py").read_text()
TESTS = """
import pytest

def test_runs():
    pass

def test_skips():
    pytest.skip("needs something stage 1 lacks")

@pytest.mark.slow
def test_slow():
    pass

@pytest.mark.xfail(reason="known")
def test_expected_failure():
    assert False
"""


def test_stage_two_runs_exactly_what_stage_one_skipped_or_deselected(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(test_mixed=TESTS,
                        test_needs_missing='import pytest\npytest.importorskip("no_such_module_here")\n'
                                           'def test_a():\n    pass\n')
    unrun = pytester.path / "unrun.txt"
    first = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "not slow", f"--record-unrun={unrun}")
    first.assert_outcomes(passed=1, skipped=2, deselected=1, xfailed=1)
    assert sorted(unrun.read_text().splitlines()) == ["test_mixed.py::test_skips", "test_mixed.py::test_slow",
                                                      "test_needs_missing.py"]
    second = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--only-listed={unrun}", "-v")
    second.assert_outcomes(passed=1, skipped=2, deselected=2)  # test_slow runs; the skips skip again
    second.stdout.fnmatch_lines(["*test_slow PASSED*"])
    assert "test_runs PASSED" not in second.stdout.str()


def test_an_empty_list_runs_nothing_and_passes(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_one="def test_a():\n    pass\n")
    empty = pytester.path / "empty.txt"
    empty.write_text("")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--only-listed={empty}")
    assert result.ret == 0
    result.assert_outcomes(deselected=1)


def test_a_missing_list_is_refused(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_one="def test_a():\n    pass\n")
    result = pytester.runpytest_subprocess(f"--only-listed={pytester.path / 'nowhere.txt'}")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--only-listed=*nowhere.txt*no such file*"])
