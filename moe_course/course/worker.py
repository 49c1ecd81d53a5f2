"""Grade one student's submission of one assignment, in its own process (``moe_course.course.grade`` runs
one per submission, in parallel, each with a wall-clock limit).

The worker grades into its own copy of the master gradebook (``gradebooks/<assignment>/<student>.db``), so
a crash, a kill or a hostile submission can only ever lose that one student's record, and parallel workers
never write the same database. It writes ``gradebooks/<assignment>/<student>.json``: status ("graded" or
"failed"), the error if any, seconds, score, max_score and the score of every grade cell.

Run as ``python -m moe_course.course.worker COURSE_DIR ASSIGNMENT STUDENT CELL_TIMEOUT MEMORY_BYTES CPU_SECONDS``.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from moe_course.course.config import Limits, course_paths, nbgrader_config
from moe_course.course.kernel import KERNEL_NAME


def record_paths(course_dir: Path, assignment: str, student: str) -> tuple[Path, Path]:
    """(gradebook copy, result json) of one submission."""
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
    """Autograde one submission into its own gradebook copy; returns (and writes) its result record."""
    from nbgrader.apps import NbGraderAPI

    paths = course_paths(course_dir)
    db, result_path = record_paths(course_dir, assignment, student)
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(paths["db"], db)
    start = time.perf_counter()
    api = NbGraderAPI(config=nbgrader_config(course_dir, db=db, limits=limits, kernel_name=KERNEL_NAME))
    outcome = api.autograde(assignment, student, force=True, create=True)
    record = {"student": student, "assignment": assignment, "seconds": round(time.perf_counter() - start, 2)}
    if outcome["success"]:
        record.update(status="graded", error="", **submission_scores(db, assignment, student))
    else:
        error = (outcome.get("error") or "") + "\n" + (outcome.get("log") or "")
        record.update(status="failed", error=summarise_error(error), score=0.0, max_score=None, cells={})
    result_path.write_text(json.dumps(record, indent=1))
    return record


def summarise_error(log: str) -> str:
    """The most telling line of nbgrader's log for a failed submission (a dead kernel, a broken file)."""
    for needle in ("DeadKernelError", "Kernel died", "NotJSONError", "Unreadable", "JSONDecodeError",
                   "ValidationError", "UnresponsiveKernelError", "Timeout"):
        for line in log.splitlines():
            if needle in line:
                return line.strip()[:300]
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return (lines[-1] if lines else "nbgrader failed without a message")[:300]


def main(argv: list[str] | None = None) -> int:
    """Grade one student: argv = course_dir, assignment, student, cell_timeout (s), memory (bytes), cpu (s)."""
    course_dir, assignment, student, cell_timeout, memory, cpu = (sys.argv[1:] if argv is None else argv)
    limits = Limits(cell_timeout=int(cell_timeout), memory_bytes=int(memory), cpu_seconds=int(cpu))
    record = grade_submission(Path(course_dir), assignment, student, limits)
    return 0 if record["status"] == "graded" else 1


if __name__ == "__main__":
    raise SystemExit(main())
