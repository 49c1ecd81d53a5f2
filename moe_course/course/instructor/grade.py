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

from moe_course.course.limits import budget
from moe_course.course.instructor import feedback as feedback_pages
from moe_course.course.limits import sandbox as bubblewrap
from moe_course.course.limits.config import SOLUTIONS, Limits, course_paths, grading_env, nbgrader_config
from moe_course.course.limits.bounded import MAX_NOTEBOOK_BYTES, read_notebook
from moe_course.course.instructor.flags import scan_notebook
from moe_course.course.inside.kernel import write_kernelspec
from moe_course.course.limits.worker import record_paths

SANDBOX_UID = 60000  # the first host uid of a root grader's kernels (as isolate, the IOI sandbox, uses)
GRADES_FIELDS = ("assignment", "student", "score", "max_score", "instructor_score", "instructor_max", "status",
                 "seconds", "error", "flags", "sandbox")
EXPLAIN_FIELDS = ("student", "grade_id", "points", "answer", "score")  # an explain sheet's columns
EXPLAIN_CHARS = 4000  # characters of a written answer kept in the explain sheet (the course asks for sentences)
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


def csv_cell(value, chars: int = CELL_CHARS):
    """``value`` as an inert ``grades.csv`` cell: numbers and None as they are; text normalised first -- every run
    of Unicode control and format characters (categories Cc and Cf: newlines, NUL, escape codes, right-to-left
    overrides, zero-width spaces) becomes one space and leading whitespace goes -- then cut to ``chars``
    characters and prefixed with ``'`` when it starts with ``= + - @``, so that a spreadsheet shows it as text
    instead of running it as a formula (OWASP's advice against CSV injection). Normalising first means no
    invisible character can hide a formula behind it: a student's grade_id or error text cannot become one."""
    if not isinstance(value, str):
        return value
    text = terminal_text(value).lstrip()
    if len(text) > chars:
        text = text[:chars - 3] + "..."
    return "'" + text if text.startswith(FORMULA_START) else text


def terminal_text(value):
    """``value`` safe to print on the instructor's terminal: a string's every run of Unicode control and format
    characters (categories Cc and Cf: escape sequences that move the cursor, recolour or retitle the terminal,
    carriage returns that overwrite a line, newlines that forge one, right-to-left overrides) becomes one space;
    anything else is returned as it is. For every student-controlled string a command prints (a student's folder
    name, an error text): the terminal then shows what the student wrote, never what it would do."""
    if not isinstance(value, str):
        return value
    marked = "".join("\x00" if unicodedata.category(char) in ("Cc", "Cf") else char for char in value)
    return re.sub("\x00+", " ", marked)


def flags_text(flags) -> str:
    """The ``flags`` column: the scan's reasons joined by "; " (a lone reason given as a string stays whole)."""
    return flags if isinstance(flags, str) else "; ".join(flags)


def explain_points(course_dir: Path) -> dict[str, dict[str, float]]:
    """{assignment: {grade_id: points}} of the explain cells (graded markdown cells, graded by the instructor)
    in the course's master gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course_paths(course_dir)['db']}", "moe-course") as gradebook:
        return {a.name: {cell.name: cell.max_score for notebook in a.notebooks for cell in notebook.grade_cells
                         if cell.cell_type == "markdown"} for a in gradebook.assignments}


def explain_sheet_path(course_dir: Path, assignment: str) -> Path:
    """Where ``explain_sheet`` writes: ``COURSE_DIR/explain/<assignment>.csv``."""
    return course_paths(course_dir)["root"] / "explain" / f"{assignment}.csv"


def _sheet_scores(course_dir: Path, assignment: str, points: dict[str, float]) -> dict[tuple[str, str], float]:
    """{(student, grade_id): the instructor's score} from the assignment's explain sheet (none if it does not
    exist; blank scores are pending). Raises ValueError naming the sheet, the row and the value for a score that
    is not a number from 0 to the cell's points, or a grade_id that is no explain cell of the assignment."""
    sheet = explain_sheet_path(course_dir, assignment)
    scores = {}
    if not sheet.is_file():
        return scores
    with open(sheet, newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            given = (row.get("score") or "").strip()
            if not given:
                continue
            if row.get("grade_id") not in points:
                raise ValueError(f"{sheet}, row {line}: grade_id={row.get('grade_id')!r} is not allowed; use one of "
                                 f"{sorted(points)} (the explain cells of {assignment})")
            try:
                score = float(given)
            except ValueError:
                score = -1.0
            if not 0 <= score <= points[row["grade_id"]]:
                raise ValueError(f"{sheet}, row {line}: score={given!r} is not allowed; use a number from 0 to "
                                 f"{points[row['grade_id']]:g} (the points of {row['grade_id']}), or leave it blank")
            scores[row["student"], row["grade_id"]] = score
    return scores


def _written_answers(notebook: Path, grade_ids, limit: int) -> dict[str, str]:
    """{grade_id: the text of that explain cell} in a submitted notebook (read within ``limit`` bytes; none
    when it cannot be read), without cells still holding the handout's YOUR ANSWER HERE."""
    try:
        cells = json.loads(read_notebook(notebook, limit))["cells"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return {}
    written = {}
    for cell in cells if isinstance(cells, list) else []:
        meta = cell.get("metadata", {}).get("nbgrader", {}) if isinstance(cell, dict) else None
        if not isinstance(meta, dict) or meta.get("grade_id") not in grade_ids:
            continue
        source = cell.get("source", "")
        text = ("".join(map(str, source)) if isinstance(source, list) else str(source)).strip()
        if text and text != "YOUR ANSWER HERE":
            written.setdefault(meta["grade_id"], text)
    return written


def explain_sheet(course_dir: Path, assignment: str, notebook_bytes: int = MAX_NOTEBOOK_BYTES) -> Path:
    """Write the explain sheet of ``assignment`` (``explain_sheet_path``), the instructor's way to grade the
    written answers: one row per collected submission and explain cell, EXPLAIN_FIELDS -- the student, the
    cell's grade_id and points, the written answer (made inert as every text cell of ``grades.csv``, cut to
    EXPLAIN_CHARS; "(no answer)" when the cell is missing or still holds the handout's YOUR ANSWER HERE) and
    the score, blank for the instructor to fill in (the rubric is in ``solutions/<assignment>.py``, inside that
    cell's solution markers). Scores already in the sheet are kept. ``export`` adds them up per student.
    Raises ValueError for an assignment that has no explain cell in the course's gradebook, or a sheet whose
    scores are not allowed (``_sheet_scores``)."""
    points = explain_points(course_dir).get(assignment, {})
    if not points:
        raise ValueError(f"assignment={assignment!r} has no explain cell in {course_paths(course_dir)['root']}; "
                         f"use a released assignment with graded markdown cells")
    kept = _sheet_scores(course_dir, assignment, points)
    rows = []
    for student in submitted_students(course_dir, assignment):
        written = {}
        for notebook in sorted((course_paths(course_dir)["submitted"] / student / assignment).glob("*.ipynb")):
            written = {**_written_answers(notebook, points, notebook_bytes), **written}
        for grade_id, most in points.items():
            score = kept.get((student, grade_id))
            rows.append({"student": student, "grade_id": grade_id, "points": most,
                         "answer": csv_cell(written.get(grade_id, "(no answer)"), EXPLAIN_CHARS),
                         "score": "" if score is None else score})
    return _write_csv(explain_sheet_path(course_dir, assignment), EXPLAIN_FIELDS, rows)


def _write_csv(target: Path, fields, rows: list[dict]) -> Path:
    """Write ``rows`` (dicts of ``fields``) to the CSV file ``target`` (its folder made); returns ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return target


def export(course_dir: Path, target: Path | None = None) -> Path:
    """Write ``grades.csv`` (default: in the course directory): one row per collected submission, GRADES_FIELDS
    -- graded, failed, or "not graded" (collected, never autograded: score 0); max_score from the master
    gradebook where grading failed or never ran. score and max_score are the autograded points out of the
    autogradable ones; instructor_max is the points of the explain cells (graded by the instructor), and
    instructor_score their sum from the assignment's explain sheet (``explain_sheet``) once every one of the
    student's explain cells has a score there, blank while any is pending. Returns its path. Raises ValueError
    for an explain sheet whose scores are not allowed."""
    from nbgrader.api import Gradebook

    paths = course_paths(course_dir)
    target = Path(target or paths["root"] / "grades.csv")
    explain = explain_points(course_dir)
    with Gradebook(f"sqlite:///{paths['db']}", "moe-course") as gradebook:
        max_scores = {a.name: a.max_score - sum(explain.get(a.name, {}).values()) for a in gradebook.assignments}
    sheets = {name: _sheet_scores(course_dir, name, points) for name, points in explain.items() if points}
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
        points = explain.get(record["assignment"], {})
        given = [sheets[record["assignment"]].get((record["student"], grade_id)) for grade_id in points]
        record["instructor_max"] = sum(points.values()) if points else ""
        record["instructor_score"] = sum(given) if points and None not in given else ""
        rows.append({field: csv_cell(record.get(field, "")) for field in GRADES_FIELDS})
    return _write_csv(target, GRADES_FIELDS, rows)


def validate(notebook: Path) -> dict:
    """nbgrader's check of a learner's notebook before hand-in: runs it and reports failing visible tests and
    edited test cells. Returns nbgrader's result dict (empty when everything passes)."""
    from nbgrader.validator import Validator

    return Validator(config=nbgrader_config(Path(notebook).parent)).validate(str(notebook))
