"""Grade one student's submission of one assignment, in its own process (``moe_course.course.grade`` runs
one per submission, in parallel, each with a wall-clock limit).

The worker grades into its own copy of the master gradebook (``gradebooks/<assignment>/<student>.db``), so
a crash, a kill or a hostile submission can only ever lose that one student's record, and parallel workers
never write the same database. It writes ``gradebooks/<assignment>/<student>.json``: status ("graded" or
"failed"), the error if any, seconds, score, max_score, the score of every grade cell and
``worker_max_rss_mib``, the peak memory this process (outside the submission's cgroup) took. A notebook over
``bounded``'s limits is not parsed at all: its row fails with the reason. A failed
submission also leaves nbgrader's whole log, traceback included, in ``gradebooks/<assignment>/<student>.log``.

Command line: ``python -m moe_course.course.worker ARGUMENTS``, the arguments being COURSE_DIR, ASSIGNMENT,
STUDENT, CELL_TIMEOUT, MEMORY_BYTES, CPU_SECONDS, OUTPUT_BYTES and NOTEBOOK_BYTES.
"""

from __future__ import annotations

import json
import os
import re
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from moe_course.course.answers import ANSWERS_ENV, CHECKS_ENV, SEED_ENV
from moe_course.course.config import Limits, checks_file, course_paths, nbgrader_config
from moe_course.course.kernel import KERNEL_NAME
from moe_course.course.sandbox import MAX_PROCESSES, SANDBOX_CHECKS_ENV, SANDBOX_UID_ENV, SCRATCH_ENV
from moe_course.course.verdict import VERDICTS_ENV

NO_OWN_SCRATCH = ("this grader is not root and cannot create a user namespace, in which each submission gets a "
                  "scratch tmpfs of its own; grading on the shared TMPDIR is refused (one submission could fill it "
                  "for all): grade as root, or allow unprivileged user namespaces (bubblewrap needs them too)")
KERNEL_STARTS = 2  # a grading kernel that does not come up is started at most this many times
# What nbclient/jupyter_client raise when a kernel never answered kernel_info (so ran no submitted code).
KERNEL_START_FAILURES = ("Kernel didn't respond", "Kernel died before replying to kernel_info")
KNOWN_CAUSES = ("OutputLimitError", "ReplyTimeoutError", "DeadKernelError", "Kernel died",
                "Kernel didn't respond", "NotJSONError", "Unreadable", "JSONDecodeError", "ValidationError",
                "UnresponsiveKernelError", "Timeout")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b(:|$)")


def record_paths(course_dir: Path, assignment: str, student: str) -> tuple[Path, Path]:
    """(gradebook copy, result json) of one submission; its failure log is the json path with ``.log``."""
    folder = course_paths(course_dir)["gradebooks"] / assignment
    return folder / f"{student}.db", folder / f"{student}.json"


def submission_scores(db: Path, assignment: str, student: str) -> dict:
    """score, max_score, {grade cell: score} and {explain cell: its points} of a graded submission in gradebook
    ``db``. An explain cell (a manually graded markdown cell) is graded by the instructor, not here: its points
    are left out of ``max_score`` (the autogradable points) and listed under ``instructor``."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{db}", "moe-course") as gradebook:
        submission = gradebook.find_submission(assignment, student)
        grades = [grade for notebook in submission.notebooks for grade in notebook.grades]
        cells = {grade.name: grade.score for grade in grades if grade.cell.cell_type == "code"}
        instructor = {grade.name: grade.max_score for grade in grades if grade.cell.cell_type != "code"}
        return {"score": submission.score, "max_score": submission.max_score - sum(instructor.values()),
                "cells": cells, "instructor": instructor}


def grade_submission(course_dir: Path, assignment: str, student: str, limits: Limits) -> dict:
    """Autograde one submission into its own gradebook copy; returns (and writes) its result record.

    A kernel that never answered at start-up (before any submitted code ran, so never the student's doing)
    is started once more; the record's error then says so if that failed too.
    """
    db, result_path = record_paths(course_dir, assignment, student)
    db.parent.mkdir(parents=True, exist_ok=True)
    result_path.with_suffix(".log").unlink(missing_ok=True)  # an earlier grading's failure
    start, seed = time.perf_counter(), secrets.randbits(31)
    record = {"student": student, "assignment": assignment, "seed": seed}
    if (too_large := oversized_notebook(course_dir, assignment, student, limits.notebook_bytes)) is not None:
        record.update(status="failed", error=f"not graded: {too_large}", score=0.0, max_score=None, cells={},
                      seconds=round(time.perf_counter() - start, 2), worker_max_rss_mib=max_rss_mib())
        result_path.write_text(json.dumps(record, indent=1))
        return record
    for attempt in range(1, KERNEL_STARTS + 1):
        outcome = _autograde(course_dir, assignment, student, limits, db, seed)
        log = (outcome.get("log") or "") + "\n" + (outcome.get("error") or "")
        if outcome["success"] or not any(sign in log for sign in KERNEL_START_FAILURES):
            break
    record["seconds"] = round(time.perf_counter() - start, 2)
    if outcome["success"]:
        failed = {grade_id: why for grade_id, why in outcome.get("verdicts", {}).items() if why is not None}
        record.update(status="graded", error="", **submission_scores(db, assignment, student), failed_checks=failed)
    else:
        result_path.with_suffix(".log").write_text(log)
        error = summarise_error(log) + (f" (kernel started {attempt} times)" if attempt > 1 else "")
        record.update(status="failed", error=error, score=0.0, max_score=None, cells={})
    record["worker_max_rss_mib"] = max_rss_mib()
    result_path.write_text(json.dumps(record, indent=1))
    return record


def oversized_notebook(course_dir: Path, assignment: str, student: str, limit: int) -> str | None:
    """Why a notebook of the submission is too large to be parsed in this process (``bounded.read_notebook``:
    more than ``limit`` bytes, or JSON arrays and objects past the limit, with the numbers), or None. Checked
    before nbgrader reads it: this process is outside the submission's cgroup."""
    from moe_course.course.bounded import NotebookTooLarge, read_notebook

    for notebook in sorted((course_paths(course_dir)["submitted"] / student / assignment).glob("*.ipynb")):
        try:
            read_notebook(notebook, limit)
        except NotebookTooLarge as why:
            return str(why)
        except OSError:
            continue  # nbgrader says why it cannot read it
    return None


def max_rss_mib() -> float:
    """The peak resident memory of this worker process so far (MiB): what grading this submission cost outside
    its cgroup. Linux's VmHWM (``/proc/self/status``, of this program since it started); getrusage's ru_maxrss
    where that is missing, which also counts the batch's memory when the worker was spawned from it."""
    try:
        with open("/proc/self/status") as status:
            return round(next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024, 1)
    except (OSError, StopIteration, ValueError):
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _autograde(course_dir: Path, assignment: str, student: str, limits: Limits, db: Path, seed: int) -> dict:
    """One nbgrader autograde of the submission into ``db`` (a fresh copy of the master gradebook).

    The kernel gets the checks without their references (``inputs.inputs_only``). The kernel's sockets, the
    answers its hidden tests record (``answers.record``, judged here by
    ``verdict.score_outside`` after the kernel ended), its stdout/stderr and (in the sandbox) its private copy
    of the submission's folder live in a scratch folder of this process's own, removed afterwards. Where the
    batch named a host uid for the sandbox (a root grader: ``SANDBOX_UID_ENV``), the kernel runs in a cgroup of
    its own where the host allows one. The scratch folder is a tmpfs of ``budget.SCRATCH_BYTES`` wherever
    ``budget.SCRATCH_TMPFS_ENV`` is set: by a root batch that found it can be mounted, or by ``main`` for a
    worker that is not root (in its own user namespace); both are gone afterwards.
    The checks' inputs are drawn from ``seed`` (random per submission), so answers computed before grading
    match nothing. Returns nbgrader's result, with the verdicts ({grade_id: reason or None}) under "verdicts".
    """
    from nbgrader.apps import NbGraderAPI

    from moe_course.course import budget
    from moe_course.course.budget import SCRATCH_TMPFS_ENV, Cgroup, mount_scratch
    from moe_course.course.inputs import inputs_only

    shutil.copyfile(course_paths(course_dir)["db"], db)
    uid = int(os.environ[SANDBOX_UID_ENV]) if SANDBOX_UID_ENV in os.environ else None
    scratch = Path(tempfile.mkdtemp(prefix=f"moe-grade-{os.getpid()}-"))  # budget.remove_leftovers finds it
    cgroup, mounted = None, False
    try:
        if os.environ.get(SCRATCH_TMPFS_ENV):
            mount_scratch(scratch)
            mounted = True
        if uid is not None:
            scratch.chmod(0o711)  # the sandbox's uid reaches its own folders here, and lists none of them
            cgroup = Cgroup.create(f"moe-grade-{os.getpid()}", memory_bytes=limits.memory_bytes,
                                   processes=MAX_PROCESSES)
        for folder in ("ipc", "answers"):
            (scratch / folder).mkdir()
            if uid is not None:
                os.chown(scratch / folder, uid, uid)
        verdicts, checks = scratch / "verdicts.json", checks_file(course_dir, assignment)
        (scratch / "inputs.py").write_text(inputs_only(checks.read_text(), checks))
        os.environ.update({SCRATCH_ENV: str(scratch), ANSWERS_ENV: str(scratch / "answers"),
                           CHECKS_ENV: str(checks), SANDBOX_CHECKS_ENV: str(scratch / "inputs.py"),
                           SEED_ENV: str(seed), VERDICTS_ENV: str(verdicts),
                           **(cgroup.environment() if cgroup else {})})
        config = nbgrader_config(course_dir, db=db, limits=limits, kernel_name=KERNEL_NAME, sockets=scratch / "ipc")
        outcome = NbGraderAPI(config=config).autograde(assignment, student, force=True, create=True)
        return {**outcome, "verdicts": json.loads(verdicts.read_text())} if verdicts.exists() else outcome
    finally:
        if cgroup is not None:
            cgroup.remove()
        if mounted:
            subprocess.run(["umount", "--lazy", str(scratch)], capture_output=True)
        budget.remove_tree(scratch)


def summarise_error(log: str) -> str:
    """The most telling line of nbgrader's log for a failed submission: a known cause (KNOWN_CAUSES: a dead
    kernel, a broken file), its exception line (``Name: message``) first, else the exception line that ends the
    first traceback, else the last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    raised = [line for line in lines if _EXCEPTION_LINE.match(line)]
    for needle in KNOWN_CAUSES:
        # the exception's own line (its message) before any other that names it, such as the `raise` line
        for line in raised + lines:
            if needle in line:
                return line[:300]
    return (raised[0] if raised else lines[-1] if lines else "nbgrader failed without a message")[:300]


def main(argv: list[str] | None = None) -> int:
    """Grade one student: argv = course_dir, assignment, student, cell_timeout (s), memory (bytes), cpu (s),
    output (bytes), notebook size (bytes). Whatever goes wrong while grading, checking or cleaning up (a
    RecursionError, MemoryError or OSError from what the submission left) ends as this student's "failed" record
    with the reason.

    A worker that is not root, and not yet on a scratch tmpfs of its own, first re-runs itself in a user and
    mount namespace of its own (``budget.own_scratch_command``), where it mounts one; where this host allows no
    user namespace it does not grade on the shared TMPDIR but fails the row with the reason (NO_OWN_SCRATCH)."""
    from moe_course.course import budget

    arguments = list(sys.argv[1:] if argv is None else argv)
    course_dir, assignment, student, cell_timeout, memory, cpu, output, notebook = arguments
    limits = Limits(cell_timeout=int(cell_timeout), memory_bytes=int(memory), cpu_seconds=int(cpu),
                    output_bytes=int(output), notebook_bytes=int(notebook))
    try:
        if os.geteuid() != 0 and not os.environ.get(budget.SCRATCH_TMPFS_ENV):
            if not budget.can_own_scratch():
                raise OSError(NO_OWN_SCRATCH)
            os.environ[budget.SCRATCH_TMPFS_ENV] = "1"
            command = budget.own_scratch_command([sys.executable, "-m", "moe_course.course.worker", *arguments])
            os.execvp(command[0], command)
        record = grade_submission(Path(course_dir), assignment, student, limits)
    except Exception as error:  # RecursionError, MemoryError and OSError included
        record = {"student": student, "assignment": assignment, "status": "failed", "score": 0.0,
                  "max_score": None, "cells": {}, "seconds": None,
                  "error": f"grading failed: {type(error).__name__}: {str(error)[:200]}"}
        result = record_paths(Path(course_dir), assignment, student)[1]
        result.parent.mkdir(parents=True, exist_ok=True)
        result.write_text(json.dumps(record, indent=1))
    return 0 if record["status"] == "graded" else 1


if __name__ == "__main__":
    raise SystemExit(main())
