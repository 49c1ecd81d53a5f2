"""Autograde a whole class in one batch, write feedback and export the grades (nbgrader's Python API).

Every submission is graded by its own process (``moe_course.course.limits.worker``) in its own session, at most
``jobs`` at a time, each under a wall-clock limit, with the grading kernel of ``moe_course.course.inside.kernel``
in the bubblewrap sandbox of ``moe_course.course.limits.sandbox`` (resource limits, file policy, restored
modules) and nbgrader's per-cell timeout. Whatever one submission does -- loop forever, exit, crash its kernel, exhaust memory, edit the tests, or not be a notebook at all --
it ends with a record for that student and cannot touch the grade of another: there is no shared process
and no shared database to corrupt. A submission whose kernel dies is marked "failed" with the reason and
scores 0 until a human regrades it.
"""

from __future__ import annotations

import concurrent.futures
import csv
import grp
import json
import os
import pwd
import queue
import re
import signal
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

from moe_course.course.inside.kernel import write_kernelspec
from moe_course.course.instructor import feedback as feedback_pages
from moe_course.course.instructor.flags import scan_notebook
from moe_course.course.limits import budget
from moe_course.course.limits import sandbox as bubblewrap
from moe_course.course.limits.config import SOLUTIONS, Limits, course_paths, grading_env, nbgrader_config
from moe_course.course.limits.worker import record_paths

SANDBOX_UID = 60000  # the first host uid of a root grader's kernels (as isolate, the IOI sandbox, uses)
GRADES_FIELDS = ("assignment", "student", "score", "max_score", "status", "seconds", "error", "flags", "sandbox")
NO_SANDBOX = "none (--no-sandbox)"  # the sandbox column of a submission graded without bubblewrap


def submitted_students(course_dir: Path, assignment: str) -> list[str]:
    """Students with a ``submitted/<student>/<assignment>/`` folder, sorted."""
    submitted = course_paths(course_dir)["submitted"]
    return sorted(p.parent.name for p in submitted.glob(f"*/{assignment}") if p.is_dir())


def _run_worker(course_dir: Path, assignment: str, student: str, limits: Limits, uid: int | None,
                tmpfs: bool = False, cgroup: bool = False, scope_bytes: int | None = None) -> dict:
    """Grade one student in a worker process, its kernel as sandbox host ``uid`` when given, and with ``tmpfs``
    under ``unshare --mount`` with its scratch folder on a tmpfs (``budget.mount_scratch``), with ``cgroup``
    in its submission's cgroup (``budget.worker_cgroup``; removed here after the worker ended), with
    ``scope_bytes`` (a grader that is not root) in a systemd user scope of that memory (``budget.user_scope``);
    returns its record. Whatever fails here -- the worker, its output, its record -- gives a "failed" record
    with the reason. The worker's output goes to a file, of which the last 300 characters are read (the
    kernel's own stdout and stderr go to ``sandbox.KERNEL_OUTPUT``, never here)."""
    failed = {"student": student, "assignment": assignment, "status": "failed", "score": 0.0, "max_score": None,
              "cells": {}, "seconds": None}
    try:
        db, result = record_paths(course_dir, assignment, student)
        result.parent.mkdir(parents=True, exist_ok=True)
        result.unlink(missing_ok=True)
        command = [sys.executable, "-m", "moe_course.course.limits.worker", str(Path(course_dir).resolve()), assignment,
                   student, str(limits.cell_timeout), str(limits.memory_bytes), str(limits.cpu_seconds),
                   str(limits.output_bytes), str(limits.notebook_bytes)]
        env = grading_env(course_dir)
        if uid is not None:
            env[bubblewrap.SANDBOX_UID_ENV] = str(uid)
        if cgroup:
            env[budget.WORKER_CGROUP_ENV] = "1"
        if tmpfs:  # a private mount namespace for the worker's scratch tmpfs
            env[budget.SCRATCH_TMPFS_ENV] = "1"
            command = ["unshare", "--mount", "--propagation", "private", "--", *command]
        if scope_bytes is not None:
            command = [*budget.user_scope(scope_bytes), *command]
        with tempfile.TemporaryFile() as output:
            process = subprocess.Popen(command, env=env, start_new_session=True, stdout=output,
                                       stderr=subprocess.STDOUT)
            try:
                process.wait(timeout=limits.submission_timeout)
                error = "" if result.exists() else (f"grading process ended with code {process.returncode}: "
                                                    f"{_tail(output)}")
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # the worker, its kernel and anything they started
                process.wait()
                error = f"timed out after {limits.submission_timeout} s (whole submission)"
            finally:  # a worker killed from outside cleans nothing up itself
                budget.remove_leftovers(Path(tempfile.gettempdir()), pids=[process.pid])
        if error:
            result.write_text(json.dumps({**failed, "error": error}))
        return json.loads(result.read_text())
    except Exception as error:  # RecursionError, MemoryError and OSError included: this student's row only
        return {**failed, "error": f"grading failed: {type(error).__name__}: {str(error)[:200]}"}


def _tail(output, chars: int = 300) -> str:
    """The last ``chars`` characters of an output file (read from its end: it may be large)."""
    output.seek(0, os.SEEK_END)
    output.seek(max(0, output.tell() - 4 * chars))
    return output.read().decode(errors="replace")[-chars:]


def sandbox_limits(uid: int | None, scope_bytes: int = 0) -> dict[str, str]:
    """Which limits hold for this batch's kernels, beyond bubblewrap and prlimit's per-process limits, as
    {limit: how}: "uid" (the host uid a root grader drops to; ``uid`` None: a grader that is not root),
    "scratch" (a tmpfs per submission: root where mounts are allowed, any grader in a user namespace of its own),
    "cgroup" (cgroup v2 or v1, where a root grader may create one; for a grader that is not root, a systemd user
    scope of ``scope_bytes`` per submission where its manager has memory delegated, ``budget.can_use_user_scope``).
    """
    held = {} if uid is None else {"uid": f"host uids from {uid}"}
    if budget.can_own_scratch():
        held["scratch"] = (f"tmpfs of {budget.SCRATCH_BYTES // 2**20} MiB per submission"
                           + ("" if uid is not None else " (in a user namespace of its own)"))
    if uid is not None and (version := budget.cgroup_version()):
        held["cgroup"] = f"{version}: memory, processes, CPU weight per submission, its grading worker included"
    elif uid is None and budget.can_use_user_scope():
        held["cgroup"] = (f"systemd user scope: memory {scope_bytes // 2**20} MiB per submission (systemd-run "
                          "--user --scope -p MemoryMax), its grading worker included")
    return held


def sandbox_uids(first: int, jobs: int) -> list[int]:
    """The host uids a root grader's kernels run as: ``first`` ... ``first + jobs - 1``, one per parallel
    grading slot. Raises ValueError when ``first`` is below 1000 or past 2**31 - jobs, or one of them belongs
    to a user or group (``pwd``/``grp``): the sandbox must share files and process limits with nobody."""
    if not isinstance(first, int) or not 1000 <= first <= 2**31 - 1 - jobs:
        raise ValueError(f"sandbox_uid={first!r} is not allowed; use a host uid from 1000 to {2**31 - 1 - jobs} "
                         f"that starts {jobs} consecutive uids belonging to no user (--sandbox-uid)")
    for uid in range(first, first + jobs):
        for database, kind in ((pwd.getpwuid, "user"), (grp.getgrgid, "group")):
            try:
                owner = database(uid)[0]
            except KeyError:
                continue
            raise ValueError(f"sandbox_uid={first}: host uid {uid} is the {kind} {owner!r}; grading as root runs "
                             f"each kernel as one of {jobs} uids from --sandbox-uid that belong to no user or "
                             "group: pick another start")
    return list(range(first, first + jobs))


def autograde(course_dir: Path, assignment: str, students=None, *, jobs: int = 2, limits: Limits = Limits(),
              solutions_dir: Path = SOLUTIONS, sandbox: bool = True, sandbox_uid: int = SANDBOX_UID) -> list[dict]:
    """Grade ``students`` (default: everyone in ``submitted/``) of ``assignment``, ``jobs`` at a time.

    The assignment must have been released into ``course_dir`` (``build.release``). Every kernel runs in
    bubblewrap (``moe_course.course.limits.sandbox``) unless ``sandbox`` is False, which each record then says in
    its ``sandbox`` field. Run as root, the grader runs each kernel as an unprivileged host uid, one of
    ``jobs`` from ``sandbox_uid`` on (``sandbox_uids``), in a cgroup and on a tmpfs of its own (``budget``).
    A grader that is not root runs each worker in a systemd user scope capping the submission's memory where
    its user manager has the memory controller delegated (``budget.can_use_user_scope``). One line on stderr
    says before grading which bound holds: that per submission, or where none does (not root and no such scope,
    or a host that gives no cgroup) that memory is capped per process only (``budget.per_process_only``).
    Returns one record per student (see ``worker``), with ``flags`` from ``flags.scan_notebook`` added; any
    error while grading or flagging one submission stays in that student's record. Raises ValueError for
    jobs < 1, an assignment that is not in the course, or (with ``sandbox``) a host where bubblewrap is
    missing or cannot run (as that uid, for root), or a ``sandbox_uid`` range that is not free.
    """
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs={jobs!r} is not allowed; use a positive integer (parallel grading processes)")
    paths = course_paths(course_dir)
    if not (paths["release"] / assignment).is_dir():
        raise ValueError(f"assignment={assignment!r} is not released in {paths['root']}; run "
                         f"`moe-course course release {assignment}` first")
    uids = sandbox_uids(sandbox_uid, jobs) if sandbox and os.geteuid() == 0 else [None] * jobs
    if sandbox and (why := bubblewrap.unavailable(uids[0])):
        raise ValueError(f"{why}. {bubblewrap.INSTALL_HINT}")
    write_kernelspec(paths["jupyter"], protect=[paths["root"], Path(solutions_dir)],
                     memory_bytes=limits.memory_bytes, cpu_seconds=limits.cpu_seconds, sandbox=sandbox)
    students = list(students) if students else submitted_students(course_dir, assignment)
    budget.remove_leftovers(Path(tempfile.gettempdir()))  # of workers an earlier batch lost (killed with it)
    scope_bytes = budget.submission_bytes(limits.memory_bytes, sandbox)
    limits_held = sandbox_limits(uids[0], scope_bytes) if sandbox else {}
    # said at the start of every batch: the instructor decides on it
    said = (f"memory is capped per submission: {limits_held['cgroup']}" if "cgroup" in limits_held
            else budget.per_process_only(limits.memory_bytes))
    print(f"moe-course course autograde: {said}", file=sys.stderr, flush=True)
    scope = uids[0] is None and "cgroup" in limits_held
    free = queue.SimpleQueue()
    for uid in uids:
        free.put(uid)

    def grade_one(student: str) -> dict:
        uid = free.get()  # a slot: no two kernels graded at once share a uid, so none shares a process limit
        try:
            # a root grader mounts the worker's scratch here; a plain grader's worker does so in its own user
            # namespace (worker.main), so it is not wrapped
            return _run_worker(course_dir, assignment, student, limits, uid,
                               tmpfs=uid is not None and "scratch" in limits_held,
                               cgroup=uid is not None and "cgroup" in limits_held,
                               scope_bytes=scope_bytes if scope else None)
        finally:
            free.put(uid)

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        records = list(pool.map(grade_one, students))
    for record in records:
        notebook = paths["submitted"] / record["student"] / assignment / f"{assignment}.ipynb"
        try:
            record["flags"] = scan_notebook(notebook, limits.notebook_bytes)
        except Exception as error:  # RecursionError from a deeply nested notebook, say: this row only
            record["flags"] = [f"not scanned: {type(error).__name__}"]
        record["sandbox"] = "bwrap" if sandbox else NO_SANDBOX
        record["limits"] = limits_held
        _, result = record_paths(course_dir, assignment, record["student"])
        result.write_text(json.dumps(record, indent=1))
    return records


def feedback(course_dir: Path, assignment: str, students=None, *,
             seconds: int = feedback_pages.FEEDBACK_SECONDS) -> dict[str, Path]:
    """HTML feedback per graded student (default: every submitted one; those not graded are left out), without
    the hidden tests (their text is cleared from the cells, their tracebacks cut to one line), made inert by
    ``moe_course.course.instructor.feedback``: the whole page cleaned by an allow-list sanitizer (nh3) and headed by a
    Content-Security-Policy, so the file the instructor opens runs no script and requests nothing, whatever
    the notebook held; oversized markup is replaced by a notice, and a student whose page takes longer than
    ``seconds`` gets a one-line "feedback skipped: ..." page instead. Returns {student: html path}.
    Raises ValueError for ``seconds`` that is not a positive integer."""
    graded = []
    for student in students or submitted_students(course_dir, assignment):
        _, result = record_paths(course_dir, assignment, student)
        if result.exists() and json.loads(result.read_text())["status"] == "graded":
            graded.append(student)
    return feedback_pages.generate(course_dir, assignment, graded, seconds)


FORMULA_START = ("=", "+", "-", "@")  # what a spreadsheet reads as a formula (OWASP, CSV injection); tab and
# carriage return, OWASP's other two, are control characters that csv_cell removes before it looks
CELL_CHARS = 300  # characters of text kept per cell: messages, not logs


def csv_cell(value):
    """``value`` as an inert ``grades.csv`` cell: numbers and None as they are; text normalised first -- every run
    of Unicode control and format characters (categories Cc and Cf: newlines, NUL, escape codes, right-to-left
    overrides, zero-width spaces) becomes one space and leading whitespace goes -- then cut to CELL_CHARS
    characters and prefixed with ``'`` when it starts with ``= + - @``, so that a spreadsheet shows it as text
    instead of running it as a formula (OWASP's advice against CSV injection). Normalising first means no
    invisible character can hide a formula behind it: a student's grade_id or error text cannot become one."""
    if not isinstance(value, str):
        return value
    marked = "".join("\x00" if unicodedata.category(char) in ("Cc", "Cf") else char for char in value)
    text = re.sub("\x00+", " ", marked).lstrip()
    if len(text) > CELL_CHARS:
        text = text[:CELL_CHARS - 3] + "..."
    return "'" + text if text.startswith(FORMULA_START) else text


def flags_text(flags) -> str:
    """The ``flags`` column: the scan's reasons joined by "; " (a lone reason given as a string stays whole)."""
    return flags if isinstance(flags, str) else "; ".join(flags)


def export(course_dir: Path, target: Path | None = None) -> Path:
    """Write ``grades.csv`` (default: in the course directory): one row per collected submission, GRADES_FIELDS
    -- graded, failed, or "not graded" (collected, never autograded: score 0); max_score from the master
    gradebook where grading failed or never ran. Returns its path."""
    from nbgrader.api import Gradebook

    paths = course_paths(course_dir)
    target = Path(target or paths["root"] / "grades.csv")
    with Gradebook(f"sqlite:///{paths['db']}", "moe-course") as gradebook:
        max_scores = {a.name: a.max_score for a in gradebook.assignments}
    records = {}
    for folder in sorted(paths["submitted"].glob("*/*")):
        if folder.is_dir() and folder.name in max_scores:
            records[folder.name, folder.parent.name] = {
                "assignment": folder.name, "student": folder.parent.name, "score": 0.0, "max_score": None,
                "status": "not graded", "error": "collected, never autograded"}
    for result in sorted(paths["gradebooks"].glob("*/*.json")):
        record = json.loads(result.read_text())
        records[record["assignment"], record["student"]] = record
    rows = []
    for key in sorted(records):
        record = records[key]
        record["max_score"] = record["max_score"] if record["max_score"] is not None else max_scores.get(
            record["assignment"])
        record["flags"] = flags_text(record.get("flags", []))
        rows.append({field: csv_cell(record.get(field, "")) for field in GRADES_FIELDS})
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=GRADES_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return target


def validate(notebook: Path) -> dict:
    """nbgrader's check of a learner's notebook before hand-in: runs it and reports failing visible tests and
    edited test cells. Returns nbgrader's result dict (empty when everything passes)."""
    from nbgrader.validator import Validator

    return Validator(config=nbgrader_config(Path(notebook).parent)).validate(str(notebook))
