"""The grader's own limits, without a batch: the checks the sandbox gets (no references), the uids a root grader
drops to, the cgroup of one submission, widget messages in the output cap, and failures that stay in one row.
The hostile batch (tests/test_course_hostile.py) checks the same through the real commands."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from course_submissions import SILENT_KERNEL
from moe_course.course.instructor import build, grade
from moe_course.course.limits import inputs
from moe_course.course.inside.answers import load_checks
from moe_course.course.limits.config import SOLUTIONS

CHECKS = sorted((SOLUTIONS / "checks").glob("*.py"))


@pytest.mark.parametrize("checks", CHECKS, ids=[c.stem for c in CHECKS])
def test_the_sandbox_gets_each_checks_file_without_its_references(checks, tmp_path):
    stripped = inputs.inputs_only(checks.read_text(), checks)
    for grade_id, check in load_checks(checks).items():
        if check.reference.__name__ != "<lambda>":
            assert f"def {check.reference.__name__}(" not in stripped, (grade_id, check.reference.__name__)
    imported = {node.module for node in ast.walk(ast.parse(stripped)) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(ast.parse(stripped)) if isinstance(node, ast.Import)
                 for alias in node.names}
    # nothing of the course library (nor flax, its modules); jax only to compile a learner's function (02's call)
    # or to run it on a mesh of CPU devices (07's)
    assert imported <= {"numpy", "jax", "moe_course.course.inside.answers"}, imported
    build.check_inputs_only(checks)  # it loads, and draws the inputs the whole file draws
    (tmp_path / "inputs.py").write_text(stripped)
    assert all(check.reference is None for check in load_checks(tmp_path / "inputs.py").values())


def test_a_checks_file_can_hide_a_package_from_the_sandbox(tmp_path):
    hiding = tmp_path / "hiding.py"
    hiding.write_text('SANDBOX_WITHOUT = ("jax", "jaxlib")\nCHECKS = {}\n')
    assert inputs.hidden_packages(hiding) == ("jax", "jaxlib")
    assert inputs.hidden_packages(SOLUTIONS / "checks" / "07_scale.py") == ()  # its exchanges run on 4 CPU devices
    assert inputs.hidden_packages(SOLUTIONS / "checks" / "01_vit.py") == ()
    bad = tmp_path / "bad.py"
    bad.write_text("SANDBOX_WITHOUT = 'jax'\nCHECKS = {}\n")
    with pytest.raises(ValueError, match="bad.py: SANDBOX_WITHOUT must be a tuple of package names"):
        inputs.hidden_packages(bad)


def test_a_root_grader_drops_to_uids_that_belong_to_nobody():
    assert grade.sandbox_uids(60000, 3) == [60000, 60001, 60002]
    with pytest.raises(ValueError, match="sandbox_uid=0 is not allowed; use a host uid from 1000"):
        grade.sandbox_uids(0, 2)
    with pytest.raises(ValueError, match=r"host uid 65534 is the user 'nobody'.*--sandbox-uid"):
        grade.sandbox_uids(65533, 2)


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a cgroup needs a root grader")
def test_a_submissions_cgroup_caps_its_processes_together_and_is_removed():
    from moe_course.course.limits.budget import Cgroup

    group = Cgroup.create(f"moe-grade-test-{os.getpid()}", memory_bytes=256 * 2**20, processes=8)
    if group is None:
        pytest.skip("this host lets no process create cgroups")
    try:
        # 20 children of one process inside the cgroup: the limit of 8 is for all of them together
        script = ("import os, time\nstarted = 0\ntry:\n    for _ in range(20):\n        if os.fork() == 0:\n"
                  "            time.sleep(2)\n            os._exit(0)\n        started += 1\nexcept OSError:\n    pass\n"
                  "print(started)")
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                              preexec_fn=group.join)
        assert 0 < int(done.stdout) < 8, done
    finally:
        group.remove()
    assert not any(folder.exists() for folder in group.folders)


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a cgroup needs a root grader")
def test_a_root_workers_cgroup_holds_it_beside_its_kernel_and_the_batch_removes_it(tmp_path):
    """``budget.worker_cgroup`` moves the worker into ``moe-grade-<pid>/worker`` (WORKER_BYTES), its kernel's
    cgroup is made beside it, the whole submission has one CPU weight and a memory limit of the two together,
    and what a killed worker left is removed by the batch (``remove_leftovers``), children first."""
    from moe_course.course.limits import budget

    script = ("import sys, time\nfrom moe_course.course.limits import budget\ngroup = budget.worker_cgroup(2**30)\n"
              "if group is None:\n    print('none', flush=True)\n    sys.exit()\n"
              "group.child('kernel', memory_bytes=2**29, processes=8)\n"
              "print(open('/proc/self/cgroup').read().replace(chr(10), ' '), flush=True)\ntime.sleep(60)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        said = worker.stdout.readline()
        if said.strip() == "none":
            pytest.skip("this host lets no process create cgroups")
        assert f"/moe-grade-{worker.pid}/worker" in said, said
        tops = [parent / f"moe-grade-{worker.pid}" for parent in budget._cgroup_parents()]
        tops = [top for top in tops if top.exists()]
        memory = [top for top in tops if (top / "memory.max").exists() or (top / "memory.limit_in_bytes").exists()]
        for top in memory:
            name = "memory.max" if (top / "memory.max").exists() else "memory.limit_in_bytes"
            held = {part: int((top / part / name).read_text()) for part in (".", "worker", "kernel")}
            assert held == {".": 2**30 + budget.WORKER_BYTES, "worker": budget.WORKER_BYTES, "kernel": 2**29}, held
        weights = [(top / name).read_text().strip() for top in tops for name in ("cpu.weight", "cpu.shares")
                   if (top / name).exists()]
        assert memory and weights and set(weights) <= {str(budget.CPU_WEIGHT), "1024"}, (tops, weights)
    finally:
        worker.kill()
        worker.wait()
    removed = budget.remove_leftovers(tmp_path, pids=[worker.pid])
    assert set(tops) <= set(removed) and not any(top.exists() for top in tops), removed


def test_cgroup_v2_delegates_the_cpu_controller_with_memory_and_pids(tmp_path, monkeypatch):
    """Without +cpu in the parent's subtree_control a v2 cgroup has no cpu.weight, and 200 busy processes of one
    submission compete one by one with everyone's (issue 55: 6.5-7.5x slower victims)."""
    from moe_course.course.limits import budget

    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("\n")
    written = []
    monkeypatch.setattr(budget, "_write", lambda path, value: written.append((path.name, value)))
    budget._delegate(tmp_path)
    assert written == [("cgroup.subtree_control", "+memory +pids"), ("cgroup.subtree_control", "+cpu")]
    written.clear()
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory pids\n")
    budget._delegate(tmp_path)
    assert written == []


def test_a_plain_grader_gets_a_systemd_user_scope_where_its_manager_has_memory_delegated(monkeypatch, tmp_path):
    """The probe both ways (this container has no systemd user manager: systemd-run's answer is mocked): a scope
    that reads its own MemoryMax in memory.max is used -- the batch names it, and each worker starts under
    ``systemd-run --user --scope -p MemoryMax=<submission_bytes>`` -- anything else is not."""
    from moe_course.course.limits import budget
    from moe_course.course.limits.config import Limits

    answer, seen = {}, []

    def systemd_run(command, **kwargs):
        seen.append(command)
        return subprocess.CompletedProcess(command, answer["code"], stdout=answer["out"], stderr="")

    monkeypatch.setattr(budget, "subprocess", SimpleNamespace(run=systemd_run, TimeoutExpired=TimeoutError))
    monkeypatch.setattr(budget.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(budget.os, "geteuid", lambda: 1000)
    answer.update(code=0, out=f"{budget.PROBE_BYTES}\n")
    assert budget.can_use_user_scope()
    assert seen[-1][:4] == ["systemd-run", "--user", "--scope", "--quiet"], seen
    assert f"MemoryMax={budget.PROBE_BYTES}" in seen[-1] and "MemorySwapMax=0" in seen[-1], seen
    for code, out in ((0, "max\n"), (1, "")):  # memory not delegated (the scope is unlimited); no user manager
        answer.update(code=code, out=out)
        assert not budget.can_use_user_scope()
    monkeypatch.setattr(budget.shutil, "which", lambda name: None)
    assert not budget.can_use_user_scope()
    monkeypatch.undo()

    limits = Limits(memory_bytes=2048 * 2**20)
    bytes_ = budget.submission_bytes(limits.memory_bytes)
    for delegated in (True, False):
        monkeypatch.setattr(budget, "can_use_user_scope", lambda: delegated)
        held = grade.sandbox_limits(None, bytes_).get("cgroup", "")
        assert ("systemd user scope: memory 4096 MiB per submission" in held) == delegated, held
    started = []

    def popen(command, **kwargs):
        started.append(command)
        raise OSError("not started here")

    monkeypatch.setattr(grade.subprocess, "Popen", popen)
    record = grade._run_worker(tmp_path, "01_vit", "ann", limits, None, scope_bytes=bytes_)
    assert record["status"] == "failed" and started[0][:len(budget.user_scope(bytes_))] == budget.user_scope(bytes_)
    assert f"MemoryMax={4096 * 2**20}" in started[0] and "moe_course.course.limits.worker" in started[0], started


def test_widget_messages_count_toward_the_output_cap():
    pytest.importorskip("nbgrader", reason="nbgrader is not installed: pip install -e '.[instructor]'")
    from moe_course.course.limits.output_cap import CappedExecute, OutputLimitError

    executor = CappedExecute(output_bytes=1000)
    executor._sent = 0
    with pytest.raises(OutputLimitError, match="passed the limit of 1000 bytes"):
        executor.process_message({"msg_type": "comm_msg", "content": {"data": {"x": "y" * 2000}}}, None, 0)


def test_a_kernel_that_stops_answering_is_ended_at_its_first_missed_reply(tmp_path):
    """Six cells of a 3 s timeout: grading stops after the first (3 s + 2 s to answer), not after all six
    (nbgrader's own executor waits 6 x 3 s)."""
    pytest.importorskip("nbgrader", reason="nbgrader is not installed: pip install -e '.[instructor]'")
    import time

    import nbformat

    from moe_course.course.limits.output_cap import CappedExecute, ReplyTimeoutError

    cells = [nbformat.v4.new_code_cell(SILENT_KERNEL)] + [nbformat.v4.new_code_cell("1 + 1") for _ in range(5)]
    executor = CappedExecute(timeout=3, answer_seconds=2, kernel_name="python3")
    start = time.perf_counter()
    with pytest.raises(ReplyTimeoutError, match="no reply within 2 s of interrupting a cell at its 3 s timeout"):
        executor.preprocess(nbformat.v4.new_notebook(cells=cells), {"metadata": {"path": str(tmp_path)}})
    assert time.perf_counter() - start < 15  # kernel start-up included; all six timeouts would be 18 s


# From the kernel's control thread, at shutdown: 20 messages of 16 MiB to the socket that asked (the kernel
# manager's control socket, which never reads).
CONTROL_FLOOD = """import sys
import nbformat
from moe_course.course.limits.output_cap import CappedExecute
FLOOD = '''k = get_ipython().kernel
def flood(stream, ident, parent):
    buffer = b"x" * (16 * 2**20)
    for _ in range(20):
        k.session.send(stream, "debug_reply", {}, parent=parent, ident=ident, buffers=[buffer])
k.control_handlers["shutdown_request"] = flood'''
def peak():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) / 1024
before = peak()
CappedExecute(timeout=20, kernel_name="python3").preprocess(nbformat.v4.new_notebook(cells=[
    nbformat.v4.new_code_cell(FLOOD)]), {"metadata": {"path": sys.argv[1]}})
print(round(peak() - before))
"""


def test_a_control_channel_flood_is_not_held_by_the_grading_process(tmp_path):
    """The grading process's peak memory grows by less than 64 MiB while the kernel sends 320 MiB to its control
    socket (it grew by 320 MiB with jupyter_client's own manager)."""
    pytest.importorskip("nbgrader", reason="nbgrader is not installed: pip install -e '.[instructor]'")
    done = subprocess.run([sys.executable, "-c", CONTROL_FLOOD, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(SOLUTIONS.parent)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) < 64, done.stdout


def test_a_file_that_is_not_regular_is_not_read_and_its_descriptor_is_closed(tmp_path):
    from moe_course.course.limits.bounded import read_regular

    (tmp_path / "probs_tests.npz").mkdir()  # a folder named as a recorded answer
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_bytes(b"x" * 10)
    (tmp_path / "link").symlink_to(tmp_path / "file")
    before = len(os.listdir("/proc/self/fd"))
    for name in ("probs_tests.npz", "fifo", "link", "missing"):
        assert read_regular(tmp_path / name, 100) is None, name
    assert read_regular(tmp_path / "file", 100) == b"x" * 10
    assert read_regular(tmp_path / "file", 4) == b"x" * 5  # one byte past the limit: over it
    assert len(os.listdir("/proc/self/fd")) == before


def test_the_error_column_shows_the_exceptions_message_not_its_raise_line():
    from moe_course.course.limits.worker import summarise_error

    log = ("Traceback (most recent call last):\n"
           '  File ".../moe_course/course/limits/output_cap.py", line 58, in process_message\n'
           "    raise OutputLimitError(f\"the notebook's output passed the limit of {self.output_bytes} bytes \"\n"
           "moe_course.course.limits.output_cap.OutputLimitError: the notebook's output passed the limit of "
           "1048576 bytes (--max-output-mb); grading stopped at cell 4\n")
    assert summarise_error(log) == ("moe_course.course.limits.output_cap.OutputLimitError: the notebook's output "
                                    "passed the limit of 1048576 bytes (--max-output-mb); grading stopped at cell 4")


def test_any_failure_while_grading_one_submission_is_that_students_row(tmp_path, monkeypatch):
    from moe_course.course.limits import worker

    def deep(*args):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(worker, "grade_submission", deep)
    monkeypatch.setattr(worker, "course_paths", lambda course: {"gradebooks": tmp_path})
    assert worker.main([str(tmp_path), "01_vit", "ann", "60", str(2**30), "60", str(2**20), str(2**20)]) == 1
    record = json.loads((tmp_path / "01_vit" / "ann.json").read_text())
    assert record["status"] == "failed" and record["error"].startswith("grading failed: RecursionError"), record


def test_what_a_killed_worker_left_is_removed_and_a_running_workers_is_kept(tmp_path):
    from moe_course.course.limits import budget

    ended = subprocess.Popen(["true"])
    ended.wait()
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "moe_course.course.limits.worker"])
    try:
        lost, kept = tmp_path / f"moe-grade-{ended.pid}-x1", tmp_path / f"moe-grade-{running.pid}-x2"
        (lost / "answers").mkdir(parents=True)
        kept.mkdir()
        group = budget.Cgroup.create(f"moe-grade-{ended.pid}", memory_bytes=2**28, processes=8)
        removed = budget.remove_leftovers(tmp_path)
        assert not lost.exists() and kept.exists() and lost in removed
        if group is not None:  # where this host lets a process create cgroups (root)
            assert set(group.folders) <= set(removed) and not any(f.exists() for f in group.folders), removed
        assert budget.remove_leftovers(tmp_path, pids=[running.pid]) == [kept] and not kept.exists()
    finally:
        running.kill()
        running.wait()


def test_a_tree_deeper_than_python_recurses_is_removed(tmp_path):
    from moe_course.course.limits.budget import remove_tree

    deep = tmp_path / "scratch"
    subprocess.run(["mkdir", "-p", str(deep / "/".join(["d"] * 1500))], check=True)  # os.makedirs recurses
    remove_tree(deep)
    assert not deep.exists()


def test_a_folder_left_at_mode_000_is_removed_by_a_grader_that_is_not_root(tmp_path):
    """What a plain-user grader meets (root reads any folder): run as uid 65534 when the test runs as root."""
    import tempfile

    plain = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    base = Path(tempfile.mkdtemp(prefix="moe-grade-locked-", dir="/tmp"))
    if plain:
        os.chown(base, 65534, 65534)
    script = ("import os, sys\nsys.path.insert(0, sys.argv[2])\n"
              "from moe_course.course.limits.budget import remove_tree\n"
              "scratch = sys.argv[1] + '/scratch'\nos.makedirs(scratch + '/locked/inner')\n"
              "open(scratch + '/locked/inner/data', 'wb').write(bytes(2**20))\n"
              "os.chmod(scratch + '/locked/inner', 0)\nos.chmod(scratch + '/locked', 0)\n"
              "os.system(f'rm -rf {scratch} 2>/dev/null'); print('rm alone leaves it:', os.path.exists(scratch))\n"
              "remove_tree(__import__('pathlib').Path(scratch)); print('removed:', not os.path.exists(scratch))")
    try:
        done = subprocess.run([*plain, sys.executable, "-c", script, str(base), str(SOLUTIONS.parent)],
                              capture_output=True, text=True, timeout=60)
        assert done.stdout.split("\n")[:2] == ["rm alone leaves it: True", "removed: True"], done
    finally:
        subprocess.run(["rm", "-rf", str(base)])


def test_grading_refuses_to_start_when_jobs_submissions_do_not_fit_in_memory(tmp_path, capsys):
    from moe_course.cli import main
    from moe_course.course.limits import budget

    each = budget.submission_bytes(6144 * 2**20)
    # the kernel's memory, its scratch tmpfs, /tmp and /dev/shm, and the grading worker's cgroup
    assert each == (6144 + 512 + 512 + 1024) * 2**20
    budget.fits(3, 6144 * 2**20, machine_bytes=3 * each)
    with pytest.raises(ValueError, match=r"^--jobs 4 x \(6144 MiB --memory-mb \+ 1024 MiB of tmpfs \+ 1024 MiB for the "
                                         r"grading worker per submission\) = 32768 MiB is more than this machine's "
                                         r"24576 MiB: lower --jobs to 3 or --memory-mb to 4096$"):
        budget.fits(4, 6144 * 2**20, machine_bytes=3 * each)
    pytest.importorskip("nbgrader", reason="the command line needs nbgrader: pip install -e '.[instructor]'")
    jobs = budget.machine_memory_bytes() // each + 1  # one more than this machine holds
    assert main(["course", "autograde", "01_vit", "--course-dir", str(tmp_path), "--jobs", str(jobs)]) == 2
    said = capsys.readouterr().err.strip()
    assert said.startswith(f"moe-course course: error: --jobs {jobs} x (6144 MiB") and "\n" not in said, said


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_the_jobs_check_reads_the_memory_limit_of_every_ancestor_cgroup(version, tmp_path, monkeypatch):
    """An unlimited cgroup below a parent limited to 4 GiB (a systemd slice, a container): 3 x (6144 + 1024 +
    1024) MiB is refused, naming the parent; the machine's MemTotal and MemAvailable are bounds too."""
    from moe_course.course.limits import budget

    mount, unlimited = tmp_path / "cgroup", "max" if version == "v2" else str(2**63 - 4096)
    own = mount / "grading.slice" / "grader"
    own.mkdir(parents=True)
    name = "memory.max" if version == "v2" else "memory.limit_in_bytes"
    (own / name).write_text(unlimited + "\n")
    (own.parent / name).write_text(f"{4 * 2**30}\n")
    if version == "v1":  # what the kernel reports for the ancestors a container hides from it
        (own / "memory.stat").write_text(f"cache 0\nhierarchical_memory_limit {6 * 2**30}\n")
    monkeypatch.setattr(budget, "_mounts", lambda: [(str(mount), "cgroup2", ["rw"]) if version == "v2"
                                                    else (str(mount), "cgroup", ["rw", "memory"])])
    monkeypatch.setattr(budget, "_own_paths", lambda: {"" if version == "v2" else "memory": "/grading.slice/grader"})
    limits = budget.memory_limits()
    assert limits[f"cgroup {own.parent}"] == 4 * 2**30 and {"MemTotal", "MemAvailable"} <= set(limits), limits
    assert limits.get(f"cgroup {own}") == (None if version == "v2" else 6 * 2**30), limits  # v2 "max": no limit
    assert budget.machine_memory_bytes() == 4 * 2**30
    said = (rf"^--jobs 3 x \(6144 MiB --memory-mb \+ 1024 MiB of tmpfs \+ 1024 MiB for the grading worker per "
            rf"submission\) = 24576 MiB is more than the memory limit of cgroup {own.parent}: 4096 MiB: not one "
            rf"submission fits$")
    with pytest.raises(ValueError, match=said):
        budget.fits(3, 6144 * 2**20)
    with pytest.raises(ValueError, match=r"= 9216 MiB is more .*: lower --jobs to 1$"):  # no --memory-mb fits 3
        budget.fits(3, 1024 * 2**20)


def test_recorded_answers_are_read_only_within_bounds(tmp_path):
    """A bzip2 or LZMA member is refused unread (its decoder inflates whole blocks); an error record is
    size-capped before it is parsed. Peak memory measured with tracemalloc."""
    import io
    import tracemalloc
    import zipfile

    import numpy as np

    from moe_course.course.limits import verdict

    wants = [(np.zeros(5),)]
    array = io.BytesIO()
    np.save(array, np.zeros(5))
    for method, number in ((zipfile.ZIP_BZIP2, 12), (zipfile.ZIP_LZMA, 14)):
        with zipfile.ZipFile(tmp_path / "double_tests.npz", "w", method) as archive:
            archive.writestr("c0_0.npy", array.getvalue())
        said = verdict.read_outputs(tmp_path, "double_tests", wants)
        assert said == (f"double_tests: the recorded answers were not read: the file holds c0_0 compressed with zip "
                        f"method {number}; only stored or deflate members are read (numpy.savez writes stored)")
    with zipfile.ZipFile(tmp_path / "double_tests.npz", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("c0_0.npy", array.getvalue())
    assert np.array_equal(verdict.read_outputs(tmp_path, "double_tests", wants)[0][0], np.zeros(5))
    (tmp_path / "double_tests.npz").unlink()
    (tmp_path / "double_tests.json").write_text('{"error": [' + "[]," * 2**20 + "[]]}")
    tracemalloc.start()
    said = verdict.read_outputs(tmp_path, "double_tests", wants)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert said.startswith("double_tests: no answers were recorded") and peak < 2**16, (said, peak)
    (tmp_path / "double_tests.json").write_text('{"error": "ValueError: no"}')
    assert verdict.read_outputs(tmp_path, "double_tests", wants) == "double_tests: your function raised ValueError: no"


def test_the_submission_folder_copied_into_the_sandbox_is_bounded(tmp_path, monkeypatch):
    from moe_course.course.limits import sandbox

    monkeypatch.setattr(sandbox, "MAX_COPY_DEPTH", 3)
    home = tmp_path / "home"
    os.makedirs(home / "a" / "b" / "c" / "d" / "e")
    (home / "notebook.ipynb").write_text("{}")
    (home / "a" / "b" / "c" / "d" / "deep.txt").write_text("x")
    copy = sandbox.private_copy(home, tmp_path / "copy")
    assert (copy / "notebook.ipynb").read_text() == "{}" and (copy / "a" / "b" / "c").is_dir()
    assert not (copy / "a" / "b" / "c" / "d").exists()
    assert sorted(p.name for p in Path(copy).iterdir()) == ["a", "notebook.ipynb"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop is a root grader's")
def test_a_root_grader_where_mounts_are_withheld_still_grades_in_the_sandbox(tmp_path, monkeypatch):
    """As in a container without CAP_SYS_ADMIN: no scratch tmpfs, and the kernel's uid still reaches its folders."""
    pytest.importorskip("nbgrader", reason="nbgrader is not installed: pip install -e '.[instructor]'")
    from moe_course.cli import main
    from moe_course.course.limits import budget, sandbox

    if sandbox.unavailable(grade.SANDBOX_UID):
        pytest.skip(sandbox.unavailable(grade.SANDBOX_UID))
    sys.path.insert(0, str(SOLUTIONS.parent / "benchmarks"))
    from grading import grade_batch

    course = tmp_path / "course"
    assert main(["course", "release", "02_moe_layer", "--course-dir", str(course), "--exercises",
                 str(tmp_path / "exercises")]) == 0
    monkeypatch.setattr(budget, "can_mount_scratch", lambda: False)
    grade_batch(course, "02_moe_layer", 1, 1, True)  # asserts full marks
    record = json.loads(next((course / "gradebooks" / "02_moe_layer").glob("*.json")).read_text())
    assert "uid" in record["limits"] and "scratch" not in record["limits"], record["limits"]
