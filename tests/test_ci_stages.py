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


GROUPED = """
import os

import pytest

@pytest.fixture(scope="module")
def shared():
    with open(os.environ["FIXTURE_LOG"], "a") as log:
        log.write(os.environ.get("PYTEST_XDIST_WORKER", "-") + "\\n")

@pytest.mark.parametrize("i", range(6))
def test_uses_it(shared, i):
    pass

def test_skips_too(shared):
    pytest.skip("needs something stage 1 lacks")
"""


def test_the_stages_in_two_xdist_workers_keep_a_shared_fixture_in_one(pytester, monkeypatch):
    """README command 2's -n 2 --dist loadgroup: a file of SHARED_FIXTURE_FILES (here test_site.py) runs in one
    worker, so its module fixture is made once; the skipped tests are recorded without xdist's "@group" and
    stage 2 runs exactly them; -m with --record-unrun under -n is refused (the workers' deselections would be
    lost)."""
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(test_mixed=TESTS, test_site=GROUPED)
    unrun, log = pytester.path / "unrun.txt", pytester.path / "fixture.log"
    monkeypatch.setenv("FIXTURE_LOG", str(log))
    options = ["-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup"]
    first = pytester.runpytest_subprocess(*options, f"--record-unrun={unrun}")
    first.assert_outcomes(passed=8, skipped=2, xfailed=1)
    assert len(log.read_text().splitlines()) == 1, log.read_text()  # made once, in one worker
    assert sorted(unrun.read_text().splitlines()) == ["test_mixed.py::test_skips", "test_site.py::test_skips_too"]
    second = pytester.runpytest_subprocess(*options, f"--only-listed={unrun}")
    second.assert_outcomes(skipped=2)
    refused = pytester.runpytest_subprocess(*options, "-m", "not slow", f"--record-unrun={unrun}")
    assert refused.ret != 0 and "--record-unrun cannot see the tests -m or -k deselect" in refused.stdout.str() + \
        refused.stderr.str()


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
