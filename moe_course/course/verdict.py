"""Grades decided outside the learner's process: the grader reads the outputs a hidden test wrote
(``answers.record``), computes the references with the course library and compares.

Runs in the grading worker, after the sandboxed kernel has ended: ``score_outside`` is an nbgrader
preprocessor placed before SaveAutoGrades. For every grade cell with a check it replaces what the kernel
said by the grader's verdict: the cell's errors are dropped when the check passes (full points), and one
error naming the failed case and why is added when it does not (0 points). The reason never quotes the
expected values. The answers are read as plain arrays only (``numpy.load(allow_pickle=False)``, regular
files, numbers), so nothing the learner's code returns can run code or compare equal to anything here.
"""

from __future__ import annotations

import io
import json
import os
import stat
import zipfile
from pathlib import Path

import numpy as np

from moe_course.course.answers import ANSWERS_ENV, CHECKS_ENV, SEED_ENV, Check, as_outputs, check_cases, load_checks

MAX_ANSWER_BYTES = 64 * 2**20  # as the sandbox's file-size limit
NUMBER_KINDS = "biuf"  # bool, int, unsigned, float: what an answer may hold
MAX_ITEM_BYTES = 16  # the widest number an output may be stored as (complex128 is refused later; float128 fits)
MAX_OUTPUTS = 64  # outputs per case an answer may record (more than any check has)
SLACK_BYTES = 2**16  # per output, past its reference's size: a header, and a small wrong shape gets its message
FAILED = "CheckFailed"  # the ename of the error a failed check adds to its cell
VERDICTS_ENV = "MOE_COURSE_VERDICTS"  # where score_outside writes {grade_id: reason or null} for the worker


def _compare(got, want, check: Check) -> str | None:
    """Why output ``got`` does not match the reference ``want`` (None when it does)."""
    want = np.asarray(want)
    if got.dtype.kind not in NUMBER_KINDS:
        return f"is not numbers (dtype {got.dtype})"
    if check.scalar and got.shape != ():
        return f"is not one number (shape {got.shape})"
    if got.shape != want.shape:
        return f"has shape {got.shape}, expected {want.shape}"
    got, want = got.astype(np.float64), want.astype(np.float64)
    bad = np.isfinite(want) & ~np.isfinite(got)
    if bad.any():
        return f"has {int(bad.sum())} non-finite value(s) (nan or inf) where the reference is finite"
    close = got == want if check.exact else np.isclose(got, want, rtol=check.rtol, atol=check.atol, equal_nan=True)
    if not close.all():  # how far off is not said: with one's own output it would give the expected value
        return f"differs from the reference in {int((~close).sum())} of {close.size} value(s)"
    return None


def references(check: Check, cases: list[tuple]) -> list[tuple]:
    """The reference outputs of ``check`` on ``cases`` (one tuple of arrays per case), from the course library."""
    return [tuple(np.asarray(w) for w in as_outputs(check.reference(*case))) for case in cases]


def judge(check: Check, grade_id: str, cases: list[tuple], outputs: list[tuple],
          wants: list[tuple] | None = None) -> str | None:
    """Compare the learner's ``outputs`` (one tuple of arrays per case) with the references of ``check`` on
    ``cases`` (``wants``, computed here when not given); returns the first failure as one line, or None when
    every case matches."""
    wants = references(check, cases) if wants is None else wants
    for index, (got, want) in enumerate(zip(outputs, wants)):
        where = f"{grade_id}, case {index + 1} of {len(cases)}"
        if len(got) != len(want):
            return f"{where}: returned {len(got)} output(s), expected {len(want)}"
        for position, (g, w) in enumerate(zip(got, want)):
            if (why := _compare(np.asarray(g), w, check)) is not None:
                return f"{where}: output {position + 1} {why}"
    return None


def _read_regular(path: Path) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (not a link, FIFO or device) of at most
    MAX_ANSWER_BYTES; None otherwise. Opened without following links and without blocking."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_ANSWER_BYTES:
            return None
        return handle.read(info.st_size + 1)[:MAX_ANSWER_BYTES + 1]  # read(n) allocates n bytes first


_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _oversized(raw: bytes, wants: list[tuple]) -> str | None:
    """Why the recorded ``.npz`` in ``raw`` may not be loaded, judged from its zip directory and .npy headers
    alone, before anything is inflated: a member that is not ``c<case>_<output>`` of a reference output, or
    that declares more bytes -- as stored (``file_size``) or as its header's shape -- than that output's
    elements at MAX_ITEM_BYTES each, plus SLACK_BYTES. None when it may be loaded."""
    def limit(name: str) -> int | None:  # None: a name no output has
        case, _, position = name.removeprefix("c").removesuffix(".npy").partition("_")
        if not (name.startswith("c") and name.endswith(".npy") and case.isdigit() and position.isdigit()
                and int(case) < len(wants) and int(position) < MAX_OUTPUTS):
            return None
        want = wants[int(case)]
        return SLACK_BYTES + (MAX_ITEM_BYTES * want[int(position)].size if int(position) < len(want) else 0)

    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        for member in archive.infolist():
            allowed = limit(member.filename)
            if allowed is None:
                return f"holds {member.filename[:40]!r}, which is no output of a case"
            if member.file_size > allowed:
                return f"declares {member.file_size} bytes for {member.filename[:-4]}, more than its shape allows"
            with archive.open(member) as handle:
                header = _HEADERS.get(np.lib.format.read_magic(handle))
                if header is None:
                    return f"holds {member.filename[:-4]} in a .npy format numpy.savez does not write"
                shape, _, dtype = header(handle)
            if dtype.hasobject or dtype.itemsize * float(np.prod(shape, dtype=np.float64)) > allowed:
                return f"declares shape {shape} of {dtype} for {member.filename[:-4]}, more than its shape allows"
    return None


def read_outputs(folder: Path, grade_id: str, wants: list[tuple]) -> list[tuple] | str:
    """The outputs ``answers.record`` wrote for ``grade_id`` (one tuple per case), or why there are none.
    ``wants``: the reference outputs (one tuple per case), which bound what the file may declare."""
    cases = len(wants)
    raw = _read_regular(Path(folder) / f"{grade_id}.npz")
    if raw is None:
        error = _read_regular(Path(folder) / f"{grade_id}.json")
        try:
            said = json.loads(error)["error"] if error else None
        except (ValueError, KeyError, TypeError, RecursionError):
            said = None
        if isinstance(said, str):
            return f"{grade_id}: your function raised {said[:300]}"
        return f"{grade_id}: no answers were recorded (the cell stopped before its graded check)"
    try:
        if (why := _oversized(raw, wants)) is not None:
            return f"{grade_id}: the recorded answers were not read: the file {why}"
        with np.load(io.BytesIO(raw), allow_pickle=False) as stored:
            arrays = {name: stored[name] for name in stored.files}
    except Exception as error:  # a damaged or forged file
        return f"{grade_id}: the recorded answers cannot be read ({type(error).__name__})"
    outputs = []
    for index in range(cases):
        count = sum(1 for name in arrays if name.startswith(f"c{index}_"))
        if count == 0:
            return f"{grade_id}: no answer recorded for case {index + 1}"
        outputs.append(tuple(arrays.get(f"c{index}_{position}") for position in range(count)))
    if any(o is None for case in outputs for o in case):
        return f"{grade_id}: the recorded answers are incomplete"
    return outputs


def verdicts(checks_file: Path, answers: Path, seed: int) -> dict[str, str | None]:
    """{grade_id: None (passed) or the reason it failed} for every check of ``checks_file``."""
    results = {}
    for grade_id, check in load_checks(checks_file).items():
        cases = check_cases(check, grade_id, seed)
        wants = references(check, cases)
        outputs = read_outputs(answers, grade_id, wants)
        results[grade_id] = outputs if isinstance(outputs, str) else judge(check, grade_id, cases, outputs, wants)
    return results


def score_outside(notebook, resources):
    """nbgrader preprocessor (after Execute, before SaveAutoGrades): the grader's verdict on every checked
    grade cell (see the module docstring). Reads the checks file, answers folder and seed from the
    environment the worker set (``answers.CHECKS_ENV``, ``ANSWERS_ENV``, ``SEED_ENV``); does nothing without.
    Writes the verdicts as JSON to ``VERDICTS_ENV`` when set (after the kernel ended: nothing submitted can
    write there)."""
    from nbformat.v4 import new_output

    if CHECKS_ENV not in os.environ or ANSWERS_ENV not in os.environ:
        return notebook, resources
    results = verdicts(Path(os.environ[CHECKS_ENV]), Path(os.environ[ANSWERS_ENV]), int(os.environ[SEED_ENV]))
    if VERDICTS_ENV in os.environ:
        Path(os.environ[VERDICTS_ENV]).write_text(json.dumps(results))
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.cell_type != "code" or not cell.metadata.get("nbgrader", {}).get("grade") or grade_id not in results:
            continue
        outputs = list(cell.get("outputs", []))
        if results[grade_id] is None:  # passed: what the kernel raised after recording does not count
            outputs = [o for o in outputs if o.get("output_type") != "error"]
        else:
            outputs.append(new_output("error", ename=FAILED, evalue=results[grade_id],
                                      traceback=[f"{FAILED}: {results[grade_id]}"]))
        cell.outputs = outputs
    return notebook, resources
