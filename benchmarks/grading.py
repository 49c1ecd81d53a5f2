"""Grading time per submission, in the bubblewrap sandbox and without it, side by side in one run.

Releases one assignment into a temporary course, hands in ``--students`` copies of its full solution and
autogrades them through the real commands (``moe-course course autograde``), once in the sandbox and once
with ``--no-sandbox``; prints wall seconds per submission, the sandbox's cost as a ratio, and what a class
of 200 would take at the same ``--jobs`` on this machine. Every submission must score full marks.

    python benchmarks/grading.py --assignment 02_moe_layer --students 8 --jobs 2
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import tempfile
import time
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


def run(name: str, students: int, jobs: int) -> dict[str, float]:
    """Seconds per submission in the sandbox and without it (one course, one assignment release)."""
    with tempfile.TemporaryDirectory(prefix="moe-grading-bench-") as folder:
        course = Path(folder) / "course"
        assert main(["course", "release", name, "--course-dir", str(course), "--exercises",
                     str(Path(folder) / "exercises")]) == 0
        return {mode: grade_batch(course, name, students, jobs, mode == "bwrap") / students
                for mode in ("bwrap", "none")}


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--assignment", default="02_moe_layer")
    parser.add_argument("--students", type=int, default=8, help="full solutions graded per mode")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    if args.students < 1 or args.jobs < 1:
        raise SystemExit(f"--students={args.students} and --jobs={args.jobs} must be positive integers")
    per = run(args.assignment, args.students, args.jobs)
    print(f"{args.assignment}, {args.students} submissions per mode, --jobs {args.jobs}, {os.cpu_count()} CPUs, "
          f"{platform.processor() or platform.machine()}, load average {os.getloadavg()[0]:.1f}")
    for mode, seconds in per.items():
        print(f"  {mode:5s}: {seconds:5.2f} s per submission (wall); a class of 200: {200 * seconds / 60:5.1f} min")
    print(f"  sandbox / no sandbox: {per['bwrap'] / per['none']:.2f}x")


if __name__ == "__main__":
    cli()
