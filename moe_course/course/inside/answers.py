"""What a hidden test does inside the grading kernel: call the learner's function on the check's inputs and
write its outputs, as plain numbers, where the grader (outside the sandbox) reads them.

An assignment's checks live in ``solutions/checks/NN_slug.py``: a module-level
``CHECKS = {grade_id: Check(...)}``. A hidden test is one call, ``record("topk_tests", top_k_routing)``. The grader
(``moe_course.course.limits.verdict``) draws the same inputs from the same seed, computes the references with the
course library and compares; nothing the answers are compared against exists in the sandbox, where this
module (with the kernel and the checks file) is all of ``moe_course`` there is (``sandbox.runtime_package``).

Outside grading (no ``MOE_COURSE_ANSWERS`` in the environment: an instructor running a solution notebook),
``record`` compares right away and raises AssertionError with the reason when a check fails.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

ANSWERS_ENV = "MOE_COURSE_ANSWERS"  # folder the answers are written to (set by the grader)
CHECKS_ENV = "MOE_COURSE_CHECKS"  # the assignment's checks file
SEED_ENV = "MOE_COURSE_GRADING_SEED"  # the seed the inputs are drawn from (drawn per submission)
DEFAULT_SEED = 0  # outside grading


@dataclasses.dataclass(frozen=True)
class Check:
    """One graded function: ``cases(rng)`` gives a list of argument tuples (fresh NumPy arrays; drawn from
    ``rng``, a ``numpy.random.Generator``); ``reference(*args)`` gives the expected output (an array, a
    number, or a tuple of them) from the course library -- it runs only outside the sandbox. Outputs are
    compared with ``numpy.allclose(rtol, atol)``, exactly for ``exact=True``; ``scalar=True`` also requires
    each output to be one number (a Python or NumPy scalar, or a 0-d array). ``call(function, *args)``, when
    given, is how the learner's function is called and its outputs taken (default ``function(*args)``): for
    a function that takes a callable or returns something other than arrays. ``cases`` and ``call`` run in
    the sandbox, so they may use NumPy but not the course library."""

    cases: Callable
    reference: Callable
    rtol: float = 1e-5
    atol: float = 1e-6
    exact: bool = False
    scalar: bool = False
    call: Callable | None = None

    def reference_outputs(self, case: tuple) -> tuple:
        """The reference's outputs on one case, as a tuple of arrays (outside the sandbox only)."""
        return tuple(np.asarray(want) for want in as_outputs(self.reference(*case)))

    def outputs(self, function: Callable, case: tuple) -> tuple:
        """The learner's outputs on one case (arrays in the case are copied first)."""
        args = [argument.copy() if isinstance(argument, np.ndarray) else argument for argument in case]
        return as_outputs(self.call(function, *args) if self.call else function(*args))


def load_checks(path: str | os.PathLike) -> dict[str, Check]:
    """The ``CHECKS`` dict of a checks file. Raises ValueError when the file defines none."""
    spec = importlib.util.spec_from_file_location(f"moe_course_checks_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    checks = getattr(module, "CHECKS", None)
    if not isinstance(checks, dict) or not all(isinstance(c, Check) for c in checks.values()):
        raise ValueError(f"{path} must define CHECKS = {{grade_id: Check(...)}}")
    return checks


def check_cases(check: Check, grade_id: str, seed: int) -> list[tuple]:
    """The argument tuples of ``check`` for ``seed`` (the same inside and outside the sandbox)."""
    return [tuple(case) for case in check.cases(np.random.default_rng([seed, zlib.crc32(grade_id.encode())]))]


def as_outputs(value) -> tuple:
    """A function's return value as a tuple of outputs (a tuple or list stays; anything else is one)."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def record(grade_id: str, function: Callable) -> None:
    """Run ``function`` (or what the check's ``call`` takes: a tuple of functions, say) on every case of
    check ``grade_id`` and write the outputs for the grader
    (``<MOE_COURSE_ANSWERS>/<grade_id>.npz``, arrays ``c<case>_<output>``, no pickles), or the exception it
    raised (``<grade_id>.json``). Outside grading, compare right away (``compare.judge``) instead."""
    folder = os.environ.get(ANSWERS_ENV)
    checks = load_checks(os.environ[CHECKS_ENV]) if CHECKS_ENV in os.environ else _solution_checks()
    seed = int(os.environ.get(SEED_ENV, DEFAULT_SEED))
    cases = check_cases(checks[grade_id], grade_id, seed)
    if folder is None:
        from moe_course.course.inside.compare import judge

        check = checks[grade_id]
        reason = judge(check, grade_id, cases, [check.outputs(function, c) for c in cases],
                       [check.reference_outputs(c) for c in cases])
        assert reason is None, reason
        return
    target = Path(folder)
    (target / f"{grade_id}.json").unlink(missing_ok=True)
    (target / f"{grade_id}.npz").unlink(missing_ok=True)
    try:
        arrays = {}
        for index, case in enumerate(cases):
            for position, output in enumerate(checks[grade_id].outputs(function, case)):
                array = np.asarray(output)
                if array.dtype.hasobject:
                    raise TypeError(f"output {position + 1} is an object array; return numbers")
                arrays[f"c{index}_{position}"] = array
        with open(target / f"{grade_id}.npz", "wb") as handle:
            np.savez(handle, **arrays)
    except Exception as error:  # the learner's code failed: the grader reports it and scores 0
        (target / f"{grade_id}.npz").unlink(missing_ok=True)
        (target / f"{grade_id}.json").write_text(json.dumps({"error": f"{type(error).__name__}: {error}"[:300]}))
        raise


def _solution_checks() -> dict[str, Check]:
    """Outside grading: the checks file of the notebook being run, found from the working directory's
    assignment name in the repository's ``solutions/checks/`` (``MOE_COURSE_CHECKS`` overrides)."""
    solutions = Path(__file__).resolve().parents[3] / "solutions"  # limits.config.SOLUTIONS; no grader import here
    names = sorted((solutions / "checks").glob(f"{Path.cwd().name}.py"))
    if not names:
        raise FileNotFoundError(f"no checks for {Path.cwd().name!r}: set {CHECKS_ENV} to the checks file")
    return load_checks(names[0])
