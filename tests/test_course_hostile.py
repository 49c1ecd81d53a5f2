"""Hostile and broken submissions, graded in ONE batch with correct ones through the real commands: every
other student's grade is unaffected, the batch finishes, and each attack fails in the way it should. The
assignment is a small one written here (two answers, 3 points). Needs nbgrader (the `test` extra)."""

import base64
import bz2
import csv
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path


import pytest

pytest.importorskip("nbgrader", reason="nbgrader is not installed: pip install -e '.[instructor]'")

from course_submissions import SILENT_KERNEL, answered, write  # noqa: E402
from moe_course.cli import main  # noqa: E402
from moe_course.course.inside.answers import DEFAULT_SEED, check_cases, load_checks  # noqa: E402
from moe_course.course.instructor.collect import MAX_ID, student_id  # noqa: E402
from moe_course.course.limits.config import REPO  # noqa: E402

NAME = "00_tiny"
ROOT = os.geteuid() == 0  # as in CI: the grader then drops each kernel to an unprivileged host uid
LONG_NAME = "\u2177" * 85  # the Roman numeral eight: 3 bytes in UTF-8, "viii" in NFKD
CELL_TIMEOUT = 15  # s; long enough for a correct cell on a loaded 2-core machine
MEMORY_MB = 3072  # the grading kernel's address space; JAX and the course library take about 1.6 GiB of it
SOLUTION = '''# %% [markdown]
# A small assignment for the grading tests.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import numpy as np

# %% nbgrader={"grade": false, "grade_id": "probs_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def probs(logits):
    ### BEGIN SOLUTION
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "probs_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
assert probs(np.zeros((1, 2))).shape == (1, 2)
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # SECRET-HIDDEN-TEST-TEXT
_answers.record("probs_tests", probs)
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "double_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def double(x):
    ### BEGIN SOLUTION
    return 2 * x
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "double_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers
_answers.record("double_tests", double)
### END HIDDEN TESTS
'''
CHECKS = '''"""The checks of the small assignment: inputs from the grading seed, references from the library."""
import numpy as np

from moe_course.course.inside.answers import Check


def _probs(logits):
    from moe_course.routing import router_probabilities

    return np.asarray(router_probabilities(logits))


SANDBOX_WITHOUT = ("jax", "jaxlib")  # the answers are NumPy, and JAX is not there to call

CHECKS = {
    "probs_tests": Check(lambda rng: [(rng.normal(size=(2, 5, 4)).astype(np.float32),)], _probs, atol=1e-6),
    "double_tests": Check(lambda rng: [(rng.normal(size=5),)], lambda values: 2 * values, exact=True),
}
'''
ESCAPES = """import os, _posixsubprocess
root = os.open('/', os.O_RDONLY)  # relative to a directory fd: no audit event, so only the OS decides
try:
    pattern = os.read(os.open('proc/sys/kernel/core_pattern', os.O_RDONLY, dir_fd=root), 4096)
    os.write(os.open('proc/sys/kernel/core_pattern', os.O_WRONLY, dir_fd=root), pattern)
    print('SYSCTL-WRITTEN')
except OSError as error:
    print('sysctl', type(error).__name__)
print('CAPS', [line.split()[1] for line in open('/proc/self/status') if line.startswith('CapEff')])
errors = os.pipe()
started = 0
try:
    for _ in range(700):
        _posixsubprocess.fork_exec([b'/bin/sleep', b'5'], [b'/bin/sleep'], True, (), None, None, -1, -1, -1, -1,
                                   -1, -1, *errors, False, True, -1, None, None, None, -1, None, False)
        started += 1
except OSError as error:
    print('fork', type(error).__name__)
print('PROCESSES', started)"""
FILLS = """import os
root = os.open('/', os.O_RDONLY)  # relative to a directory fd: past the in-kernel guard, to the OS's limits
def fill(folder):
    written = 0
    try:
        for index in range(40):
            handle = os.open(f'{folder}/fill{index}', os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=root)
            for _ in range(2):
                written += os.write(handle, bytes(2**24))
            os.close(handle)
    except OSError:
        pass
    for index in range(40):
        try:
            os.remove(f'{folder}/fill{index}', dir_fd=root)
        except OSError:
            pass
    return written // 2**20
print('FILLED', fill('tmp'), fill('dev/shm'), fill(os.getcwd().lstrip('/')))"""
BOMB = """import io, os, zipfile
header = io.BytesIO()
np.lib.format.write_array_header_1_0(header, {'descr': '<f8', 'fortran_order': False, 'shape': (2**25,)})
os.remove('/grading/answers/probs_tests.npz')
with zipfile.ZipFile('/grading/answers/probs_tests.npz', 'w', zipfile.ZIP_DEFLATED) as archive:
    with archive.open('c0_0.npy', 'w', force_zip64=True) as member:
        member.write(header.getvalue())
        for _ in range(256):
            member.write(bytes(2**20))
print('BOMB', os.path.getsize('/grading/answers/probs_tests.npz'))"""
# One message buffer sent again and again on the kernel's stdin channel, which grading never reads; the cell
# waits while it arrives (with the channel connected, the worker held 1.6 GiB of it when the kernel ended).
STDIN_FLOOD = """import time
k = get_ipython().kernel
buffer, sent = b'x' * (48 * 2**20), 0
for _ in range(40):
    k.session.send(k.stdin_socket, 'input_request', {'prompt': '', 'password': False}, parent=k.get_parent('shell'),
                   ident=k._parent_ident['shell'], buffers=[buffer])
    sent += 1
time.sleep(3)
print('STDIN', sent)"""
# From the kernel's control thread, when grading asks it to shut down: 60 messages of 48 MiB to the socket that
# asked (the kernel manager's, which never reads; a worker held 3.0 GiB of them).
CONTROL_FLOOD = """k = get_ipython().kernel
def flood(stream, ident, parent):
    buffer = b'x' * (48 * 2**20)
    for _ in range(60):
        k.session.send(stream, 'debug_reply', {}, parent=parent, ident=ident, buffers=[buffer])
k.control_handlers['shutdown_request'] = flood
print('CONTROL armed')"""
# A .json error record of 60 MB of empty lists (about 1.2 GB of Python objects, parsed).
JSON_RECORD = """import os
os.remove('/grading/answers/probs_tests.npz')
with open('/grading/answers/probs_tests.json', 'w') as handle:
    handle.write('{"error": [')
    for _ in range(20):
        handle.write('[],' * 10**6)
    handle.write('[]]}')
print('RECORD', os.path.getsize('/grading/answers/probs_tests.json'))"""
# Past the in-kernel guard (a directory fd): the read-only tmpfs bwrap builds / and /dev on, and the one that
# hides JAX (SANDBOX_WITHOUT), each written to.
ROOT_FILL = """import os
root = os.open('/', os.O_RDONLY)
hidden = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), 'jax').lstrip('/')
for folder in ('', 'dev/', hidden + '/'):
    written = 0
    try:
        handle = os.open(folder + 'fill', os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=root)
        for _ in range(64):
            written += os.write(handle, bytes(2**24))
    except OSError as error:
        print('ROOTFILL', '/' + folder, written, error.strerror)"""
# A folder its own grader (not root) could not list or remove as it stood: 32 MB inside, then mode 000.
LOCKED = """import os
os.makedirs('locked/inner')
with open('locked/inner/data', 'wb') as handle:
    handle.write(bytes(32 * 2**20))
os.chmod('locked/inner', 0)
os.chmod('locked', 0)
print('LOCKED', oct(os.stat('locked').st_mode & 0o777))"""
GOOD = {"probs_answer": SOLUTION.split("### BEGIN SOLUTION\n")[1].split("    ### END")[0]}


def _with(notebook: dict, **sources) -> dict:
    """``notebook`` with the cells of the given grade ids replaced (a value of None deletes the cell)."""
    cells = []
    for cell in notebook["cells"]:
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if grade_id in sources:
            if sources[grade_id] is None:
                continue
            cell = {**cell, "source": sources[grade_id]}
        cells.append(cell)
    return {**notebook, "cells": cells}


def _cell(notebook: dict, grade_id: str) -> dict:
    return next(c for c in notebook["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)


def _bzip2_member_npz(blocks: int) -> bytes:
    """A recorded answer of a few KB whose member ``c0_0.npy`` is bzip2 (zip method 12) of ``blocks`` x 45 MB of
    zeros, declared as small: one block of bz2's own output (run-length coding first) repeated at the bit level,
    the stream's combined CRC recomputed; the file is written stored, then its method fields set to 12."""
    bits = bin(int.from_bytes(bz2.compress(bytes(45 * 10**6), 9), "big"))[2:]
    bits = bits.zfill(-(-len(bits) // 8) * 8)
    end_magic = format(0x177245385090, "048b")  # bzip2's end-of-stream marker
    block = bits[32:bits.rindex(end_magic)]
    combined = 0
    for _ in range(blocks):
        combined = ((combined << 1 | combined >> 31) & 0xFFFFFFFF) ^ int(block[48:80], 2)
    stream = bits[:32] + block * blocks + end_magic + format(combined, "032b")
    stream += "0" * (-len(stream) % 8)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("c0_0.npy", int(stream, 2).to_bytes(len(stream) // 8, "big"))
    raw = bytearray(buffer.getvalue())
    central = raw.index(b"PK\x01\x02")  # the method: 8 bytes into the local header, 10 into the directory's
    raw[8:10] = raw[central + 10:central + 12] = (12).to_bytes(2, "little")
    return bytes(raw)


def _write_giant(notebook: dict, path, lists: int) -> None:
    """``notebook`` with a metadata value of ``lists`` empty lists, written in pieces (3 bytes per list)."""
    head, tail = json.dumps({**notebook, "metadata": {**notebook["metadata"], "x": "HERE"}}).split('"HERE"')
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        handle.write(head + "[")
        for _ in range(lists // 10**6):
            handle.write("[]," * 10**6)
        handle.write("[]]" + tail)


def _peak_rss_reset() -> bool:
    """Reset this process's peak resident memory (VmHWM) to what it holds now; False where Linux refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _status_mib(field: str) -> float:
    """This process's ``VmHWM`` (peak resident memory) or ``VmRSS`` (resident now), in MiB."""
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(f"{field}:")) / 1024


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    solutions, course = root / "solutions", root / "course"
    solutions.mkdir()
    (solutions / f"{NAME}.py").write_text(SOLUTION)
    (solutions / "checks").mkdir()
    (solutions / "checks" / f"{NAME}.py").write_text(CHECKS)
    assert main(["course", "release", NAME, "--course-dir", str(course), "--solutions", str(solutions),
                 "--exercises", str(root / "exercises")]) == 0
    released = course / "release" / NAME / f"{NAME}.ipynb"
    full = answered(released, course / "source" / NAME / f"{NAME}.ipynb")
    blank = json.loads(released.read_text())
    correct = {"probs_answer": "".join(_cell(full, "probs_answer")["source"]),
               "double_answer": "".join(_cell(full, "double_answer")["source"])}
    wrong_probs = "def probs(logits):\n    return np.zeros_like(logits)"
    outside = root / "outside.txt"
    secrets = [course / "source" / NAME / f"{NAME}.ipynb", course / "gradebook.db", solutions / f"{NAME}.py",
               course / "gradebooks" / NAME / "good.db"]
    readers = "\n".join(f"try:\n    print(open({str(p)!r}, 'rb').read()[:4000])\nexcept Exception as error:\n"
                        f"    print(type(error).__name__)" for p in secrets)
    victim = course / "submitted" / "good" / NAME / f"{NAME}.ipynb"
    writers = "\n".join(f"try:\n    open({str(p)!r}, 'w').write('pwned')\nexcept Exception as error:\n"
                        f"    print(type(error).__name__)" for p in (outside, victim, course / "grades.csv"))
    record = course / "gradebooks" / NAME / "spawns.json"
    # Past the in-kernel guard (no audit event for these), so only the sandbox stands in the way.
    dir_fd = "\n".join(f"try:\n    print(open(os.open({str(p.relative_to('/'))!r}, os.O_RDONLY, dir_fd=root), 'rb')"
                       f".read()[:4000])\nexcept Exception as error:\n    print(type(error).__name__)" for p in secrets)
    # another student's notebook, the grading kernelspec (every later kernel would run it) and the master
    # gradebook (hidden tests, checksums): the attacks that harm others; and the repository's .git
    kernelspec = course / "jupyter" / "kernels" / "moe-course-grader" / "kernel.json"
    overwritten = [victim, kernelspec, course / "gradebook.db"]
    dir_fd_write = "\n".join(f"try:\n    os.write(os.open({str(p.relative_to('/'))!r}, os.O_WRONLY | os.O_TRUNC, "
                             f"dir_fd=root), b'pwned')\nexcept Exception as error:\n    print(type(error).__name__)"
                             for p in overwritten)
    dir_fd_write += (f"\ntry:\n    print(open(os.open({str((REPO / '.git' / 'HEAD').relative_to('/'))!r}, os.O_RDONLY, "
                     f"dir_fd=root)).read())\nexcept Exception as error:\n    print(type(error).__name__)")
    spawner = ("import _posixsubprocess\ndef spawn(script):\n    _posixsubprocess.fork_exec([b'/bin/sh', b'-c', "
               "script.encode()], [b'/bin/sh'], True, (), None, None, -1, -1, -1, -1, -1, -1, *os.pipe(), False, "
               "True, -1, None, None, None, -1, None, False)\n")
    spawn = (spawner + f"spawn('sleep 4; echo pwned > {record}; echo pwned > {victim}')\n"
             "print('processes', sorted({open(f'/proc/{p}/comm').read().strip() for p in os.listdir('/proc') "
             "if p.isdigit()} - {'sh', 'sleep'}))\n"
             "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 80), timeout=2)\n    print('NETWORK')\n"
             "except OSError as error:\n    print(type(error).__name__)")
    duplicated = _with(full)
    duplicated["cells"].append({**_cell(full, "double_tests"), "id": "copy-of-double-tests"})  # as Jupyter copies
    retyped = _with(full, probs_answer=wrong_probs, probs_tests="# nothing to test")
    markdown = _cell(retyped, "probs_tests")
    markdown.update(cell_type="markdown")
    for key in ("outputs", "execution_count"):
        markdown.pop(key, None)
    checks = load_checks(solutions / "checks" / f"{NAME}.py")
    case, = check_cases(checks["probs_tests"], "probs_tests", DEFAULT_SEED)
    known = checks["probs_tests"].reference(*case).tolist()  # what the seed-0 inputs should give
    forge = ("\nimport os, io\nbuffer = io.BytesIO()\nnp.savez(buffer, c0_0=np.full((2, 5, 4), 0.25))\n"
             "os.remove('/grading/answers/probs_tests.npz')\n"
             "open('/grading/answers/probs_tests.npz', 'wb').write(buffer.getvalue())")
    submissions = {
        "good": full,
        "good2": full,
        "blank": blank,
        "loop": _with(full, probs_answer="def probs(logits):\n    while True:\n        pass"),
        "stubborn_loop": _with(full, probs_answer="import time\ndef probs(logits):\n    while True:\n        try:\n"
                               "            time.sleep(0.05)\n        except BaseException:\n            pass"),
        "sys_exit": _with(full, probs_answer=correct["probs_answer"] + "\nimport sys\nsys.exit(3)"),
        "os_exit": _with(full, probs_answer=correct["probs_answer"] + "\nimport os\nos._exit(1)"),
        "segfault": _with(full, probs_answer="import faulthandler\nfaulthandler._sigsegv()"),
        "memory_bomb": _with(full, probs_answer="def probs(logits):\n    hoard = np.ones(2**29)  # 4 GiB\n"
                             "    return hoard[:logits.size].reshape(logits.shape)"),
        "edits_tests": retyped,
        "deletes_tests": _with(full, probs_answer=wrong_probs, probs_tests=None),
        "duplicates_tests": duplicated,
        "monkeypatch": _with(full, probs_answer=wrong_probs + "\nimport numpy, moe_course.routing\n"
                             "numpy.allclose = lambda *a, **k: True\nnumpy.array_equal = lambda *a, **k: True\n"
                             "moe_course.routing.router_probabilities = probs\n"
                             "numpy.testing.assert_allclose = lambda *a, **k: None",
                             double_answer="def double(x):\n    import numpy\n"
                             "    numpy.array_equal = lambda *a, **k: True\n    return x"),
        "code_patch": _with(full, probs_answer=wrong_probs + "\nimport moe_course.routing.router as r\n"
                            "r.router_probabilities.__code__ = (lambda logits, key=None, *, noise_std=None: "
                            "logits * 0).__code__"),
        "unhooks": _with(full, probs_answer=correct["probs_answer"] + "\nget_ipython().events.callbacks"
                         "['pre_run_cell'].clear()", double_answer="import numpy\n"
                         "numpy.array_equal = lambda *a, **k: True\ndef double(x):\n    return x"),
        "post_run_hook": _with(full, probs_answer=wrong_probs + "\ndef hide(result):\n    result.error_in_exec = None\n"
                               "get_ipython().events.register('post_run_cell', hide)"),
        "thread_patch": _with(full, probs_answer=wrong_probs + "\nimport threading, time, numpy\ndef patch():\n"
                              "    while True:\n        numpy.isclose = numpy.allclose = lambda *a, **k: True\n"
                              "        time.sleep(0.001)\nthreading.Thread(target=patch, daemon=True).start()"),
        "added_cell": {**full, "cells": full["cells"] + [  # a cell without nbgrader metadata, after the tests
            {"cell_type": "code", "execution_count": None, "id": "added", "metadata": {}, "outputs": [],
             "source": "import os\nfor name in os.listdir('/grading/answers'):\n"
                       "    open('/grading/answers/' + name, 'wb').write(b'')"}]},
        "reads_secrets": _with(full, probs_answer=correct["probs_answer"] + "\n" + readers),
        "writes_outside": _with(full, probs_answer=correct["probs_answer"] + "\n" + writers),
        "dir_fd": _with(full, probs_answer=correct["probs_answer"] + "\nimport os\nroot = os.open('/', os.O_RDONLY)\n"
                        + dir_fd + "\n" + dir_fd_write),
        "spawns": _with(full, probs_answer=correct["probs_answer"] + "\nimport os\n" + spawn),
        "kills_all": _with(full, probs_answer=correct["probs_answer"] + "\nimport os\n" + spawner
                           + "spawn('kill -9 -1')\nimport time\ntime.sleep(2)"),
        "fifo": _with(full, probs_answer=correct["probs_answer"] + f"\nimport os\nos.mkfifo('{NAME}.ipynb.x')"),
        "floods": _with(full, double_answer=correct["double_answer"] + "\nfor _ in range(40):\n"
                        "    print('x' * 2**20)"),
        "warns": _with(full, double_answer="import sys, warnings\ndef double(x):\n    warnings.warn('slow')\n"
                       "    print('doubling', file=sys.stderr)\n    return 2 * x"),
        "library": _with(full, probs_answer="def probs(logits):\n    from moe_course.routing import "
                         "router_probabilities\n    return np.asarray(router_probabilities(logits))"),
        "hardcoded": _with(full, probs_answer=f"def probs(logits):\n    known = np.array({known!r})\n"
                           "    return known if logits.shape == known.shape else np.zeros_like(logits)"),
        "object_equal": _with(full, double_answer="class Equal:\n    def __eq__(self, other):\n        return True\n"
                              "def double(x):\n    return np.array([Equal() for _ in x], dtype=object)"),
        "forges_answers": _with(full, probs_answer=wrong_probs, double_answer=correct["double_answer"] + forge),
        "answers_fifo": _with(full, probs_answer=wrong_probs, double_answer=correct["double_answer"]
                              + "\nimport os\nos.remove('/grading/answers/probs_tests.npz')\n"
                              "os.mkfifo('/grading/answers/probs_tests.npz')\n"
                              "os.symlink('/etc/passwd', '/grading/answers/probs_tests.json')"),
        "injects_html": {**full, "cells": full["cells"] + [  # into the feedback page the instructor opens
            {"cell_type": "markdown", "id": "md", "metadata": {},
             "source": "<script>alert('pwned-script')</script><iframe src='http://evil.example/a'></iframe>"},
            {"cell_type": "code", "execution_count": None, "id": "html", "metadata": {}, "outputs": [],
             "source": "from IPython.display import HTML, Javascript, display\n"
                       "display(HTML(\"<img src='http://evil.example/b.png' onerror='alert(1)'>\"))\n"
                       "display(Javascript('alert(2)'))"}]},
        # A root grader's kernel is an unprivileged host uid: no host sysctl written, no capability, and its
        # process limit holds.
        "escapes": _with(full, probs_answer=correct["probs_answer"] + "\n" + ESCAPES),
        # Shared resources: /tmp, /dev/shm and the writable folders are bounded per submission (the scratch
        # folder is a tmpfs of its own, in the worker's user namespace when the grader is not root); the tmpfs
        # under /, /dev and a hidden package are read-only; a folder left at mode 000 is removed all the same.
        "fills_disks": _with(full, probs_answer=correct["probs_answer"] + "\n" + FILLS),
        "fills_root": _with(full, probs_answer=correct["probs_answer"] + "\n" + ROOT_FILL),
        "locks_folder": _with(full, probs_answer=correct["probs_answer"] + "\n" + LOCKED),
        # What the grader's own processes read or receive from a submission stays bounded: its stdin channel,
        # a bzip2 member in a recorded answer, a huge error record, a huge notebook.
        "stdin_flood": _with(full, double_answer=correct["double_answer"] + "\n" + STDIN_FLOOD),
        "bzip2_npz": _with(full, double_answer=correct["double_answer"] + "\nimport base64, os\n"
                           "os.remove('/grading/answers/probs_tests.npz')\n"
                           "open('/grading/answers/probs_tests.npz', 'wb').write(base64.b64decode("
                           f"{base64.b64encode(_bzip2_member_npz(32)).decode()!r}))"),
        "json_record": _with(full, double_answer=correct["double_answer"] + "\n" + JSON_RECORD),
        "control_flood": _with(full, double_answer=correct["double_answer"] + "\n" + CONTROL_FLOOD),
        # A kernel that stops answering is ended at its first missed reply.
        "silent": _with(full, probs_answer=correct["probs_answer"] + "\n" + SILENT_KERNEL),
        # What the kernel writes to its own stdout, or sends as widget messages, never reaches the batch whole.
        "stdout_flood": _with(full, double_answer=correct["double_answer"] + "\nimport os, sys\nwritten = 0\n"
                              "saved = sys.stdout._original_stdstream_copy  # ipykernel's copy of the real fd 1\n"
                              "try:\n    for _ in range(80):\n        written += os.write(saved, b'x' * 2**20)\n"
                              "except OSError as error:\n    print('STDOUT', written, type(error).__name__)"),
        "comm_flood": _with(full, double_answer=correct["double_answer"] + "\nimport comm\n"
                            "channel = comm.create_comm(target_name='flood')\nfor _ in range(40):\n"
                            "    channel.send(data={'x': 'y' * 2**20})"),
        # A recorded answer that inflates to 256 MiB from a few hundred KiB is not read.
        "npz_bomb": _with(full, probs_answer=wrong_probs, double_answer=correct["double_answer"] + "\n" + BOMB),
        # Trees and chains deep enough to exhaust Python's recursion, left for the grader to clean and scan.
        "deep_tree": {**_with(full, probs_answer=correct["probs_answer"] + "\nimport os\nos.makedirs('/'.join("
                                                           "['d'] * 2000), exist_ok=True)"),
                      "cells": _with(full)["cells"] + [{"cell_type": "code", "execution_count": None, "id": "chain",
                                                        "metadata": {}, "outputs": [], "source": "x" + ".a" * 1500}]},
        "deep_json": '{"cells": [], "metadata": {"x": ' + "[" * 100_000 + "]" * 100_000 + '}, "nbformat": 4, '
                     '"nbformat_minor": 5}',
        # The sandbox's checks file draws the inputs and nothing else; a package the checks file hides is absent.
        "reads_checks": _with(full, probs_answer=correct["probs_answer"] + "\nprint('CHECKS-FILE', "
                              "open('/grading/checks.py').read())"),
        "primitive": _with(full, double_answer="def double(x):\n    import jax.numpy as jnp\n"
                           "    return np.asarray(jnp.multiply(x, 2))"),
        LONG_NAME: full,  # 255 bytes, 340 characters once normalised ("viii" each)
        "empty": "",
        "malformed": '{"cells": [ this is not json',
    }
    export = root / "export"
    for student, notebook in submissions.items():
        write(notebook, export / student / f"{NAME}.ipynb")
    # A correct notebook of 128 MiB: a metadata value of 45 million empty lists (as the 200 MB one that once
    # took the batch's flag scan to 4.2 GiB), written in pieces.
    _write_giant(full, export / "giant" / f"{NAME}.ipynb", 45 * 10**6)
    submissions["giant"] = full
    assert main(["course", "collect", str(export), "--assignment", NAME, "--course-dir", str(course)]) == 0
    # The workers' TMPDIR, where their scratch folders go: its own, searchable by a root grader's sandbox uids.
    scratch, tmpdir = Path(tempfile.mkdtemp(prefix="moe-hostile-scratch-")), os.environ.get("TMPDIR")
    scratch.chmod(0o711)
    os.environ["TMPDIR"] = str(scratch)
    measured = _peak_rss_reset()
    held_before = _status_mib("VmRSS")  # what this test process already holds (in a whole suite: torch, ...)
    start = time.perf_counter()
    try:
        code = main(["course", "autograde", NAME, "--course-dir", str(course), "--jobs", "2", "--cell-timeout",
                     str(CELL_TIMEOUT), "--memory-mb", str(MEMORY_MB), "--submission-timeout", "240",
                     "--solutions", str(solutions)])
    finally:
        os.environ.pop("TMPDIR") if tmpdir is None else os.environ.update(TMPDIR=tmpdir)
    seconds = time.perf_counter() - start
    batch_rss = _status_mib("VmHWM") - held_before if measured else None  # what grading the batch added
    assert code == 0
    assert main(["course", "export", "--course-dir", str(course)]) == 0
    with open(course / "grades.csv") as handle:
        grades = {row["student"]: row for row in csv.DictReader(handle)}
    print(f"\n{len(submissions)} submissions (hostile and correct) graded in {seconds:.1f} s wall, 2 jobs")
    yield {"grades": grades, "course": course, "outside": outside, "scratch": scratch, "batch_rss": batch_rss,
           "students": {student_id(name): notebook for name, notebook in submissions.items()}}
    subprocess.run(["rm", "-rf", str(scratch)])


def _score(graded, student) -> float:
    return float(graded["grades"][student]["score"])


def _outputs(graded, student, grade_id) -> str:
    path = graded["course"] / "autograded" / student / NAME / f"{NAME}.ipynb"
    return json.dumps(_cell(json.loads(path.read_text()), grade_id).get("outputs", []))


def test_the_batch_grades_everyone_and_correct_students_are_unaffected(graded):
    assert sorted(graded["grades"]) == sorted(graded["students"])
    for student in ("good", "good2"):
        assert graded["grades"][student]["status"] == "graded"
        assert _score(graded, student) == 3.0 == float(graded["grades"][student]["max_score"])
    assert _score(graded, "blank") == 0.0


def test_a_long_lms_name_is_graded_under_a_bounded_id_and_grades_csv_is_inert(graded):
    row = graded["grades"][student_id(LONG_NAME)]
    assert len(row["student"]) <= MAX_ID and row["status"] == "graded" and _score(graded, row["student"]) == 3.0
    cells = [value for row in graded["grades"].values() for value in row.values()]
    assert not [cell for cell in cells if cell and cell[0] in "=+-@\t\r"], "a cell a spreadsheet would run"


def test_feedback_shows_what_a_student_injected_as_text(graded):
    from moe_course.course.instructor.grade import feedback

    written = feedback(graded["course"], NAME, ["injects_html", "good"])
    assert set(written) == {"injects_html", "good"} and _score(graded, "injects_html") == 3.0
    page = written["injects_html"].read_text()
    assert "pwned-script" in page, "the markdown cell is still there, as text"
    # live markup, not the escaped text of the cells' sources: a script that alerts, a frame, an image from
    # elsewhere, an event handler
    for live in (r"<script[^>]*>[^<]*alert", r"<iframe", r"<img[^>]*evil\.example", r"<[a-z][^<>]*\bonerror\s*="):
        assert not re.search(live, page, re.IGNORECASE), live


def test_an_infinite_loop_times_out_and_scores_zero_on_its_cell(graded):
    assert _score(graded, "loop") == 1.0  # double still counts
    assert "CellTimeoutError" in _outputs(graded, "loop", "probs_tests") or "KeyboardInterrupt" in _outputs(
        graded, "loop", "probs_tests")
    # A loop that swallows the interrupt keeps its kernel busy for good: nbgrader gives up on that submission.
    stubborn = graded["grades"]["stubborn_loop"]
    assert stubborn["status"] == "failed" and "Timeout" in stubborn["error"] and _score(graded, "stubborn_loop") == 0.0


def test_exits_and_crashes_end_only_that_submission(graded):
    assert graded["grades"]["sys_exit"]["status"] == "graded" and _score(graded, "sys_exit") == 3.0
    for student in ("os_exit", "segfault"):
        assert graded["grades"][student]["status"] == "failed" and _score(graded, student) == 0.0
        assert graded["grades"][student]["error"], graded["grades"][student]
        assert float(graded["grades"][student]["max_score"]) == 3.0


def test_a_memory_bomb_raises_memory_error_in_its_cell(graded):
    assert graded["grades"]["memory_bomb"]["status"] == "graded"
    assert _score(graded, "memory_bomb") == 1.0
    assert "MemoryError" in _outputs(graded, "memory_bomb", "probs_tests")


def test_edited_deleted_duplicated_and_retyped_test_cells_are_restored(graded):
    assert _score(graded, "edits_tests") == 1.0  # the restored probs test fails on the wrong answer
    assert _score(graded, "deletes_tests") == 1.0  # the deleted test is put back, and fails
    assert _score(graded, "duplicates_tests") == 3.0 == float(graded["grades"]["duplicates_tests"]["max_score"])


def test_monkeypatching_what_the_tests_use_does_not_pass_them(graded):
    assert _score(graded, "monkeypatch") == 0.0
    assert _score(graded, "code_patch") == 1.0  # its double is right; the probs test sees the real library
    assert "CheckFailed" in _outputs(graded, "code_patch", "probs_tests")
    assert "assigns an attribute" in graded["grades"]["monkeypatch"]["flags"]
    assert "uses .__code__" in graded["grades"]["code_patch"]["flags"]
    # Unregistering the kernel's pre-cell restore, then patching, gains nothing: the grader compares outside.
    assert graded["grades"]["unhooks"]["status"] == "graded" and _score(graded, "unhooks") == 2.0
    assert "uses get_ipython" in graded["grades"]["unhooks"]["flags"]
    assert "assigns an attribute (numpy.array_equal)" in graded["grades"]["unhooks"]["flags"]


def test_hidden_tests_and_other_files_cannot_be_read_or_written(graded):
    assert _score(graded, "reads_secrets") == 3.0
    printed = _outputs(graded, "reads_secrets", "probs_answer")
    assert "SECRET-HIDDEN-TEST-TEXT" not in printed and printed.count("GradingViolation") == 4, printed
    assert _score(graded, "writes_outside") == 3.0
    assert _outputs(graded, "writes_outside", "probs_answer").count("GradingViolation") == 3
    assert not graded["outside"].exists()
    victim = graded["course"] / "submitted" / "good" / NAME / f"{NAME}.ipynb"
    assert "pwned" not in victim.read_text()


def test_empty_and_malformed_notebooks_fail_alone(graded):
    for student in ("empty", "malformed"):
        row = graded["grades"][student]
        assert row["status"] == "failed" and _score(graded, student) == 0.0 and row["error"], row
        assert row["flags"] == "unreadable notebook"


def test_the_sandbox_holds_where_the_guard_does_not_look(graded):
    """Opening relative to a directory fd and starting processes raise no audit event: the sandbox alone keeps
    the hidden tests, the gradebook and other students out of reach, and the processes die with the kernel."""
    assert _score(graded, "dir_fd") == 3.0
    printed = _outputs(graded, "dir_fd", "probs_answer")
    assert "SECRET-HIDDEN-TEST-TEXT" not in printed and printed.count("FileNotFoundError") == 8, printed
    assert "refs/heads" not in printed  # the repository (solutions, .git) is not in the sandbox
    victim = graded["course"] / "submitted" / "good" / NAME / f"{NAME}.ipynb"
    assert "pwned" not in (graded["course"] / "jupyter" / "kernels" / "moe-course-grader" / "kernel.json").read_text()
    assert b"pwned" not in (graded["course"] / "gradebook.db").read_bytes()
    time.sleep(5)  # longer than the spawned writer waits
    assert "pwned" not in victim.read_text()
    record = graded["course"] / "gradebooks" / NAME / "spawns.json"
    assert "pwned" not in record.read_text() and _score(graded, "spawns") == 3.0
    printed = _outputs(graded, "spawns", "probs_answer")
    assert "NETWORK" not in printed and "OSError" in printed
    # Besides the shell it started: its own init (bwrap) and its kernel, no other process on the machine.
    assert re.search(r"processes \['bwrap', 'python[\d.]*'\]", printed), printed


def test_a_fifo_an_output_flood_and_killing_everything_end_only_that_submission(graded):
    killed = graded["grades"]["kills_all"]
    assert killed["status"] == "failed" and _score(graded, "kills_all") == 0.0 and killed["error"]
    assert _score(graded, "fifo") == 3.0 and graded["grades"]["fifo"]["status"] == "graded"
    flood = graded["grades"]["floods"]
    assert flood["status"] == "failed" and "OutputLimitError" in flood["error"] and _score(graded, "floods") == 0.0


def test_a_correct_answer_that_warns_on_stderr_keeps_its_marks(graded):
    assert _score(graded, "warns") == 3.0
    assert "doubling" in _outputs(graded, "warns", "double_tests")  # still shown in the feedback


def test_every_row_says_it_was_graded_in_the_sandbox(graded):
    assert {row["sandbox"] for row in graded["grades"].values()} == {"bwrap"}


def test_grades_are_decided_outside_the_sandbox(graded):
    """The hidden tests only record outputs; the grader draws the inputs from a fresh seed per submission and
    compares with the library outside the sandbox, where the learner's code never runs."""
    assert _score(graded, "library") == 1.0  # the reference is not in the sandbox to be called
    assert "ModuleNotFoundError" in _outputs(graded, "library", "probs_tests")
    assert _score(graded, "hardcoded") == 1.0  # answers for the seed-0 inputs match no submission's inputs
    assert "probs_tests, case 1 of 1: output 1 differs from the reference" in _outputs(graded, "hardcoded",
                                                                                        "probs_tests")
    assert _score(graded, "object_equal") == 2.0  # an object array that equals anything is not numbers
    assert "object array" in _outputs(graded, "object_equal", "double_tests")
    # What once hid a failing test in the kernel -- a post-run hook clearing its error, a thread re-patching the
    # comparisons -- gains nothing; a cell added after the tests that empties the answers loses them.
    for student in ("post_run_hook", "thread_patch"):
        assert _score(graded, student) == 1.0, student
    assert _score(graded, "added_cell") == 0.0 and graded["grades"]["added_cell"]["status"] == "graded"
    assert "cannot be read" in _outputs(graded, "added_cell", "probs_tests")
    for student in ("forges_answers", "answers_fifo"):  # a forged, special or linked answers file: no marks
        assert graded["grades"][student]["status"] == "graded" and _score(graded, student) == 1.0, student
    records = [json.loads(p.read_text()) for p in (graded["course"] / "gradebooks" / NAME).glob("*.json")]
    seeds = [r["seed"] for r in records if r["status"] == "graded"]
    assert len(seeds) > 20 and len(set(seeds)) == len(seeds), seeds  # 2**31 seeds: a repeat is a bug


def test_a_root_graders_kernel_is_an_unprivileged_host_user(graded):
    """No host sysctl written, no capability, the process limit held: bubblewrap's uid 65534 is an
    unprivileged host uid -- one of the --sandbox-uid range when the grader is root -- never host root (whose
    writes to /proc/sys succeed and whom the process limit does not bind)."""
    from moe_course.course.limits.sandbox import MAX_PROCESSES

    assert _score(graded, "escapes") == 3.0
    printed = _outputs(graded, "escapes", "probs_answer")
    assert "SYSCTL-WRITTEN" not in printed and re.search(r"sysctl (PermissionError|OSError)", printed), printed
    assert "CAPS ['0000000000000000']" in printed, printed
    assert "fork BlockingIOError" in printed, printed
    assert 0 < int(re.search(r"PROCESSES (\d+)", printed).group(1)) < MAX_PROCESSES, printed
    record = json.loads((graded["course"] / "gradebooks" / NAME / "escapes.json").read_text())
    assert ("uid" in record["limits"]) == ROOT, record["limits"]  # what held, as the batch reported it


def test_one_submission_cannot_fill_the_disks_of_others(graded):
    printed = _outputs(graded, "fills_disks", "probs_answer")
    tmp, shm, home = map(int, re.search(r"FILLED (\d+) (\d+) (\d+)", printed).groups())  # MiB
    assert 0 < tmp <= 256 and 0 < shm <= 256 and 0 < home <= 512, printed
    for student in ("good", "good2"):
        assert _score(graded, student) == 3.0


def test_what_the_kernel_floods_its_stdout_or_widgets_with_never_reaches_the_batch(graded):
    from moe_course.course.inside.guard import FILE_SIZE_BYTES

    assert _score(graded, "stdout_flood") == 3.0  # its stdout is a file of its own, capped by the file-size limit
    printed = _outputs(graded, "stdout_flood", "double_answer")
    assert 0 < int(re.search(r"STDOUT (\d+) OSError", printed).group(1)) <= FILE_SIZE_BYTES, printed
    widgets = graded["grades"]["comm_flood"]
    assert widgets["status"] == "failed" and "OutputLimitError" in widgets["error"], widgets


def test_a_recorded_answer_that_would_inflate_is_not_read(graded):
    assert graded["grades"]["npz_bomb"]["status"] == "graded" and _score(graded, "npz_bomb") == 1.0
    said = _outputs(graded, "npz_bomb", "probs_tests")  # 255 KiB: more than a (2, 5, 4) output's file can be
    assert "the recorded answers were not read: the file is more than the " in said, said


def test_deep_trees_chains_and_documents_cost_only_their_own_row(graded):
    assert graded["grades"]["deep_tree"]["status"] == "graded" and _score(graded, "deep_tree") == 3.0
    deep = graded["grades"]["deep_json"]
    assert deep["status"] == "failed" and deep["error"] and _score(graded, "deep_json") == 0.0, deep


def test_the_sandbox_holds_no_reference_and_not_the_primitive_it_hides(graded):
    """The checks file in the sandbox has the inputs but no reference (nor the library call it makes), and a
    package the assignment hides (SANDBOX_WITHOUT) cannot be imported: an answer that calls it scores 0."""
    assert _score(graded, "reads_checks") == 3.0
    printed = _outputs(graded, "reads_checks", "probs_answer")
    assert "CHECKS-FILE" in printed and "rng.normal" in printed, printed
    assert "_probs" not in printed and "router_probabilities" not in printed, printed
    assert graded["grades"]["primitive"]["status"] == "graded" and _score(graded, "primitive") == 2.0
    assert "ImportError" in _outputs(graded, "primitive", "double_tests")


def test_the_graders_own_processes_stay_under_1_gib(graded):
    """Each worker (its peak resident memory, recorded with its row) and the batch (the peak resident memory it
    added to this process while it graded and flag-scanned everyone; ``moe-course course autograde`` is a process
    of its own) stay under 1 GiB, whatever a submission sent or wrote: they are outside its cgroup."""
    records = [json.loads(p.read_text()) for p in (graded["course"] / "gradebooks" / NAME).glob("*.json")]
    measured = {r["student"]: r["worker_max_rss_mib"] for r in records if "worker_max_rss_mib" in r}
    assert len(measured) == len(graded["students"]), sorted(set(graded["students"]) - set(measured))
    assert max(measured.values()) < 1024, sorted(measured.items(), key=lambda item: -item[1])[:3]
    if graded["batch_rss"] is not None:
        assert graded["batch_rss"] < 1024, graded["batch_rss"]


def test_a_flood_on_the_kernels_stdin_channel_reaches_nothing(graded):
    assert graded["grades"]["stdin_flood"]["status"] == "graded" and _score(graded, "stdin_flood") == 3.0
    assert "STDIN 40" in _outputs(graded, "stdin_flood", "double_answer")


def test_a_flood_on_the_control_channel_is_not_held_by_the_worker(graded):
    assert graded["grades"]["control_flood"]["status"] == "graded" and _score(graded, "control_flood") == 3.0
    assert "CONTROL armed" in _outputs(graded, "control_flood", "double_answer")
    record = json.loads((graded["course"] / "gradebooks" / NAME / "control_flood.json").read_text())
    assert record["worker_max_rss_mib"] < 700, record


def test_a_kernel_that_stops_answering_is_ended_at_its_first_missed_reply(graded):
    silent = graded["grades"]["silent"]
    assert silent["status"] == "failed" and _score(graded, "silent") == 0.0, silent
    assert (f"ReplyTimeoutError: the kernel sent no reply within 10 s of interrupting a cell at its {CELL_TIMEOUT} s "
            "timeout") in silent["error"], silent


def test_a_bzip2_member_or_a_huge_error_record_is_not_read(graded):
    assert graded["grades"]["bzip2_npz"]["status"] == "graded" and _score(graded, "bzip2_npz") == 1.0
    said = _outputs(graded, "bzip2_npz", "probs_tests")
    assert "c0_0 compressed with zip method 12; only stored or deflate members are read" in said, said
    assert graded["grades"]["json_record"]["status"] == "graded" and _score(graded, "json_record") == 1.0
    assert re.search(r"RECORD \d{8}", _outputs(graded, "json_record", "double_answer"))
    said = _outputs(graded, "json_record", "probs_tests")
    assert "probs_tests: no answers were recorded" in said, said


def test_a_giant_notebook_costs_only_its_own_row(graded):
    from moe_course.course.limits.bounded import MAX_NOTEBOOK_BYTES
    from moe_course.course.instructor.grade import GRADES_FIELDS

    giant = graded["grades"]["giant"]
    assert giant["status"] == "failed" and _score(graded, "giant") == 0.0, giant
    assert f"larger than the limit of {MAX_NOTEBOOK_BYTES} bytes (8 MiB, --max-notebook-mb)" in giant["error"], giant
    assert giant["flags"].startswith("not scanned: ") and "larger than the limit" in giant["flags"], giant
    assert giant["sandbox"] == "bwrap" and giant["max_score"] == "3.0", giant
    for student, row in graded["grades"].items():  # every row whole: the batch finished with every column
        assert set(row) == set(GRADES_FIELDS) and row["status"] in ("graded", "failed") and row["sandbox"], row


def test_the_tmpfs_under_root_dev_and_a_hidden_package_cannot_be_filled(graded):
    assert _score(graded, "fills_root") == 3.0
    printed = _outputs(graded, "fills_root", "probs_answer")
    filled = re.findall(r"ROOTFILL (\S+) (\d+) ([^\\\"]+)", printed)
    assert len(filled) == 3 and {f[0] for f in filled} >= {"/", "/dev/"}, printed
    assert all(written == "0" and why == "Read-only file system" for _, written, why in filled), filled


def test_a_folder_left_at_mode_000_is_removed_with_the_scratch(graded):
    assert _score(graded, "locks_folder") == 3.0
    assert "LOCKED 0o0" in _outputs(graded, "locks_folder", "probs_answer")
    assert not list(graded["scratch"].iterdir()), list(graded["scratch"].iterdir())  # every worker's scratch gone


# Rows of their own (no batch): what only a root grader's cgroups hold. A plain grader gets none: its
# submissions are capped per process (the batch says so, test_course_limits), so these rows skip there.
FAIR_SHARE_FLOOR = 0.5  # per the docstring below; benchmarks/grading.py --cpu-attack prints the same measure


@pytest.mark.skipif(not ROOT, reason="a plain grader has no cgroup per submission: CPU is shared per process")
def test_200_busy_shells_of_one_submission_leave_another_at_least_half_its_fair_cpu_share():
    """A victim's fixed CPU work (3 million loop steps in Python) in its submission's cgroup beside another
    submission's cgroup holding 200 busy shells, 3 rounds (benchmarks/grading.py ``cpu_attack``): over the loop,
    the victim's CPU seconds against what equal weight per submission owes it -- half of what the two used
    together, or its wall time where less (``VictimRun.fair_share``) -- stay above FAIR_SHARE_FLOOR in the median.
    With equal CPU weight per submission the measure is about 1 at any ambient load (other tests' processes take
    from both alike; a wall-time ratio against a run alone moves with that load: 2.08 at load 19.5 in CI); were
    the 201 processes weighted one by one it would be about 0.01. Costs 6 victim runs (under a second each on an
    idle core) and 3 x 3 s of spinning shells."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from grading import BUSY_SHELLS, NO_CGROUPS, cpu_attack, median

    try:
        alone, beside = cpu_attack(3)
    except OSError as error:
        if str(error) == NO_CGROUPS:
            pytest.skip(NO_CGROUPS)
        raise
    shares = [run.fair_share for run in beside]
    print(f"\nvictim beside {BUSY_SHELLS} busy shells: {beside}; fair shares {shares}; alone {alone} "
          f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    assert all(run.attacker_cpu > 0 for run in beside), beside  # the shells were seen spinning
    assert median(shares) >= FAIR_SHARE_FLOOR, beside


@pytest.mark.skipif(not ROOT, reason="making a cgroup needs a root grader (test_course_limits mocks one for all)")
def test_an_unlimited_cgroup_under_a_limited_parent_is_refused_at_the_jobs_check():
    """A grader process in a real cgroup without a memory limit, below a parent limited to 4 GiB (a systemd
    slice, a container): the jobs x memory check of ``autograde --jobs 3 --memory-mb 6144`` (``budget.fits``, which
    the command runs before grading; test_course_limits runs the command) refuses in one line naming the sum's
    terms and the parent's limit."""
    from moe_course.course.limits import budget

    parent = budget.Cgroup.create(f"moe-hostile-slice-{os.getpid()}", memory_bytes=4 * 2**30, processes=256)
    if parent is None:
        pytest.skip("this host lets no process create cgroups")
    try:
        for folder in parent.folders:
            (folder / "grader").mkdir()  # no limit of its own
        grader = [folder / "grader" for folder in parent.folders]
        # the grader joins the cgroup first thing (no preexec_fn: this test process runs JAX's threads)
        script = (f"from pathlib import PosixPath\nfrom moe_course.course.limits import budget\n"
                  f"budget.Cgroup({grader!r}).join()\nbudget.fits(3, 6144 * 2**20)")
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        parent.remove()
    limited = next(folder for folder in parent.folders if "memory" in str(folder))
    said = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and said.startswith("ValueError: "), done.stderr
    # the parent, or (cgroup v1) the grader's own, whose hierarchical_memory_limit is the parent's
    assert re.fullmatch(re.escape("ValueError: --jobs 3 x (6144 MiB --memory-mb + 1024 MiB of tmpfs + 1024 MiB for "
                                  "the grading worker per submission) = 24576 MiB is more than the memory limit of "
                                  f"cgroup {limited}") + "(/grader)?" + re.escape(": 4096 MiB: not one submission "
                                                                                  "fits"), said), said
