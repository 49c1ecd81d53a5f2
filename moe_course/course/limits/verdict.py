"""Grades decided outside the learner's process: the grader reads the outputs a hidden test wrote
(``answers.record``), computes the references with the course library and compares.

Runs in the grading worker, after the sandboxed kernel has ended: ``score_outside`` is an nbgrader
preprocessor placed before SaveAutoGrades. For every grade cell with a check it replaces what the kernel
said by the grader's verdict: the cell's errors are dropped when the check passes (full points), and one
error naming the failed case and why is added when it does not (0 points). The reason never quotes the
expected values. The answers are read as plain arrays only (``numpy.lib.format.read_array(allow_pickle=False)``,
regular files, numbers), so nothing the learner's code returns can run code or compare equal to anything here;
and read within bounds the references set (sizes checked before and while inflating, stored or deflate
members only, an error record capped before it is parsed), so nothing it writes can grow the grader.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np

from moe_course.course.inside.answers import ANSWERS_ENV, CHECKS_ENV, SEED_ENV, Check, check_cases, load_checks
from moe_course.course.limits.bounded import read_regular
from moe_course.course.inside.compare import judge

MAX_ANSWER_BYTES = 64 * 2**20  # as the sandbox's file-size limit
MAX_ITEM_BYTES = 16  # the widest number an output may be stored as (complex128 is refused later; float128 fits)
MAX_OUTPUTS = 64  # outputs per case an answer may record (more than any check has)
SLACK_BYTES = 2**16  # per output, past its reference's size: a header, and a small wrong shape gets its message
FAILED = "CheckFailed"  # the ename of the error a failed check adds to its cell
VERDICTS_ENV = "MOE_COURSE_VERDICTS"  # where score_outside writes {grade_id: reason or null} for the worker


def references(check: Check, cases: list[tuple]) -> list[tuple]:
    """The reference outputs of ``check`` on ``cases`` (one tuple of arrays per case), from the course library."""
    return [check.reference_outputs(case) for case in cases]


_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
BOUNDED_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}  # zip methods read here
CHUNK_BYTES = 2**16  # a member is inflated this many bytes at a time, its running total checked after each
MEMBER_OVERHEAD = 512  # zip bytes per member besides its data: local header, directory entry, a name
MAX_ERROR_RECORD_BYTES = 8192  # a ``.json`` record: ``record`` writes 300 characters of error, JSON-escaped


def _output_limits(wants: list[tuple]) -> list[list[int]]:
    """Per case, the bytes each of MAX_OUTPUTS outputs may take inflated: its reference output's elements at
    MAX_ITEM_BYTES each (0 past the reference's outputs), plus SLACK_BYTES."""
    return [[SLACK_BYTES + (MAX_ITEM_BYTES * want[i].size if i < len(want) else 0) for i in range(MAX_OUTPUTS)]
            for want in wants]


def _member_limit(name: str, limits: list[list[int]]) -> int | None:
    """The inflated bytes member ``name`` may take: ``c<case>_<output>.npy`` of a case and output position
    that exist (``_output_limits``); None for any other name."""
    case, _, position = name.removeprefix("c").removesuffix(".npy").partition("_")
    if not (name.startswith("c") and name.endswith(".npy") and case.isdigit() and position.isdigit()
            and int(case) < len(limits) and int(position) < MAX_OUTPUTS):
        return None
    return limits[int(case)][int(position)]


def _inflate(archive: zipfile.ZipFile, member: zipfile.ZipInfo, allowed: int) -> bytes | None:
    """The data of ``member`` (stored or deflate), read CHUNK_BYTES at a time; None as soon as the running
    total passes ``allowed`` bytes, so no more than ``allowed`` + CHUNK_BYTES are ever inflated."""
    chunks, total = [], 0
    with archive.open(member) as handle:
        while chunk := handle.read(CHUNK_BYTES):
            total += len(chunk)
            if total > allowed:
                return None
            chunks.append(chunk)
    return b"".join(chunks)


def _load_members(raw: bytes, wants: list[tuple]) -> dict[str, np.ndarray] | str:
    """The arrays of the recorded ``.npz`` in ``raw`` ({member name without .npy: array}), or why it may not
    be read. Every member is judged before and while it is inflated: a name that is no ``c<case>_<output>``
    or appears twice, a compression method other than stored or deflate (bzip2's and LZMA's decoders inflate
    a whole block at once, gigabytes from a few bytes), a declared size (``file_size``), an inflated size or a
    ``.npy`` header shape past that output's limit (``_output_limits``: the reference's elements at
    MAX_ITEM_BYTES each, plus SLACK_BYTES), an object dtype. Arrays are parsed with
    ``numpy.lib.format.read_array(allow_pickle=False)`` from the bytes read."""
    limits = _output_limits(wants)
    arrays = {}
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        for member in archive.infolist():
            name = member.filename
            allowed = _member_limit(name, limits)
            if allowed is None:
                return f"holds {name[:40]!r}, which is no output of a case"
            if name[:-4] in arrays:
                return f"holds {name[:-4]} twice"
            if member.compress_type not in BOUNDED_METHODS:
                return (f"holds {name[:-4]} compressed with zip method {member.compress_type}; only "
                        f"{' or '.join(BOUNDED_METHODS.values())} members are read (numpy.savez writes stored)")
            if member.file_size > allowed:
                return f"declares {member.file_size} bytes for {name[:-4]}, more than its shape allows"
            data = _inflate(archive, member, allowed)
            if data is None:
                return f"inflates {name[:-4]} past the {allowed} bytes its shape allows"
            handle = io.BytesIO(data)
            header = _HEADERS.get(np.lib.format.read_magic(handle))
            if header is None:
                return f"holds {name[:-4]} in a .npy format numpy.savez does not write"
            shape, _, dtype = header(handle)
            if dtype.hasobject or dtype.itemsize * float(np.prod(shape, dtype=np.float64)) > allowed:
                return f"declares shape {shape} of {dtype} for {name[:-4]}, more than its shape allows"
            handle.seek(0)
            arrays[name[:-4]] = np.lib.format.read_array(handle, allow_pickle=False)
    return arrays


def _said_error(folder: Path, grade_id: str) -> str | None:
    """The exception text a ``.json`` record of ``grade_id`` holds (``{"error": text}``), read only when the
    file is at most MAX_ERROR_RECORD_BYTES (checked before parsing); None otherwise."""
    record = read_regular(Path(folder) / f"{grade_id}.json", MAX_ERROR_RECORD_BYTES)
    if not record or len(record) > MAX_ERROR_RECORD_BYTES:
        return None
    try:
        said = json.loads(record)["error"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    return said if isinstance(said, str) else None


def read_outputs(folder: Path, grade_id: str, wants: list[tuple]) -> list[tuple] | str:
    """The outputs ``answers.record`` wrote for ``grade_id`` (one tuple per case), or why there are none.
    ``wants``: the reference outputs (one tuple per case), which bound what the file may hold and declare:
    the ``.npz`` is read only up to the sum of its reference outputs' limits, plus SLACK_BYTES per case and
    MEMBER_OVERHEAD per possible member (``_load_members`` judges the rest), a ``.json`` error record only up
    to MAX_ERROR_RECORD_BYTES."""
    limits = _output_limits(wants)
    budget = min(MAX_ANSWER_BYTES, sum(sum(limit[:len(want)]) + SLACK_BYTES + MEMBER_OVERHEAD * MAX_OUTPUTS
                                       for limit, want in zip(limits, wants)))
    raw = read_regular(Path(folder) / f"{grade_id}.npz", budget)
    if raw is None:
        said = _said_error(folder, grade_id)
        if said is not None:
            return f"{grade_id}: your function raised {said[:300]}"
        return f"{grade_id}: no answers were recorded (the cell stopped before its graded check)"
    if len(raw) > budget:
        return (f"{grade_id}: the recorded answers were not read: the file is more than the {budget} bytes its "
                "outputs allow")
    try:
        arrays = _load_members(raw, wants)
    except Exception as error:  # a damaged or forged file
        return f"{grade_id}: the recorded answers cannot be read ({type(error).__name__})"
    if isinstance(arrays, str):
        return f"{grade_id}: the recorded answers were not read: the file {arrays}"
    outputs = []
    for index in range(len(wants)):
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
