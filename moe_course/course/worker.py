"""Grade one student's submission of one assignment, in its own process (``moe_course.course.grade`` runs
one per submission, in parallel, each with a wall-clock limit).

The worker grades into its own copy of the master gradebook (``gradebooks/<assignment>/<student>.db``), so
a crash, a kill or a hostile submission can only ever lose that one student's record, and parallel workers
never write the same database. It writes ``gradebooks/<assignment>/<student>.json``: status ("graded" or
"failed"), the error if any, seconds, score, max_score and the score of every grade cell. A failed
submission also leaves nbgrader's whole log, traceback included, in ``gradebooks/<assignment>/<student>.log``.

Command line: ``python -m moe_course.course.worker ARGUMENTS``, the arguments being COURSE_DIR, ASSIGNMENT,
STUDENT, CELL_TIMEOUT, MEMORY_BYTES, CPU_SECONDS and OUTPUT_BYTES.
"""

from __future__ import annotations

import json
import os
import re
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

KERNEL_STARTS = 2  # a grading kernel that does not come up is started at most this many times
# What nbclient/jupyter_client raise when a kernel never answered kernel_info (so ran no submitted code).
KERNEL_START_FAILURES = ("Kernel didn't respond", "Kernel died before replying to kernel_info")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b(:|$)")


def record_paths(course_dir: Path, assignment: str, student: str) -> tuple[Path, Path]:
    """(gradebook copy, result json) of one submission; its failure log is the json path with ``.log``."""
    folder = course_paths(course_dir)["gradebooks"] / assignment
    return folder / f"{student}.db", folder / f"{student}.json"


def submission_scores(db: Path, assignment: str, student: str) -> dict:
    """score, max_score and {grade cell: score} of a graded submission in gradebook ``db``."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{db}", "moe-course") as gradebook:
        submission = gradebook.find_submission(assignment, student)
        cells = {grade.name: grade.score for notebook in submission.notebooks for grade in notebook.grades}
        return {"score": submission.score, "max_score": submission.max_score, "cells": cells}


def grade_submission(course_dir: Path, assignment: str, student: str, limits: Limits) -> dict:
    """Autograde one submission into its own gradebook copy; returns (and writes) its result record.

    A kernel that never answered at start-up (before any submitted code ran, so never the student's doing)
    is started once more; the record's error then says so if that failed too.
    """
    db, result_path = record_paths(course_dir, assignment, student)
    db.parent.mkdir(parents=True, exist_ok=True)
    result_path.with_suffix(".log").unlink(missing_ok=True)  # an earlier grading's failure
    start, seed = time.perf_counter(), secrets.randbits(31)
    for attempt in range(1, KERNEL_STARTS + 1):
        outcome = _autograde(course_dir, assignment, student, limits, db, seed)
        log = (outcome.get("log") or "") + "\n" + (outcome.get("error") or "")
        if outcome["success"] or not any(sign in log for sign in KERNEL_START_FAILURES):
            break
    record = {"student": student, "assignment": assignment, "seconds": round(time.perf_counter() - start, 2),
              "seed": seed}
    if outcome["success"]:
        failed = {grade_id: why for grade_id, why in outcome.get("verdicts", {}).items() if why is not None}
        record.update(status="graded", error="", **submission_scores(db, assignment, student), failed_checks=failed)
    else:
        result_path.with_suffix(".log").write_text(log)
        error = summarise_error(log) + (f" (kernel started {attempt} times)" if attempt > 1 else "")
        record.update(status="failed", error=error, score=0.0, max_score=None, cells={})
    result_path.write_text(json.dumps(record, indent=1))
    return record


def _autograde(course_dir: Path, assignment: str, student: str, limits: Limits, db: Path, seed: int) -> dict:
    """One nbgrader autograde of the submission into ``db`` (a fresh copy of the master gradebook).

    The kernel gets the checks without their references (``inputs.inputs_only``). The kernel's sockets, the
    answers its hidden tests record (``answers.record``, judged here by
    ``verdict.score_outside`` after the kernel ended), its stdout/stderr and (in the sandbox) its private copy
    of the submission's folder live in a scratch folder of this process's own, removed afterwards. Where the
    batch named a host uid for the sandbox (a root grader: ``SANDBOX_UID_ENV``), the kernel runs in a cgroup of
    its own where the host allows one, and that folder is a tmpfs of ``budget.SCRATCH_BYTES`` where the batch
    found it can be mounted (``budget.SCRATCH_TMPFS_ENV``), both gone afterwards.
    The checks' inputs are drawn from ``seed`` (random per submission), so answers computed before grading
    match nothing. Returns nbgrader's result, with the verdicts ({grade_id: reason or None}) under "verdicts".
    """
    from nbgrader.apps import NbGraderAPI

    from moe_course.course.budget import SCRATCH_TMPFS_ENV, Cgroup, mount_scratch
    from moe_course.course.inputs import inputs_only

    shutil.copyfile(course_paths(course_dir)["db"], db)
    uid = int(os.environ[SANDBOX_UID_ENV]) if SANDBOX_UID_ENV in os.environ else None
    scratch = Path(tempfile.mkdtemp(prefix="moe-grade-"))
    cgroup = None
    try:
        if uid is not None:
            if os.environ.get(SCRATCH_TMPFS_ENV):
                mount_scratch(scratch)
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
        if uid is not None and os.environ.get(SCRATCH_TMPFS_ENV):
            subprocess.run(["umount", "--lazy", str(scratch)], capture_output=True)
        remove_tree(scratch)


def remove_tree(folder: Path) -> None:
    """Remove ``folder`` and all it holds, however deep (coreutils ``rm``: a kernel may leave a tree thousands
    of folders deep, which ``shutil.rmtree`` cannot descend), without crossing into another file system."""
    subprocess.run(["rm", "-rf", "--one-file-system", "--", str(folder)], capture_output=True)


def summarise_error(log: str) -> str:
    """The most telling line of nbgrader's log for a failed submission: a known cause (a dead kernel, a
    broken file), else the exception line that ends the first traceback, else the last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for needle in ("OutputLimitError", "DeadKernelError", "Kernel died", "Kernel didn't respond", "NotJSONError", "Unreadable",
                   "JSONDecodeError", "ValidationError", "UnresponsiveKernelError", "Timeout"):
        for line in lines:
            if needle in line:
                return line[:300]
    raised = [line for line in lines if _EXCEPTION_LINE.match(line)]
    return (raised[0] if raised else lines[-1] if lines else "nbgrader failed without a message")[:300]


def main(argv: list[str] | None = None) -> int:
    """Grade one student: argv = course_dir, assignment, student, cell_timeout (s), memory (bytes), cpu (s),
    output (bytes). Whatever goes wrong while grading, checking or cleaning up (a RecursionError, MemoryError
    or OSError from what the submission left) ends as this student's "failed" record with the reason."""
    course_dir, assignment, student, cell_timeout, memory, cpu, output = (sys.argv[1:] if argv is None else argv)
    limits = Limits(cell_timeout=int(cell_timeout), memory_bytes=int(memory), cpu_seconds=int(cpu),
                    output_bytes=int(output))
    try:
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
