"""Shared fixtures, and the two options that split the suite between the stages of .ci/run.

``--record-unrun=PATH`` (stage 1, README command 1's install: no PyTorch, no nbgrader) writes the node id of every
test that skipped or was deselected to PATH; ``--only-listed=PATH`` (stage 2, after PyTorch and the instructor
extra are added) runs only those. Together they run the whole suite once; a user's README command 2 runs all of
it. Give the path with "=": pytest reads its command line before this file adds the
options, and a path standing on its own would be taken for a folder of tests (and the tests' root with it).

README command 2 (which CI runs in both stages) runs the suite in two pytest-xdist worker processes (``-n 2 --dist loadgroup``): the tests of
each file in ``SHARED_FIXTURE_FILES`` stay in one worker, so their module- or session-scoped fixture (a graded
batch, a built website, an 8-device run) is made once; every other test goes wherever a worker is free. The
skipped tests' reports reach the controlling process, which alone writes ``--record-unrun``.
"""

from pathlib import Path

import pytest

from moe_course.configs import ViTConfig
from moe_course.data import ClutteredDigits, DigitsConfig


def pytest_addoption(parser):
    group = parser.getgroup("moe-course", "the stages of .ci/run")
    group.addoption("--record-unrun", metavar="PATH", type=Path,
                    help="write the node ids of the tests that skipped or were deselected to PATH, one per line")
    group.addoption("--only-listed", metavar="PATH", type=Path,
                    help="run only the tests whose node ids PATH lists (as --record-unrun wrote them)")


SHARED_FIXTURE_FILES = ("test_course_hostile", "test_course_feedback_hostile", "test_course_grading",
                        "test_course_release", "test_site", "test_parallel", "test_selfcheck", "test_limoe",
                        "test_limoe_eval", "test_convert_vit", "test_upcycle_cli", "test_multihost_input")
_unrun: list[str] = []  # node ids of this session's skipped and deselected tests, in the order pytest reported them


def pytest_itemcollected(item):
    if item.path.stem in SHARED_FIXTURE_FILES:  # read by pytest-xdist's collection hook (the node id gets "@group")
        item.add_marker(pytest.mark.xdist_group(item.path.stem))


def pytest_collection_modifyitems(config, items):
    listed = config.getoption("only_listed")
    if listed is None:
        return
    if not listed.is_file():
        raise pytest.UsageError(f"--only-listed={str(listed)!r}: no such file; pass the file --record-unrun wrote")
    wanted = set(listed.read_text().splitlines())  # test ids, and the files whose collection skipped as a whole

    def is_listed(item):
        nodeid = _without_group(item.nodeid)
        return nodeid in wanted or nodeid.split("::")[0] in wanted

    config.hook.pytest_deselected(items=[item for item in items if not is_listed(item)])
    items[:] = [item for item in items if is_listed(item)]


def pytest_configure(config):
    deselecting = config.option.markexpr or config.option.keyword
    if config.getoption("record_unrun") is not None and getattr(config.option, "numprocesses", None) and deselecting:
        raise pytest.UsageError("--record-unrun cannot see the tests -m or -k deselect inside pytest-xdist's workers; "
                                "run the recording stage without -m/-k or without -n")


def pytest_deselected(items):
    _unrun.extend(_without_group(item.nodeid) for item in items)


def _without_group(nodeid: str) -> str:
    """The node id without the "@group" that pytest-xdist's --dist loadgroup appends to a grouped test's."""
    stem, _, group = nodeid.rpartition("@")
    return stem if stem and group in SHARED_FIXTURE_FILES else nodeid


def pytest_runtest_logreport(report):
    nodeid = _without_group(report.nodeid)
    if report.skipped and not hasattr(report, "wasxfail") and nodeid not in _unrun:
        _unrun.append(nodeid)


def pytest_collectreport(report):
    if report.skipped:  # a whole file skipped while importing (pytest.importorskip at module level)
        _unrun.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("record_unrun")
    if path is not None and not hasattr(session.config, "workerinput"):  # the controller (or a run without -n)
        path.write_text("".join(f"{nodeid}\n" for nodeid in _unrun))
    listed = session.config.getoption("only_listed")
    if listed is not None and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and not listed.read_text().strip():
        session.exitstatus = pytest.ExitCode.OK  # the first stage skipped nothing: nothing is left to run


@pytest.fixture(scope="session")
def small_digits():
    """A small, fast variant of the embedded dataset: 16x16 canvases, 8/3/3 glyphs per class."""
    return ClutteredDigits(DigitsConfig(image_size=16, digit_size=(8, 12), glyphs_per_class=(8, 3, 3), eval_copies=1))


@pytest.fixture(scope="session")
def tiny_vit_config():
    return ViTConfig(name="test-tiny", image_size=16, patch_size=4, channels=1, width=16, depth=2, heads=2,
                     mlp_dim=32, num_classes=10, pool="gap")
