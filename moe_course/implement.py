"""The chapters' "Implement." tasks: the learner's function replaces the library's in the cells that follow, once
it agrees with the library's on every case the chapter gives it (docs/course.md, "How a chapter asks you to work").

A chapter hands out a stub that raises ``NotImplementedError`` and then calls ``use_yours``, which says in one
line which function the next measurement runs, so Run All (and the notebook tests) pass whether or not the task is
done -- and a learner's function that is written but wrong is named, with where it differs, not used silently.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np


def _leaves(value: Any) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(value)]


def differs(yours: Any, library: Any, *, rtol: float, atol: float) -> str | None:
    """Why the output ``yours`` does not match ``library`` (structure, shape, a non-finite value where the library
    has a finite one, or the largest absolute difference beyond ``atol + rtol * |library|``), or None where it
    matches. Both are arrays or pytrees of arrays; non-finite values are compared, never skipped."""
    mine, theirs = _leaves(yours), _leaves(library)
    if len(mine) != len(theirs):
        return f"it returns {len(mine)} arrays where the library returns {len(theirs)}"
    for index, (a, b) in enumerate(zip(mine, theirs)):
        where = f"output {index}: " if len(theirs) > 1 else ""
        if a.shape != b.shape:
            return f"{where}shape {a.shape}, the library's is {b.shape}"
        if not np.array_equal(np.isfinite(a), np.isfinite(b)):
            return f"{where}{int((~np.isfinite(a) & np.isfinite(b)).sum())} non-finite values where the library's are finite"
        close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        if not close.all():
            gap = np.abs(a.astype(np.float64) - b.astype(np.float64))[~close].max()
            return f"{where}{int((~close).sum())} of {close.size} values differ, by up to {gap:.2e}"
    return None


def use_yours(yours: Callable, library: Callable, cases: Sequence[tuple], *, name: str | None = None,
              rtol: float = 1e-5, atol: float = 1e-5, compare: Callable | None = None) -> Callable:
    """The function the chapter's next cells run: ``yours`` where it is written and returns what ``library``
    returns on every one of ``cases`` (each a tuple of positional arguments), otherwise ``library``.

    Prints one line: "yours matches the library on N cases: the cells below use yours", "not written yet: the
    cells below use the library's" (``yours`` raised NotImplementedError), or what went wrong -- the case, the
    error it raised or where its output differs (``differs``) -- and that the library's is used. Outputs are
    arrays or pytrees of arrays compared with ``np.isclose(rtol, atol)``; ``compare``, where given, maps both
    outputs to what is compared (e.g. a model to its parameters, ``lambda m: nnx.state(m, nnx.Param)``). Raises
    ValueError for no cases: a match on nothing proves nothing.
    """
    if not cases:
        raise ValueError("use_yours needs at least one case to compare yours with the library's on")
    label = name or getattr(yours, "__name__", "yours")
    for number, args in enumerate(cases, 1):
        try:
            mine = yours(*args)
            mine = mine if compare is None else compare(mine)
        except NotImplementedError:
            print(f"{label}: not written yet: the cells below use the library's")
            return library
        except Exception as error:  # the learner's bug, reported and not raised, so Run All goes on
            print(f"{label}: case {number} of {len(cases)} raised {type(error).__name__}: {error} -- "
                  "the cells below use the library's")
            return library
        theirs = library(*args)
        why = differs(mine, theirs if compare is None else compare(theirs), rtol=rtol, atol=atol)
        if why is not None:
            print(f"{label}: differs from the library on case {number} of {len(cases)} ({why}) -- "
                  "the cells below use the library's")
            return library
    print(f"{label}: yours matches the library on {len(cases)} cases: the cells below use yours")
    return yours
