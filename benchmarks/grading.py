"""Grading time per submission, in the bubblewrap sandbox and without it, side by side in one run.

Releases one assignment into a temporary course, hands in ``--students`` copies of its full solution and
autogrades them through the real commands (``moe-course course autograde``), once in the sandbox and once
with ``--no-sandbox``; prints wall seconds per submission, the sandbox's cost as a ratio, and what a class
of 200 would take at the same ``--jobs`` on this machine. Every submission must score full marks.

    python benchmarks/grading.py --assignment 02_moe_layer --students 8 --jobs 2

``--cpu-attack`` (a root grader's cgroups) measures instead what one submission's 200 busy shells cost another:
a victim's fixed CPU work timed alone and beside them, each in a submission cgroup of its own as a root batch's
worker makes one (``budget.worker_cgroup``: equal CPU weight), in ``--rounds`` turns; beside them, the CPU
seconds the victim got over the share equal weight owes it (``VictimRun.fair_share``), which ambient load leaves
alone where the wall-time ratio moves with it:

    python benchmarks/grading.py --cpu-attack --rounds 7

``--each`` grades one full solution of every assignment in the sandbox (``--jobs 1``), the autograde command in a
cgroup of its own where this process may make one (root), and prints its wall seconds and peak memory (the
cgroup's: the worker, the kernel and the references together):

    python benchmarks/grading.py --each
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from moe_course.cli import main


def solution_notebook(course: Path, name: str) -> dict:
    """The released notebook of ``name`` with every answer cell taken from its source (the full solution)."""
    source = json.loads((course / "source" / name / f"{name}.ipynb").read_text())
    answers = {c["metadata"]["nbgrader"]["grade_id"]: c["source"] for c in source["cells"]
               if c["metadata"].get("nbgrader", {}).get("solution")}
    released = json.loads((course / "release" / name / f"{name}.ipynb").read_text())
    for cell in released["cells"]:
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell["source"] = answers[grade_id]
    return released


def grade_batch(course: Path, name: str, students: int, jobs: int, sandbox: bool) -> float:
    """Collect ``students`` full solutions, autograde them; returns the wall seconds of autograde."""
    export = course.parent / f"export-{'bwrap' if sandbox else 'none'}"
    notebook = json.dumps(solution_notebook(course, name))
    prefix = "sandboxed" if sandbox else "unsandboxed"
    for index in range(students):
        (export / f"{prefix}{index:03d}").mkdir(parents=True)
        (export / f"{prefix}{index:03d}" / f"{name}.ipynb").write_text(notebook)
    assert main(["course", "collect", str(export), "--assignment", name, "--course-dir", str(course)]) == 0
    start = time.perf_counter()
    argv = ["course", "autograde", name, "--course-dir", str(course), "--jobs", str(jobs)]
    assert main(argv + ([] if sandbox else ["--no-sandbox"])) == 0
    seconds = time.perf_counter() - start
    assert main(["course", "export", "--course-dir", str(course)]) == 0
    with open(course / "grades.csv") as handle:
        rows = [r for r in csv.DictReader(handle) if r["student"].startswith(prefix)]
    assert len(rows) == students and all(r["score"] == r["max_score"] for r in rows), rows
    return seconds


def measured_autograde(course: Path, name: str) -> tuple[float, int | None]:
    """(wall seconds, peak bytes or None) of ``moe-course course autograde name --jobs 1`` in a child process, in a
    cgroup of its own (``budget.Cgroup``; None where none can be made): the peak is its memory high-water mark
    (v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``), the submission's cgroups below it included."""
    from moe_course.course.limits import budget

    group = budget.Cgroup.create(f"moe-bench-{os.getpid()}", memory_bytes=2**40, processes=4 * budget.MAX_PROCESSES)
    argv = [sys.executable, "-m", "moe_course.cli", "course", "autograde", name, "--course-dir", str(course),
            "--jobs", "1"]
    start = time.perf_counter()
    try:
        subprocess.run(argv, check=True, preexec_fn=None if group is None else group.join)
        seconds = time.perf_counter() - start
        peaks = [int((f / n).read_text()) for f in (group.folders if group else [])
                 for n in ("memory.max_usage_in_bytes", "memory.peak") if (f / n).exists()]
    finally:
        if group is not None:
            group.remove()
    return seconds, max(peaks, default=None)


def each(names: list[str]) -> dict[str, tuple[float, int | None]]:
    """Per assignment, one full solution graded in the sandbox: (wall seconds, peak bytes or None)."""
    measured = {}
    for name in names:
        with tempfile.TemporaryDirectory(prefix="moe-grading-each-") as folder:
            course = Path(folder) / "course"
            assert main(["course", "release", name, "--course-dir", str(course), "--exercises",
                         str(Path(folder) / "exercises")]) == 0
            (Path(folder) / "export" / "solution").mkdir(parents=True)
            (Path(folder) / "export" / "solution" / f"{name}.ipynb").write_text(
                json.dumps(solution_notebook(course, name)))
            assert main(["course", "collect", str(Path(folder) / "export"), "--assignment", name,
                         "--course-dir", str(course)]) == 0
            measured[name] = measured_autograde(course, name)
            assert main(["course", "export", "--course-dir", str(course)]) == 0
            with open(course / "grades.csv") as handle:
                row = next(csv.DictReader(handle))
            assert row["score"] == row["max_score"], row
    return measured


def run(name: str, students: int, jobs: int) -> dict[str, float]:
    """Seconds per submission in the sandbox and without it (one course, one assignment release)."""
    with tempfile.TemporaryDirectory(prefix="moe-grading-bench-") as folder:
        course = Path(folder) / "course"
        assert main(["course", "release", name, "--course-dir", str(course), "--exercises",
                     str(Path(folder) / "exercises")]) == 0
        return {mode: grade_batch(course, name, students, jobs, mode == "bwrap") / students
                for mode in ("bwrap", "none")}


WORKER_MARK = "moe_course.course.limits.worker"  # in a helper's argv: a concurrent batch keeps its cgroup
IN_SUBMISSION_CGROUP = ("import sys\nfrom moe_course.course.limits import budget\n"
                        "if budget.worker_cgroup(2**30) is None:\n    sys.exit(3)\n")
# The victim's loop, bracketed by the CPU seconds of every process in the attacker's submission cgroup (named in
# MOE_BENCH_ATTACKER; /proc/<pid>/stat's utime + stime) where one runs beside it: prints wall and CPU seconds of
# the loop and the attacker's CPU seconds over the same span.
VICTIM_LOOP = """import os, time
def attacker_seconds(name):
    if not name:
        return 0.0
    ticks = 0
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            if f'/{name}/' in open(f'/proc/{pid}/cgroup').read():
                ticks += sum(int(v) for v in open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[11:13])
        except OSError:
            pass
    return ticks / os.sysconf('SC_CLK_TCK')
name = os.environ.get('MOE_BENCH_ATTACKER', '')
before = attacker_seconds(name)
start, cpu = time.perf_counter(), time.process_time()
total = 0
for i in range(3 * 10**6):
    total += i
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
print(wall, cpu, attacker_seconds(name) - before)
"""
BUSY_SHELLS = 200
# one shell forks the 200 (cheap), each of which waits 2 s before it spins: starting them is not slowed by those
# already spinning
ATTACKER = ("import subprocess, time\nsubprocess.Popen(['sh', '-c', 'for i in $(seq %d); do (sleep 2; while :; do :; "
            "done) & done; wait'])\nprint('ready', flush=True)\ntime.sleep(300)" % BUSY_SHELLS)
NO_CGROUPS = "this host lets no process create cgroups (a root grader's)"


def _in_submission_cgroup(script: str, **env: str) -> subprocess.Popen:
    """A process that moves into a submission cgroup of its own (``budget.worker_cgroup``, as a root batch's
    worker does) and then runs ``script``, with ``env`` added to its environment."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), **env}
    return subprocess.Popen([sys.executable, "-c", IN_SUBMISSION_CGROUP + script, WORKER_MARK], env=env,
                            stdout=subprocess.PIPE, text=True)


@dataclass
class VictimRun:
    """One run of the victim's loop: its wall and CPU seconds and the attacker's CPU seconds over the same span
    (0 alone)."""

    wall: float
    cpu: float
    attacker_cpu: float

    @property
    def fair_share(self) -> float:
        """The victim's CPU seconds over what equal weight per submission owes it: half of what the two
        submissions used together, or all of its wall time where that is less (one process uses one core).
        About 1 with equal weights at any ambient load; about 2/201 (0.01) were 201 processes weighted alike."""
        return self.cpu / min(self.wall, (self.cpu + self.attacker_cpu) / 2)


def _victim_run(attacker: int | None = None) -> VictimRun:
    from moe_course.course.limits import budget

    name = "" if attacker is None else f"{budget.LEFTOVER_PREFIX}{attacker}"
    victim = _in_submission_cgroup(VICTIM_LOOP, MOE_BENCH_ATTACKER=name)
    said, _ = victim.communicate(timeout=300)
    budget.remove_leftovers(Path(tempfile.gettempdir()), pids=[victim.pid])
    if victim.returncode == 3:
        raise OSError(NO_CGROUPS)
    assert victim.returncode == 0, said
    return VictimRun(*map(float, said.split()))


def cpu_attack(rounds: int) -> tuple[list[VictimRun], list[VictimRun]]:
    """(victim runs alone, victim runs beside BUSY_SHELLS busy shells), ``rounds`` of each in turns, every
    process in a submission cgroup of its own. Raises OSError where no cgroup can be made (not root)."""
    from moe_course.course.limits import budget

    alone, beside = [], []
    for _ in range(rounds):
        alone.append(_victim_run())
        attacker = _in_submission_cgroup(ATTACKER)
        try:
            if attacker.stdout.readline().strip() != "ready":
                raise OSError(NO_CGROUPS)
            time.sleep(3)  # every shell spins
            beside.append(_victim_run(attacker.pid))
        finally:
            attacker.kill()
            attacker.wait()
            budget.remove_leftovers(Path(tempfile.gettempdir()), pids=[attacker.pid])  # the shells with it
    return alone, beside


def median(values: list[float]) -> float:
    """The middle value (the upper one of an even count)."""
    return sorted(values)[len(values) // 2]


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--assignment", default="02_moe_layer")
    parser.add_argument("--students", type=int, default=8, help="full solutions graded per mode")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--cpu-attack", action="store_true", help="time a victim beside 200 busy shells (root)")
    parser.add_argument("--each", action="store_true",
                        help="every assignment's solution graded once in the sandbox: seconds and peak memory")
    parser.add_argument("--rounds", type=int, default=5, help="--cpu-attack: victim runs alone and beside each")
    args = parser.parse_args(argv)
    if args.students < 1 or args.jobs < 1 or args.rounds < 1:
        raise SystemExit(f"--students={args.students}, --jobs={args.jobs} and --rounds={args.rounds} must be "
                         "positive integers")
    if args.cpu_attack:
        alone, beside = cpu_attack(args.rounds)
        print(f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, load average "
              f"{os.getloadavg()[0]:.1f}; victim alone {[round(r.wall, 2) for r in alone]} s, beside {BUSY_SHELLS} "
              f"busy shells {[round(r.wall, 2) for r in beside]} s (wall)")
        print(f"  beside / alone (median wall): {median([r.wall for r in beside]) / median([r.wall for r in alone]):.2f}x")
        print(f"  beside: victim CPU {[round(r.cpu, 2) for r in beside]} s, the shells' CPU over the same spans "
              f"{[round(r.attacker_cpu, 2) for r in beside]} s")
        print(f"  victim's CPU / its fair share (median): {median([r.fair_share for r in beside]):.2f}")
        return
    if args.each:
        from moe_course.course.instructor.build import assignment_names

        print(f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, load average "
              f"{os.getloadavg()[0]:.1f} before; one full solution per assignment, sandbox, --jobs 1")
        for name, (seconds, peak) in each(assignment_names()).items():
            memory = "n/a (no cgroup: not root)" if peak is None else f"{peak / 2**20:.0f} MiB"
            print(f"  {name:14s} {seconds:6.1f} s   peak memory {memory}")
        return
    per = run(args.assignment, args.students, args.jobs)
    print(f"{args.assignment}, {args.students} submissions per mode, --jobs {args.jobs}, {os.cpu_count()} CPUs, "
          f"{platform.processor() or platform.machine()}, load average {os.getloadavg()[0]:.1f}")
    for mode, seconds in per.items():
        print(f"  {mode:5s}: {seconds:5.2f} s per submission (wall); a class of 200: {200 * seconds / 60:5.1f} min")
    print(f"  sandbox / no sandbox: {per['bwrap'] / per['none']:.2f}x")


if __name__ == "__main__":
    cli()
