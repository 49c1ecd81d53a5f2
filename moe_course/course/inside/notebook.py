"""The helpers every assignment's setup cell imports (solutions/NN_slug.py): a prediction kept as first written
(``predictions``) and two arrays compared (``differs``, ``close``).

They run in the learner's own kernel and in the grading sandbox, which gets this module
(``limits.sandbox.RUNTIME_MODULES``): the standard library and NumPy only.
"""

import functools
import json
from pathlib import Path

import numpy as np


def first_answer(name: str, value, path: str) -> str:
    """Record ``value`` as the first answer of prediction ``name`` in the JSON file ``path`` (beside the notebook)
    unless one is recorded already; returns the line to print.

    ``value`` is anything ``json.dumps`` takes; None means "not answered yet" and records nothing. Raises
    AssertionError when an answer was recorded before and ``value`` is another one (the first one counts)."""
    if value is None:
        return f"{name} is not answered yet: nothing recorded"
    where = Path(path)
    recorded = json.loads(where.read_text()) if where.exists() else {}
    if name not in recorded:
        where.write_text(json.dumps({**recorded, name: json.dumps(value)}, indent=1) + "\n")
        return f"{name} = {value} recorded as your prediction (in {path} beside this notebook)"
    assert recorded[name] == json.dumps(value), (
        f"{name} was {recorded[name]} when first recorded and is {value} now: a prediction counts as first written; "
        f"put it back (to start over, delete {path})")
    return f"{name} = {value}, as first recorded"


def predictions(path: str):
    """``freeze(name, value)``: ``first_answer`` with the predictions file ``path`` (e.g. "02_moe_layer.predictions
    .json")."""
    return functools.partial(first_answer, path=path)


def differs(mine, theirs):
    """Largest absolute difference between two arrays (booleans as 0 and 1; a float64 scalar), or why they cannot
    be compared (a str naming both shapes)."""
    mine, theirs = np.asarray(mine, np.float64), np.asarray(theirs, np.float64)
    return f"shape {mine.shape}, expected {theirs.shape}" if mine.shape != theirs.shape else np.abs(mine - theirs).max()


def close(mine, theirs, what: str, tolerance: float = 1e-5) -> None:
    """Raises AssertionError naming ``what`` when ``mine`` and ``theirs`` differ in shape or by more than
    ``tolerance`` anywhere (absolute)."""
    gap = differs(mine, theirs)
    assert not isinstance(gap, str), f"your {what} has {gap}"
    assert gap <= tolerance, f"your {what} differs from the library's by {gap:.3g}"
