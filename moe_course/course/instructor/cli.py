"""``moe-course course ...``: the instructor's and the learner's commands (nbgrader's Python API underneath).

    moe-course course release [ASSIGNMENT ...]            build exercises/ (and the course's gradebook)
    moe-course course collect EXPORT_DIR --assignment A   copy an LMS export into the course
    moe-course course autograde A [--jobs N]              grade every collected submission of A (in bubblewrap)
    moe-course course feedback A                          HTML feedback per student (no hidden tests)
    moe-course course explain A                           the written answers of A, for the instructor to score
    moe-course course export [--to grades.csv]            one CSV row per submission
    moe-course course validate NOTEBOOK                   a learner checks a notebook before hand-in
"""

from __future__ import annotations

import time
from pathlib import Path

from moe_course.course.limits.config import EXERCISES, SOLUTIONS, Limits

DEFAULT_COURSE_DIR = "course"


def add_parser(sub) -> None:
    """Add the ``course`` command and its subcommands to the ``moe-course`` parser's subparsers."""
    course = sub.add_parser("course", help="assignments and automatic grading (needs moe-course[instructor])")
    commands = course.add_subparsers(dest="course_command", required=True)

    def with_course_dir(parser):
        parser.add_argument("--course-dir", default=DEFAULT_COURSE_DIR,
                            help=f"the instructor's nbgrader course folder (default: ./{DEFAULT_COURSE_DIR})")
        return parser

    release = with_course_dir(commands.add_parser("release", help="generate the student versions into exercises/"))
    release.add_argument("assignments", nargs="*", help="NN_slug names (default: every solutions/NN_*.py)")
    release.add_argument("--solutions", default=str(SOLUTIONS), help="folder of the py:percent sources")
    release.add_argument("--exercises", default=str(EXERCISES), help="where the student notebooks go")

    collect = with_course_dir(commands.add_parser("collect", help="copy an LMS export of submissions into the course"))
    collect.add_argument("export_dir", help="unpacked export: one folder per student, or Canvas-named files")
    collect.add_argument("--assignment", required=True, help="the NN_slug these submissions answer")

    autograde = with_course_dir(commands.add_parser("autograde", help="grade every collected submission"))
    autograde.add_argument("assignment")
    autograde.add_argument("--jobs", type=int, default=2, help="submissions graded in parallel (default 2)")
    autograde.add_argument("--cell-timeout", type=int, default=Limits.cell_timeout, help="seconds per cell")
    autograde.add_argument("--submission-timeout", type=int, default=Limits.submission_timeout,
                           help="wall-clock seconds per submission")
    autograde.add_argument("--memory-mb", type=int, default=Limits.memory_bytes // 2**20,
                           help="address-space limit of the grading kernel (MiB)")
    autograde.add_argument("--max-output-mb", type=int, default=Limits.output_bytes // 2**20,
                           help="output one notebook may print before its grading stops (MiB)")
    autograde.add_argument("--max-notebook-mb", type=int, default=Limits.notebook_bytes // 2**20,
                           help="size of a submitted notebook past which it is not graded (MiB)")
    autograde.add_argument("--solutions", default=str(SOLUTIONS), help="kept unreadable for submitted code")
    autograde.add_argument("--no-sandbox", action="store_true",
                           help="grade without bubblewrap (unsafe; written into grades.csv for every row)")
    autograde.add_argument("--sandbox-uid", type=int, default=60000,
                           help="grading as root: the first of JOBS consecutive host uids, belonging to no user or "
                                "group, that the kernels run as (default 60000)")

    feedback = with_course_dir(commands.add_parser("feedback", help="HTML feedback per graded student"))
    feedback.add_argument("assignment")

    explain = with_course_dir(commands.add_parser(
        "explain", help="write COURSE_DIR/explain/A.csv: every written (explain) answer, a score column to fill in"))
    explain.add_argument("assignment")

    export = with_course_dir(commands.add_parser("export", help="write grades.csv"))
    export.add_argument("--to", default=None, help="CSV path (default: COURSE_DIR/grades.csv)")

    validate = commands.add_parser("validate", help="run a notebook and its visible tests before handing it in")
    validate.add_argument("notebook")


def run(args) -> dict:
    """Run the ``course`` subcommand in ``args``; returns the summary lines ``moe-course`` prints, every key and
    value passed through ``grade.terminal_text`` (student names and error texts are the students' own: no control
    character of theirs reaches the instructor's terminal).

    Raises ValueError for bad input (unknown assignment, missing folder, bad limit), and ImportError with the
    install line when nbgrader is missing.
    """
    summary = _run(args)
    from moe_course.course.instructor.grade import terminal_text

    return {terminal_text(key): terminal_text(value) for key, value in summary.items()}


def _run(args) -> dict:
    try:
        import nbgrader  # noqa: F401
    except ImportError as err:
        raise ValueError(f"moe-course course needs nbgrader ({err}); install it with pip install -e \".[instructor]\"") from err
    from moe_course.course.instructor import build, collect, grade
    from moe_course.course.limits import budget

    course_dir = Path(getattr(args, "course_dir", "."))
    command = args.course_command
    if command == "release":
        released = build.release(course_dir, args.assignments, solutions_dir=Path(args.solutions),
                                 exercises_dir=Path(args.exercises))
        return {"released": ", ".join(p.stem for p in released), "exercises": args.exercises}
    if command == "collect":
        found, skipped = collect.collect(Path(args.export_dir), course_dir, args.assignment)
        entries = {student: notebook.relative_to(args.export_dir).parts[0] for student, notebook in found.items()}
        shortened = {f"shortened to {student}": entry[:120] + ("..." if len(entry) > 120 else "")
                     for student, entry in entries.items() if len(entry) > collect.MAX_ID}
        return {"collected": len(found), "skipped": len(skipped), **shortened,
                **{f"skipped {name}": why for name, why in skipped.items()}}
    if command == "autograde":
        limits = Limits(cell_timeout=args.cell_timeout, submission_timeout=args.submission_timeout,
                        memory_bytes=args.memory_mb * 2**20, output_bytes=args.max_output_mb * 2**20,
                        notebook_bytes=args.max_notebook_mb * 2**20)
        budget.fits(args.jobs, limits.memory_bytes, sandbox=not args.no_sandbox)  # before grading anything
        start = time.perf_counter()
        records = grade.autograde(course_dir, args.assignment, jobs=args.jobs, limits=limits,
                                  solutions_dir=Path(args.solutions), sandbox=not args.no_sandbox,
                                  sandbox_uid=args.sandbox_uid)
        seconds = time.perf_counter() - start
        lines = {r["student"]: f"{r['score']} / {r['max_score']}" + (
                     f" + {sum(r['instructor'].values()):g} graded by the instructor" if r.get("instructor") else "")
                 + f" ({r['status']}{': ' + r['error'] if r['error'] else ''})" for r in records}
        held = next((r["limits"] for r in records if r.get("limits")), {})
        return {**lines, "submissions": len(records), "limits beyond prlimit": "; ".join(
                    f"{name}: {how}" for name, how in held.items()) or "none (not root, or no sandbox)",
                "seconds": round(seconds, 1),
                "seconds per submission": round(seconds / max(1, len(records)), 2)}
    if command == "feedback":
        written = grade.feedback(course_dir, args.assignment)
        return {"feedback files": len(written), "folder": str(course_dir / "feedback")}
    if command == "explain":
        sheet = grade.explain_sheet(course_dir, args.assignment)
        return {"explain sheet": str(sheet), "next": "fill in its score column (rubric: solutions/"
                f"{args.assignment}.py), then run moe-course course export"}
    if command == "export":
        return {"grades": str(grade.export(course_dir, args.to))}
    results = grade.validate(Path(args.notebook))
    if results:
        failed = results.get("failed", []) + results.get("changed", []) + results.get("type_changed", [])
        raise ValueError(f"{args.notebook}: {len(failed)} cell(s) would not pass or were changed:\n"
                         + "\n".join(cell.get("raw_error") or cell["source"][:200] for cell in failed))
    return {"validated": args.notebook, "result": "every visible test passes"}
