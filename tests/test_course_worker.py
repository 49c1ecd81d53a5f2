"""The grading worker's handling of a kernel that never came up, and of nbgrader's failure logs. Fast: no
kernel is started (nbgrader's autograde is replaced by recorded outcomes); the real kernels run in
test_course_grading.py and test_course_hostile.py."""

import json

import pytest

from moe_course.course.limits import worker
from moe_course.course.limits.config import Limits, nbgrader_config

NOT_STARTED = """[ERROR] There was an error processing assignment: /c/submitted/ann/03_vmoe_bpr
[ERROR] Traceback (most recent call last):
  File ".../nbgrader/converters/base.py", line 390, in convert_notebooks
    self.convert_single_notebook(notebook_filename)
  File ".../jupyter_client/client.py", line 183, in _async_wait_for_ready
    raise RuntimeError(
RuntimeError: Kernel didn't respond to heartbeats in 120 seconds and timed out
[ERROR] There was an error processing assignment '03_vmoe_bpr' for student 'ann'
[ERROR] Please see the the above traceback for details on the specific errors on the above failures.
"""
BROKEN = NOT_STARTED.replace("RuntimeError: Kernel didn't respond to heartbeats in 120 seconds and timed out",
                             "PermissionError: [Errno 13] Permission denied: '/c/autograded/ann'")


@pytest.fixture
def course(tmp_path, monkeypatch):
    (tmp_path / "gradebook.db").write_bytes(b"")
    monkeypatch.setattr(worker, "submission_scores", lambda db, a, s: {"score": 7.0, "max_score": 7.0, "cells": {}})
    return tmp_path


def _replay(monkeypatch, outcomes):
    calls = []

    def autograde(course_dir, assignment, student, limits, db, seed, group=None):
        calls.append(student)
        return outcomes[len(calls) - 1]

    monkeypatch.setattr(worker, "_autograde", autograde)
    return calls


def test_summary_names_the_exception_not_nbgraders_closing_line():
    assert worker.summarise_error(NOT_STARTED) == ("RuntimeError: Kernel didn't respond to heartbeats in 120 "
                                                   "seconds and timed out")
    assert worker.summarise_error(BROKEN) == "PermissionError: [Errno 13] Permission denied: '/c/autograded/ann'"
    assert worker.summarise_error("") == "nbgrader failed without a message"


def test_a_kernel_that_did_not_start_is_started_again(course, monkeypatch):
    calls = _replay(monkeypatch, [{"success": False, "log": NOT_STARTED}, {"success": True}])
    record = worker.grade_submission(course, "03_vmoe_bpr", "ann", Limits())
    assert len(calls) == 2
    assert record["status"] == "graded" and record["score"] == 7.0 and record["error"] == ""
    _, result = worker.record_paths(course, "03_vmoe_bpr", "ann")
    assert json.loads(result.read_text()) == record and not result.with_suffix(".log").exists()


def test_a_kernel_that_never_starts_fails_after_two_starts_with_the_log_kept(course, monkeypatch):
    calls = _replay(monkeypatch, [{"success": False, "log": NOT_STARTED}] * 3)
    record = worker.grade_submission(course, "03_vmoe_bpr", "ann", Limits())
    assert len(calls) == worker.KERNEL_STARTS == 2
    assert record["status"] == "failed" and record["score"] == 0.0 and record["max_score"] is None
    assert record["error"] == ("RuntimeError: Kernel didn't respond to heartbeats in 120 seconds and timed out "
                               "(kernel started 2 times)")
    _, result = worker.record_paths(course, "03_vmoe_bpr", "ann")
    assert "Traceback" in result.with_suffix(".log").read_text()
    _replay(monkeypatch, [{"success": True}])  # regraded later: the old failure's log goes
    assert worker.grade_submission(course, "03_vmoe_bpr", "ann", Limits())["status"] == "graded"
    assert not result.with_suffix(".log").exists()


def test_other_failures_are_not_retried(course, monkeypatch):
    calls = _replay(monkeypatch, [{"success": False, "log": BROKEN}, {"success": True}])
    record = worker.grade_submission(course, "03_vmoe_bpr", "ann", Limits())
    assert len(calls) == 1 and record["status"] == "failed" and record["error"].startswith("PermissionError")


def test_grading_kernels_use_unix_sockets_in_the_given_folder(tmp_path):
    pytest.importorskip("nbgrader", reason="nbgrader is not installed: pip install -e '.[instructor]'")
    config = nbgrader_config(tmp_path, sockets=tmp_path / "s")
    assert config.KernelManager.transport == "ipc"
    assert config.KernelManager.ip == str((tmp_path / "s").resolve() / "kernel")
    assert "transport" not in nbgrader_config(tmp_path).KernelManager


def test_stderr_in_a_test_cell_is_held_from_the_grade_and_put_back():
    pytest.importorskip("nbgrader", reason="nbgrader is not installed: pip install -e '.[instructor]'")
    import nbformat
    from nbgrader.utils import determine_grade

    from moe_course.course.limits.config import hold_stderr, restore_stderr

    cell = nbformat.v4.new_code_cell("assert double(1) == 2", metadata={"nbgrader": {
        "grade": True, "solution": False, "grade_id": "t", "points": 2, "locked": True, "schema_version": 3}})
    warning = nbformat.v4.new_output("stream", name="stderr", text="UserWarning: slow\n")
    printed = nbformat.v4.new_output("stream", name="stdout", text="2\n")
    cell.outputs = [warning, printed]
    notebook = nbformat.v4.new_notebook(cells=[cell])
    assert determine_grade(cell) == (0, 2.0)  # nbgrader's own rule: stderr fails the test
    notebook, resources = hold_stderr(notebook, {})
    assert determine_grade(notebook.cells[0]) == (2.0, 2.0)
    notebook, resources = restore_stderr(notebook, resources)
    assert notebook.cells[0].outputs == [warning, printed]
    failed = nbformat.v4.new_output("error", ename="AssertionError", evalue="", traceback=[])
    notebook.cells[0].outputs = [warning, failed]
    notebook, resources = hold_stderr(notebook, {})
    assert determine_grade(notebook.cells[0]) == (0, 2.0)  # a failing test still scores 0


def test_export_lists_every_collected_submission_graded_or_not(tmp_path):
    pytest.importorskip("nbgrader", reason="nbgrader is not installed: pip install -e '.[instructor]'")
    import csv

    from nbgrader.api import Gradebook

    from moe_course.course.instructor.grade import export

    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}", "moe-course") as gradebook:
        gradebook.add_assignment("03_vmoe_bpr")
    for student in ("ann", "bob", "cy"):
        (tmp_path / "submitted" / student / "03_vmoe_bpr").mkdir(parents=True)
    _, result = worker.record_paths(tmp_path, "03_vmoe_bpr", "ann")
    result.parent.mkdir(parents=True)
    result.write_text(json.dumps({"student": "ann", "assignment": "03_vmoe_bpr", "status": "graded", "error": "",
                                  "score": 1.0, "max_score": 1.0, "seconds": 9.0, "flags": [], "sandbox": "bwrap"}))
    _, failed = worker.record_paths(tmp_path, "03_vmoe_bpr", "bob")
    failed.write_text(json.dumps({"student": "bob", "assignment": "03_vmoe_bpr", "status": "failed",
                                  "error": "Kernel died", "score": 0.0, "max_score": None, "seconds": 3.0}))
    with open(export(tmp_path)) as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    assert [(s, rows[s]["status"], rows[s]["score"]) for s in sorted(rows)] == [
        ("ann", "graded", "1.0"), ("bob", "failed", "0.0"), ("cy", "not graded", "0.0")]
    assert rows["ann"]["sandbox"] == "bwrap" and rows["cy"]["error"] == "collected, never autograded"


def _sandbox_options(tmp_path, monkeypatch, hidden=()) -> tuple[list[str], dict]:
    """bwrap and its mounts as the grading sandbox makes them (without the kernel command), around a stand-in
    Python installation and package under ``tmp_path`` (which, like a CI clone, lives under /tmp); ``hidden``:
    folder names of that Python hidden as SANDBOX_WITHOUT hides a package. Returns (options, paths)."""
    from moe_course.course.limits import sandbox

    if sandbox.unavailable():
        pytest.skip(sandbox.unavailable())
    python, package = tmp_path / "venv", tmp_path / "clone" / "moe_course"
    for folder in (python, package, *(python / name for name in hidden)):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "marker").write_text(folder.name)
        folder.chmod(0o755)
    for parent in (tmp_path, tmp_path / "clone"):
        parent.chmod(0o755)
    monkeypatch.setattr(sandbox, "python_folders", lambda: [python])
    monkeypatch.setattr(sandbox, "package_folder", lambda: package)
    home, sockets, connection = tmp_path / "home", tmp_path / "ipc", tmp_path / "kernel.json"
    for folder in (home, sockets):
        folder.mkdir()
    connection.write_text("{}")
    runtime, answers, checks = tmp_path / "runtime", tmp_path / "answers", tmp_path / "checks.py"
    for folder in (runtime, answers):
        folder.mkdir()
    (runtime / "marker").write_text("runtime")
    checks.write_text("checks")
    refusal = tmp_path / "hidden.py"
    refusal.write_text(sandbox.HIDDEN_INIT)
    argv = sandbox.bwrap_argv(home, home, connection, sockets, runtime=runtime, answers=answers, checks=checks,
                              memory_bytes=2**30, cpu_seconds=10, file_size_bytes=2**20, env={},
                              hidden=([python / name for name in hidden], refusal))
    return argv[:argv.index("--")], {"python": python, "package": package, "home": home}


def test_a_python_and_package_under_tmp_stay_visible_in_the_sandbox(tmp_path, monkeypatch):
    """The sandbox's fresh /tmp must not hide a Python or package that lives under /tmp (a CI clone's venv)."""
    import subprocess

    from moe_course.course.limits import sandbox

    options, paths = _sandbox_options(tmp_path, monkeypatch)
    shown = subprocess.run([*options, "--", "/bin/cat", str(paths["python"] / "marker"),
                            str(paths["package"] / "marker"), sandbox.CHECKS_INSIDE],
                           capture_output=True, text=True, timeout=30)
    # the runtime stands where the package is: the course library is not in the sandbox
    assert shown.returncode == 0 and shown.stdout == "venvruntimechecks", shown.stderr


def test_only_sized_tmpfs_are_writable_in_the_sandbox(tmp_path, monkeypatch):
    """The tmpfs bwrap builds / and /dev on, and the one hiding a package, are read-only (tmpfs pages belong to
    no process: unsized, they were half the RAM each); /tmp and /dev/shm are the sizes the module says; no
    user namespace can be made inside, where an unsized tmpfs could be mounted."""
    import subprocess

    from moe_course.course.limits import sandbox

    options, paths = _sandbox_options(tmp_path, monkeypatch, hidden=("jaxlike",))
    folders = ["/", "/dev", str(paths["python"] / "jaxlike"), "/tmp", "/dev/shm", str(paths["home"])]
    script = (f"for d in {' '.join(folders)}; do if echo x > $d/probe; then echo $d writable; else echo $d not; fi; "
              "done 2>/dev/null; stat -f -c '%S %b' /tmp /dev/shm; if unshare -U true 2>/dev/null; then echo userns; fi")
    shown = subprocess.run([*options, "--", "/bin/sh", "-c", script], capture_output=True, text=True, timeout=30)
    lines = shown.stdout.splitlines()
    assert lines[:6] == [f"{d} {'writable' if d in ('/tmp', '/dev/shm', str(paths['home'])) else 'not'}"
                         for d in folders], shown
    assert [int(block) * int(count) for block, count in map(str.split, lines[6:8])] == [sandbox.TMPFS_BYTES] * 2
    assert "userns" not in lines or not sandbox._bwrap_offers("--disable-userns"), shown
    assert sandbox.WRITABLE_TMPFS_BYTES == 2 * sandbox.TMPFS_BYTES


def test_a_notebook_past_max_notebook_mb_is_not_graded_and_the_row_names_the_option(course, monkeypatch):
    calls = _replay(monkeypatch, [{"success": True}])
    notebook = worker.course_paths(course)["submitted"] / "ann" / "03_vmoe_bpr" / "03_vmoe_bpr.ipynb"
    notebook.parent.mkdir(parents=True)
    notebook.write_text('{"cells": [], "metadata": {"x": "' + "x" * 2**20 + '"}}')
    record = worker.grade_submission(course, "03_vmoe_bpr", "ann", Limits(notebook_bytes=2**20))
    assert record["status"] == "failed" and not calls
    assert record["error"] == (f"not graded: 03_vmoe_bpr.ipynb is larger than the limit of {2**20} bytes "
                               "(1 MiB, --max-notebook-mb) for a submitted notebook")
    assert worker.grade_submission(course, "03_vmoe_bpr", "ann", Limits(notebook_bytes=2 * 2**20))["status"] == "graded"
